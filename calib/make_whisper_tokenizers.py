#!/usr/bin/env python3
"""Hugging Face tokenizer.json files for the Whisper vocabularies, from OpenAI's own tiktoken
files (PyPI `openai-whisper`, whisper/assets/*.tiktoken). Standard library only.

    make_whisper_tokenizers.py ASSETS_DIR OUT_DIR

writes OUT_DIR/english/tokenizer.json (gpt2.tiktoken: the .en models, 51864 tokens),
OUT_DIR/multilingual/tokenizer.json (multilingual.tiktoken, 99 languages: tiny ... large-v2,
51865 tokens) and OUT_DIR/multilingual-v3/tokenizer.json (100 languages, `yue` added: large-v3
and its distillations, 51866 tokens), each with a languages.json of its language tokens.

The special tokens follow OpenAI's whisper/tokenizer.py (`get_encoding`): end-of-text, start of
transcript, one token per language, translate, transcribe, start of LM, start of previous,
no speech, no timestamps, then the 1501 timestamps. The BPE merges are recovered from the
tiktoken ranks the standard way: a token of rank r is the merge of the two parts byte-pair
encoding reaches with the ranks below r.
"""

import base64
import json
import os
import sys

# OpenAI's whisper/tokenizer.py LANGUAGES, in its order (the order of the language tokens).
LANGUAGES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th "
    "ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr "
    "pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt "
    "haw ln ha ba jw su yue"
).split()
assert len(LANGUAGES) == 100


def byte_to_unicode():
    """GPT-2's reversible map of bytes to printable characters (the ByteLevel alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def read_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def split_at_rank(ranks, token, max_rank):
    """The parts byte-pair encoding leaves `token` in using only merges ranked below max_rank."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < max_rank and (best is None or r < best[1]):
                best = (i, r)
        if best is None:
            return parts
        i = best[0]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def tokenizer_json(ranks, languages):
    to_char = byte_to_unicode()
    text = lambda b: "".join(to_char[x] for x in b)
    vocab = {}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[text(token)] = rank
        if len(token) > 1:
            parts = split_at_rank(ranks, token, rank)
            if len(parts) != 2:
                raise SystemExit(f"rank {rank}: not the merge of two lower-ranked tokens")
            merges.append(f"{text(parts[0])} {text(parts[1])}")
    specials = ["<|endoftext|>", "<|startoftranscript|>"]
    specials += [f"<|{lang}|>" for lang in languages]
    specials += ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                 "<|notimestamps|>"]
    specials += [f"<|{i * 0.02:.2f}|>" for i in range(1501)]
    first = len(ranks)
    added = [
        {"id": first + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, s in enumerate(specials)
    ]
    for a in added:
        vocab[a["content"]] = a["id"]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": merges},
    }, {lang: first + 2 + i for i, lang in enumerate(languages)}


def main():
    assets, out = sys.argv[1], sys.argv[2]
    for name, source, n_languages, size in [
        ("english", "gpt2.tiktoken", 99, 51864),
        ("multilingual", "multilingual.tiktoken", 99, 51865),
        ("multilingual-v3", "multilingual.tiktoken", 100, 51866),
    ]:
        ranks = read_ranks(os.path.join(assets, source))
        tok, langs = tokenizer_json(ranks, LANGUAGES[:n_languages])
        n = len(tok["model"]["vocab"])
        if n != size:
            raise SystemExit(f"{name}: {n} tokens, expected {size}")
        os.makedirs(os.path.join(out, name), exist_ok=True)
        with open(os.path.join(out, name, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
        with open(os.path.join(out, name, "languages.json"), "w", encoding="utf-8") as f:
            json.dump(langs, f, indent=1)


if __name__ == "__main__":
    main()
