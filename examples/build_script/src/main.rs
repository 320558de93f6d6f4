//! Prints where the build script put the quantized checkpoint.

fn main() {
    println!(
        "{} quantized layers in {}",
        env!("QUANTIZED_LAYERS"),
        env!("QUANTIZED_CHECKPOINT")
    );
}
