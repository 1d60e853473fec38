"""The "Cluster queue" panel in the Lab (issue 29 item 4): a real ``jupyter lab``, Debian's Chromium
driven by Playwright, and the real dev cluster (Slurm over SSH).

The scene (``tests/queue_scene.py``): a held job of ANOTHER Unix user (``hplother``) named
``a|b c <img src=x onerror=alert(1)>``, a held job of ours, node n3 DOWN with the reason
``hpl queue test``. The panel, opened from its own tab in the left area, lists the other user's
pending job (its name as text: no element made of it), with its place in the partition and the
reason it waits; ours under "Your pending jobs"; n3 as down with its reason; and for the built-in
``local`` cluster it says the view is Slurm-only. Screenshot: ``test-artifacts/queue_panel.png``.
"""

from __future__ import annotations

import os

from lab_browser import playwright_or_fail
from queue_scene import DOWN_REASON, OTHER_NAME, OTHER_USER, queue_scene

from benchmarks._lab import Lab, launch_chromium, open_lab

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(REPO, "test-artifacts")

_playwright = playwright_or_fail


def test_queue_panel_lists_another_users_pending_job_and_a_down_node(dev_cluster, tmp_path):
    sync_playwright = _playwright()
    os.makedirs(ARTIFACTS, exist_ok=True)
    with queue_scene(DOWN_REASON) as scene:
        lab = Lab(str(tmp_path), log_path=os.path.join(ARTIFACTS, "queue-jupyter-lab.log"),
                  args=["--HyperPodLab.queue_interval_s=2"]).start()
        try:
            with sync_playwright() as p:
                browser = launch_chromium(p)
                page = open_lab(browser.new_context(viewport={"width": 1400, "height": 950}), lab)
                page.locator('.jp-SideBar [data-id="hyperpod-lab-queue"]').click()  # its own tab
                panel = page.get_by_test_id("hp-queue")
                panel.wait_for(state="visible", timeout=30000)
                assert page.evaluate("() => window.jupyterapp.commands.hasCommand('hyperpod:open-queue')")
                select = panel.get_by_test_id("hp-queue-cluster")
                assert select.input_value() == "local-slurm"  # Slurm clusters first

                # another user's pending job: its name as typed, as text; its place and why it waits
                other = panel.locator(f'[data-testid=hp-queue-job][data-job-id="{scene["other"]}"]')
                other.wait_for(timeout=30000)
                assert (other.get_attribute("data-user"), other.get_attribute("data-status"),
                        other.get_attribute("data-mine")) == (OTHER_USER, "pending", "false")
                name = other.get_by_test_id("hp-queue-job-name")
                assert name.inner_text() == OTHER_NAME
                assert name.evaluate("el => el.children.length") == 0 and panel.locator("img").count() == 0
                position = int(other.get_attribute("data-position"))
                assert other.get_by_test_id("hp-queue-job-wait").inner_text() == f"#{position} in dev · JobHeldUser"

                # ours, with its place among the pending jobs of its partition
                mine = panel.get_by_test_id("hp-queue-mine").locator(f'[data-job-id="{scene["ours"]}"]')
                assert "pending in dev · JobHeldUser" in mine.inner_text()
                ours = panel.locator(f'[data-testid=hp-queue-job][data-job-id="{scene["ours"]}"]')
                assert ours.get_attribute("data-mine") == "true"

                # the DOWN node with its reason, and the count of down nodes
                node = panel.locator('[data-testid=hp-queue-node][data-node="n3"]')
                assert node.get_attribute("data-group") == "down"
                assert node.get_by_test_id("hp-queue-node-reason").inner_text() == DOWN_REASON
                assert panel.locator('[data-testid=hp-queue-counts] [data-group="down"]').inner_text() == "down 1"
                assert panel.locator('[data-testid=hp-queue-partition][data-partition="dev"]').count() == 1
                page.screenshot(path=os.path.join(ARTIFACTS, "queue_panel.png"))

                # a cluster without a queue view: a labelled, empty panel
                select.select_option("local")
                unsupported = panel.get_by_test_id("hp-queue-unsupported")
                unsupported.wait_for(timeout=30000)
                assert "Slurm-only" in unsupported.inner_text()
                assert panel.locator("[data-testid=hp-queue-job]").count() == 0
                browser.close()
        finally:
            lab.stop()
