"""Fixtures of the admin workbench tests: Debian's Chromium and the screenshot folder.

The browser is Debian's ``/usr/bin/chromium`` (scripts/install_browser.sh installs it)
driven by Playwright's Python package; nothing is downloaded at test time.  Screenshots go
to ``$LLMPOOL_SCREENSHOT_DIR`` when set, else to a ``screenshots`` folder of this run's
pytest temporary directory.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.admin_ui.helpers import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TOKEN,
    WORKBENCH_MODELS,
    EventStream,
    create_superuser,
)
from tests.conftest import LiveService, write_settings

def start_workbench(tmp_path_factory, mode: str) -> LiveService:
    """A live service with the workbench models, the admin token and a superuser."""
    folder = tmp_path_factory.mktemp(f"workbench-{mode}")
    settings_path = write_settings(folder, WORKBENCH_MODELS, service={"admin_token": TOKEN})
    live = LiveService(settings_path, folder / "db.sqlite3", mode=mode).start()
    try:
        live.staff = create_superuser(live)
    except BaseException:
        live.stop()
        raise
    return live


def stop_workbench(live: LiveService) -> None:
    # An event stream still open must not hold up a clean shutdown.
    with EventStream(live):
        assert live.stop() == 0


@pytest.fixture(scope="package")
def embedded_workbench(tmp_path_factory):
    live = start_workbench(tmp_path_factory, "embedded")
    yield live
    stop_workbench(live)


@pytest.fixture(scope="package")
def split_workbench(tmp_path_factory):
    """The production split: runtime worker and daphne over Redis, PostgreSQL (started when a test needs it)."""
    live = start_workbench(tmp_path_factory, "split")
    yield live
    stop_workbench(live)



@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory) -> Path:
    configured = os.environ.get("LLMPOOL_SCREENSHOT_DIR")
    folder = Path(configured) if configured else tmp_path_factory.mktemp("screenshots", numbered=False)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module, closed (with Playwright's driver) after it.

    Playwright's sync API keeps an event loop running in the main thread while it is active;
    held for the whole session, it would break every asyncio test that runs later."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run scripts/install_browser.sh")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
