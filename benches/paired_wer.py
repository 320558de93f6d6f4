#!/usr/bin/env python3
"""Paired WER differences between the entries of one `oasr-quantize gate --json` report.

`verify` reports each checkpoint's WER against full precision with a paired-bootstrap interval;
this compares two quantized checkpoints with each other the same way: over the utterances both
transcribed, each resample draws utterances with replacement, each with both checkpoints' word
errors (2000 resamples, seeded; the 2.5th and 97.5th percentiles). Word errors use the port of
src/wer.rs in tests/compressed_tensors/check_transformers.py (self-tested against its tests).

    python3 benches/paired_wer.py long.json                   # every entry against full precision
    python3 benches/paired_wer.py long.json --against fp8_rtn # every entry against one entry
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "compressed_tensors"))
from check_transformers import paired_interval, word_errors  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report", type=Path, help="the JSON of `oasr-quantize gate --json`")
    ap.add_argument("--against", help="an entry name (default: full precision)")
    ap.add_argument("--set", help="the gate set to compare on (default: every set in the report)")
    args = ap.parse_args()

    report = json.loads(args.report.read_text())
    by_set: dict[str, dict[str, dict]] = {}
    for result in report["results"]:
        if "verify" in result and (args.set is None or result["set"] == args.set):
            by_set.setdefault(result["set"], {})[result["name"]] = result["verify"]
    if not by_set:
        print(f"{args.report}: no verified entry" + (f" on set {args.set}" if args.set else ""))
        return 1
    for set_name, entries in by_set.items():
        if args.against and args.against not in entries:
            print(f"{args.report}: no entry {args.against!r} on set {set_name}")
            return 1
        any_report = next(iter(entries.values()))
        ids = [t["id"] for t in any_report["transcripts"]]
        reference = {t["id"]: t["reference_text"] for t in any_report["transcripts"]}
        words = [word_errors(reference[i], reference[i])[1] for i in ids]

        def errors(verify: dict, side: str) -> list[int]:
            by_id = {t["id"]: t[side] for t in verify["transcripts"]}
            missing = [i for i in ids if i not in by_id]
            if missing:
                raise SystemExit(f"{args.report}: {missing[0]} missing from an entry on {set_name}")
            return [word_errors(reference[i], by_id[i])[0] for i in ids]

        if args.against:
            base, base_name = errors(entries[args.against], "quantized"), args.against
        else:
            base, base_name = errors(any_report, "full_precision"), "full precision"
        print(f"{set_name}: {len(ids)} utterances, {sum(words)} words; WER minus {base_name}'s "
              f"({100.0 * sum(base) / sum(words):.2f} %), points, 95 % paired-bootstrap interval")
        for name, verify in entries.items():
            if name == args.against:
                continue
            q = errors(verify, "quantized")
            delta, lo, hi = (100.0 * x for x in paired_interval(q, base, words))
            print(f"  {name:28s} {delta:+.2f}  [{lo:+.2f}, {hi:+.2f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
