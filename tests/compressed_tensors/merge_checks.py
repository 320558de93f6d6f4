#!/usr/bin/env python3
"""Combine `check_transformers.py` results of the same exports on disjoint parts of one manifest
(a set checked in parts to fit a device call, `CHECK_MANIFEST` per part) into one table.

    python3 tests/compressed_tensors/merge_checks.py part1.json part2.json ...

Word errors and words add up across parts, so the combined WERs are the corpus WERs of the whole
set; transformers' teacher-forced mean is weighted by steps. `verify`'s teacher-forced figure is
its report's, which already covers the whole set.
"""
import json
import sys


def main(paths: list[str]) -> None:
    parts = [json.load(open(p)) for p in paths]
    n_exports = {len(p["quantized"]) for p in parts}
    if len(n_exports) != 1:
        sys.exit("the parts do not check the same exports")
    print("| export | utterances | full-precision transcripts the same | WER fp, transformers "
          "| WER q, transformers | WER q, `verify` | quantized transcripts the same "
          "| teacher-forced cosine mean (min), transformers | the same, `verify` |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i in range(n_exports.pop()):
        qs = [p["quantized"][i] for p in parts]
        if len({q["dir"] for q in qs}) != 1:
            sys.exit(f"export {i} differs between the parts")

        def wer(key):
            errors = sum(q["wer"][key]["errors"] for q in qs)
            words = sum(q["wer"][key]["words"] for q in qs)
            return 100 * errors / words

        utts = sum(q["utterances_compared"] for q in qs)

        def same(key):
            return round(sum(q[key] * q["utterances_compared"] for q in qs))

        tf = [q["teacher_forced"]["transformers"] for q in qs]
        steps = sum(t["steps"] for t in tf)
        mean = sum(t["cosine_mean"] * t["steps"] for t in tf) / steps
        v = qs[0]["teacher_forced"]["verify"]
        print(f"| `{qs[0]['dir'].rsplit('/', 1)[-1]}` | {utts} "
              f"| {same('full_precision_transcript_match_fraction')} "
              f"| {wer('transformers_full_precision'):.2f} % "
              f"| {wer('transformers_quantized'):.2f} % "
              f"| {wer('verify_quantized_recomputed'):.2f} % "
              f"| {same('quantized_transcript_match_fraction')} "
              f"| {mean:.5f} ({min(t['cosine_min'] for t in tf):.3f}) "
              f"| {v['cosine_mean']:.5f} ({v['cosine_min']:.3f}) |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
