"""The submit form (a main-area tab opened from the sidebar's "Submit to cluster…") offers the JobSpec's ``resiliency.storm_restarts`` (the restart-storm
guard K, docs/restart-storms.md) and ``tensorboard`` (docs/tensorboard.md), end to end: a real
``jupyter lab`` (token auth), Debian's Chromium driven by Playwright, and a real job on the
built-in ``local`` cluster (examples/train_lm.py, a few steps of a tiny model under torchrun).

Asserted: both fields show their JobSpec defaults (3, off); K = 1001 (above 1000) shows the
form's message right below the field, marks it invalid and posts nothing; K = 5 with TensorBoard
"rank 0" is posted, the job's record read back through ``GET hyperpod/jobs/<id>`` carries
``storm_restarts`` 5 and ``tensorboard`` "rank0", and the finished job wrote TensorBoard event
files into ``<job_dir>/tensorboard``. Screenshots go to ``test-artifacts/submit-form/``.
"""

from __future__ import annotations

import glob
import os
import shutil

from lab_browser import cancel_job_quietly, chromium_page, fresh_artifacts, open_hyperpod_tab, screenshot, wait_job_ended

from benchmarks._lab import Lab

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(REPO, "test-artifacts", "submit-form")
ARGS = "--steps 6 --d-model 32 --n-layers 1 --n-heads 2 --batch-size 2 --seq-len 32"


def _is_submit(request) -> bool:
    return request.method == "POST" and request.url.split("?")[0].endswith("/hyperpod/jobs")


def test_storm_guard_and_tensorboard_fields_reach_the_job(tmp_path):
    fresh_artifacts(ARTIFACTS)
    root = tmp_path / "root"
    os.makedirs(root / "examples")
    shutil.copy(os.path.join(REPO, "examples", "train_lm.py"), root / "examples" / "train_lm.py")
    lab = Lab(str(root), log_path=os.path.join(ARTIFACTS, "jupyter-lab.log")).start()
    job_id = None
    try:
        with chromium_page(1400, 1000, ARTIFACTS, lab) as page:
            posts: list[str] = []
            page.on("request", lambda r: posts.append(r.url) if _is_submit(r) else None)
            sidebar = open_hyperpod_tab(page, lab)
            sidebar.locator('[data-testid=hp-cluster][data-cluster="local"]').wait_for()
            sidebar.locator("[data-testid=hp-open-submit]").click()
            form = page.locator("[data-testid=hp-submit-page] [data-testid=hp-submit-form]")
            form.get_by_label("Script path", exact=True).fill("examples/train_lm.py")
            form.get_by_label("Script arguments", exact=True).fill(ARGS)
            form.get_by_label("Job name", exact=True).fill("form-fields")
            form.get_by_label("Cluster", exact=True).select_option("local")

            # the goodput advice at 1 node: no error, a warning that checkpointless has no peer
            # to heal from (it raised "1 instances do not split into groups of 2 replicas")
            form.get_by_label("Nodes", exact=True).fill("1")
            form.locator("[data-testid=hp-advice-warning]").first.wait_for(timeout=30000)
            assert "1 instance" in form.locator("[data-testid=hp-advice-warning]").first.inner_text()
            assert form.locator("[data-testid=hp-advice-error]").count() == 0

            storm = form.get_by_label("Restart-storm guard K", exact=True)
            tensorboard = form.get_by_label("TensorBoard", exact=True)
            # the JobSpec defaults, and the values the select offers
            assert storm.input_value() == "3"
            assert tensorboard.input_value() == "off"
            assert tensorboard.locator("option").evaluate_all("els => els.map(e => e.value)") == \
                ["off", "rank0", "all-ranks"]

            # 1. out of range: the form's message below the field, nothing posted
            storm.fill("1001")
            storm.press("Enter")
            err = form.locator('[data-testid=hp-field-error][data-field="resiliency.storm_restarts"]')
            err.wait_for(state="visible", timeout=10000)
            assert "from 1 to 1000" in err.inner_text(), err.inner_text()
            assert storm.get_attribute("aria-invalid") == "true"
            # in the field's own row, right below it, and named by the input for assistive tech
            assert storm.evaluate("(e) => e.closest('.jp-HyperPod-field') === "
                                  "document.querySelector('[data-testid=hp-field-error]').parentElement")
            assert storm.get_attribute("aria-describedby") == err.get_attribute("id")
            form.get_by_role("button", name="Submit").click()  # the button: the same refusal
            page.wait_for_timeout(700)
            assert posts == [], posts
            assert form.locator("[data-testid=hp-field-error]").count() == 1
            screenshot(page, ARTIFACTS, "1-storm-out-of-range")

            # 2. a valid K and TensorBoard on rank 0: posted, and the error is gone
            storm.fill("5")
            tensorboard.select_option("rank0")
            with page.expect_response(lambda r: _is_submit(r.request)) as answer:
                form.get_by_role("button", name="Submit").click()
            assert answer.value.ok, answer.value.text()
            sent = answer.value.request.post_data_json["spec"]
            assert sent["resiliency"]["storm_restarts"] == 5 and sent["tensorboard"] == "rank0", sent
            job_id = answer.value.json()["job"]["job_id"]
            assert form.locator("[data-testid=hp-field-error]").count() == 0
            assert storm.get_attribute("aria-invalid") is None
            screenshot(page, ARTIFACTS, "2-submitted")

        # 3. the job's record through the REST API carries both fields
        job = lab.get(f"hyperpod/jobs/{job_id}")["job"]
        assert job["spec"]["resiliency"]["storm_restarts"] == 5, job["spec"]
        assert job["spec"]["tensorboard"] == "rank0", job["spec"]
        job = wait_job_ended(lab, job_id)
        assert job["status"] == "completed", (job["status"], job["reason"])
        events = glob.glob(os.path.join(job["job_dir"], "tensorboard", "**", "events.out.tfevents.*"),
                           recursive=True)
        assert events, f"no TensorBoard event files under {job['job_dir']}/tensorboard"
        job_id = None
    finally:
        cancel_job_quietly(lab, job_id)  # a job left running by a failed assertion
        lab.stop()
