#!/usr/bin/env python3
"""The fixture of tests/whisper_beam.rs: OpenAI Whisper's own decoder (`whisper.decode`, package
openai-whisper) on the full-precision tiny.en, greedy and with beam search, on real and synthetic
clips.

The model is openai-whisper's `Whisper` module with the weights of oasr-quantize's Hugging Face
export of the fetched tiny.en (the names mapped to OpenAI's), in float32 on the CPU. Each clip's
log-mel is openai-whisper's `log_mel_spectrogram` padded as its `transcribe()` pads a window (the
clip's frames, then 0.0 to 3000). Decoding: `DecodingOptions(temperature=0, beam_size=N or None,
without_timestamps=True, sample_len=oasr-quantize's token limit)`, no fallback, with
oasr-quantize's suppression list (the export's `suppress_tokens` and every timestamp token; OpenAI
adds its special tokens, which the script shows are in that list already). The test checks that
`oasr-quantize transcribe --no-fallback --beam-size N` gives the same tokens.

    oasr-quantize export "$OASR_WHISPER_TINY_EN" /tmp/tiny-hf --format compressed-tensors
    python3 tests/whisper_beam/make_fixture.py /tmp/tiny-hf "$HOME/.cache/oasr-quantize" \\
        crossdomain/wav16k/CLIP.wav ... > tests/fixtures/whisper_beam/openai_whisper.json

(clip paths relative to the asset cache `calib/fetch-assets.sh` fills)

Needs torch, numpy, safetensors and openai-whisper (20250625 was used; see the fixture's
`versions`). Nothing is downloaded: the tokenizer is the package's own gpt2.tiktoken.
"""
import json
import math
import sys
import wave
from pathlib import Path

import numpy as np
import torch
import whisper
from safetensors.torch import load_file
from whisper.decoding import DecodingOptions, decode
from whisper.model import ModelDimensions, Whisper

BEAMS = (2, 5)


def read_wav(path):
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (1, 16000, 2), path
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0


def openai_name(hf):
    """A Hugging Face Whisper tensor name as OpenAI's module names it."""
    name = hf.removeprefix("model.")
    for a, b in [
        ("encoder.embed_positions.weight", "encoder.positional_embedding"),
        ("decoder.embed_positions.weight", "decoder.positional_embedding"),
        ("decoder.embed_tokens", "decoder.token_embedding"),
        ("encoder.layer_norm", "encoder.ln_post"),
        ("decoder.layer_norm", "decoder.ln"),
        (".layers.", ".blocks."),
        (".self_attn_layer_norm", ".attn_ln"),
        (".encoder_attn_layer_norm", ".cross_attn_ln"),
        (".self_attn.", ".attn."),
        (".encoder_attn.", ".cross_attn."),
        (".q_proj", ".query"),
        (".k_proj", ".key"),
        (".v_proj", ".value"),
        (".out_proj", ".out"),
        (".fc1", ".mlp.0"),
        (".fc2", ".mlp.2"),
        (".final_layer_norm", ".mlp_ln"),
    ]:
        name = name.replace(a, b)
    return name


def load_model(export_dir):
    config = json.loads((export_dir / "config.json").read_text())
    dims = ModelDimensions(
        n_mels=config["num_mel_bins"], n_audio_ctx=config["max_source_positions"],
        n_audio_state=config["d_model"], n_audio_head=config["encoder_attention_heads"],
        n_audio_layer=config["encoder_layers"], n_vocab=config["vocab_size"],
        n_text_ctx=config["max_target_positions"], n_text_state=config["d_model"],
        n_text_head=config["decoder_attention_heads"], n_text_layer=config["decoder_layers"])
    model = Whisper(dims)
    weights = {openai_name(k): v.float() for k, v in load_file(export_dir / "model.safetensors").items()
               if k != "proj_out.weight"}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    # alignment_heads is a buffer OpenAI fills from its own checkpoints; nothing else may differ.
    assert set(missing) <= {"alignment_heads"} and not unexpected, (missing, unexpected)
    return model.eval()


def main():
    export_dir, cache, clips = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    torch.set_num_threads(2)
    model = load_model(export_dir)
    generation = json.loads((export_dir / "generation_config.json").read_text())
    tokenizer = whisper.tokenizer.get_tokenizer(multilingual=False)
    timestamp_begin = generation["no_timestamps_token_id"] + 1
    suppress = sorted(set(generation["suppress_tokens"])
                      | set(range(timestamp_begin, model.dims.n_vocab)))
    # OpenAI always adds its special tokens to the list, and suppresses a blank and end-of-text at
    # the first step: both must be what oasr-quantize suppresses, or the decoders differ.
    specials = {tokenizer.transcribe, tokenizer.translate, tokenizer.sot, tokenizer.sot_prev,
                tokenizer.sot_lm, tokenizer.no_speech}
    extra = sorted(specials - set(suppress))
    assert sorted(tokenizer.encode(" ") + [tokenizer.eot]) == sorted(generation["begin_suppress_tokens"])
    result = {"versions": {"torch": torch.__version__, "openai-whisper": whisper.__version__},
              "specials_not_in_the_list": extra, "clips": []}
    for clip in clips:
        audio = read_wav(cache / clip)
        limit = min(24 + math.ceil(12 * len(audio) / 16000), 224)
        mel = whisper.log_mel_spectrogram(torch.from_numpy(audio), model.dims.n_mels,
                                          padding=whisper.audio.N_SAMPLES)
        content = mel.shape[-1] - whisper.audio.N_FRAMES
        mel = whisper.pad_or_trim(mel[:, :content], whisper.audio.N_FRAMES)
        entry = {"path": clip, "samples": len(audio), "limit": limit, "tokens": {}}
        for beam in (1,) + BEAMS:
            options = DecodingOptions(task="transcribe", language="en", temperature=0.0,
                                      beam_size=None if beam == 1 else beam, sample_len=limit,
                                      without_timestamps=True, suppress_tokens=suppress, fp16=False)
            with torch.no_grad():
                r = decode(model, mel, options)
            entry["tokens"][str(beam)] = [t for t in r.tokens if t < tokenizer.eot]
            entry.setdefault("text", {})[str(beam)] = r.text
            entry.setdefault("avg_logprob", {})[str(beam)] = r.avg_logprob
        result["clips"].append(entry)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
