"""The job dashboard (issue 18, item 1) end to end: a real ``jupyter lab`` (token auth), Debian's
Chromium driven by Playwright, and a real job on the built-in ``local`` cluster: 2 ranks under
torchrun with torch.distributed (gloo), examples/train_lm.py with memory and persistent
checkpoints, into which ``inject-fault --kind exception --rank 1`` is injected; torchrun
restarts the workers and the job recovers from its memory checkpoint and finishes.

The dashboard is opened from the sidebar's job list (its Dashboard button). Asserted: the lanes
are per node (issue 27: the job's one node, both ranks), the fault mark is in the node's lane
naming rank 1 and the recovery mark in the job lane after it; opening the node shows rank 0's
and rank 1's own lanes, the fault on rank 1's; the checkpoints are spans per tier (not one mark
each); the uPlot charts drew the steps; zoom by the wheel and by
keys (+, -, arrows, 0) changes the visible range; the events table filters by kind; Enter on
the fault's row opens rank 1's log at its traceback (the "Traceback" line is visible); in the
dark theme the dashboard's background and text follow the theme variables; a reload brings the
tab back. Screenshots (light, zoomed, log, dark) go to ``test-artifacts/dashboard/``.
"""

from __future__ import annotations

import os
import shutil
import time

from lab_browser import dark_theme, open_hyperpod_tab, playwright_or_fail, screenshot
from slurm_jobs import Follow

from benchmarks._lab import Lab, launch_chromium
from hyperpod_lab import cli
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(REPO, "test-artifacts", "dashboard")
SCRIPT = os.path.join(REPO, "examples", "train_lm.py")


_playwright = playwright_or_fail



def _shot(page, name: str) -> str:
    return screenshot(page, ARTIFACTS, name)


def _rgb(page, css_color: str) -> str:
    """A CSS colour as the browser computes it (``rgb(r, g, b)``)."""
    return page.evaluate("""(c) => { const d = document.createElement('div'); d.style.color = c;
        document.body.appendChild(d); const v = getComputedStyle(d).color; d.remove(); return v; }""", css_color)


def _theme_colors(page, dash) -> tuple[tuple[str, str], tuple[str, str]]:
    """(the dashboard's computed background and text colour, the theme variables' colours)."""
    got = dash.evaluate("e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).color]")
    want = page.evaluate("""() => { const s = getComputedStyle(document.body);
        return [s.getPropertyValue('--jp-layout-color0').trim(), s.getPropertyValue('--jp-ui-font-color1').trim()]; }""")
    return tuple(got), (_rgb(page, want[0]), _rgb(page, want[1]))


def _view(page) -> tuple[float, float]:
    r = page.locator("[data-testid=hp-dash-range]")
    return float(r.get_attribute("data-t0")), float(r.get_attribute("data-t1"))


def _run_job(client: Client) -> str:
    """The 2-rank job with an exception injected into rank 1 at step >= 8; waits for its end."""
    job_id = cli.run(["submit", SCRIPT, "--cluster", "local", "--procs-per-node", "2", "--name", "dash-ui",
                      "--checkpoint-every", "4", "--checkpoint-memory-every", "2",
                      "--env", "HYPERPOD_LAB_STEP_EVENT_INTERVAL_S=0.001",
                      "--", "--steps", "30", "--d-model", "32", "--n-layers", "1", "--n-heads", "2",
                      "--batch-size", "2", "--seq-len", "32", "--step-sleep", "0.15"], client=client)
    job = Follow(client, job_id)
    job.until(lambda: any(e.data["step"] >= 8 for e in job.kinds("step")), "step 8", timeout=240)
    client.inject_fault(job_id, 1, kind="exception")
    job.until(lambda: job.kinds("finished"), "finished", timeout=300)
    assert job.kinds("recovery.completed"), "the job did not recover"
    return job_id


def test_dashboard_lanes_zoom_filter_log_and_themes(tmp_path):
    sync_playwright = _playwright()
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    os.makedirs(ARTIFACTS)
    client = Client(JobStore())  # the store the Lab's server reads (the session's data dir)
    lab = Lab(str(tmp_path), log_path=os.path.join(ARTIFACTS, "jupyter-lab.log")).start()
    try:
        job_id = _run_job(client)
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            try:
                sidebar = open_hyperpod_tab(page, lab)
                row = sidebar.locator(f'[data-testid=hp-job][data-job-id="{job_id}"]')
                row.wait_for()
                assert page.evaluate("() => window.jupyterapp.commands.hasCommand('hyperpod:open-dashboard')")

                # 1. open the dashboard from the job list: a main-area tab
                t_open = time.monotonic()
                row.locator("[data-testid=hp-open-dashboard]").click()
                dash = page.locator(f'[data-testid=hp-dashboard][data-job-id="{job_id}"]')
                dash.wait_for()
                page.wait_for_selector(f'[data-testid=hp-dashboard][data-job-id="{job_id}"][data-state=drawn]')
                assert page.locator(f'#jp-main-dock-panel [data-testid=hp-dashboard][data-job-id="{job_id}"]').count() == 1
                # one lane per node: the local job's two ranks are on one node
                lane1 = dash.locator('[data-testid=hp-dash-lane][data-kind=node]')
                fault = lane1.locator('[data-testid=hp-dash-mark][data-kind="fault.detected"][data-cat=fault][data-rank="1"]')
                fault.first.wait_for()
                assert lane1.count() == 1, lane1.evaluate_all("els => els.map(e => e.dataset.lane)")
                print(f"dashboard drawn {time.monotonic() - t_open:.2f} s after the click")
                # the injected fault is a mark of rank 1's lane (its label names the exception)
                labels = fault.evaluate_all("els => els.map(e => e.getAttribute('aria-label'))")
                assert any("fault: rank 1" in x and "InjectedFault" in x for x in labels), labels
                # the recovery: in the job lane, after the fault
                recovery = dash.locator('[data-testid=hp-dash-lane][data-lane="job"] '
                                        '[data-testid=hp-dash-mark][data-kind="recovery.completed"]')
                assert recovery.count() == 1
                assert float(recovery.get_attribute("data-t")) > float(fault.first.get_attribute("data-t"))
                assert "recovered" in recovery.get_attribute("aria-label")
                # the node opens to its ranks' own lanes (asked of the server: ?node=), the fault on rank 1's
                lane1.locator("[data-testid=hp-dash-expand]").click()
                rank_lane = '[data-testid=hp-dash-lane][data-kind=rank][data-lane="{}"]'.format
                dash.locator(rank_lane("1")).wait_for()
                assert dash.locator(f'{rank_lane("1")} [data-testid=hp-dash-mark][data-cat=fault]').count() >= 1
                # rank 0's own marks: at most torchrun's stop of it, a fault rank 1's caused (drawn fainter)
                secondary = dash.locator(f'{rank_lane("0")} [data-testid=hp-dash-mark][data-cat=fault]').evaluate_all(
                    "els => els.map(e => e.classList.contains('jp-mod-secondary'))")
                assert all(secondary), secondary
                # checkpoints collapsed into spans per tier (a restart starts a new run)
                for lane in ("0", "1"):
                    spans = dash.locator(f'{rank_lane(lane)} .jp-HyperPodDash-span[data-kind=checkpoint][data-tier=memory]')
                    counts = [int(c) for c in spans.evaluate_all("els => els.map(e => e.dataset.count)")]
                    assert 1 <= len(counts) <= 3 and sum(counts) >= 8, counts
                steps = dash.locator(f'{rank_lane("0")} .jp-HyperPodDash-span[data-kind=step]')
                assert 1 <= steps.count() <= 3
                # the charts: uPlot canvases with the steps
                for key in ("loss", "steps_per_s"):
                    chart = dash.locator(f"[data-testid=hp-dash-chart-{key}]")
                    chart.locator("canvas").first.wait_for()
                    assert int(chart.get_attribute("data-points")) >= 20
                dash.locator("[data-testid=hp-goodput-value]").wait_for()
                # the compact timeline: one line per checkpoint run per tier, one per incident
                timeline = dash.locator("[data-testid=hp-dash-timeline] li")
                assert timeline.count() < 20
                # light theme: the theme's variables
                got, want = _theme_colors(page, dash)
                assert got == want, (got, want)
                _shot(page, "1-light")

                # 2. zoom: the wheel over the lanes, then keys
                full = _view(page)
                box = lane1.first.locator(".jp-HyperPodDash-track").bounding_box()
                page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                page.mouse.wheel(0, -400)
                page.wait_for_function("(w) => { const r = document.querySelector('[data-testid=hp-dash-range]');"
                                       " return r.dataset.t1 - r.dataset.t0 < w * 0.8; }", arg=full[1] - full[0])
                wheeled = _view(page)
                assert wheeled[1] - wheeled[0] < (full[1] - full[0]) * 0.8 and wheeled[0] >= full[0]
                lanes = dash.locator("[data-testid=hp-dash-lanes]")
                lanes.focus()
                page.keyboard.press("0")
                page.wait_for_function("(w) => { const r = document.querySelector('[data-testid=hp-dash-range]');"
                                       " return Math.abs((r.dataset.t1 - r.dataset.t0) - w) < 1e-6; }", arg=full[1] - full[0])
                page.keyboard.press("+")
                page.keyboard.press("+")
                page.wait_for_function("(w) => { const r = document.querySelector('[data-testid=hp-dash-range]');"
                                       " return r.dataset.t1 - r.dataset.t0 < w * 0.5; }", arg=full[1] - full[0])
                zoomed = _view(page)
                page.keyboard.press("ArrowRight")
                page.wait_for_function("(t) => +document.querySelector('[data-testid=hp-dash-range]').dataset.t0 > t",
                                       arg=zoomed[0])
                panned = _view(page)
                assert panned[0] > zoomed[0] and abs((panned[1] - panned[0]) - (zoomed[1] - zoomed[0])) < 1e-6
                _shot(page, "2-zoomed")
                page.keyboard.press("-")
                page.wait_for_function("(w) => { const r = document.querySelector('[data-testid=hp-dash-range]');"
                                       " return r.dataset.t1 - r.dataset.t0 > w * 1.2; }", arg=zoomed[1] - zoomed[0])
                page.keyboard.press("0")

                # 3. the events table: filter by kind (and by rank)
                table = dash.locator("[data-testid=hp-dash-events]")
                table.locator("tbody tr").first.wait_for()
                assert table.locator("tbody tr").count() > 20
                dash.locator("[data-testid=hp-dash-filter-kind]").select_option("fault.detected")
                page.wait_for_function("""() => { const rows = [...document.querySelectorAll('[data-testid=hp-dash-events] tbody tr')];
                    return rows.length > 0 && rows.every(r => r.dataset.kind === 'fault.detected'); }""")
                kinds = table.locator("tbody tr").evaluate_all("els => els.map(e => e.dataset.kind)")
                assert set(kinds) == {"fault.detected"} and 1 <= len(kinds) <= 3, kinds
                dash.locator("[data-testid=hp-dash-filter-rank]").fill("1")
                page.wait_for_function("""() => { const rows = [...document.querySelectorAll('[data-testid=hp-dash-events] tbody tr')];
                    return rows.length > 0 && rows.every(r => r.dataset.rank === '1'); }""")

                # 4. Enter on the fault's row: rank 1's log at its traceback
                fault_row = table.locator('tbody tr[data-kind="fault.detected"][data-rank="1"]').first
                fault_row.focus()
                page.keyboard.press("Enter")
                logs = dash.locator("[data-testid=hp-dash-logs]")
                logs.wait_for(state="visible")
                tb = logs.get_by_text("Traceback (most recent call last)").first
                tb.wait_for(state="visible", timeout=30000)
                assert tb.is_visible()
                page.wait_for_function("""() => { const l = document.querySelector('[data-testid=hp-dash-logs]');
                    const t = [...l.querySelectorAll('*')].find(e => e.children.length === 0 &&
                        /Traceback \\(most recent call last\\)/.test(e.textContent));
                    if (!t) return false;
                    const box = t.getBoundingClientRect();
                    let p = t.parentElement; while (p && p !== l && !(p.scrollHeight > p.clientHeight + 2)) p = p.parentElement;
                    const s = (p || l).getBoundingClientRect();
                    return box.top >= s.top - 1 && box.bottom <= s.bottom + 1; }""")
                assert "InjectedFault" in logs.inner_text()
                _shot(page, "3-log")
                # the fault's mark opens the same log (a click; Enter on the focused mark is a click)
                dash.locator("[data-testid=hp-dash-tab-events]").click()
                fault.first.focus()
                page.keyboard.press("Enter")
                logs.wait_for(state="visible")

                # 5. the dark theme: background and text follow the theme variables
                light = _theme_colors(page, dash)[0]
                dark_theme(page)
                page.wait_for_function(
                    "(bg) => getComputedStyle(document.querySelector('[data-testid=hp-dashboard]')).backgroundColor !== bg",
                    arg=light[0])
                got, want = _theme_colors(page, dash)
                assert got == want and got != light, (got, want, light)
                assert dash.locator("[data-testid=hp-dash-chart-loss] canvas").count() >= 1  # redrawn for the theme
                _shot(page, "4-dark")

                # 6. a reload brings the dashboard tab back (the layout restorer)
                page.wait_for_timeout(1500)  # the workspace is saved shortly after a layout change
                page.goto(f"{lab.url}lab?token={lab.token}", wait_until="domcontentloaded")
                page.wait_for_selector(f'[data-testid=hp-dashboard][data-job-id="{job_id}"][data-state=drawn]')
                browser.close()
            except Exception:
                _shot(page, "failure")
                raise
    except Exception:
        print(lab.log_tail())
        raise
    finally:
        lab.stop()
    for name in ("1-light", "2-zoomed", "3-log", "4-dark"):
        assert os.path.getsize(os.path.join(ARTIFACTS, name + ".png")) > 10_000
