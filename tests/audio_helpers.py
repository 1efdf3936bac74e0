"""The speech-to-text tests' real model and speech: Whisper base in CTranslate2's format
(``scripts/install_whisper_base.sh`` assembles it into the test cache once) and a sentence
espeak-ng speaks to a wav file."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SENTENCE = "Please open the door and turn on the light."


def whisper_base() -> Path:
    """The model's folder (assembled on first use; the script holds a lock while it works)."""
    answer = subprocess.run([str(ROOT / "scripts" / "install_whisper_base.sh")], check=True, capture_output=True,
                            text=True, timeout=600)
    return Path(answer.stdout.strip().splitlines()[-1])


def speak(text: str, path: Path) -> Path:
    """``text`` spoken by espeak-ng into the wav file ``path`` (22.05 kHz mono)."""
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, timeout=60)
    return path


def words(text: str) -> list[str]:
    """The words of ``text``, case and punctuation aside."""
    return re.findall(r"[a-z0-9']+", text.lower())
