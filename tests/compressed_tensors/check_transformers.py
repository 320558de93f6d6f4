#!/usr/bin/env python3
"""Load oasr-quantize's Hugging Face Whisper exports with transformers + compressed-tensors and
compare what transformers computes with the project's own `oasr-quantize verify --json` reports.

For the full-precision export (--fp) and every quantized export (--quantized, one verify JSON each):

1. load WhisperForConditionalGeneration.from_pretrained(dir, dtype=float32) on the CPU (or --device),
   capturing transformers' logging, compressed-tensors' loguru/stdlib logging and Python warnings;
   any message about unexpected / missing / unused / newly initialised / mismatched weights, any
   compressed-tensors "Could not match" target warning, any non-empty `output_loading_info` list, or
   any quantized module left compressed or not matching the config's targets/ignore is a failure;
2. run one plain forward first (compressed-tensors decompresses on the model's first forward through
   a forward pre-hook; `generate` calls the encoder directly and would otherwise see int8/fp8 weights);
3. greedy-decode every utterance (num_beams=1, no sampling, no temperature fallback, no timestamps,
   English transcription, oasr-quantize's token limit) and compute teacher-forced logits on the
   full-precision model's tokens. The verify reports must come from `verify --no-fallback` (the
   same greedy decoding); a report that kept a decoding above temperature 0 is a failure.

Exit status: 0 all checks passed; 1 a load problem or |WER_q(transformers) - WER_q(verify)| above
--wer-tolerance; 2 bad arguments or inputs.

`--served-numerics` is a diagnostic, not the check: it makes compressed-tensors' simulation compute
what the served kernels (and `verify`) compute, in the two places they differ — the dynamic int8
input scale amax/127 (compressed-tensors: amax/127.5) and each quantized layer's output rounded
once to f16 (compressed-tensors keeps f32) — leaving f32 reassociation as the only difference
(docs/accuracy.md: that alone still parts the greedy decodes of near-tied utterances).

`python3 check_transformers.py --self-test` runs the WER-normalisation tests (no torch needed).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import math
import os
import platform
import random
import re
import sys
import time
import warnings
import wave
from pathlib import Path

# Nothing is fetched at run time: every path is a local directory.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class InputError(Exception):
    """A problem with the arguments or input files (exit status 2)."""


# --------------------------------------------------------------------------------------------
# WER: a port of src/wer.rs (keep the two in step).
#
# Normalisation: lower case; `-`, `/` and `:` become spaces; every other character that is not a
# letter, digit, apostrophe or whitespace is removed; apostrophes at word edges are removed; a
# number written in digits (0 to 999 999 999) becomes its spoken words; whitespace collapses.
# Word-level Levenshtein distance; a corpus WER is sum(errors) / sum(reference words).
# --------------------------------------------------------------------------------------------

_ONES = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _below_thousand(n: int, out: list[str]) -> None:
    hundreds, rest = n // 100, n % 100
    if hundreds > 0:
        out.append(_ONES[hundreds])
        out.append("hundred")
    if rest >= 20:
        out.append(_TENS[rest // 10])
        if rest % 10 != 0:
            out.append(_ONES[rest % 10])
    elif rest > 0 or hundreds == 0:
        out.append(_ONES[rest])


def number_words(n: int) -> list[str]:
    """Spoken words of an integer below one billion."""
    out: list[str] = []
    rest = n
    for scale, name in ((1_000_000, "million"), (1_000, "thousand")):
        if rest >= scale:
            _below_thousand(rest // scale, out)
            out.append(name)
            rest %= scale
    if rest > 0 or not out:
        _below_thousand(rest, out)
    return out


def normalize(text: str) -> list[str]:
    """The normalised words of a text (src/wer.rs `normalize`)."""
    chars = []
    for c in text.lower():
        if c in "-/:":
            c = " "
        # Rust: c.is_alphanumeric() || c.is_whitespace() || c == '\''
        if c.isalnum() or c.isspace() or c == "'":
            chars.append(c)
    words: list[str] = []
    for word in "".join(chars).split():
        word = word.strip("'")
        if not word:
            continue
        if word.isascii() and word.isdigit() and int(word) < 1_000_000_000:
            words.extend(number_words(int(word)))
        else:
            words.append(word)
    return words


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edit distance in words, words in the normalised reference)."""
    r = normalize(reference)
    h = normalize(hypothesis)
    prev = list(range(len(h) + 1))
    for i, rw in enumerate(r):
        cur = [i + 1] + [0] * len(h)
        for j, hw in enumerate(h):
            cur[j + 1] = min(prev[j] + (rw != hw), prev[j + 1] + 1, cur[j] + 1)
        prev = cur
    return prev[len(h)], len(r)


def corpus_wer(pairs) -> dict:
    """WER over (reference, hypothesis) pairs: summed errors over summed reference words."""
    errors = words = 0
    for ref, hyp in pairs:
        e, w = word_errors(ref, hyp)
        errors += e
        words += w
    if words == 0:
        rate = 0.0 if errors == 0 else 1.0
    else:
        rate = errors / words
    return {"wer": rate, "errors": errors, "words": words}


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 7


def paired_interval(a: list[float], b: list[float],
                    weights: list[float]) -> tuple[float, float, float]:
    """Σa/Σw − Σb/Σw over the items (utterances), and its 95 % paired-bootstrap interval (2000
    resamples of the items with replacement, seeded): with a and b word errors and w reference
    words, the difference of two WERs (as fractions), as `verify` reports it against full
    precision."""
    rng = random.Random(BOOTSTRAP_SEED)
    n = len(weights)
    diffs = [x - y for x, y in zip(a, b)]
    draws = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        picks = [rng.randrange(n) for _ in range(n)]
        w = sum(weights[k] for k in picks)
        draws.append(sum(diffs[k] for k in picks) / w if w else 0.0)
    draws.sort()
    return (sum(diffs) / sum(weights), draws[int(0.025 * BOOTSTRAP_RESAMPLES)],
            draws[int(0.975 * BOOTSTRAP_RESAMPLES)])


def self_test() -> int:
    """The tests of src/wer.rs, run on this port."""
    checks = [
        (normalize("Hello, World!  It's 20 past-two."),
         ["hello", "world", "it's", "twenty", "past", "two"]),
        (normalize("'Quoted' 105 and 1,000"),
         ["quoted", "one", "hundred", "five", "and", "one", "thousand"]),
        (normalize("0 7 13 40 99 2024"),
         "zero seven thirteen forty ninety nine two thousand twenty four".split(" ")),
        (normalize("3000000"), ["three", "million"]),
        (word_errors("the cat sat", "The cat sat."), (0, 3)),
        (word_errors("the cat sat", "the bat sat down"), (2, 3)),
        (word_errors("the cat sat", "cat"), (2, 3)),
        (word_errors("twenty one", "21"), (0, 2)),
        (word_errors("", "noise"), (1, 0)),
        (corpus_wer([("a b c d", "a b c d"), ("a b c d", "a x c")]),
         {"wer": 0.25, "errors": 2, "words": 8}),
        (corpus_wer([("", "")]), {"wer": 0.0, "errors": 0, "words": 0}),
        (normalize("1000000000 999999999"),
         ["1000000000", "nine", "hundred", "ninety", "nine", "million", "nine", "hundred",
          "ninety", "nine", "thousand", "nine", "hundred", "ninety", "nine"]),
        (normalize("rock/pop: AC-DC ''x'' don't"), ["rock", "pop", "ac", "dc", "x", "don't"]),
    ]
    failed = 0
    for i, (got, want) in enumerate(checks):
        if got != want:
            failed += 1
            print(f"self-test {i}: got {got!r}, want {want!r}")
    print(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def read_manifest(path: Path, limit: int | None) -> list[dict]:
    if not path.is_file():
        raise InputError(f"manifest {path} does not exist")
    items = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: not JSON: {e}") from None
            for key in ("id", "audio", "text"):
                if key not in row:
                    raise InputError(f"{path}:{lineno}: missing key {key!r}")
            audio = Path(row["audio"])
            if not audio.is_absolute():
                audio = path.parent / audio
            items.append({"id": str(row["id"]), "audio": audio, "text": row["text"],
                          "source": row.get("source")})
            if limit and len(items) >= limit:
                break
    if not items:
        raise InputError(f"manifest {path} has no utterances")
    return items


def read_audio(path: Path):
    """16 kHz mono 16-bit PCM as float32 samples / 32768, from WAV (Python's wave module) or FLAC
    (soundfile, when installed: the staged long set is FLAC, losslessly the same samples)."""
    import numpy as np

    if not path.is_file():
        raise InputError(f"audio file {path} does not exist")
    if path.suffix.lower() == ".flac":
        try:
            import soundfile
        except ImportError:
            raise InputError(f"{path}: reading FLAC needs soundfile (pip install --no-index "
                             "--find-links .whl/ct soundfile)") from None
        info = soundfile.info(str(path))
        if info.channels != 1 or info.samplerate != 16000 or info.subtype != "PCM_16":
            raise InputError(f"{path}: need 16 kHz mono 16-bit PCM, got {info.samplerate} Hz, "
                             f"{info.channels} channel(s), {info.subtype}")
        data, _ = soundfile.read(str(path), dtype="int16")
        return data.astype(np.float32) / 32768.0
    try:
        with wave.open(str(path), "rb") as w:
            channels, rate, width, frames = (w.getnchannels(), w.getframerate(),
                                             w.getsampwidth(), w.getnframes())
            data = w.readframes(frames)
    except wave.Error as e:
        raise InputError(f"{path}: not a PCM wav file ({e})") from None
    if channels != 1 or rate != 16000 or width != 2:
        raise InputError(f"{path}: need 16 kHz mono 16-bit PCM, got {rate} Hz, {channels} "
                         f"channel(s), {8 * width}-bit")
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


def token_limit(samples: int, setting: str) -> int:
    """The decoding's token limit: oasr-quantize's (`token_limit` in
    src/models/whisper/decoding.rs: 24 + 12 per second of 16 kHz audio, at most 224), or a fixed
    number."""
    if setting == "audio":
        return min(24 + math.ceil(12.0 * samples / 16000), 224)
    try:
        return int(setting)
    except ValueError:
        raise InputError(f"--max-new-tokens {setting!r}: 'audio' or a number") from None


def fallback_ids(report: dict) -> list[str]:
    """Utterances that verify kept a decoding at a temperature above 0 for (either model):
    its decoding then differs from greedy `generate` by design (`verify --no-fallback`)."""
    return [str(t["id"]) for t in report["transcripts"]
            if t.get("temperature_full_precision", 0.0) > 0.0
            or t.get("temperature_quantized", 0.0) > 0.0]


def read_verify_json(path: Path) -> dict:
    if not path.is_file():
        raise InputError(f"verify JSON {path} does not exist")
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise InputError(f"verify JSON {path}: not JSON: {e}") from None
    for key in ("transcripts", "teacher_forced"):
        if key not in report:
            raise InputError(f"verify JSON {path}: missing top-level key {key!r}")
    by_id = {}
    for i, t in enumerate(report["transcripts"]):
        for key in ("id", "full_precision", "quantized"):
            if key not in t:
                raise InputError(f"verify JSON {path}: transcripts[{i}] has no {key!r}")
        by_id[str(t["id"])] = t
    report["_by_id"] = by_id
    return report


# --------------------------------------------------------------------------------------------
# Capturing load-time messages
# --------------------------------------------------------------------------------------------

# A message about weights/keys that were unexpected, missing, unused, (newly) initialised or
# mismatched: transformers' LOAD REPORT, older "Some weights ... were not used/initialized", etc.
_BAD_WORDS = re.compile(
    r"unexpected|missing|unused|not used|newly initiali[sz]ed|not initiali[sz]ed|mismatch", re.I)
_BAD_CONTEXT = re.compile(r"weight|key|param|checkpoint|state.?dict|tensor|load report", re.I)
# compressed-tensors: a config target that matched no module. compressed-tensors 0.19's
# match_named_modules stops at a module's first matching target, so an exact-name target in a group
# that follows a class-name group ("Linear") is reported although it matched; such a message whose
# target is a quantized module is kept as a note, not a failure (see LoadedModel).
_CT_NO_MATCH = re.compile(r"could not match", re.I)
_CT_NO_MATCH_TARGET = re.compile(r"Could not match `([^`]+)`")


def is_bad_message(message: str) -> bool:
    return bool((_BAD_WORDS.search(message) and _BAD_CONTEXT.search(message))
                or _CT_NO_MATCH.search(message))


class _ListHandler(logging.Handler):
    def __init__(self, sink: list[str]):
        super().__init__(level=logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # a broken log call must not hide the others
            msg = str(record.msg)
        self.sink.append(f"[{record.name}] {record.levelname}: {msg}")


@contextlib.contextmanager
def capture_messages():
    """Collect WARNING+ records of transformers (which does not propagate to the root logger),
    of every other stdlib logger (root), of loguru (compressed-tensors) and Python warnings."""
    messages: list[str] = []
    handler = _ListHandler(messages)
    loggers = [logging.getLogger("transformers"), logging.getLogger()]
    for lg in loggers:
        lg.addHandler(handler)
    loguru_id = None
    try:
        from loguru import logger as loguru_logger

        def _sink(message):
            rec = message.record
            messages.append(f"[loguru:{rec['name']}] {rec['level'].name}: {rec['message']}")

        loguru_id = loguru_logger.add(_sink, level="WARNING")
    except ImportError:
        loguru_logger = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield messages
        finally:
            for w in caught:
                messages.append(f"[warnings:{w.category.__name__}] {w.message} "
                                f"({w.filename}:{w.lineno})")
            for lg in loggers:
                lg.removeHandler(handler)
            if loguru_id is not None:
                loguru_logger.remove(loguru_id)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def _enum_value(x):
    return getattr(x, "value", x)


def _matches(name: str, module, target: str, torch) -> bool:
    """compressed-tensors' matching: `re:` regex on the name, exact name, or class name in MRO."""
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    if target == name:
        return True
    return any(cls.__name__ == target for cls in type(module).__mro__
               if issubclass(cls, torch.nn.Module))


def quantization_summary(model, qconfig: dict | None, torch) -> tuple[dict, list[str]]:
    """What compressed-tensors set up, after the first forward; and problems found in it."""
    problems: list[str] = []
    quantized = {}
    for name, module in model.named_modules():
        scheme = getattr(module, "quantization_scheme", None)
        if scheme is None:
            continue
        w, ia = scheme.weights, scheme.input_activations
        entry = {
            "status": str(_enum_value(getattr(module, "quantization_status", None))),
            "weight_dtype": str(module.weight.dtype).replace("torch.", ""),
            "weights": None if w is None else
            f"{_enum_value(w.type)}{w.num_bits}/{_enum_value(w.strategy)}",
            "inputs": None if ia is None else
            f"{_enum_value(ia.type)}{ia.num_bits}/{_enum_value(ia.strategy)}/"
            f"{'dynamic' if ia.dynamic else 'static'}",
        }
        scale = getattr(module, "input_scale", None)
        if scale is not None:
            entry["input_scale"] = [float(v) for v in scale.detach().float().flatten()[:4]]
        quantized[name] = entry
        if entry["status"] != "decompressed":
            problems.append(f"{name}: quantization status {entry['status']!r} after the first "
                            "forward (expected 'decompressed')")
        if module.weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            problems.append(f"{name}: weight is still {module.weight.dtype} after the first forward")
        if scale is not None and not bool(torch.isfinite(scale).all() and (scale > 0).all()):
            problems.append(f"{name}: input_scale {entry['input_scale']} is not finite and positive")

    summary = {"quantized_modules": len(quantized), "_names": set(quantized)}
    if qconfig is None:
        if quantized:
            problems.append(f"{len(quantized)} modules carry a quantization scheme but config.json "
                            "has no quantization_config")
        return summary, problems
    if not quantized:
        problems.append("config.json has a quantization_config but no module was quantized")

    # Which Linear modules the config says are quantized, by compressed-tensors' rules.
    targets = [t for g in qconfig.get("config_groups", {}).values() for t in g.get("targets", [])]
    ignore = qconfig.get("ignore") or []
    expected = set()
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        if any(_matches(name, module, t, torch) for t in targets) and not any(
                _matches(name, module, i, torch) for i in ignore):
            expected.add(name)
    got = set(quantized)
    if expected - got:
        problems.append(f"targeted but not quantized: {sorted(expected - got)[:10]}")
    if got - expected:
        problems.append(f"quantized but not targeted (or ignored): {sorted(got - expected)[:10]}")
    for name in ignore:
        if not name.startswith("re:") and name not in dict(model.named_modules()):
            problems.append(f"ignore entry {name!r} names no module")

    kinds: dict[str, int] = {}
    for entry in quantized.values():
        key = f"w={entry['weights']} in={entry['inputs']} status={entry['status']} " \
              f"dtype={entry['weight_dtype']}"
        kinds[key] = kinds.get(key, 0) + 1
    summary["kinds"] = kinds
    static = {n: e["input_scale"] for n, e in quantized.items() if "input_scale" in e}
    if static:
        summary["static_input_scales"] = static
    return summary, problems


class LoadedModel:
    def __init__(self, path: Path, role: str, args, torch, transformers):
        self.path = path
        self.role = role
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.generate_messages: list[str] = []  # distinct, e.g. max_new_tokens vs max_length
        for name in ("config.json", "model.safetensors", "tokenizer.json",
                     "preprocessor_config.json", "generation_config.json"):
            if not (path / name).is_file():
                raise InputError(f"{path}: no {name}")
        config_json = json.loads((path / "config.json").read_text(encoding="utf-8"))
        self.qconfig = config_json.get("quantization_config")

        t0 = time.time()
        with capture_messages() as messages:
            model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
                str(path), dtype=torch.float32, output_loading_info=True, local_files_only=True)
        self.load_messages = list(messages)
        self.loading_info = {k: sorted(str(x) for x in v) for k, v in info.items()}
        for key, values in self.loading_info.items():
            if values:
                self.problems.append(f"from_pretrained {key}: {values[:10]}"
                                     f"{' ...' if len(values) > 10 else ''}")
        bad_messages = [m for m in self.load_messages if is_bad_message(m)]

        model.eval()
        if args.device != "cpu":
            model.to(args.device)
        self.model = model
        self.device = args.device

        with capture_messages() as messages:
            self.processor = transformers.WhisperProcessor.from_pretrained(
                str(path), local_files_only=True)
        self.processor_messages = list(messages)
        self.tokenizer = self.processor.tokenizer
        self.eot = self.tokenizer.eos_token_id
        if self.eot is None:
            raise InputError(f"{path}: tokenizer has no eos token")

        gc = copy.deepcopy(model.generation_config)
        # No temperature fallback, no no-speech skipping, no conditioning on previous text.
        for attr in ("logprob_threshold", "compression_ratio_threshold", "no_speech_threshold",
                     "condition_on_prev_tokens"):
            setattr(gc, attr, None)
        self.generation_config = gc
        multilingual = getattr(gc, "is_multilingual", None)
        if multilingual is None:
            multilingual = bool(getattr(gc, "lang_to_id", None))
        self.multilingual = bool(multilingual)
        self.gen_kwargs = dict(generation_config=gc, num_beams=1, do_sample=False,
                               temperature=0.0, return_timestamps=False)
        if self.multilingual:
            self.gen_kwargs.update(language="en", task="transcribe")
        self.prompt = self._expected_prompt(gc)

        # compressed-tensors decompresses on the model's first forward (a forward pre-hook on the
        # top-level model); generate() calls the encoder directly, so run one forward first.
        with torch.no_grad(), capture_messages() as messages:
            n_mels = model.config.num_mel_bins
            feats = torch.zeros(1, n_mels, 2 * model.config.max_source_positions,
                                dtype=torch.float32, device=self.device)
            model(input_features=feats,
                  decoder_input_ids=torch.tensor([self.prompt], device=self.device))
        self.warmup_messages = list(messages)
        self.quant, problems = quantization_summary(model, self.qconfig, torch)
        quantized_names = self.quant.pop("_names")
        self.problems += problems
        for msg in bad_messages:
            m = _CT_NO_MATCH_TARGET.search(msg)
            if m and m.group(1) in quantized_names:
                self.notes.append(f"benign (the target did match and is quantized): {msg}")
            else:
                self.problems.append(f"load message: {msg}")
        if args.served_numerics:
            round_outputs_to_f16(model, quantized_names, torch)
        if hasattr(model, "ct_decompress_hook"):
            self.problems.append("compressed-tensors' decompression hook is still registered "
                                 "after the first forward")
        self.load_seconds = time.time() - t0

    def _expected_prompt(self, gc) -> list[int]:
        start = gc.decoder_start_token_id
        if start is None:
            start = self.model.config.decoder_start_token_id
        prompt = [start]
        if self.multilingual:
            prompt += [gc.lang_to_id["<|en|>"], gc.task_to_id["transcribe"]]
        no_ts = getattr(gc, "no_timestamps_token_id", None)
        if no_ts is not None and prompt[-1] != no_ts:
            prompt.append(no_ts)
        return prompt

    def features(self, audio, torch, style: str):
        """The log-mel input. `processor`: the WhisperFeatureExtractor's own, on the audio
        zero-padded to 30 s (the padded frames are the log-mel of silence). `transcribe`: what
        openai-whisper's transcribe() and oasr-quantize feed the model: the log-mel of the audio
        with 30 s of zeros appended, its floor over all of it, the audio's own frames kept and the
        rest of the 3000 frames 0.0. The two differ on every clip shorter than 30 s."""
        import numpy as np

        fe = self.processor.feature_extractor
        if style == "processor":
            feats = fe(audio, sampling_rate=16000, return_tensors="np").input_features[0]
        else:
            padded = np.concatenate([audio[:30 * 16000], np.zeros(30 * 16000, np.float32)])
            full = fe(padded, sampling_rate=16000, return_tensors="np", truncation=False,
                      padding="longest").input_features[0]
            frames = 2 * self.model.config.max_source_positions
            content = min(len(audio), 30 * 16000) // 160
            feats = np.zeros((full.shape[0], frames), np.float32)
            feats[:, :content] = full[:, :content]
        return torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32))[None].to(
            device=self.device)

    def transcribe(self, feats, torch, limits: list[int]) -> list[dict]:
        """Greedy decodings of a batch of inputs (feats [B, mels, frames]), each cut at its own
        token limit. Every row has the same prompt and no padding, so one `generate` up to the
        largest limit, each row then cut at its own, decodes as one call per utterance with its
        limit would, up to the last bits of the f32 sums: those depend on the batch's shape and
        can flip a near-tie of a quantized model (docs/accuracy.md measures how often)."""
        with torch.no_grad(), capture_messages() as messages:
            out = self.model.generate(input_features=feats, **self.gen_kwargs,
                                      max_new_tokens=max(limits))
        for msg in messages:
            if msg not in self.generate_messages:
                self.generate_messages.append(msg)
        seq = out if isinstance(out, torch.Tensor) else out["sequences"]
        results = []
        for row, limit in zip(seq.tolist(), limits):
            ids = [int(x) for x in row]
            # The output may or may not start with the prompt; every id >= eot is special.
            i = 0
            while i < len(ids) and ids[i] >= self.eot:
                i += 1
            j = i
            while j < len(ids) and ids[j] < self.eot:
                j += 1
            # generate ran to at least this row's limit, so a row with fewer text tokens than
            # its limit stopped at end of text (which transformers may leave out of the output);
            # end of text is a generated token too, so after `limit` text tokens it is cut off
            ended = j - i < limit
            tokens = ids[i:min(j, i + limit)]
            ids = ids[:i] + tokens + ([self.eot] if ended else [])
            text = self.tokenizer.decode(tokens, skip_special_tokens=True).strip()
            results.append({"ids": ids, "leading_special": ids[:i], "tokens": tokens,
                            "ended_with_eot": ended, "text": text})
        return results

    def teacher_forced_rows(self, feats, prompt: list[int], tokens: list[list[int]], torch):
        """For each row of the batch, the logits rows predicting its tokens[0..n-1] and the end
        of text: n+1 rows, float64. Shorter rows are padded at the end (the decoder is causal, so
        the padding changes no row that is kept)."""
        width = max(len(t) for t in tokens)
        dec = torch.tensor([prompt + t + [self.eot] * (width - len(t)) for t in tokens],
                           device=self.device)
        with torch.no_grad():
            logits = self.model(input_features=feats, decoder_input_ids=dec, use_cache=False).logits
        p = len(prompt)
        return [logits[b, p - 1: p + len(t)].to(device="cpu", dtype=torch.float64)
                for b, t in enumerate(tokens)]


def use_served_int8_scale() -> None:
    """Dynamic symmetric int8 inputs scaled by amax/127, as the served kernels and `verify` do;
    compressed-tensors divides by half its integer range, 255 / 2 = 127.5 (fp8's range, 896 / 2 =
    448, is already the served divisor)."""
    from compressed_tensors.quantization import QuantizationType
    from compressed_tensors.quantization.utils import helpers

    original = helpers.calculate_qparams

    def served(min_vals, max_vals, args, global_scale=None):
        scales, zero_points = original(min_vals, max_vals, args, global_scale=global_scale)
        if args.symmetric and _enum_value(args.type) == _enum_value(QuantizationType.INT):
            q_min, q_max = helpers.calculate_range(args, scales.device)
            scales = scales * ((q_max - q_min) / 2 / q_max).to(scales.dtype)
        return scales, zero_points

    helpers.calculate_qparams = served  # compute_dynamic_scales_and_zp looks it up here


def round_outputs_to_f16(model, names: set, torch) -> None:
    """Each quantized layer's output (bias included) rounded once to f16, as the served scaled
    GEMM's epilogue writes it."""
    for name, module in model.named_modules():
        if name in names:
            module.register_forward_hook(
                lambda _m, _i, out: out.to(torch.float16).to(out.dtype))


def row_metrics(fp_rows, q_rows, torch) -> dict:
    """Per-row cosine, centred cosine, KL(fp || q) and top-1 agreement (all float64)."""
    def cos(a, b):
        return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-300)

    c = cos(fp_rows, q_rows)
    cc = cos(fp_rows - fp_rows.mean(-1, keepdim=True), q_rows - q_rows.mean(-1, keepdim=True))
    lp, lq = torch.log_softmax(fp_rows, -1), torch.log_softmax(q_rows, -1)
    kl = (lp.exp() * (lp - lq)).sum(-1)
    top1 = fp_rows.argmax(-1) == q_rows.argmax(-1)
    return {"cosine": c.tolist(), "centered_cosine": cc.tolist(), "kl": kl.tolist(),
            "top1": [bool(x) for x in top1.tolist()]}


def _mean(xs):
    return sum(xs) / len(xs) if xs else None


def _fmt(x, spec=".4f"):
    return "-" if x is None else format(x, spec)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fp", type=Path, help="full-precision HF export directory")
    p.add_argument("--quantized", type=Path, nargs="+", default=[],
                   help="quantized HF export directories")
    p.add_argument("--verify-json", type=Path, nargs="+", default=[],
                   help="one `oasr-quantize verify --json` report per --quantized dir, same order")
    p.add_argument("--manifest", type=Path, help="JSON-lines manifest {id, audio, text, source?}")
    p.add_argument("--limit", type=int, default=0, help="first N utterances (0: all)")
    p.add_argument("--out", type=Path, help="result JSON")
    p.add_argument("--wer-tolerance", type=float, default=0.003,
                   help="max |WER_q(transformers) - WER_q(verify)| as a fraction (default 0.003)")
    p.add_argument("--max-new-tokens", default="audio",
                   help="'audio' (default): oasr-quantize's token limit, 24 + 12 per second of "
                        "audio, at most 224; or a fixed number")
    p.add_argument("--features", choices=["transcribe", "processor"], default="transcribe",
                   help="'transcribe' (default): the log-mel `verify` feeds, openai-whisper's "
                        "transcribe() padding; 'processor': WhisperFeatureExtractor's own, "
                        "which pads the audio, not the log-mel, and so decodes short clips "
                        "differently")
    p.add_argument("--served-numerics", action="store_true",
                   help="diagnostic: simulate the served kernels' numerics (dynamic int8 scale "
                        "amax/127, quantized outputs rounded to f16) instead of "
                        "compressed-tensors' own")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--batch", type=int, default=1,
                   help="utterances decoded together (default 1); the last bits of the sums "
                        "depend on the batch's shape, which can flip a quantized model's "
                        "near-tied greedy choices")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    p.add_argument("--self-test", action="store_true",
                   help="only run the WER-normalisation tests and exit")
    args = p.parse_args(argv)
    if args.self_test:
        return args
    missing = [f"--{n.replace('_', '-')}" for n in ("fp", "manifest", "out")
               if getattr(args, n) is None]
    if not args.quantized:
        missing.append("--quantized")
    if missing:
        p.error(f"missing {', '.join(missing)}")
    if args.batch < 1:
        p.error("--batch must be at least 1")
    if len(args.verify_json) != len(args.quantized):
        p.error(f"{len(args.quantized)} --quantized dirs but {len(args.verify_json)} --verify-json "
                "files (one per dir, same order)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.self_test:
        return self_test()

    import numpy  # noqa: F401  (fail early with a clear message if missing)
    import torch
    import transformers

    try:
        import compressed_tensors
        ct_version = compressed_tensors.__version__
    except ImportError:
        ct_version = None
    transformers.utils.logging.set_verbosity_warning()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.served_numerics:
        use_served_int8_scale()
    # On a GPU, float32 stays float32 (torch lets convolutions use TF32 by default).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    utts = read_manifest(args.manifest, args.limit or None)
    verify = [read_verify_json(p) for p in args.verify_json]
    for d in [args.fp, *args.quantized]:
        if not d.is_dir():
            raise InputError(f"{d} is not a directory")
    if ct_version is None and any(
            "quantization_config" in json.loads((d / "config.json").read_text())
            for d in args.quantized if (d / "config.json").is_file()):
        raise InputError("compressed-tensors is not installed: pip install --no-index "
                         "--find-links .whl/ct compressed-tensors")

    print(f"transformers {transformers.__version__}, compressed-tensors {ct_version}, "
          f"torch {torch.__version__}, {len(utts)} utterances", flush=True)
    fp = LoadedModel(args.fp, "full_precision", args, torch, transformers)
    print(f"loaded {args.fp} ({fp.load_seconds:.1f} s)", flush=True)
    qs = []
    for d in args.quantized:
        qs.append(LoadedModel(d, "quantized", args, torch, transformers))
        print(f"loaded {d} ({qs[-1].load_seconds:.1f} s): {qs[-1].quant}", flush=True)
    if fp.quant["quantized_modules"]:
        fp.problems.append("the full-precision export has quantized modules")
    for q in qs:
        if q.prompt != fp.prompt:
            q.problems.append(f"decoder prompt {q.prompt} differs from the full-precision "
                              f"export's {fp.prompt}")

    per_utt = []
    rows_by_q = [{"cosine": [], "centered_cosine": [], "kl": [], "top1": []} for _ in qs]
    utt_cos_means = [[] for _ in qs]
    t0 = time.time()
    for start in range(0, len(utts), args.batch):
        chunk = utts[start:start + args.batch]
        audios = [read_audio(u["audio"]) for u in chunk]
        for u, audio in zip(chunk, audios):
            if len(audio) > 30 * 16000:
                print(f"warning: {u['id']} is {len(audio) / 16000:.1f} s long; the feature "
                      "extractor keeps the first 30 s", file=sys.stderr)
        limits = [token_limit(len(audio), args.max_new_tokens) for audio in audios]
        feats_fp = torch.cat([fp.features(audio, torch, args.features) for audio in audios])
        fp_outs = fp.transcribe(feats_fp, torch, limits)
        prompt = fp.prompt
        for u, fp_out in zip(chunk, fp_outs):
            if fp_out["leading_special"] and fp_out["leading_special"] != prompt:
                fp.problems.append(f"{u['id']}: generate's output starts with "
                                   f"{fp_out['leading_special']}, expected prompt {prompt}")
        fp_tokens = [o["tokens"] for o in fp_outs]
        fp_rows = fp.teacher_forced_rows(feats_fp, prompt, fp_tokens, torch)
        recs = [{"id": u["id"], "reference_text": u["text"], "prompt": prompt,
                 "full_precision": {"text": o["text"], "ids": o["ids"],
                                    "ended_with_eot": o["ended_with_eot"]},
                 "quantized": []} for u, o in zip(chunk, fp_outs)]
        for qi, q in enumerate(qs):
            feats = torch.cat([q.features(audio, torch, args.features) for audio in audios])
            q_outs = q.transcribe(feats, torch, limits)
            q_rows = q.teacher_forced_rows(feats, prompt, fp_tokens, torch)
            for b, (u, rec, q_out) in enumerate(zip(chunk, recs, q_outs)):
                m = row_metrics(fp_rows[b], q_rows[b], torch)
                for key in rows_by_q[qi]:
                    rows_by_q[qi][key] += m[key]
                utt_cos_means[qi].append(_mean(m["cosine"]))
                v = verify[qi]["_by_id"].get(u["id"])
                rec["quantized"].append({
                    "dir": str(q.path), "text": q_out["text"], "ids": q_out["ids"],
                    "ended_with_eot": q_out["ended_with_eot"],
                    "feature_max_abs_diff_vs_fp": float((feats[b] - feats_fp[b]).abs().max()),
                    "teacher_forced_rows": len(m["cosine"]),
                    "cosine_mean": _mean(m["cosine"]), "cosine_min": min(m["cosine"]),
                    "verify_quantized": None if v is None else v["quantized"],
                    "verify_full_precision": None if v is None else v["full_precision"],
                })
        per_utt += recs
        print(f"[{start + len(chunk)}/{len(utts)}] {chunk[-1]['id']} ({time.time() - t0:.0f} s): "
              f"{fp_outs[-1]['text'][:70]}", flush=True)

    results = []
    failures = []
    if fp.problems:
        failures += [f"{fp.path}: {p}" for p in fp.problems]
    for qi, q in enumerate(qs):
        rep = verify[qi]
        ids_common = [r["id"] for r in per_utt if r["id"] in rep["_by_id"]]
        missing_ids = [r["id"] for r in per_utt if r["id"] not in rep["_by_id"]]
        common = [r for r in per_utt if r["id"] in rep["_by_id"]]
        ref = {r["id"]: r["reference_text"] for r in per_utt}
        tf_fp = corpus_wer((r["reference_text"], r["full_precision"]["text"]) for r in common)
        tf_q = corpus_wer((r["reference_text"], r["quantized"][qi]["text"]) for r in common)
        v_fp = corpus_wer((ref[i], rep["_by_id"][i]["full_precision"]) for i in ids_common)
        v_q = corpus_wer((ref[i], rep["_by_id"][i]["quantized"]) for i in ids_common)
        # The port check: the whole verify report, recomputed here with its own references.
        v_all_q = corpus_wer((t.get("reference_text", ""), t["quantized"])
                             for t in rep["transcripts"])
        v_all_fp = corpus_wer((t.get("reference_text", ""), t["full_precision"])
                              for t in rep["transcripts"])
        ref_mismatch = [i for i in ids_common if "reference_text" in rep["_by_id"][i]
                        and normalize(rep["_by_id"][i]["reference_text"]) != normalize(ref[i])]
        q_match = [normalize(r["quantized"][qi]["text"]) == normalize(rep["_by_id"][r["id"]]["quantized"])
                   for r in common]
        fp_match = [normalize(r["full_precision"]["text"])
                    == normalize(rep["_by_id"][r["id"]]["full_precision"]) for r in common]
        rows = rows_by_q[qi]
        vtf = rep.get("teacher_forced") or {}
        # transformers − verify, utterance by utterance, with its paired-bootstrap interval
        tf_err = [word_errors(r["reference_text"], r["quantized"][qi]["text"]) for r in common]
        v_err = [word_errors(r["reference_text"], rep["_by_id"][r["id"]]["quantized"])[0]
                 for r in common]
        paired = (paired_interval([e for e, _ in tf_err], v_err, [w for _, w in tf_err])
                  if common else None)
        delta = None if not common else abs(tf_q["wer"] - v_q["wer"])
        res = {
            "dir": str(q.path),
            "verify_json": str(args.verify_json[qi]),
            "load": {"ok": not q.problems, "problems": q.problems, "notes": q.notes,
                     "messages": q.load_messages, "warmup_messages": q.warmup_messages,
                     "processor_messages": q.processor_messages,
                     "generate_messages": q.generate_messages,
                     "loading_info": q.loading_info, "seconds": q.load_seconds,
                     "quantization": q.quant, "prompt": q.prompt,
                     "quantization_config_format": (q.qconfig or {}).get("format")},
            "utterances_compared": len(common),
            "utterances_missing_from_verify": missing_ids,
            "reference_text_mismatch_ids": ref_mismatch,
            "wer": {
                "transformers_full_precision": tf_fp,
                "transformers_quantized": tf_q,
                "verify_full_precision_recomputed": v_fp,
                "verify_quantized_recomputed": v_q,
                "abs_delta_quantized": delta,
                "delta_quantized_transformers_minus_verify":
                    None if paired is None else {"delta": paired[0], "interval_95": paired[1:]},
                "tolerance": args.wer_tolerance,
                "verify_reported": {"utterances": rep.get("utterances"),
                                    "full_precision": rep.get("wer_full_precision"),
                                    "quantized": rep.get("wer_quantized")},
                "verify_all_transcripts_recomputed": {"full_precision": v_all_fp,
                                                      "quantized": v_all_q},
            },
            "quantized_transcript_match_fraction": _mean([float(x) for x in q_match]),
            "quantized_transcript_mismatch_ids": [r["id"] for r, ok in zip(common, q_match) if not ok],
            "full_precision_transcript_match_fraction": _mean([float(x) for x in fp_match]),
            "full_precision_transcript_mismatch_ids":
                [r["id"] for r, ok in zip(common, fp_match) if not ok],
            "teacher_forced": {
                "transformers": {
                    "steps": len(rows["cosine"]),
                    "cosine_mean": _mean(rows["cosine"]),
                    "cosine_min": min(rows["cosine"]) if rows["cosine"] else None,
                    "cosine_mean_of_utterance_means": _mean(utt_cos_means[qi]),
                    "centered_cosine_mean": _mean(rows["centered_cosine"]),
                    "kl_fp_q_mean": _mean(rows["kl"]),
                    "top1_agreement": _mean([float(x) for x in rows["top1"]]),
                },
                "verify": {k: vtf.get(k) for k in ("steps", "cosine_mean", "cosine_min",
                                                   "centered_cosine_mean", "kl_mean",
                                                   "top1_agreement")},
            },
        }
        for p in q.problems:
            failures.append(f"{q.path}: {p}")
        retried = fallback_ids(rep)
        res["verify_fallback_ids"] = retried
        if retried:
            failures.append(f"{args.verify_json[qi]}: verify kept a decoding above temperature 0 "
                            f"on {len(retried)} utterances ({', '.join(retried[:3])} ...); generate "
                            "decodes greedily, so run `verify --no-fallback` for this comparison")
        if not common:
            failures.append(f"{q.path}: no utterance of the manifest is in {args.verify_json[qi]}")
        elif delta > args.wer_tolerance:
            failures.append(f"{q.path}: |WER_q transformers {tf_q['wer']:.4f} - verify "
                            f"{v_q['wer']:.4f}| = {delta:.4f} > {args.wer_tolerance}")
        results.append(res)

    out = {
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "compressed_tensors": ct_version},
        "args": {k: (str(v) if isinstance(v, Path) else
                     [str(x) for x in v] if isinstance(v, list) else v)
                 for k, v in vars(args).items()},
        "utterances": len(per_utt),
        "full_precision": {"dir": str(fp.path), "load": {
            "ok": not fp.problems, "problems": fp.problems, "notes": fp.notes,
            "messages": fp.load_messages,
            "warmup_messages": fp.warmup_messages, "processor_messages": fp.processor_messages,
            "generate_messages": fp.generate_messages,
            "loading_info": fp.loading_info, "seconds": fp.load_seconds, "prompt": fp.prompt}},
        "quantized": results,
        "transcripts": per_utt,
        "failures": failures,
        "passed": not failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    # Compact table.
    print()
    print(f"{'export':<34} {'load':<4} {'WERfp tf':>8} {'WERq tf':>8} {'WERq vfy':>8} "
          f"{'|d|':>6} {'q=vfy':>6} {'fp=vfy':>6} {'cos tf mean/min':>17} {'cos vfy mean/min':>17}")
    for res in results:
        w = res["wer"]
        t, v = res["teacher_forced"]["transformers"], res["teacher_forced"]["verify"]
        name = Path(res["dir"]).name[-34:]
        print(f"{name:<34} {'ok' if res['load']['ok'] else 'FAIL':<4} "
              f"{w['transformers_full_precision']['wer'] * 100:7.2f}% "
              f"{w['transformers_quantized']['wer'] * 100:7.2f}% "
              f"{w['verify_quantized_recomputed']['wer'] * 100:7.2f}% "
              f"{_fmt(None if w['abs_delta_quantized'] is None else w['abs_delta_quantized'] * 100, '5.2f')}% "
              f"{_fmt(res['quantized_transcript_match_fraction'], '6.3f')} "
              f"{_fmt(res['full_precision_transcript_match_fraction'], '6.3f')} "
              f"{_fmt(t['cosine_mean'], '.5f'):>8}/{_fmt(t['cosine_min'], '.4f'):<8} "
              f"{_fmt(v['cosine_mean'], '.5f'):>8}/{_fmt(v['cosine_min'], '.4f'):<8}")
    print("\nWER_q transformers − verify, points, 95 % paired-bootstrap interval:")
    for res in results:
        d = res["wer"]["delta_quantized_transformers_minus_verify"]
        if d is not None:
            lo, hi = d["interval_95"]
            print(f"  {Path(res['dir']).name:<34} {d['delta'] * 100:+.2f}  "
                  f"[{lo * 100:+.2f}, {hi * 100:+.2f}]")
    print(f"\nfull precision load: {'ok' if not fp.problems else 'FAIL'}; result: {args.out}")
    if failures:
        print("\nFAILED:", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    print("passed")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
