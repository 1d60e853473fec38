"""What every Playwright test of the Lab needs: Python playwright and Debian's Chromium, or a
failure that says how to install them (never a skip), and screenshots under test-artifacts/."""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

from benchmarks._lab import MissingComponent, chromium_path, launch_chromium

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def playwright_or_fail():
    """``playwright.sync_api.sync_playwright``; fails the test naming the install command when
    Python playwright or /usr/bin/chromium is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Python playwright is not installed; run "
                    "'PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 .venv/bin/pip install -e .[test]'", pytrace=False)
    try:
        chromium_path()
    except MissingComponent as e:
        pytest.fail(str(e), pytrace=False)
    return sync_playwright


def fresh_artifacts(artifacts: str) -> str:
    """Empty the folder ``artifacts`` (this test's screenshots and logs), creating it; returns it."""
    shutil.rmtree(artifacts, ignore_errors=True)
    os.makedirs(artifacts)
    return artifacts


@contextlib.contextmanager
def chromium_page(width: int, height: int, artifacts: str, lab=None, failure: str = "failure"):
    """Launch Debian's Chromium headless through Playwright (``benchmarks._lab.launch_chromium``)
    and yield one page with a ``width`` x ``height`` px viewport; fails the test as
    :func:`playwright_or_fail` does when either is missing. When the block raises,
    ``<artifacts>/<failure>.png`` is saved while the browser is still open and the tail of
    ``lab``'s log (a ``benchmarks._lab.Lab``, if given) is printed before the error goes on. The
    browser is closed on leaving."""
    with playwright_or_fail()() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            try:
                yield page
            except Exception:
                screenshot(page, artifacts, failure)
                if lab is not None:
                    print(lab.log_tail())
                raise
        finally:
            browser.close()


def screenshot(page, artifacts: str, name: str) -> str:
    """Save the page's viewport as ``<artifacts>/<name>.png``; returns the path."""
    os.makedirs(artifacts, exist_ok=True)
    path = os.path.join(artifacts, name + ".png")
    page.screenshot(path=path, full_page=False)
    return path


def open_hyperpod_tab(page, lab):
    """Load ``lab`` in ``page`` (60 s default timeout for its waits) and click the HyperPod tab in
    the left sidebar, by its title; returns the sidebar's locator."""
    page.set_default_timeout(60000)
    page.goto(lab.lab_url(), wait_until="domcontentloaded")
    page.locator('.jp-SideBar [data-id="hyperpod-lab-sidebar"]').click()
    return page.locator("[data-testid=hp-sidebar]")


def dark_theme(page, timeout_ms: int = 30000) -> None:
    """Switch the Lab to "JupyterLab Dark" and wait until it is applied and the Lab's theme-change
    splash (``#jupyterlab-splash``, drawn over the page while the theme's CSS loads) is gone, so a
    screenshot shows the page, not the splash."""
    from benchmarks._lab import run_command

    run_command(page, "apputils:change-theme", {"theme": "JupyterLab Dark"})
    page.wait_for_function("() => document.body.dataset.jpThemeLight === 'false'", timeout=timeout_ms)
    page.wait_for_selector("#jupyterlab-splash", state="detached", timeout=timeout_ms)


def wait_job_ended(lab, job_id: str, timeout_s: float = 120.0) -> dict:
    """Poll ``GET hyperpod/jobs/<job_id>`` of ``lab`` once a second until the job completed,
    failed or was cancelled, or ``timeout_s`` seconds passed; returns its last record."""
    import time

    deadline = time.monotonic() + timeout_s
    job = lab.get(f"hyperpod/jobs/{job_id}")["job"]
    while job["status"] not in ("completed", "failed", "cancelled") and time.monotonic() < deadline:
        time.sleep(1)
        job = lab.get(f"hyperpod/jobs/{job_id}")["job"]
    return job


def cancel_job_quietly(lab, job_id: str | None) -> None:
    """Cancel ``job_id`` (a job a failed assertion left running) unless it is None; a server that
    no longer answers is ignored."""
    if job_id is not None:
        try:
            lab.post(f"hyperpod/jobs/{job_id}/cancel", {})
        except OSError:
            pass
