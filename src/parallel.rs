//! How one utterance's work shares the rayon pool with others: calibration and `verify` run
//! utterances side by side, one per thread, and then the work inside an utterance (the forward's
//! GEMMs and attention, the reference numerics' quantize and scaled GEMM) stays on its thread.

thread_local! {
    /// Set while this thread runs one of several utterances that share the pool
    /// ([`one_utterance`]).
    static UTTERANCE_PER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, the work of one utterance of `side_by_side` that run in parallel on the pool. When
/// they are at least as many as the pool's threads, the work inside `f` (the forward's GEMMs,
/// attention heads and decode-step products, the reference numerics' quantize and scaled GEMM)
/// stays on this thread: splitting it as well only makes tasks for threads that are already
/// busy, and a thread that waits for one of its stolen tasks starts another utterance meanwhile,
/// so utterances stall one another and their buffers pile up. With fewer utterances than
/// threads, that work splits across the pool as before. The results are the same bits either
/// way (the splits never cut a sum).
pub(crate) fn one_utterance<R>(side_by_side: usize, f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            UTTERANCE_PER_THREAD.set(self.0);
        }
    }
    let alone = side_by_side >= rayon::current_num_threads();
    let _restore = Restore(UTTERANCE_PER_THREAD.replace(alone));
    f()
}

/// Whether the work of this thread's utterance may split across the pool (see [`one_utterance`]).
pub(crate) fn inner_parallelism() -> bool {
    !UTTERANCE_PER_THREAD.get()
}

/// The `with_min_len` of a parallel loop over `items` inside one utterance's work: 1 (split
/// freely), or all of them (one task, on this thread) under [`one_utterance`].
pub(crate) fn min_task_len(items: usize) -> usize {
    if inner_parallelism() {
        1
    } else {
        items.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::{
        quantize_per_token, scaled_mm, ActScale, Activation, GemmEpilogue, OutDtype, QuantDtype,
    };

    /// The reference numerics give the same bits split across the pool or kept on the thread of
    /// one utterance (their splits cut rows, never a sum), and the scope ends with its closure.
    #[test]
    fn the_numerics_are_the_same_bits_split_or_on_one_thread() {
        let (m, n, k) = (300, 96, 384);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 53 % 89) as f32 - 44.0) / 9.0)
            .collect();
        for dtype in [QuantDtype::Int8, QuantDtype::Float8E4m3fn] {
            let run = || {
                let a = quantize_per_token(&x, m, k, None, dtype);
                let wq = quantize_per_token(&w, n, k, None, dtype);
                let epi = GemmEpilogue {
                    bias: None,
                    activation: Activation::None,
                    out: OutDtype::F16,
                };
                let y = scaled_mm(
                    dtype,
                    &a.codes,
                    ActScale::PerRow(&a.scales),
                    &wq.codes,
                    &wq.scales,
                    m,
                    n,
                    k,
                    &epi,
                );
                (a.codes, a.scales, y)
            };
            let split = run();
            let alone = one_utterance(usize::MAX, run);
            assert!(inner_parallelism(), "the scope must end with its closure");
            assert_eq!(split, alone, "{dtype:?}");
        }
    }
}
