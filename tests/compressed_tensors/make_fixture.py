#!/usr/bin/env python3
"""Write reference compressed-tensors checkpoints of a tiny.en-shaped Whisper with compressed-tensors
itself (no llm-compressor), and keep only their small files as a fixture.

For each scheme, a seeded random WhisperForConditionalGeneration (same weights for every scheme) is
quantized the way llm-compressor's save path does it (see ModelCompressor's docstring in
compressed_tensors/compressors/model_compressors/model_compressor.py, 0.19.0):

    apply_quantization_config(model, QuantizationConfig(...))     # scales/zero points registered
    weight_scale = amax(|W|, per output channel) / 127 (int8) or / 448 (fp8 e4m3)
    input_scale  = --static-input-scale for static inputs; status FROZEN
    compressor = ModelCompressor.from_pretrained_model(model)     # config + format inferred
    compressor.compress_model(model)                              # weights -> int8 / fp8
    model.save_pretrained(dir); compressor.update_config(dir)     # quantization_config added

Schemes:
    w8a8_int8                       weights int8 per channel, inputs int8 dynamic per token
    fp8_dynamic                     weights fp8 e4m3 per channel, inputs fp8 dynamic per token
    w8a8_int8_static_encoder_fc2    as w8a8_int8, plus a second config group with the exact names
                                    model.encoder.layers.N.fc2: int8 inputs static per tensor

Each <out>/<scheme>/ gets config.json (as written) and tensors.json (the safetensors header of the
written model.safetensors: name -> {dtype, shape}, no weights). Unless --no-self-check, each written
checkpoint is loaded back with transformers (any missing/unexpected-key report fails) and its
dequantized weights compared with the originals. --keep-checkpoints DIR also keeps the full
checkpoints (and a full-precision one of the same weights) there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import struct
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# tiny.en's shape and special tokens.
TINY_EN = dict(
    vocab_size=51864, d_model=384, encoder_layers=4, decoder_layers=4,
    encoder_attention_heads=6, decoder_attention_heads=6,
    encoder_ffn_dim=1536, decoder_ffn_dim=1536, num_mel_bins=80,
    max_source_positions=1500, max_target_positions=448, activation_function="gelu",
    decoder_start_token_id=50257, eos_token_id=50256, pad_token_id=50256, bos_token_id=50256,
    begin_suppress_tokens=[220, 50256], tie_word_embeddings=True, scale_embedding=False,
)
SCHEMES = ("w8a8_int8", "fp8_dynamic", "w8a8_int8_static_encoder_fc2")
MAX_FIXTURE_BYTES = 200 * 1024


def build_config(scheme: str, model, ct):
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig,
                                                 QuantizationScheme)

    kind = "float" if scheme == "fp8_dynamic" else "int"
    weights = dict(num_bits=8, type=kind, symmetric=True, strategy="channel", dynamic=False)
    dynamic = dict(num_bits=8, type=kind, symmetric=True, strategy="token", dynamic=True)
    groups = {"group_0": QuantizationScheme(
        targets=["Linear"], weights=QuantizationArgs(**weights),
        input_activations=QuantizationArgs(**dynamic))}
    if scheme == "w8a8_int8_static_encoder_fc2":
        # Exact names sort before class names in compressed-tensors' match_targets, so this group
        # wins over group_0's "Linear" for these modules.
        fc2 = [n for n, _ in model.named_modules() if re.fullmatch(r"model\.encoder\.layers\.\d+\.fc2", n)]
        static = dict(num_bits=8, type="int", symmetric=True, strategy="tensor", dynamic=False)
        groups["group_1"] = QuantizationScheme(
            targets=fc2, weights=QuantizationArgs(**weights),
            input_activations=QuantizationArgs(**static))
    return QuantizationConfig(config_groups=groups, ignore=["proj_out"])


def new_model(args, torch, transformers):
    config = transformers.WhisperConfig(**TINY_EN)
    torch.manual_seed(args.seed)
    model = transformers.WhisperForConditionalGeneration(config)
    return model.to(getattr(torch, args.dtype)).eval()


def quantize_and_save(scheme: str, args, torch, transformers, out_dir: Path) -> dict:
    """Quantize a fresh seeded model with `scheme`; write the checkpoint to out_dir.
    Returns the original float weights of the quantized modules (for the round-trip check)."""
    import compressed_tensors as ct
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.offload import update_offload_parameter
    from compressed_tensors.quantization import QuantizationStatus, apply_quantization_config

    model = new_model(args, torch, transformers)
    qconfig = build_config(scheme, model, ct)
    apply_quantization_config(model, qconfig)

    originals = {}
    for name, module in model.named_modules():
        scheme_obj = getattr(module, "quantization_scheme", None)
        if scheme_obj is None:
            continue
        w = module.weight.detach()
        originals[name] = w.float().clone()
        qmax = 448.0 if scheme_obj.weights.type == "float" else 127.0
        amax = w.float().abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
        update_offload_parameter(module, "weight_scale",
                                 (amax / qmax).to(module.weight_scale.dtype))
        if hasattr(module, "input_scale"):  # static inputs only; dynamic ones register none
            update_offload_parameter(module, "input_scale",
                                     torch.full_like(module.input_scale, args.static_input_scale))
        module.quantization_status = QuantizationStatus.FROZEN
    if not originals:
        raise RuntimeError(f"{scheme}: apply_quantization_config quantized no module")

    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(str(out_dir))
    compressor.update_config(str(out_dir))
    print(f"{scheme}: {len(originals)} modules quantized, format "
          f"{compressor.quantization_config.format}", flush=True)
    return originals


def safetensors_header(ckpt: Path) -> dict:
    """name -> {dtype, shape} over all safetensors files of a checkpoint (header only)."""
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"{ckpt}: no .safetensors file written")
    tensors = {}
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        for name, meta in header.items():
            tensors[name] = {"dtype": meta["dtype"], "shape": meta["shape"]}
    return dict(sorted(tensors.items()))


def write_tensors_json(path: Path, tensors: dict) -> None:
    """One tensor per line: small and diff-friendly."""
    lines = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in tensors.items()]
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")


class _ListHandler(logging.Handler):
    def __init__(self, sink):
        super().__init__(level=logging.WARNING)
        self.sink = sink

    def emit(self, record):
        self.sink.append(f"[{record.name}] {record.levelname}: {record.getMessage()}")


@contextlib.contextmanager
def capture_messages():
    messages: list[str] = []
    handler = _ListHandler(messages)
    loggers = [logging.getLogger("transformers"), logging.getLogger()]
    for lg in loggers:
        lg.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield messages
        finally:
            messages += [f"[warnings:{w.category.__name__}] {w.message}" for w in caught]
            for lg in loggers:
                lg.removeHandler(handler)


_BAD = re.compile(r"unexpected|missing|unused|not used|newly initiali[sz]ed|not initiali[sz]ed|"
                  r"mismatch|could not match", re.I)


def self_check(scheme: str, ckpt: Path, originals: dict, torch, transformers) -> list[str]:
    """Load the written checkpoint with transformers; compare dequantized and original weights."""
    problems = []
    with capture_messages() as messages:
        model, info = transformers.WhisperForConditionalGeneration.from_pretrained(
            str(ckpt), dtype=torch.float32, output_loading_info=True, local_files_only=True)
    for key, values in info.items():
        if values:
            problems.append(f"from_pretrained {key}: {sorted(map(str, values))[:10]}")
    quantized = {n for n, m in model.named_modules() if hasattr(m, "quantization_scheme")}
    for msg in messages:
        if not _BAD.search(msg):
            continue
        # compressed-tensors 0.19 warns "Could not match `X`" for an exact-name target listed after
        # a "Linear" target even though X matched (match_named_modules stops at the first target).
        m = re.search(r"Could not match `([^`]+)`", msg)
        if m and m.group(1) in quantized:
            print(f"{scheme}: note: benign compressed-tensors warning: {msg}", flush=True)
        else:
            problems.append(f"load message: {msg}")
    with torch.no_grad():
        logits = model(input_features=torch.zeros(1, 80, 3000),
                       decoder_input_ids=torch.tensor([[50257, 50362]])).logits
    if not bool(torch.isfinite(logits).all()):
        problems.append("non-finite logits after reload")
    worst = 0.0
    for name, w0 in originals.items():
        module = model.get_submodule(name)
        w1 = module.weight.detach().float()
        if w1.shape != w0.shape:
            problems.append(f"{name}: reloaded weight {tuple(w1.shape)} vs {tuple(w0.shape)}")
            continue
        # int8: |error| <= scale/2; fp8 e4m3 (3 mantissa bits): |error| <= |w| * 2^-4 + small.
        scale = module.weight_scale.detach().float()
        if scheme == "fp8_dynamic":
            bound = w0.abs() * 2.0 ** -4 + scale * 2.0 ** -9 + 1e-7
        else:
            bound = scale * 0.5 + 1e-6
        ratio = float(((w1 - w0).abs() / bound).max())
        worst = max(worst, ratio)
    if worst > 1.1:  # fp16 rounding of w/scale adds up to ~0.03 units of scale
        problems.append(f"dequantized weights off by {worst:.3f}x the rounding bound")
    status = {str(getattr(getattr(m, "quantization_status", None), "value", None))
              for m in model.modules() if hasattr(m, "quantization_scheme")}
    print(f"{scheme}: reload ok={not problems}, worst error/bound {worst:.3f}, statuses {status}",
          flush=True)
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="fixture root, e.g. tests/fixtures/compressed_tensors")
    p.add_argument("--schemes", nargs="+", choices=SCHEMES, default=list(SCHEMES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16",
                   help="model dtype before quantization (compressed-tensors gives the scales the "
                        "weights' dtype); default float16")
    p.add_argument("--static-input-scale", type=float, default=0.05)
    p.add_argument("--keep-checkpoints", type=Path,
                   help="also keep the full checkpoints (and a full_precision one) here")
    p.add_argument("--no-self-check", action="store_true")
    args = p.parse_args(argv)

    import torch
    import transformers
    try:
        import compressed_tensors
    except ImportError:
        print("error: compressed-tensors is not installed: "
              "pip install --no-index --find-links .whl/ct compressed-tensors", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"compressed-tensors {compressed_tensors.__version__}", flush=True)

    failures = []
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for scheme in args.schemes:
            ckpt = Path(tmp) / scheme
            originals = quantize_and_save(scheme, args, torch, transformers, ckpt)
            dest = args.out / scheme
            if dest.exists():
                shutil.rmtree(dest)
            dest.mkdir(parents=True)
            shutil.copyfile(ckpt / "config.json", dest / "config.json")
            write_tensors_json(dest / "tensors.json", safetensors_header(ckpt))
            total += sum(f.stat().st_size for f in dest.iterdir())
            if not args.no_self_check:
                failures += [f"{scheme}: {m}" for m in
                             self_check(scheme, ckpt, originals, torch, transformers)]
            if args.keep_checkpoints:
                keep = args.keep_checkpoints / scheme
                if keep.exists():
                    shutil.rmtree(keep)
                shutil.copytree(ckpt, keep)
        if args.keep_checkpoints:
            fp_dir = args.keep_checkpoints / "full_precision"
            if fp_dir.exists():
                shutil.rmtree(fp_dir)
            new_model(args, torch, transformers).save_pretrained(str(fp_dir))

    print(f"fixture: {args.out} ({total / 1024:.1f} KiB)")
    if total > MAX_FIXTURE_BYTES:
        failures.append(f"fixture is {total} bytes, over {MAX_FIXTURE_BYTES}")
    if failures:
        print("FAILED:", file=sys.stderr)
        for f in failures:
            print(f"  {f}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
