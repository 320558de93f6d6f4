#!/usr/bin/env python3
"""The teacher-forced cosine of two `verify --json` reports of one manifest, compared utterance
by utterance: mean(A) − mean(B) over the steps, and its 95 % paired-bootstrap interval over the
utterances (the resampling of benches/paired_wer.py, each utterance weighted by its steps). For
example the GPU lane against the CPU reference of the same checkpoint (docs/accuracy.md, "fp8 on
the GPU"). A report may also be a gate JSON, with `--entry` naming the result to read.

    python3 benches/paired_cosine.py gpu.json cpu.json
    python3 benches/paired_cosine.py gpu.json long.json --entry-b smoothquant_fp8
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "compressed_tensors"))
from check_transformers import paired_interval  # noqa: E402


def teacher_forced(path: Path, entry: str | None) -> dict[str, dict]:
    """Per-utterance teacher-forced figures of a verify report, or of a gate report's entry."""
    report = json.loads(path.read_text())
    if "results" in report:
        found = [r["verify"] for r in report["results"] if r["name"] == entry]
        if len(found) != 1:
            raise SystemExit(f"{path}: a gate report; name one of its entries with --entry-a/-b "
                             f"({', '.join(r['name'] for r in report['results'])})")
        report = found[0]
    return {t["id"]: t["teacher_forced"] for t in report["transcripts"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--entry-a", help="the entry to read when A is a gate report")
    ap.add_argument("--entry-b", help="the entry to read when B is a gate report")
    args = ap.parse_args()
    a, b = teacher_forced(args.a, args.entry_a), teacher_forced(args.b, args.entry_b)
    if a.keys() != b.keys():
        raise SystemExit(f"{args.a} and {args.b} are not of the same utterances")
    ids = sorted(a)
    for i in ids:
        if a[i]["steps"] != b[i]["steps"]:
            raise SystemExit(f"{i}: {a[i]['steps']} steps in A, {b[i]['steps']} in B: not the "
                             "same tokens scored")
    steps = [a[i]["steps"] for i in ids]
    delta, lo, hi = paired_interval([a[i]["cosine_mean"] * a[i]["steps"] for i in ids],
                                    [b[i]["cosine_mean"] * b[i]["steps"] for i in ids], steps)
    print(f"{len(ids)} utterances, {sum(steps)} teacher-forced steps: cosine mean A − B "
          f"{delta:+.6f} (95 % interval {lo:+.6f} to {hi:+.6f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
