"""PyTorch cross-check of the library baselines of `bench-gemm` (run by gemm-device-run.sh).

Times torch.mm fp16 (+ bias), torch._int_mm (cuBLASLt int8 -> int32) and torch._scaled_mm
(fp8 e4m3 -> bf16) with CUDA graphs, the median of repeated replays, on random data, so the
cuBLASLt numbers that bench-gemm measures through cudarc can be compared with PyTorch's.
"""

import statistics
import sys

import torch


def bench(fn, ops, samples=15):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end) / 5, 1e-4)
    inner = max(1, min(400, int(2.0 / one) + 1))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    graph.replay()
    times = []
    for _ in range(samples):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / inner)
    ms = statistics.median(times)
    return ms * 1e3, ops / (ms * 1e-3) / 1e12


def main():
    shapes = [(1500, 384, 384), (1500, 1536, 384), (8192, 2048, 512), (4096, 4096, 4096), (8192, 8192, 8192)]
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| M | N | K | fp16+bias µs (TFLOP/s) | _int_mm µs (TOP/s) | _scaled_mm fp8 µs (TFLOP/s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for m, n, k in shapes:
        ops = 2 * m * n * k
        a16 = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w16 = torch.randn(n, k, device="cuda", dtype=torch.float16)
        b16 = torch.randn(n, device="cuda", dtype=torch.float16)
        a8 = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
        w8 = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
        af = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
        wf = (torch.randn(n, k, device="cuda") * 4).to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        row = []
        row.append(bench(lambda: torch.addmm(b16, a16, w16.t()), ops))
        try:
            row.append(bench(lambda: torch._int_mm(a8, w8.t()), ops))
        except Exception as e:  # noqa: BLE001
            print(f"_int_mm {m}x{n}x{k}: {e}", file=sys.stderr)
            row.append((float("nan"), float("nan")))
        try:
            row.append(bench(lambda: torch._scaled_mm(af, wf.t(), one, one, out_dtype=torch.bfloat16), ops))
        except Exception as e:  # noqa: BLE001
            print(f"_scaled_mm {m}x{n}x{k}: {e}", file=sys.stderr)
            row.append((float("nan"), float("nan")))
        cells = " | ".join(f"{us:.1f} ({t:.0f})" for us, t in row)
        print(f"| {m} | {n} | {k} | {cells} |")


if __name__ == "__main__":
    main()
