#!/usr/bin/env python3
"""The fixture of tests/whisper_padding.rs: Hugging Face transformers' greedy transcription of
real and synthetic clips by the full-precision Whisper tiny.en, under both ways of padding a short
clip to Whisper's 30 s window.

- `feature-extractor`: transformers' own `WhisperFeatureExtractor` (the audio zero-padded to 30 s,
  then its log-mel), what transformers and vLLM serve;
- `transcribe`: openai-whisper's `transcribe()` (the log-mel of the clip with 30 s of zeros
  appended, the clip's own frames kept, the rest of the 3000 frames 0.0), built here from the same
  feature extractor.

Both decode greedily (`generate`, temperature 0, no fallback) with oasr-quantize's token limit
(24 + 12 per second, at most 224). The test checks that `oasr-quantize transcribe --no-fallback
--padding P` gives the same tokens.

    oasr-quantize export "$OASR_WHISPER_TINY_EN" /tmp/tiny-hf --format compressed-tensors
    python3 tests/whisper_padding/make_fixture.py /tmp/tiny-hf "$HOME/.cache/oasr-quantize" \\
        crossdomain/wav16k/CLIP.wav ... > tests/fixtures/whisper_padding/transformers.json

(clip paths relative to the asset cache `calib/fetch-assets.sh` fills)

Needs torch, numpy and transformers (5.17 was used; see the fixture's `versions`).
"""
import json
import math
import sys
import wave
from pathlib import Path

import numpy as np
import torch
import transformers


def read_wav(path):
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (1, 16000, 2), path
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0


def features(fe, audio, padding):
    if padding == "feature-extractor":
        return fe(audio, sampling_rate=16000, return_tensors="np").input_features[0]
    padded = np.concatenate([audio, np.zeros(30 * 16000, np.float32)])
    full = fe(padded, sampling_rate=16000, return_tensors="np", truncation=False,
              padding="longest").input_features[0]
    out = np.zeros((full.shape[0], 3000), np.float32)
    content = len(audio) // 160
    out[:, :content] = full[:, :content]
    return out


def main():
    model_dir, cache, clips = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    torch.set_num_threads(1)
    proc = transformers.WhisperProcessor.from_pretrained(model_dir)
    model = transformers.WhisperForConditionalGeneration.from_pretrained(
        model_dir, dtype=torch.float32).eval()
    eot = proc.tokenizer.eos_token_id
    result = {"versions": {"torch": torch.__version__, "transformers": transformers.__version__},
              "clips": []}
    for clip in clips:
        audio = read_wav(cache / clip)
        limit = min(24 + math.ceil(12 * len(audio) / 16000), 224)
        entry = {"path": clip, "samples": len(audio), "tokens": {}}
        for padding in ("transcribe", "feature-extractor"):
            f = torch.from_numpy(features(proc.feature_extractor, audio, padding))[None]
            with torch.no_grad():
                ids = model.generate(input_features=f, num_beams=1, do_sample=False,
                                     max_new_tokens=limit, return_timestamps=False)[0].tolist()
            entry["tokens"][padding] = [t for t in ids if t < eot]
        result["clips"].append(entry)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
