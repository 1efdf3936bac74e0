"""What one heavy request costs everyone else, and what the stop-sequence search costs per piece.

``stop_watch``: the microseconds ``runtime.inference.stop_sequences.StopWatch.feed`` takes for one piece of
four characters, with three ordinary stop sequences, and at the bounds (16 stop sequences of
1,000 characters, each a run of one character that the text keeps matching: the search's worst
case), over ``--pieces`` pieces.

``--service N``: on a service with two stub models (embedded, then the split over Redis on
127.0.0.1:6379), N bystander requests on model ``m`` (streams of a few tokens, 8 at a time)
alone, then again while one client sends request after request on model ``heavy`` that is as
large as the bounds let it be (10,000 messages of 100 characters, 16 stop sequences of 1,000
characters: 1.4 MB) and another the issue's oversized ones (2,000 stop sequences of 10 KB, a
million short messages: both refused).  Gives the bystanders' p50 / p99 in ms and how many
failed, and how many heavy requests ran meanwhile.
Run: .venv/bin/python bench/heavy_requests.py [--pieces 20000] [--service 400]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentiles, running_service  # noqa: E402
from runtime.inference.stop_sequences import StopWatch  # noqa: E402

MAX_MESSAGES, MAX_STOP_SEQUENCES, MAX_STOP_LENGTH = 10_000, 16, 1_000  # models_app.api.limits


def stop_watch(pieces: int) -> dict:
    def per_piece(stops: list[str], piece: str) -> float:
        watch = StopWatch(stops)
        started = time.perf_counter()
        for _ in range(pieces):
            watch.feed(piece)
        return round((time.perf_counter() - started) / pieces * 1e6, 2)

    worst = ["a" * (MAX_STOP_LENGTH - 1) + chr(ord("b") + index) for index in range(MAX_STOP_SEQUENCES)]
    return {
        "ordinary_us_per_piece": per_piece(["\n\nUser:", "</s>", "<|im_end|>"], "the "),
        "at_the_bounds_us_per_piece": per_piece(worst, "aaaa"),
    }


SETTINGS = {
    "service": {},
    "engine": {},
    "models": {
        "m": {"backend": "stub", "enabled": True, "stub_token_delay_ms": 1},
        "heavy": {"backend": "stub", "enabled": True, "stub_reply": "done"},
    },
}


def heavy_bodies() -> list[bytes]:
    within = json.dumps({
        "model": "heavy", "messages": [{"role": "user", "content": "word " * 20}] * MAX_MESSAGES,
        "stop": ["y" * MAX_STOP_LENGTH] * MAX_STOP_SEQUENCES,
    }).encode()
    stops = json.dumps({"model": "heavy", "messages": [{"role": "user", "content": "hi"}],
                        "stop": ["x" * 10_000] * 2_000}).encode()
    message = b'{"role": "user", "content": "hi"}'
    million = b'{"model": "heavy", "messages": [' + b", ".join([message] * 1_000_000) + b"]}"
    return [within, stops, million]


def bystanders(url: str, count: int) -> tuple[list[float], int]:
    def one(_) -> float | None:  # seconds, None for a failed request
        started = time.perf_counter()
        with httpx.Client(timeout=60) as client:
            answer = client.post(url + "/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "one two three"}], "stream": True})
        ok = answer.status_code == 200 and '"error"' not in answer.text
        return time.perf_counter() - started if ok else None

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(count)))
    return [seconds for seconds in results if seconds is not None], sum(seconds is None for seconds in results)


def shape(mode: str, count: int) -> dict:
    figures: dict = {}
    with running_service(SETTINGS, mode) as url:
        bystanders(url, 16)  # warm
        alone, failed = bystanders(url, count)
        figures["alone"] = {**percentiles(alone), "failed": failed}
        stop, heavy_sent = threading.Event(), {"within": 0, "refused": 0}

        def heavy(body: bytes, key: str) -> None:
            with httpx.Client(timeout=120) as client:
                while not stop.is_set():
                    client.post(url + "/v1/chat/completions", content=body)
                    heavy_sent[key] += 1

        within, *oversized = heavy_bodies()
        senders = [threading.Thread(target=heavy, args=(within, "within"))]
        senders += [threading.Thread(target=heavy, args=(body, "refused")) for body in oversized]
        for sender in senders:
            sender.start()
        try:
            beside, failed = bystanders(url, count)
        finally:
            stop.set()
            for sender in senders:
                sender.join()
        figures["beside_heavy_requests"] = {**percentiles(beside), "failed": failed, **heavy_sent}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pieces", type=int, default=20_000)
    parser.add_argument("--service", type=int, default=0, help="bystander requests per phase (0: none)")
    args = parser.parse_args()
    result: dict = {"stop_watch": stop_watch(args.pieces)}
    if args.service:
        result["service"] = {mode: shape(mode, args.service) for mode in ("embedded", "split")}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
