"""Alerts when away reach the open Lab (issue 29 item 3): a real ``jupyter lab`` with an
``alerts.toml`` (a ``job_failed`` rule named ``failed-here``, its webhook a real ``http.server`` on
loopback), a real job on the built-in ``local`` cluster that exits 3, and Debian's Chromium
driven by Playwright.

Asserted: ``GET hyperpod/alerts`` lists the rule's one alert for the job; the Lab shows it as a
JupyterLab notification naming the rule and the job, once (still one at the next poll, none
after a reload of the page: the shown keys are remembered); the webhook got one message too. Screenshots:
``test-artifacts/alerts-lab/`` (``alert_toast.png``, ``alert_notification.png``: the
notification centre).
"""

from __future__ import annotations

import json
import os

from lab_browser import chromium_page, fresh_artifacts, open_hyperpod_tab, screenshot, wait_job_ended
from loopback_http import LoopbackHTTP

from benchmarks._lab import Lab

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(REPO, "test-artifacts", "alerts-lab")
POLL_S = 5  # src/models/alertFeed.ts POLL_MS


def test_a_fired_rule_is_shown_once_in_the_lab(tmp_path):
    fresh_artifacts(ARTIFACTS)
    posts: list[bytes] = []

    def answer(request):
        posts.append(request.rfile.read(int(request.headers.get("Content-Length") or 0)))
        return 200, "text/plain", b"ok"

    hook = LoopbackHTTP(answer, methods=("POST",))
    root = tmp_path / "root"
    os.makedirs(root)
    (root / "fail.py").write_text("import sys\nprint('failing on purpose', flush=True)\nsys.exit(3)\n")
    alerts = tmp_path / "alerts.toml"
    alerts.write_text(f'[webhook]\nurl = "http://127.0.0.1:{hook.port}/hook"\n\n'
                      '[[rules]]\non = "job_failed"\nname = "failed-here"\n')
    alerts.chmod(0o600)
    # the job store and the alerts sent file of this test only
    lab = Lab(str(root), log_path=os.path.join(ARTIFACTS, "jupyter-lab.log"),
              env={"HYPERPOD_LAB_DATA_DIR": str(tmp_path / "data")},
              args=[f"--HyperPodLab.alerts_file={alerts}"]).start()
    try:
        with chromium_page(1280, 800, ARTIFACTS, lab) as page:
            sidebar = open_hyperpod_tab(page, lab)
            sidebar.locator('[data-testid=hp-cluster][data-cluster="local"]').wait_for()
            spec = {"script": "fail.py", "name": "will-fail", "cluster": "local", "args": [],
                    "resiliency": {"auto_resume": False}}  # failed at once, no restarts
            job_id = lab.post("hyperpod/jobs", {"spec": spec})["job"]["job_id"]
            assert wait_job_ended(lab, job_id)["status"] == "failed"

            toast = page.locator(".Toastify__toast", has_text='Alert "failed-here"')
            toast.first.wait_for(timeout=30000)
            assert job_id in toast.first.inner_text() and "failed" in toast.first.inner_text()
            toast.first.screenshot(path=os.path.join(ARTIFACTS, "alert_toast.png"))
            # the Lab's notification centre (the status bar's bell) lists it too
            page.locator(".jp-Notification-Status").click()
            page.locator(".jp-Notification-List", has_text='Alert "failed-here"').wait_for()
            screenshot(page, ARTIFACTS, "alert_notification")
            page.keyboard.press("Escape")
            fired = lab.get("hyperpod/alerts")
            assert fired["enabled"] is True
            assert [(a["rule"], a["on"], a["job_id"]) for a in fired["alerts"]] == \
                [("failed-here", "job_failed", job_id)], fired
            assert lab.get(f"hyperpod/alerts?after={fired['next']}")["alerts"] == []
            # once: no second toast at the next poll, none after a reload (its first poll)
            with page.expect_response(lambda r: "/hyperpod/alerts?" in r.url, timeout=POLL_S * 2000):
                pass
            page.wait_for_timeout(300)
            assert toast.count() == 1
            with page.expect_response(lambda r: "/hyperpod/alerts?" in r.url):
                page.reload(wait_until="domcontentloaded")
            page.wait_for_timeout(500)
            assert toast.count() == 0
            # the route answers the same again: what stopped the toast is the Lab's memory
            assert lab.get("hyperpod/alerts")["alerts"] == fired["alerts"]
        # the webhook got the same alert, once
        assert [json.loads(b)["text"] for b in posts] == [fired["alerts"][0]["text"]], posts
    finally:
        lab.stop()
        hook.close()
