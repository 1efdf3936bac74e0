"""Ports and environment of a managed server."""
from __future__ import annotations

import errno
import os
import socket

from runtime.supervisor.command import ServerStartError


def connect_host(host: str) -> str:
    """The host part of a URL that reaches a server bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def choose_port(host: str, configured: int | None, replica_index: int) -> int:
    """The configured port (plus the replica index) or a free one; raise when it is taken."""
    if configured is None:
        return _free_port(host)
    port = configured + replica_index
    if port > 65535:
        raise ServerStartError(f"port {configured} + replica index {replica_index} is above 65535")
    family = _family(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # Servers bind with SO_REUSEADDR too, so only a listener (not TIME_WAIT) counts as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServerStartError(f"port {port} on {host} is already in use") from None
            raise ServerStartError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from None
    return port


def _family(host: str, port: int) -> int:
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ServerStartError(f"cannot resolve host {host!r}: {exc.strerror}") from None


def _free_port(host: str) -> int:
    with socket.socket(_family(host, 0), socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def server_env(extra: dict[str, str], library_path: str | None) -> dict[str, str]:
    """The runtime's environment plus the definition's, with ``library_path`` first on LD_LIBRARY_PATH."""
    env = {**os.environ, **extra}
    if library_path:
        current = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = f"{library_path}:{current}" if current else library_path
    return env

