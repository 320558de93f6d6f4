#!/usr/bin/env python3
"""Build the Asterisk calibration / gate speech sets (helper of calib/fetch-assets.sh).

Python 3 standard library only. Reads the extracted Debian packages
asterisk-core-sounds-en-wav (8 kHz WAV prompts) and asterisk-core-sounds-en
(core-sounds-en.txt.gz with the transcripts) and writes into OUT_DIR:

  wav16k/<id>.wav   16 kHz mono 16-bit PCM (sox, no dither: byte-for-byte reproducible)
  calib.jsonl       {"id", "audio": "wav16k/<id>.wav", "text"} per line, sorted by id
  gate.jsonl        same format, disjoint from calib.jsonl
  skipped.tsv       <prompt>\t<reason> for every prompt that was left out
  SHA256SUMS        sha256sum -c compatible, paths relative to OUT_DIR

Rules (keep calib/README.md in sync):
  id     = prompt path relative to the sounds folder, without ".wav", "/" -> "-"
           (digits/1.wav -> digits-1).
  text   = transcript with annotation markup removed: [..], (..), <..> spans and "..."
           fragment markers are deleted, whitespace collapsed. A prompt is skipped when it
           has no transcript, the transcript is only markup (tones, beeps, silence) or empty
           after cleaning, the transcript contains "*" or "#" (spoken form ambiguous:
           star/asterisk, pound/hash), or the source lasts < 0.3 s or > 30 s.
  split  = usable prompts sorted by id (code-point order); 0-based position i:
           odd i -> gate, even i -> calib.
"""

import argparse
import concurrent.futures
import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import wave

MIN_SECONDS = 0.3
MAX_SECONDS = 30.0
SOX_ARGS = ["-D", "-R", "-V1"]  # no dither, repeatable, errors only
SOX_OUT = ["-t", "wav", "-c", "1", "-b", "16", "-e", "signed-integer"]
SOX_EFFECTS = ["rate", "-h", "16000"]

_MARKUP = re.compile(r"\[[^\]]*\]|\([^)]*\)|<[^>]*>")
_ELLIPSIS = re.compile(r"\.{3,}|\u2026")
_WS = re.compile(r"\s+")


def die(msg):
    print(f"make_manifests.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def read_transcripts(path):
    opener = gzip.open if path.endswith(".gz") else open
    out = {}
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith(";"):
                continue
            name, sep, text = line.partition(":")
            if not sep:
                die(f"{path}:{lineno}: no 'name: text' separator")
            name = name.strip()
            if name in out:
                die(f"{path}:{lineno}: duplicate transcript for {name!r}")
            out[name] = text.strip()
    return out


def clean_text(raw):
    """Return (text, None) or (None, reason)."""
    if not raw:
        return None, "empty transcript"
    if _MARKUP.fullmatch(raw):
        return None, "non-speech annotation " + raw
    text = _MARKUP.sub(" ", raw)
    text = _ELLIPSIS.sub(" ", text)
    text = _WS.sub(" ", text).strip()
    if not text or not re.search(r"[A-Za-z0-9]", text):
        return None, "empty after cleaning"
    if "*" in text or "#" in text:
        return None, "ambiguous spoken form of * or #"
    return text, None


def wav_seconds(path):
    with wave.open(path, "rb") as w:
        return w.getnframes() / float(w.getframerate())


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def convert(sox, src, dst):
    cmd = [sox, *SOX_ARGS, src, *SOX_OUT, dst, *SOX_EFFECTS]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        die(f"sox failed on {src}: {r.stderr.strip()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sounds-dir", required=True, help="extracted .../sounds/en_US_f_Allison")
    ap.add_argument("--transcripts", required=True, help="core-sounds-en.txt(.gz)")
    ap.add_argument("--out", required=True, help="output folder (must not exist yet)")
    ap.add_argument("--sox", default="sox")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()

    transcripts = read_transcripts(a.transcripts)

    prompts = []  # (rel_without_ext, abs_path)
    for dirpath, dirnames, filenames in os.walk(a.sounds_dir):
        dirnames.sort()
        for fn in sorted(filenames):
            if fn.endswith(".wav"):
                p = os.path.join(dirpath, fn)
                rel = os.path.relpath(p, a.sounds_dir)[: -len(".wav")].replace(os.sep, "/")
                prompts.append((rel, p))
    if not prompts:
        die(f"no .wav prompts under {a.sounds_dir}")

    usable = []  # (id, src, text)
    skipped = []  # (rel, reason)
    seen_ids = {}
    for rel, src in prompts:
        uid = rel.replace("/", "-")
        if uid in seen_ids:
            die(f"id collision: {rel!r} and {seen_ids[uid]!r} both map to {uid!r}")
        seen_ids[uid] = rel
        if rel not in transcripts:
            skipped.append((rel, "no transcript"))
            continue
        text, reason = clean_text(transcripts[rel])
        if text is None:
            skipped.append((rel, reason))
            continue
        secs = wav_seconds(src)
        if secs < MIN_SECONDS or secs > MAX_SECONDS:
            skipped.append((rel, f"duration {secs:.3f} s outside [{MIN_SECONDS}, {MAX_SECONDS}]"))
            continue
        usable.append((uid, src, text))
    wav_names = {rel for rel, _ in prompts}
    for name in sorted(transcripts):
        if name not in wav_names:
            skipped.append((name, "transcript without audio"))

    usable.sort(key=lambda u: u[0])
    gate = [u for i, u in enumerate(usable) if i % 2 == 1]
    calib = [u for i, u in enumerate(usable) if i % 2 == 0]
    if len(gate) < 200 or len(calib) < 200:
        die(f"too few utterances: gate {len(gate)}, calib {len(calib)} (need >= 200 each)")

    os.makedirs(a.out)  # fails if it exists: the caller hands us a fresh temp path
    wavdir = os.path.join(a.out, "wav16k")
    os.makedirs(wavdir)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        futs = [ex.submit(convert, a.sox, src, os.path.join(wavdir, uid + ".wav")) for uid, src, _ in usable]
        for f in futs:
            f.result()

    def write_manifest(name, rows):
        with open(os.path.join(a.out, name), "w", encoding="utf-8", newline="\n") as f:
            for uid, _, text in rows:
                f.write(json.dumps({"id": uid, "audio": f"wav16k/{uid}.wav", "text": text}, ensure_ascii=False))
                f.write("\n")

    write_manifest("calib.jsonl", calib)
    write_manifest("gate.jsonl", gate)
    with open(os.path.join(a.out, "skipped.tsv"), "w", encoding="utf-8", newline="\n") as f:
        for rel, reason in sorted(skipped):
            f.write(f"{rel}\t{reason}\n")

    files = ["calib.jsonl", "gate.jsonl"] + [f"wav16k/{uid}.wav" for uid, _, _ in usable]
    with open(os.path.join(a.out, "SHA256SUMS"), "w", encoding="utf-8", newline="\n") as f:
        for rel in files:
            f.write(f"{sha256_file(os.path.join(a.out, rel))}  {rel}\n")

    print(
        f"asterisk: {len(prompts)} prompts, {len(usable)} usable, "
        f"calib {len(calib)}, gate {len(gate)}, skipped {len(skipped)} (see skipped.tsv)",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
