"""The job dashboard at 2,048 ranks (issue 27 item 3) in a real ``jupyter lab`` and Debian's
Chromium (Playwright): a SYNTHETIC job (no training runs) of 2,048 ranks on 256 nodes of 8,
written by the project's own EventWriter as benchmarks/scale.py writes it (steps from rank 0,
a memory checkpoint of every rank every 5 steps with its rank and node, rank 1337's fault
reported by its node's agent, n167).

Asserted: the dashboard opens with one lane per node (257 rows with the job's) and at most 60
lane elements in the DOM (only the rows in view and a few around them); ↓ 20 times from the job's
lane focuses n19, scrolled into view; n167's lane carries the
fault of rank 1337, named in its label; scrolling the lanes to the end brings the last node's
lane (n255) into the DOM and still keeps at most 60; opening n167 asks the server for its ranks
and shows its 8 ranks' lanes (1336-1343), rank 1337's with the fault. Screenshot:
``test-artifacts/dashboard_2048.png``.
"""

from __future__ import annotations

import os
from dataclasses import replace

from lab_browser import playwright_or_fail

from benchmarks._common import track_local_job
from benchmarks._lab import Lab, launch_chromium, open_lab, run_command
from benchmarks.scale import write_job
from hyperpod_lab.submit.jobs import JobStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(REPO, "test-artifacts")
RANKS, NODES, MAX_LANES = 2048, 256, 60

_playwright = playwright_or_fail


def _lanes_in_dom(dash) -> int:
    return dash.locator("[data-testid=hp-dash-lane]").count()


def test_a_2048_rank_job_opens_with_a_bounded_number_of_lanes_scrolls_and_expands_a_node(tmp_path):
    sync_playwright = _playwright()
    store = JobStore()  # the store the Lab's server reads (the session's data dir)
    rec = track_local_job(str(tmp_path / "job"), "dash-2048", store=store)
    write_job(rec.job_dir, rec.job_id, RANKS, steps=40, fault_rank=1337)
    store.put(replace(rec, status="completed", exit_code=0))
    os.makedirs(ARTIFACTS, exist_ok=True)
    os.makedirs(tmp_path / "lab")
    lab = Lab(str(tmp_path / "lab"), log_path=os.path.join(ARTIFACTS, "dashboard-2048-lab.log")).start()
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = open_lab(browser.new_context(viewport={"width": 1500, "height": 1100}), lab)
            try:
                run_command(page, "hyperpod:open-dashboard", {"jobId": rec.job_id})
                dash = page.locator(f'[data-testid=hp-dashboard][data-job-id="{rec.job_id}"]')
                # drawn with every event folded (a cold fold of 2,048 files takes a few requests)
                page.wait_for_selector(f'[data-testid=hp-dashboard][data-job-id="{rec.job_id}"]'
                                       '[data-state=drawn][data-partial=false]', timeout=180_000)
                lanes = dash.locator("[data-testid=hp-dash-lanes]")
                assert lanes.get_attribute("data-lanes") == str(NODES + 1)
                assert f"{RANKS} ranks · {NODES} nodes" in dash.locator("[data-testid=hp-dash-facts]").inner_text()
                shown = _lanes_in_dom(dash)
                assert 10 <= shown <= MAX_LANES, shown
                first = dash.locator('[data-testid=hp-dash-lane][data-lane="n0"]')
                assert dash.locator('[data-testid=hp-dash-lane][data-kind=node]').first.get_attribute("data-lane") == "n0"

                # keys: ↓ from the job's lane moves through lanes not yet in the DOM, scrolling each into view
                dash.locator('[data-testid=hp-dash-lane][data-lane="job"]').focus()
                for _ in range(20):
                    page.keyboard.press("ArrowDown")
                focused = page.evaluate("() => document.activeElement.dataset.lane")
                assert focused == "n19", focused
                assert page.evaluate("""() => { const a = document.activeElement.getBoundingClientRect();
                    const v = document.querySelector('[data-testid=hp-dash-lane-rows]').getBoundingClientRect();
                    return a.top >= v.top - 1 && a.bottom <= v.bottom + 1; }""")
                assert _lanes_in_dom(dash) <= MAX_LANES

                # scroll the lanes to the end (the wheel over the lanes' names): the last node's lane
                rows = dash.locator("[data-testid=hp-dash-lane-rows]")
                box = dash.locator('[data-testid=hp-dash-lane][data-lane="n19"] .jp-HyperPodDash-laneLabel').bounding_box()
                page.mouse.move(box["x"] + 20, box["y"] + 10)
                last = dash.locator('[data-testid=hp-dash-lane][data-lane="n255"]')
                for _ in range(100):
                    if last.count():
                        break
                    page.mouse.wheel(0, 2000)
                    page.wait_for_timeout(50)
                last.wait_for(timeout=10_000)
                assert rows.evaluate("e => e.scrollTop + e.clientHeight >= e.scrollHeight - 2")
                assert _lanes_in_dom(dash) <= MAX_LANES and first.count() == 0

                # n167: the fault of rank 1337 on its lane, then its 8 ranks' lanes on request
                rows.evaluate("(e, i) => { e.scrollTop = i * 40 - 80; }", 1 + 167)
                n167 = dash.locator('[data-testid=hp-dash-lane][data-lane="n167"]')
                n167.wait_for(timeout=10_000)
                assert n167.get_attribute("data-faults") == "1"
                fault = n167.locator('[data-testid=hp-dash-mark][data-cat=fault]')
                assert fault.get_attribute("data-rank") == "1337"
                assert "fault: rank 1337 on n167" in fault.get_attribute("aria-label")
                n167.locator("[data-testid=hp-dash-expand]").click()
                ranks = dash.locator('[data-testid=hp-dash-lane][data-kind=rank][data-node="n167"]')
                page.wait_for_function("() => document.querySelectorAll("
                                       "'[data-testid=hp-dash-lane][data-kind=rank][data-node=\"n167\"][data-lane=\"1343\"]').length === 1",
                                       timeout=30_000)
                assert ranks.evaluate_all("els => els.map(e => e.dataset.lane)") == [str(r) for r in range(1336, 1344)]
                assert lanes.get_attribute("data-lanes") == str(NODES + 1 + 8)
                r1337 = dash.locator('[data-testid=hp-dash-lane][data-kind=rank][data-lane="1337"]')
                assert r1337.locator('[data-testid=hp-dash-mark][data-cat=fault]').count() == 1
                assert dash.locator('[data-testid=hp-dash-lane][data-kind=rank][data-lane="1336"] '
                                    '[data-testid=hp-dash-mark][data-cat=fault]').count() == 0
                assert _lanes_in_dom(dash) <= MAX_LANES
                # (by the list's scrollTop: the virtualised list re-renders its lanes as events
                # arrive, and a lane's element handle may be replaced while Playwright waits for it
                # to be stable: "Element is not attached to the DOM", fresh19)
                rows.evaluate("(e, i) => { e.scrollTop = i * 40 - 80; }", 1 + 167)
                n167.wait_for(timeout=10_000)
                page.screenshot(path=os.path.join(ARTIFACTS, "dashboard_2048.png"))
                # closed again: the node's ranks leave
                n167.locator("[data-testid=hp-dash-expand]").click()
                ranks.first.wait_for(state="detached", timeout=10_000)
                assert lanes.get_attribute("data-lanes") == str(NODES + 1)
            except Exception:  # what the page and the server showed
                page.screenshot(path=os.path.join(ARTIFACTS, "dashboard_2048-failure.png"))
                print(lab.log_tail())
                raise
            browser.close()
    finally:
        lab.stop()
    assert os.path.getsize(os.path.join(ARTIFACTS, "dashboard_2048.png")) > 10_000
