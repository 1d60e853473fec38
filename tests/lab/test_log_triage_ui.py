"""The log triage panel in the Lab (issue 18, item 3): a real ``jupyter lab``, Debian's Chromium
driven by Playwright, a real 2-rank job on the built-in ``local`` cluster (torch.distributed
with gloo) into which ``inject-fault --kind exception --rank 1`` is injected.

In the job's dashboard (Logs tab, ``LogTriagePanel``): lines both ranks printed show once with
the badge ``ranks 0-1``; the first failure names rank 1 and its exception; "Show traceback"
scrolls to the highlighted traceback and focuses it; a search (typed, Enter) lists the matching
lines of both ranks; the rank filter (typed, Enter) shows rank 1 only; the Follow toggle is a
pressed button; the panel uses theme colours (light and dark). Screenshots in
``test-artifacts/log-triage/``.
"""

from __future__ import annotations

import os

from lab_browser import dark_theme, playwright_or_fail
from slurm_jobs import Follow

from benchmarks._lab import Lab, launch_chromium, open_lab, run_command
from hyperpod_lab import cli
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStatus, JobStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "tests", "scripts", "triage_job.py")
ARTIFACTS = os.path.join(REPO, "test-artifacts", "log-triage")


_playwright = playwright_or_fail


def _failed_job(client) -> str:
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local", "--procs-per-node", "2", "--name", "triage-ui",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001",
                      "--", "--steps", "12", "--sleep", "0.1"], client=client)
    job = Follow(client, job_id)
    job.until(lambda: any(e.data["step"] >= 3 for e in job.kinds("step")), "step 3")
    client.inject_fault(job_id, 1, kind="exception")
    job.until(lambda: job.kinds("fault.detected"), "fault.detected")
    job.until(lambda: job.kinds("finished") or JobStatus(client.status(job_id).status).is_terminal(), "the end")
    return job_id


def test_log_triage_panel_in_the_dashboard(tmp_path):
    sync_playwright = _playwright()
    client = Client(JobStore())  # the store the Lab's server reads (same environment)
    job_id = _failed_job(client)
    os.makedirs(ARTIFACTS, exist_ok=True)
    lab = Lab(str(tmp_path), log_path=os.path.join(ARTIFACTS, "jupyter-lab.log")).start()
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = open_lab(browser.new_context(viewport={"width": 1400, "height": 1000}), lab)
            run_command(page, "hyperpod:open-dashboard", {"jobId": job_id})
            page.get_by_test_id("hp-dash-tab-logs").click()
            panel = page.get_by_test_id("log-triage")
            panel.wait_for(state="visible", timeout=30000)

            # lines both ranks printed: once, with their rank set
            shared = panel.locator(".jp-HyperPod-triage-line[data-ranks='0,1']", has_text="model: 2 layers")
            shared.first.wait_for(timeout=30000)
            assert shared.first.locator(".jp-HyperPod-triage-badge").inner_text() == "ranks 0-1"
            assert panel.locator(".jp-HyperPod-triage-line[data-ranks='1']", has_text="rank 1 says hello").count() >= 1

            # the first failure: rank 1, its exception; "Show traceback" highlights and focuses it
            failure = page.get_by_test_id("triage-failure")
            assert "First failure: rank 1" in failure.inner_text() and "InjectedFault" in failure.inner_text()
            page.get_by_test_id("triage-goto-failure").click()
            tb = page.get_by_test_id("triage-traceback")
            tb.wait_for(timeout=30000)
            assert "Traceback (most recent call last):" in tb.inner_text()
            assert tb.evaluate("el => el.classList.contains('jp-mod-fault') && document.activeElement === el")
            assert panel.locator(".jp-mod-fault", has_text="InjectedFault").count() >= 1
            page.screenshot(path=os.path.join(ARTIFACTS, "traceback-light.png"))

            # search by keyboard: both ranks' "says hello" lines
            search = page.get_by_test_id("triage-search")
            search.fill("says hello")
            search.press("Enter")
            page.wait_for_function("""() => document.querySelectorAll(
                '[data-testid=triage-lines] .jp-mod-match').length >= 2""", timeout=30000)
            texts = panel.locator(".jp-mod-match .jp-HyperPod-triage-text").all_inner_texts()
            assert "rank 0 says hello" in texts and "rank 1 says hello" in texts, texts

            # the rank filter: rank 1 only
            search.fill("")
            ranks = page.get_by_test_id("triage-ranks")
            ranks.fill("1")
            ranks.press("Enter")
            page.wait_for_function("""() => { const rows = [...document.querySelectorAll(
                '[data-testid=triage-lines] .jp-HyperPod-triage-line')];
                return rows.length > 0 && rows.every(r => r.dataset.ranks === '1'); }""", timeout=30000)

            # follow: a pressed toggle button (keyboard)
            follow = page.get_by_test_id("triage-follow")
            follow.focus()
            page.keyboard.press("Enter")
            assert follow.get_attribute("aria-pressed") == "true"
            page.keyboard.press("Enter")
            assert follow.get_attribute("aria-pressed") == "false"

            # theme colours: the line list follows the dark theme
            light_bg = page.get_by_test_id("triage-lines").evaluate("el => getComputedStyle(el).backgroundColor")
            dark_theme(page)
            page.get_by_test_id("triage-goto-failure").click()
            page.get_by_test_id("triage-traceback").wait_for(timeout=30000)
            dark_bg = page.get_by_test_id("triage-lines").evaluate("el => getComputedStyle(el).backgroundColor")
            assert dark_bg != light_bg, (light_bg, dark_bg)
            page.screenshot(path=os.path.join(ARTIFACTS, "traceback-dark.png"))
            browser.close()
    finally:
        lab.stop()
