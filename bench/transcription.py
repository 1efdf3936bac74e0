"""Speech to text through llm-pool: p50/p99 latency of POST /v1/audio/transcriptions (Whisper base,
int8, greedy) on the embedded default and on the split over Redis, against faster-whisper called
directly in this process on the same file, so the difference is llm-pool's path (the multipart
edge, the channel layer carrying the file, the engine process).  The speech is a sentence
espeak-ng says; the model comes from scripts/install_whisper_base.sh.  Prints one JSON object.
Needs espeak-ng, and Redis on 127.0.0.1:6379 for the split.

Run: .venv/bin/python bench/transcription.py [--runs 10] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, percentiles, running_service  # noqa: E402

SENTENCE = "Please open the door and turn on the light. The weather is fine and the meeting starts at nine."


def model_folder() -> str:
    answer = subprocess.run([str(ROOT / "scripts" / "install_whisper_base.sh")], check=True, capture_output=True, text=True)
    return answer.stdout.strip().splitlines()[-1]


def direct(folder: str, audio: bytes, runs: int, threads: int) -> list[float]:
    import io

    from faster_whisper import WhisperModel

    model = WhisperModel(folder, device="cpu", compute_type="int8", cpu_threads=threads, local_files_only=True)
    latencies = []
    for _ in range(runs + 1):  # the first warms up
        began = time.perf_counter()
        segments, _ = model.transcribe(io.BytesIO(audio), language="en", beam_size=1)
        "".join(segment.text for segment in segments)
        latencies.append(time.perf_counter() - began)
    return latencies[1:]


def served(folder: str, audio: bytes, runs: int, threads: int, mode: str) -> list[float]:
    settings = {"models": {"whisper": {"backend": "whisper", "enabled": True, "model_path": folder,
                                       "whisper_compute_type": "int8", "whisper_cpu_threads": threads,
                                       "whisper_beam_size": 1}}}
    latencies = []
    with running_service(settings, mode) as url, httpx.Client(base_url=url, timeout=120) as http:
        for _ in range(runs + 1):
            began = time.perf_counter()
            answer = http.post("/v1/audio/transcriptions", files={"file": ("speech.wav", audio, "audio/wav")},
                               data={"model": "whisper", "language": "en"})
            latencies.append(time.perf_counter() - began)
            answer.raise_for_status()
    return latencies[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    folder = model_folder()
    with tempfile.TemporaryDirectory() as work:
        wav = Path(work) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(wav), SENTENCE], check=True)
        audio = wav.read_bytes()
    results = {"model": "whisper-base int8, beam 1", "cpu_threads": args.threads, "audio_bytes": len(audio),
               "audio_seconds": round((len(audio) - 44) / (22050 * 2), 2)}
    results["direct"] = percentiles(direct(folder, audio, args.runs, args.threads))
    for mode in ("embedded", "split"):
        results[mode] = percentiles(served(folder, audio, args.runs, args.threads, mode))
        results[f"{mode}_added_p50_ms"] = round(results[mode]["p50_ms"] - results["direct"]["p50_ms"], 1)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
