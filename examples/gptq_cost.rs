//! The cost of GPTQ's per-layer stages at a given weight shape (seeded random weight and
//! inputs: cost only). `cargo run --release --example gptq_cost -- N K ROWS`.
use oasr_quantize::algorithms::gptq::{quantize_weight, GptqOptions};
use oasr_quantize::numerics::QuantDtype;
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let [n, k, rows] = args[..] else {
        eprintln!("usage: gptq_cost N K ROWS (a [N, K] weight, ROWS calibration inputs)");
        std::process::exit(2);
    };
    let mut s = 7u64;
    let mut r = move || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let w: Vec<f32> = (0..n * k).map(|_| r() * 0.05).collect();
    let factors = 16;
    let mix: Vec<f32> = (0..factors * k).map(|_| r()).collect();
    let mut xs = vec![0f32; rows * k];
    for row in xs.chunks_mut(k) {
        let f: Vec<f32> = (0..factors).map(|_| r() * 3.0).collect();
        for (j, x) in row.iter_mut().enumerate() {
            *x = (0..factors).map(|m| f[m] * mix[m * k + j]).sum::<f32>() + 0.1 * r();
        }
    }
    let t = Instant::now();
    let mut gram = vec![0f32; k * k];
    // SAFETY: xᵀ [k, rows] and x [rows, k] over xs, the product [k, k] over gram.
    unsafe {
        gemm::gemm(
            k,
            k,
            rows,
            gram.as_mut_ptr(),
            1,
            k as isize,
            false,
            xs.as_ptr(),
            k as isize,
            1,
            xs.as_ptr(),
            1,
            k as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
    eprintln!("gram {:.2?}", t.elapsed());
    let t = Instant::now();
    let g = quantize_weight(
        "l",
        &w,
        n,
        k,
        QuantDtype::Float8E4m3fn,
        &gram,
        rows,
        GptqOptions::default(),
    )
    .expect("gptq");
    eprintln!(
        "quantize_weight {:.2?} err {} rtn {}",
        t.elapsed(),
        g.output_error,
        g.rtn_output_error
    );
}
