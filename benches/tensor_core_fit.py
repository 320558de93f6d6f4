"""Scores candidate models of the fp8 tensor cores' sum against GPU results.

    python3 benches/tensor_core_fit.py DATA.npz [--variants all|chosen|zeros]
    python3 benches/tensor_core_fit.py DATA.npz --write-fixtures tests/fixtures/tensor_core

DATA.npz comes from `benches/tensor_core_data.py` on the GPU (cuBLASLt's fp8 GEMM with f32
output, without promotion: the tensor cores' own accumulator across the whole K). For each
candidate it prints the share of outputs the model gives bit for bit, per magnitude mix and K.
The chosen model (the defaults of `Model`) is the one src/numerics/tensor_core.rs implements
(docs/numerics.md). `--write-fixtures` writes a slice of the GPU's results (with promotion every
128 K elements, as this project's wgmma kernel promotes) for the unit tests of that file: per
mix and K, `<mix>_k<K>.bin` = m, n, k (u32 LE), A codes [m, k], W codes [n, k], the GPU's f32
results [m, n] (LE). Needs numpy only.
"""

import argparse
import itertools
import os
import struct

import numpy as np


def e4m3_values():
    """The value of every e4m3 (fn) code, exact in f64; NaN codes give NaN."""
    v = np.zeros(256)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> 3) & 0xF, code & 0x7
        if e == 0xF and m == 0x7:
            v[code] = np.nan
        elif e == 0:
            v[code] = sign * m / 8.0 * 2.0**-6
        else:
            v[code] = sign * (1 + m / 8.0) * 2.0 ** (e - 7)
    return v


E4M3 = e4m3_values()
# the magnitude mixes of benches/tensor_core_data.py (data from before 2026-12-07 has no "sparse")
MIXES = ["normal", "wide", "positive", "per_token", "sparse"]
NEG = -(1 << 20)  # the exponent of a zero: below every real one


def log2_floor(x):
    """floor(log2 |x|) elementwise, NEG for zeros."""
    _, e = np.frexp(np.abs(x))
    return np.where(x == 0, NEG, e - 1)


def input_exponent(x, clamp_subnormal):
    """An operand's exponent: floor(log2 |x|), or e4m3's emin (-6) for its subnormals."""
    e = log2_floor(x)
    if clamp_subnormal:
        e = np.where(x == 0, NEG, np.maximum(e, -6))
    return e


def trunc_to_bits(x, bits, mode):
    """x rounded to `bits` significant bits (toward zero or to nearest even)."""
    e = log2_floor(x)
    unit = np.exp2(np.where(x == 0, 0, e - (bits - 1)).astype(np.float64))
    q = x / unit
    q = np.trunc(q) if mode == "rz" else np.round(q)
    return np.where(x == 0, 0.0, q * unit)


class Model:
    """One candidate: each block of `block` K elements adds its products to the accumulator c.

    align: the exponent a product counts with when the block picks its largest exponent:
      "pre"  = ea + eb (before the product's own carry), "post" = the product's exact exponent.
    kept: bits kept below the largest exponent (terms, c among them, truncated toward zero).
    final: how the exact sum of the truncated terms becomes the new c:
      "f32" = round to nearest f32, "rzP" = truncate to P significant bits, "rnP" likewise to
      nearest.
    clamp_subnormal: an e4m3 subnormal operand counts with exponent -6 (e4m3's emin).
    carry_bit: keep one more bit when the largest product carried (its significand >= 2).
    zero_aligns: a product with a zero operand counts too, each zero operand with exponent -6
      (an exponent field of 0, as a subnormal's); otherwise zero products never set the top.
    """

    def __init__(self, block=32, align="pre", kept=13, final="rz14", clamp_subnormal=True,
                 carry_bit=False, zero_aligns=False):
        self.block, self.align, self.kept, self.final = block, align, kept, final
        self.clamp_subnormal, self.carry_bit = clamp_subnormal, carry_bit
        self.zero_aligns = zero_aligns

    def name(self):
        return (f"block={self.block} align={self.align} kept={self.kept} final={self.final} "
                f"clamp_sub={self.clamp_subnormal} carry_bit={self.carry_bit} "
                f"zero_aligns={self.zero_aligns}")

    def run(self, a, w):
        """The model's f32 results of A [M, K] times W [N, K]^T (decoded values)."""
        m, k = a.shape
        n = w.shape[0]
        ea = input_exponent(a, self.clamp_subnormal)
        ew = input_exponent(w, self.clamp_subnormal)
        if self.zero_aligns:
            ea, ew = np.where(a == 0, -6, ea), np.where(w == 0, -6, ew)
        c = np.zeros((m, n))
        for s in range(0, k, self.block):
            ab, wb = a[:, None, s:s + self.block], w[None, :, s:s + self.block]
            prod = ab * wb  # exact in f64
            zero = (prod == 0) & (not self.zero_aligns)
            if self.align == "pre":
                ep = np.where(zero, NEG, ea[:, None, s:s + self.block] + ew[None, :, s:s + self.block])
            else:
                ep = np.where(zero, NEG, log2_floor(prod))
            top = np.maximum(ep.max(axis=2), log2_floor(c))
            kept = np.full(top.shape, self.kept)
            if self.carry_bit:
                # the largest products' significand, relative to 2^top: >= 2 means a carry
                sig = np.where(ep == top[..., None], np.abs(prod) / np.exp2(top[..., None].clip(-200)), 0)
                kept = kept + (sig.max(axis=2) >= 2)
            unit = np.exp2((top - kept).clip(-300).astype(np.float64))
            terms = np.trunc(prod / unit[..., None]).sum(axis=2)
            total = (terms + np.trunc(c / unit)) * unit
            total = np.where(top <= NEG // 2, c, total)
            if self.final == "f32":
                c = total.astype(np.float32).astype(np.float64)
            else:
                mode, bits = self.final[:2], int(self.final[2:])
                c = trunc_to_bits(total, bits, mode)
                c = c.astype(np.float32).astype(np.float64)
        return c.astype(np.float32)


def write_fixtures(d, folder, rows=16, cols=32):
    """A slice of the promoted results of every mix at K = 32 and 384, for the Rust unit tests."""
    os.makedirs(folder, exist_ok=True)
    for mix in [m for m in MIXES if f"{m}_k32_a" in d]:
        for k in [32, 384]:
            a, w = d[f"{mix}_k{k}_a"], d[f"{mix}_k{k}_w"]
            # the first rows and columns without a NaN code (0x7f, 0xff)
            r = np.flatnonzero(((a & 0x7F) != 0x7F).all(axis=1))[:rows]
            c = np.flatnonzero(((w & 0x7F) != 0x7F).all(axis=1))[:cols]
            a, w, y = a[r], w[c], d[f"{mix}_k{k}_promoted"][np.ix_(r, c)]
            assert len(r) == rows and len(c) == cols and np.isfinite(y).all(), f"{mix} K={k}"
            with open(os.path.join(folder, f"{mix}_k{k}.bin"), "wb") as f:
                f.write(struct.pack("<3I", rows, cols, k))
                f.write(a.astype(np.uint8).tobytes())
                f.write(w.astype(np.uint8).tobytes())
                f.write(y.astype("<f4").tobytes())


def candidates(which):
    if which == "chosen":
        return [Model()]
    if which == "zeros":
        # how zeros and subnormals set a block's alignment (the sparse mix tells them apart)
        return [Model(clamp_subnormal=c, zero_aligns=z) for c in [False, True]
                for z in [False, True]]
    out = []
    for block, align, kept, final, clamp, carry in itertools.product(
            [32, 16], ["pre", "post"], [13, 14], ["f32", "rz14", "rz15", "rz24"], [False, True],
            [False, True]):
        out.append(Model(block=block, align=align, kept=kept, final=final, clamp_subnormal=clamp,
                         carry_bit=carry))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("data")
    p.add_argument("--variants", default="all", choices=["all", "chosen", "zeros"])
    p.add_argument("--ks", default="32,64,128,384")
    p.add_argument("--rows", type=int, default=64, help="rows of A scored (all 256 is slower)")
    p.add_argument("--write-fixtures", metavar="DIR")
    args = p.parse_args()
    d = np.load(args.data)
    if args.write_fixtures:
        write_fixtures(d, args.write_fixtures)
        return
    ks = [int(x) for x in args.ks.split(",")]
    mixes = [m for m in MIXES if f"{m}_k{ks[0]}_a" in d]
    print(f"device: {d['device']}")
    results = []
    for model in candidates(args.variants):
        scores = []
        for mix in mixes:
            for k in ks:
                a = E4M3[d[f"{mix}_k{k}_a"][: args.rows]]
                w = E4M3[d[f"{mix}_k{k}_w"]]
                gpu = d[f"{mix}_k{k}_fast"][: args.rows]
                got = model.run(a, w)
                finite = np.isfinite(gpu)  # NaN codes in the operands: not scored
                scores.append(((mix, k), float(np.mean(got[finite] == gpu[finite]))))
        mean = np.mean([s for _, s in scores])
        results.append((mean, model.name(), scores))
    results.sort(key=lambda r: -r[0])
    for mean, name, scores in results[:12]:
        print(f"{mean:.4f}  {name}")
        print("        " + "  ".join(f"{mix[:4]}/{k}:{s:.3f}" for (mix, k), s in scores))


if __name__ == "__main__":
    main()
