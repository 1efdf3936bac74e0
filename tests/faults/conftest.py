"""Fixtures for the fault tests: the managed-server fakes and their leak check, reused."""
from tests.managed.conftest import fake_bin, no_process_left_behind  # noqa: F401
