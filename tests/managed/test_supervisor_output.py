"""A managed process writes its output to its log file itself; the ring of its lines is read from
that file when asked for (runtime.supervisor.output): no pipe, no thread copying lines."""
from __future__ import annotations

import os
import sys
import textwrap
import threading
from pathlib import Path

from runtime.supervisor import ManagedProcess, ServerCommand
from runtime.supervisor import output as supervisor_output
from runtime.supervisor import process as supervisor_process
from runtime.supervisor.output import OutputLog
from tests.managed.helpers import eventually

# A process that writes what a file of orders tells it to, when the test appends an order (its
# stdin is /dev/null); ``\\n`` in an order is a newline, and an order ``exit`` ends it.
WRITER = textwrap.dedent(
    """
    import os, sys, time
    orders, seen = sys.argv[1], 0
    while True:
        text = open(orders).read() if os.path.exists(orders) else ""
        if len(text) > seen:
            for order in text[seen:].splitlines():
                if order == "exit":
                    sys.exit(0)
                sys.stdout.write(order.replace("\\\\n", "\\n").replace("NOEOL:", ""))
                sys.stdout.flush()
            seen = len(text)
        time.sleep(0.01)
    """
)


def order(path: Path, *lines: str) -> None:
    with open(path, "a") as orders:
        orders.write("".join(f"{line}\n" for line in lines))


async def writer(state_dir: Path, orders: Path, log: Path) -> ManagedProcess:
    command = ServerCommand("writer", [sys.executable, "-c", WRITER, str(orders)], dict(os.environ), log)
    process = ManagedProcess(command, state_dir)
    await process.start()
    return process


async def test_the_process_writes_its_log_file_itself_and_no_thread_copies_it(state_dir, tmp_path):
    orders, log = tmp_path / "orders", state_dir / "logs" / "w.log"
    process = await writer(state_dir, orders, log)
    try:
        # Its stdout and stderr are the log file (appended to), not a pipe of ours.
        for fd in (1, 2):
            assert os.readlink(f"/proc/{process.pid}/fd/{fd}") == str(log)
        assert not any(thread.name.startswith("output:") for thread in threading.enumerate())
        # Our own copy of the file's write end is closed once the process has its own.
        assert process._output.writer is None

        order(orders, "one\\ntwo\\n")
        await eventually(lambda: process.output_since(None, 10) == (["one", "two"], 2), 5, "the first lines read")
        order(orders, "three\\n")
        await eventually(lambda: process.output_since(2, 10) == (["three"], 3), 5, "the next line read")
        assert process.tail(2) == "two\nthree"
        assert log.read_text() == "one\ntwo\nthree\n"
    finally:
        order(orders, "exit")
        await process.wait_exit(10)
        await process.stop()


async def test_a_last_line_without_its_newline_counts_once_the_process_is_gone(state_dir, tmp_path):
    orders, log = tmp_path / "orders", state_dir / "logs" / "w.log"
    process = await writer(state_dir, orders, log)
    order(orders, "whole\\nNOEOL:half")
    await eventually(lambda: log.read_text() == "whole\nhalf", 5, "both written")
    assert process.output_since(None, 10) == (["whole"], 1)  # the half line may still go on
    order(orders, "exit")
    assert await process.wait_exit(10)
    await process.stop()
    assert process.output_since(None, 10) == (["whole", "half"], 2)
    assert process.tail() == "whole\nhalf"  # the file is closed: the ring still answers


def test_long_lines_count_in_pieces_and_a_line_redrawn_without_newlines_is_seen_before_it_ends(tmp_path):
    log = OutputLog(tmp_path / "x.log")
    piece = supervisor_output.MAX_LINE_BYTES
    os.write(log.writer, b"a" * (2 * piece + 5) + b"\n")
    assert [len(line) for line in log.since(None, 10)[0]] == [piece, piece, 5]
    # A progress bar that redraws itself with carriage returns writes no newline for a long time.
    os.write(log.writer, b"\rLoading 50%" * (piece // 10))
    lines, written = log.since(3, 10)
    assert written == 4 and lines[0].startswith("\rLoading 50%") and len(lines[0]) == piece
    log.close()


def test_the_log_is_cut_past_its_cap_and_the_numbering_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(supervisor_output, "LOG_ROTATE_BYTES", 100)
    path = tmp_path / "x.log"
    log = OutputLog(path)
    first = b"".join(b"line %d\n" % i for i in range(20))  # 150 bytes
    os.write(log.writer, first)
    log.check_size()
    assert path.with_name("x.log.1").read_bytes() == first
    assert path.read_bytes() == b""
    os.write(log.writer, b"after\n")  # the process appends: its next line is the file's first
    assert path.read_bytes() == b"after\n"
    assert log.since(19, 10) == (["line 19", "after"], 21)
    log.check_size()  # under the cap: left as it is
    assert path.read_bytes() == b"after\n" and path.with_name("x.log.1").read_bytes() == first
    log.close()


async def test_a_running_process_s_log_is_kept_under_its_cap_with_nobody_asking(state_dir, tmp_path, monkeypatch):
    """The supervisor reads and caps the log by itself (``ManagedProcess._check_output``): a
    process that writes past the cap has its file cut though nothing asks for its lines."""
    monkeypatch.setattr(supervisor_process, "OUTPUT_CHECK_SECONDS", 0.05)
    monkeypatch.setattr(supervisor_output, "LOG_ROTATE_BYTES", 100)
    orders, log = tmp_path / "orders", state_dir / "logs" / "w.log"
    process = await writer(state_dir, orders, log)
    try:
        order(orders, "\\n".join(f"line {i}" for i in range(20)) + "\\n")  # 150 bytes
        await eventually(lambda: log.with_name("w.log.1").exists(), 5, "the log copied to .1 and cut")
        assert log.stat().st_size == 0
        assert log.with_name("w.log.1").read_text().count("\n") == 20
        assert process._output.written == 20  # read into the ring before the cut
    finally:
        order(orders, "exit")
        await process.wait_exit(10)
        await process.stop()


async def test_a_moved_log_goes_on_in_its_new_place(state_dir, tmp_path):
    orders, log = tmp_path / "orders", state_dir / "logs" / "spare.log"
    process = await writer(state_dir, orders, log)
    try:
        order(orders, "before\\n")
        await eventually(lambda: process.output_since(None, 10)[1] == 1, 5, "the first line")
        moved = state_dir / "logs" / "m.r0.log"
        process.rename("m replica 0", moved)
        order(orders, "after\\n")
        await eventually(lambda: process.output_since(1, 10) == (["after"], 2), 5, "the line after the move")
        assert moved.read_text() == "before\nafter\n" and not log.exists()
    finally:
        order(orders, "exit")
        await process.wait_exit(10)
        await process.stop()
