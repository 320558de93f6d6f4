//! Quantize a checkpoint from code: `cargo run --release --example quantize -- SRC DST [RECIPE]`.

use oasr_quantize::{Quantizer, Stage};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(src), Some(dst)) = (args.next(), args.next()) else {
        return Err("usage: quantize SRC DST [RECIPE]".into());
    };
    let recipe = args.next().unwrap_or_else(|| "int8_w8a8_rtn".into());
    let outcome = Quantizer::new(src, dst)
        .recipe(recipe)
        .on_progress(|p| {
            if p.stage == Stage::Writing && p.done == p.total {
                eprintln!("wrote {} tensors", p.total);
            }
        })
        .run()?;
    if let Some(report) = outcome.report {
        for layer in &report.layers {
            println!("{:50} {:.5}", layer.name, layer.relative_weight_error);
        }
    }
    Ok(())
}
