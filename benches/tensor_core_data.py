"""Collects fp8 GEMM results of the GPU's tensor cores, for fitting the CPU model of their sum
(`verify --fp8-accumulation tensor-core`, src/numerics/tensor_core.rs; docs/numerics.md).

Runs where torch sees a Hopper GPU. For several K and several mixes of magnitudes (the last,
"sparse", is mostly zeros and subnormals, as a static scale quantizes silence) it draws e4m3
matrices A [M, K] and W [N, K], multiplies them with cuBLASLt's fp8 GEMM (`torch._scaled_mm`,
unit scales, f32 output) without promotion (`use_fast_accum=True`: the tensor cores' own
accumulator across the whole K) and with it, and saves the codes and the f32 results:

    python3 benches/tensor_core_data.py OUT.npz

`benches/tensor_core_fit.py OUT.npz` then scores candidate models on them (no GPU needed).
"""

import sys

import numpy as np
import torch


def draw(mix, rows, k, gen):
    """A [rows, k] f32 matrix of the named magnitude mix (before rounding to e4m3)."""
    normal = torch.randn(rows, k, generator=gen, device="cuda")
    if mix == "normal":
        return normal * 4.0
    if mix == "wide":
        # every element its own binade: alignment drops many bits of the small products
        exp = torch.randint(-8, 9, (rows, k), generator=gen, device="cuda").float()
        return normal * torch.exp2(exp)
    if mix == "positive":
        # one sign: the block sums carry out above the largest product
        return normal.abs() * 4.0 + 0.25
    if mix == "per_token":
        # heavy tails scaled to e4m3's range per row, as the quantizer does
        t = normal / torch.rand(rows, k, generator=gen, device="cuda").clamp_min(0.05).sqrt()
        return t / t.abs().amax(dim=1, keepdim=True) * 448.0
    if mix == "sparse":
        # a static scale's input in silence: most elements zero or e4m3 subnormals (below
        # 2^-6), a few normal ones; decides how zeros and subnormals set a block's alignment
        exp = torch.randint(-12, 3, (rows, k), generator=gen, device="cuda").float()
        keep = torch.rand(rows, k, generator=gen, device="cuda") < 0.5
        return torch.where(keep, normal * torch.exp2(exp), torch.zeros_like(normal))
    raise ValueError(mix)


def main():
    out = sys.argv[1]
    gen = torch.Generator(device="cuda").manual_seed(20261207)
    one = torch.ones((), device="cuda")
    m, n = 256, 256
    saved = {"device": np.array(torch.cuda.get_device_name())}
    for mix in ["normal", "wide", "positive", "per_token", "sparse"]:
        for k in [32, 64, 128, 384]:
            # clamped: torch's cast gives NaN above e4m3's largest finite value
            a = draw(mix, m, k, gen).clamp(-448, 448).to(torch.float8_e4m3fn)
            # the sparse mix's weights span every binade ("wide")
            w = draw("wide" if mix == "sparse" else mix, n, k, gen)
            w = w.clamp(-448, 448).to(torch.float8_e4m3fn)
            for fast in [True, False]:
                y = torch._scaled_mm(
                    a, w.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast
                )
                saved[f"{mix}_k{k}_{'fast' if fast else 'promoted'}"] = y.cpu().numpy()
            saved[f"{mix}_k{k}_a"] = a.view(torch.uint8).cpu().numpy()
            saved[f"{mix}_k{k}_w"] = w.view(torch.uint8).cpu().numpy()
    np.savez_compressed(out, **saved)
    print(f"{len(saved)} arrays from {torch.cuda.get_device_name()} into {out}")


if __name__ == "__main__":
    main()
