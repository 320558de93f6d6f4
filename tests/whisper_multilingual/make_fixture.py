#!/usr/bin/env python3
"""What Hugging Face transformers decodes with a multilingual Whisper: the independent reference
for this tool's language detection and multilingual prompt (tests/whisper_multilingual.rs).

    make_fixture.py CHECKPOINT OUT.json ID=WAV [ID=WAV ...]

CHECKPOINT is the seeded random-weight `parity-multilingual` checkpoint (f32) that
`cargo run --release --example whisper_family -- parity-multilingual DIR --dtype f32` writes; the
Rust test writes the same bytes again. For every WAV (16 kHz mono) it records, with transformers'
own feature extractor and `generate` (greedy, no temperature fallback):

- `detected`: the language token `generate` detects (language=None) and the tokens it then
  decodes after `<|notimestamps|>`;
- `german_translate`: the tokens decoded with language "de" and task "translate";
- the prompts `generate` built in both cases.

Random weights: this is evidence of the decoding logic, not of accuracy. Needs torch,
transformers and numpy (run on the GPU machine, CPU only); nothing is downloaded.
"""

import json
import os
import sys
import wave

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch
import transformers
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration

MAX_NEW_TOKENS = 20


def read_wav(path):
    with wave.open(path, "rb") as w:
        if w.getframerate() != 16000 or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise SystemExit(f"{path}: expected 16 kHz mono 16-bit PCM")
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return data.astype(np.float32) / 32768.0


def split(sequence, prompt_length):
    return sequence[:prompt_length], sequence[prompt_length:]


def main():
    checkpoint, out, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32)
    model.eval()
    g = model.generation_config
    fe = WhisperFeatureExtractor(feature_size=model.config.num_mel_bins)
    eot = g.eos_token_id
    utterances = []
    for pair in pairs:
        uid, path = pair.split("=", 1)
        audio = read_wav(path)
        features = fe(audio, sampling_rate=16000, return_tensors="pt").input_features
        record = {"id": uid, "samples": int(audio.shape[0])}
        with torch.no_grad():
            for name, kwargs in [
                ("detected", {}),
                ("german_translate", {"language": "de", "task": "translate"}),
            ]:
                seq = model.generate(
                    features, max_new_tokens=MAX_NEW_TOKENS, do_sample=False, num_beams=1, **kwargs
                )[0].tolist()
                # Older versions return the prompt (it ends at <|notimestamps|>), newer ones
                # only the generated tokens.
                if g.no_timestamps_token_id in seq:
                    end = seq.index(g.no_timestamps_token_id) + 1
                    prompt, tokens = split(seq, end)
                else:
                    prompt, tokens = None, seq
                if eot in tokens:
                    tokens = tokens[: tokens.index(eot) + 1]
                record[name] = {"prompt": prompt, "tokens": tokens}
            # The language generate detects (language=None), by transformers' own detection.
            lang = model.detect_language(input_features=features, generation_config=g)
        record["detected_language"] = int(lang.reshape(-1)[0])
        utterances.append(record)
    fixture = {
        "generator": "tests/whisper_multilingual/make_fixture.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "max_new_tokens": MAX_NEW_TOKENS,
        "end_of_text": eot,
        "utterances": utterances,
    }
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
