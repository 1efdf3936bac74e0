"""Process supervision with real processes: groups, readiness, stop, output, parent death, sweep."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from runtime.supervisor import (
    ManagedProcess,
    ServerCommand,
    ServerStartError,
    choose_port,
    server_env,
    sweep_stale_processes,
)
from runtime.supervisor import output as supervisor_output
from runtime.supervisor import process as supervisor_process
from runtime.supervisor.pidfiles import group_empty
from runtime.supervisor import spawner
from runtime.supervisor.spawner import SPAWNER
from runtime.supervisor.watch import open_watch
from tests.conftest import free_port
from tests.managed.helpers import ROOT, alive, eventually, pidfiles, process_state, records, wait_until


def fake_command(fake_bin: Path, state_dir: Path, port: int, env: dict | None = None, argv_tail=()) -> ServerCommand:
    argv = [str(fake_bin / "vllm"), "serve", "org/m", "--host", "127.0.0.1", "--port", str(port), *argv_tail]
    return ServerCommand(
        label="vllm serve for model m, replica 1",
        argv=argv,
        env=server_env(env or {}, None),
        log_path=state_dir / "logs" / "m.r0.log",
    )


async def started(fake_bin: Path, state_dir: Path, env: dict | None = None, timeout: float = 10.0):
    port = free_port()
    process = ManagedProcess(fake_command(fake_bin, state_dir, port, env), state_dir)
    await process.start()
    await process.wait_ready(f"http://127.0.0.1:{port}/health", timeout)
    return process


async def test_a_server_runs_in_its_own_process_group_with_a_pidfile(fake_bin, state_dir):
    process = await started(fake_bin, state_dir, {"FAKE_READY_AFTER": "0.3"})
    assert os.getpgid(process.pid) == process.pid and os.getsid(process.pid) == process.pid
    [record] = pidfiles(state_dir)
    assert (record["pid"], record["pgid"], record["owner_pid"]) == (process.pid, process.pid, os.getpid())
    assert await process.stop() == 0
    assert pidfiles(state_dir) == [] and not alive(process.pid)
    assert "shutting down on SIGTERM" in process.tail()


async def test_readiness_is_noticed_within_a_poll_of_the_server_answering(fake_bin, state_dir, tmp_path):
    """The health checks keep one short interval through a long load (no back-off), so the first
    200 is seen about one interval after the server is ready, however long it loaded."""
    checks_log = tmp_path / "health.jsonl"
    process = await started(fake_bin, state_dir, {"FAKE_READY_AFTER": "1.5", "FAKE_HEALTH_LOG": str(checks_log)})
    noticed = time.monotonic()
    try:
        checks = [json.loads(line) for line in checks_log.read_text().splitlines()]
        loading = [check["at"] for check in checks if check["status"] == 503]
        gaps = [later - earlier for earlier, later in zip(loading, loading[1:])]
        assert checks[-1]["status"] == 200 and len(gaps) > 10
        assert statistics.median(gaps) < 5 * supervisor_process.READY_POLL_SECONDS
        # Generous for a busy machine: a back-off to 0.5 s would be late by up to that.
        assert noticed - checks[-1]["ready_at"] < 0.25
    finally:
        await process.stop()


async def test_a_server_that_says_it_is_ready_is_asked_again_at_once(fake_bin, state_dir, monkeypatch):
    """Output from a starting server brings the next health check forward: with checks every
    30 s, a server that prints its ready line as its /health turns 200 is still noticed then."""
    monkeypatch.setattr(supervisor_process, "READY_POLL_SECONDS", 30.0)
    env = {"FAKE_READY_AFTER": "1.0", "FAKE_READY_LINE": "INFO model loaded"}
    began = time.monotonic()
    process = await started(fake_bin, state_dir, env, timeout=20)
    try:
        assert time.monotonic() - began < 10
        assert "INFO model loaded" in process.tail()
    finally:
        await process.stop()


async def test_output_wakes_the_health_check_without_a_timer(fake_bin, state_dir, monkeypatch):
    """With inotify, the server's own output is the wake-up: with both the check interval and the
    log-size tick at 30 s, a server that prints its ready line is still noticed at once."""
    monkeypatch.setattr(supervisor_process, "READY_POLL_SECONDS", 30.0)
    monkeypatch.setattr(supervisor_process, "OUTPUT_WATCH_SECONDS", 30.0)
    env = {"FAKE_READY_AFTER": "1.0", "FAKE_READY_LINE": "INFO model loaded"}
    began = time.monotonic()
    process = await started(fake_bin, state_dir, env, timeout=40)
    try:
        assert time.monotonic() - began < 10
    finally:
        await process.stop()


async def test_a_file_watch_wakes_on_a_write_and_times_out_without_one(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"")
    watch = open_watch(path)
    assert watch is not None  # Linux: inotify
    try:
        assert await watch.written(0.05) is False
        with open(path, "ab") as file:
            file.write(b"model loaded\n")
        assert await watch.written(5) is True
        assert await watch.written(0.05) is False  # one write, one wake-up
    finally:
        watch.close()


def test_a_server_started_through_setpriv_is_the_server_itself(fake_bin, state_dir):
    """setpriv execs the server: the pid the supervisor holds runs the server's program, not setpriv."""
    if spawner._SETPRIV() is None:
        pytest.skip("no setpriv with --pdeathsig on this machine")

    async def run():
        process = await started(fake_bin, state_dir, {"FAKE_READY_AFTER": "0.1"})
        try:
            cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
            return [part.decode() for part in cmdline if part]
        finally:
            await process.stop()

    cmdline = asyncio.run(run())
    assert "setpriv" not in " ".join(cmdline) and any(part.endswith("vllm") for part in cmdline)


async def test_exit_before_ready_reports_the_exit_code_and_the_output_tail(fake_bin, state_dir):
    port = free_port()
    process = ManagedProcess(fake_command(fake_bin, state_dir, port, {"FAKE_EXIT_AT_START": "3"}), state_dir)
    await process.start()
    with pytest.raises(ServerStartError) as raised:
        await process.wait_ready(f"http://127.0.0.1:{port}/health", 30)
    message = str(raised.value)
    assert message.startswith("vllm serve for model m, replica 1 exited with code 3 before it was ready")
    assert "FATAL fake vllm: cannot load org/m" in message
    await process.stop()
    assert pidfiles(state_dir) == []


async def test_a_refused_command_line_fails_with_the_programs_message(fake_bin, state_dir):
    port = free_port()
    command = fake_command(fake_bin, state_dir, port, argv_tail=["--no-such-flag"])
    process = ManagedProcess(command, state_dir)
    await process.start()
    with pytest.raises(ServerStartError, match=r"exited with code 2 before it was ready(.|\n)*--no-such-flag"):
        await process.wait_ready(f"http://127.0.0.1:{port}/health", 30)
    await process.stop()


async def test_a_server_that_never_gets_ready_times_out(fake_bin, state_dir):
    port = free_port()
    process = ManagedProcess(fake_command(fake_bin, state_dir, port, {"FAKE_READY_AFTER": "60"}), state_dir)
    await process.start()
    with pytest.raises(ServerStartError, match=r"was not ready within 0.5 s .*/health never answered 200"):
        await process.wait_ready(f"http://127.0.0.1:{port}/health", 0.5)
    assert process.running
    await process.stop()
    assert not alive(process.pid)


async def test_a_missing_binary_is_a_start_error(state_dir):
    command = ServerCommand("x", ["/nonexistent/llama-server"], dict(os.environ), state_dir / "logs" / "x.log")
    with pytest.raises(ServerStartError, match="cannot start /nonexistent/llama-server .*No such file"):
        await ManagedProcess(command, state_dir).start()
    assert pidfiles(state_dir) == []


def test_a_taken_port_is_refused_and_a_free_one_is_picked():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        with pytest.raises(ServerStartError, match=f"port {taken} on 127.0.0.1 is already in use"):
            choose_port("127.0.0.1", taken, 0)
    assert choose_port("127.0.0.1", taken, 0) == taken
    assert choose_port("127.0.0.1", taken - 1, 1) == taken  # replica i uses port + i
    assert choose_port("127.0.0.1", None, 0) > 0


def test_the_library_path_goes_first_on_ld_library_path(monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/lib")
    env = server_env({"CUDA_VISIBLE_DEVICES": "1"}, "/opt/cuda/lib64")
    assert env["LD_LIBRARY_PATH"] == "/opt/cuda/lib64:/usr/local/lib" and env["CUDA_VISIBLE_DEVICES"] == "1"


async def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_period(fake_bin, state_dir, monkeypatch):
    monkeypatch.setattr(supervisor_process, "STOP_GRACE_SECONDS", 0.3)
    process = await started(fake_bin, state_dir, {"FAKE_IGNORE_SIGTERM": "1"})
    began = time.monotonic()
    assert await process.stop() == -signal.SIGKILL
    assert 0.3 <= time.monotonic() - began < 5
    assert pidfiles(state_dir) == []


async def test_when_the_leader_exits_its_workers_are_killed(fake_bin, state_dir, tmp_path):
    record = tmp_path / "record.jsonl"
    process = await started(fake_bin, state_dir, {"FAKE_CHILD": "1", "FAKE_RECORD": str(record)})
    [start] = records(record)
    worker = start["child_pid"]
    assert os.getpgid(worker) == process.pid
    exits = []
    process.on_exit(lambda p: exits.append(p.returncode))
    os.kill(process.pid, signal.SIGKILL)
    assert await process.wait_exit(5)
    assert exits == [-signal.SIGKILL]
    await eventually(lambda: not alive(worker), 5, message="worker killed with its leader")
    await process.stop()
    assert pidfiles(state_dir) == []


def test_a_group_is_empty_only_once_its_last_process_is_reaped():
    leader = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert not group_empty(leader.pid)
        leader.kill()
        os.waitid(os.P_PID, leader.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        assert not group_empty(leader.pid)  # its group id is still taken
    finally:
        leader.kill()
        leader.wait()
    assert group_empty(leader.pid)


async def test_output_goes_to_a_bounded_ring_and_a_log_file_that_keeps_the_previous_run(state_dir):
    script = "import sys\nfor i in range(1000): print('line', i)\nsys.exit(5)"
    log = state_dir / "logs" / "m.r0.log"
    for _run in range(2):
        command = ServerCommand("printer", [sys.executable, "-c", script], dict(os.environ), log)
        process = ManagedProcess(command, state_dir)
        await process.start()
        assert await process.wait_exit(10)
        await process.stop()
    assert process.returncode == 5
    await process.output_settled()
    assert process.tail(3) == "line 997\nline 998\nline 999"
    assert len(process._output.lines) == supervisor_output.RING_LINES
    assert log.read_text().count("\n") == 1000
    assert log.with_name("m.r0.log.1").read_text().count("\n") == 1000


RUNTIME_STAND_IN = textwrap.dedent(
    """
    import asyncio, json, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from runtime.supervisor import ManagedProcess, ServerCommand, server_env
    from runtime.supervisor import spawner
    if not {setpriv!r}:
        spawner._SETPRIV = lambda: None  # the child arms its death signal itself (preexec_fn)

    async def main():
        processes = []
        for port in {ports!r}:
            argv = [{vllm!r}, "serve", "org/m", "--host", "127.0.0.1", "--port", str(port)]
            command = ServerCommand("fake", argv, server_env({env!r}, None), Path({state!r}) / "logs" / f"{{port}}.log")
            process = ManagedProcess(command, Path({state!r}))
            await process.start()
            await process.wait_ready(f"http://127.0.0.1:{{port}}/health", 20)
            processes.append(process.pid)
        print(json.dumps(processes), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def run_stand_in(fake_bin: Path, state_dir: Path, record: Path, count: int = 2,
                 setpriv: bool = True) -> tuple[subprocess.Popen, list[int]]:
    """A plain Python process that owns ``count`` fake servers through the supervisor (their death
    signal armed by setpriv, or with ``setpriv=False`` by the child itself)."""
    script = RUNTIME_STAND_IN.format(
        root=str(ROOT),
        setpriv=setpriv,
        ports=[free_port() for _ in range(count)],
        vllm=str(fake_bin / "vllm"),
        env={"FAKE_CHILD": "1", "FAKE_RECORD": str(record)},
        state=str(state_dir),
    )
    runtime = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    leaders = json.loads(runtime.stdout.readline())
    return runtime, leaders


@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "preexec"])
def test_kill_9_of_the_owner_kills_the_leaders_and_the_sweep_kills_the_rest(fake_bin, state_dir, tmp_path, setpriv):
    if setpriv and spawner._SETPRIV() is None:
        pytest.skip("no setpriv with --pdeathsig on this machine")
    record = tmp_path / "record.jsonl"
    runtime, leaders = run_stand_in(fake_bin, state_dir, record, setpriv=setpriv)
    workers = [start["child_pid"] for start in records(record)]
    assert len(pidfiles(state_dir)) == 2 and all(alive(pid) for pid in leaders + workers)
    runtime.kill()
    runtime.wait()
    # PR_SET_PDEATHSIG: the leaders die with their owner...
    wait_until(lambda: not any(alive(pid) for pid in leaders), 5, message="leaders gone within 5 s")
    # ...their workers (no death signal of their own) survive until the next runtime sweeps.
    assert all(alive(pid) for pid in workers)
    killed = sweep_stale_processes(state_dir)
    assert sorted(entry["pid"] for entry in killed) == sorted(leaders)
    wait_until(lambda: not any(alive(pid) for pid in workers), 5, message="workers swept")
    assert pidfiles(state_dir) == []


def test_the_sweep_leaves_groups_of_a_live_runtime_alone(fake_bin, state_dir, tmp_path):
    runtime, leaders = run_stand_in(fake_bin, state_dir, tmp_path / "record.jsonl", count=1)
    try:
        assert sweep_stale_processes(state_dir) == []
        assert all(alive(pid) for pid in leaders) and len(pidfiles(state_dir)) == 1
    finally:
        runtime.kill()
        runtime.wait()
    sweep_stale_processes(state_dir)
    wait_until(lambda: not any(alive(pid) for pid in leaders), 5, message="leader gone")


def test_the_sweep_drops_unreadable_and_dead_pidfiles_and_stale_temp_files(state_dir):
    folder = state_dir / "managed"
    folder.mkdir(parents=True)
    (folder / "1.json").write_text("{not json")
    dead = {"pid": 999999, "pgid": 999999, "start_time": "1", "owner_pid": 999998, "owner_start_time": "1"}
    (folder / "999999.json").write_text(json.dumps(dead))
    scratch = state_dir / "tmp"
    scratch.mkdir()
    (scratch / "999998-m.r0.abc.yaml").write_text("{}")
    (scratch / f"{os.getpid()}-m.r0.def.yaml").write_text("{}")
    assert sweep_stale_processes(state_dir) == []
    assert list(folder.iterdir()) == []
    assert [path.name for path in scratch.iterdir()] == [f"{os.getpid()}-m.r0.def.yaml"]
    assert process_state(999999) is None


async def test_a_cancelled_start_returns_only_once_what_it_spawned_is_gone(state_dir, monkeypatch):
    """A spare stopped while it starts: its start is cancelled while the fork is queued on the
    spawner thread; the cancellation must not return before that child has been spawned, killed
    and reaped (a shutdown that returned earlier left an engine process behind)."""
    spawned_pids: list[int] = []
    real_spawn = supervisor_process.spawn

    def recording_spawn(command, folder, output):
        result = real_spawn(command, folder, output)
        spawned_pids.append(result[0].pid)
        return result

    monkeypatch.setattr(supervisor_process, "spawn", recording_spawn)
    gate = threading.Event()
    SPAWNER.submit(gate.wait, 10)  # the spawner thread is busy: the start's fork waits behind it
    command = ServerCommand(
        label="sleeper",
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
        env=dict(os.environ),
        log_path=state_dir / "logs" / "sleeper.log",
    )
    starting = asyncio.create_task(ManagedProcess(command, state_dir).start())
    await asyncio.sleep(0.2)
    starting.cancel()
    asyncio.get_running_loop().call_later(0.3, gate.set)
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert len(spawned_pids) == 1, "the cancelled start returned before its spawn had run"
    assert not alive(spawned_pids[0])
    assert pidfiles(state_dir) == []


def test_the_program_setpriv_will_exec_is_checked_first_as_the_exec_would(tmp_path):
    """setpriv execs the server itself, so the spawner finds the program first: a relative path from
    the command's folder, a bare name on its PATH; a missing or non-executable one is the OSError the
    exec would raise (a start error naming it), not a setpriv exit code."""
    program = tmp_path / "bin" / "server"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert spawner._executable("bin/server", None, tmp_path) == str(program)
    assert spawner._executable("server", {"PATH": str(program.parent)}, None) == str(program)
    with pytest.raises(FileNotFoundError):
        spawner._executable("bin/missing", None, tmp_path)
    program.chmod(0o644)
    with pytest.raises(PermissionError):
        spawner._executable(str(program), None, None)
