"""The submit form in JupyterLab's main area (issue 29 item 6), end to end: a real ``jupyter lab``
(token auth), Debian's Chromium driven by Playwright, and a real job on the built-in ``local``
cluster.

A notebook is opened and edited (not saved); its toolbar's "Submit to cluster" opens the form
as a main-area tab (inside the dock panel, not the sidebar), titled by the notebook, with the
notebook as its source; the sidebar's "Submit to cluster…" button and the palette command
reuse that tab. On a wide tab the environment check and the goodput advice stand beside the
fields (a second column); on a narrow one they wrap below them. Submitting posts the notebook it
was opened for, saved first (the script the server made of it has the unsaved edit), and the job
appears in the sidebar's job list. Screenshots: ``test-artifacts/submit-main/`` (``submit_form_main.png``,
``submit_form_narrow.png``, ``submit_form_dark.png``).
"""

from __future__ import annotations

import json
import os

from lab_browser import cancel_job_quietly, chromium_page, dark_theme, fresh_artifacts, open_hyperpod_tab, screenshot

from benchmarks._lab import Lab, run_command

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARTIFACTS = os.path.join(REPO, "test-artifacts", "submit-main")
NOTEBOOK = "train_nb.ipynb"


def _is_submit(request) -> bool:
    return request.method == "POST" and request.url.split("?")[0].endswith("/hyperpod/jobs")


def _box(locator) -> dict:
    box = locator.bounding_box()
    assert box is not None, f"{locator} is not shown"
    return box


def _walk(page, lab) -> str:
    """The Lab part: open the notebook and edit it, open the form from its toolbar, check where
    it is and how it is laid out, submit; returns the job's id."""
    sidebar = open_hyperpod_tab(page, lab)
    sidebar.locator('[data-testid=hp-cluster][data-cluster="local"]').wait_for()
    # the sidebar keeps clusters and jobs: no form in it, a button that opens one
    assert sidebar.locator("[data-testid=hp-submit-form]").count() == 0
    sidebar.locator("[data-testid=hp-open-submit]").wait_for()

    # 1. open the notebook and edit it without saving
    run_command(page, "docmanager:open", {"path": NOTEBOOK, "factory": "Notebook"})
    notebook = page.locator(".jp-NotebookPanel:visible")
    notebook.locator(".jp-Cell .cm-content").first.wait_for()
    notebook.locator(".jp-Cell .cm-content").first.click()
    page.keyboard.press("Control+End")
    page.keyboard.type("\nprint('edited in the lab')")

    # 2. its toolbar's "Submit to cluster": the form in a main-area tab for this notebook
    notebook.locator('.jp-Toolbar-item[data-jp-item-name="hyperpod-submit"] button').click()
    tab = page.locator("[data-testid=hp-submit-page]")
    tab.wait_for()
    assert tab.evaluate("e => e.closest('#jp-main-dock-panel') !== null && e.closest('.jp-SideBar') === null")
    page.locator("#jp-main-dock-panel .lm-TabBar-tab.lm-mod-current",
                 has_text=f"Submit {NOTEBOOK}").wait_for()
    form = tab.locator("[data-testid=hp-submit-form]")
    assert form.get_by_label("Current notebook", exact=True).is_checked()
    assert form.locator("[data-testid=hp-source-notebook-path]").inner_text() == NOTEBOOK
    assert NOTEBOOK in tab.locator("[data-testid=hp-submit-subtitle]").inner_text()
    sections = form.locator("section.jp-HyperPod-formSection h3").all_inner_texts()
    assert sections == ["Cluster & resources", "Resiliency & checkpoints", "Secrets & metrics"], sections

    form.get_by_label("Job name", exact=True).fill("nb-main")
    form.get_by_label("Cluster", exact=True).select_option("local")
    form.get_by_label("Nodes", exact=True).fill("1")
    # the environment check (the notebook against local's interpreter: the same) and the
    # goodput advice for 1 node, in the column beside the fields
    env = form.locator('[data-testid=hp-env][data-summary="ok"]')
    env.wait_for(timeout=30000)
    form.locator("[data-testid=hp-advice-mtbf]").wait_for(timeout=30000)
    assert form.locator("[data-testid=hp-advice-mtbf]").inner_text().startswith("1 node:")
    main_col, aside = form.locator(".jp-HyperPod-formMain"), form.locator(".jp-HyperPod-formAside")
    assert aside.locator("[data-testid=hp-env-section]").count() == 1
    assert aside.locator("[data-testid=hp-advice-section]").count() == 1
    m, a = _box(main_col), _box(aside)
    assert a["x"] >= m["x"] + m["width"] and abs(a["y"] - m["y"]) < 2, (m, a)
    screenshot(page, ARTIFACTS, "submit_form_main")

    # 3. the sidebar's button and the palette command reuse the notebook's tab
    page.locator("#jp-main-dock-panel .lm-TabBar-tab", has_text=NOTEBOOK).first.click()
    notebook.wait_for()
    sidebar.locator("[data-testid=hp-open-submit]").click()
    tab.wait_for(state="visible")
    page.locator("#jp-main-dock-panel .lm-TabBar-tab", has_text=NOTEBOOK).first.click()
    run_command(page, "hyperpod:submit")
    tab.wait_for(state="visible")
    assert page.locator("[data-testid=hp-submit-page]").count() == 1
    assert form.get_by_label("Job name", exact=True).input_value() == "nb-main"  # the same form

    # 4. a narrow tab: the check and the advice wrap below the fields
    page.set_viewport_size({"width": 900, "height": 960})
    page.wait_for_function("""() => {
        const m = document.querySelector('.jp-HyperPod-formMain').getBoundingClientRect();
        const a = document.querySelector('.jp-HyperPod-formAside').getBoundingClientRect();
        return a.top >= m.bottom; }""", timeout=10000)
    aside.scroll_into_view_if_needed()
    screenshot(page, ARTIFACTS, "submit_form_narrow")
    page.set_viewport_size({"width": 1440, "height": 960})

    # 5. submit: the notebook the form was opened for, saved first
    with page.expect_response(lambda r: _is_submit(r.request)) as answer:
        form.get_by_role("button", name="Submit").click()
    assert answer.value.ok, answer.value.text()
    body = answer.value.request.post_data_json
    assert body["notebook"] == NOTEBOOK and body["spec"]["script"] == NOTEBOOK, body
    job_id = answer.value.json()["job"]["job_id"]
    assert job_id.startswith("nb-main-"), job_id
    done = form.locator("[data-testid=hp-submit-done]")
    done.wait_for()
    assert job_id in done.inner_text()
    # the job in the sidebar's list (the sidebar is shown), selected
    row = sidebar.locator(f'[data-testid=hp-job][data-job-id="{job_id}"]')
    row.wait_for(state="visible", timeout=30000)
    assert row.locator("button[aria-pressed=true]").count() == 1
    assert tab.is_visible()  # the form stays open beside it
    screenshot(page, ARTIFACTS, "submit_form_submitted")
    dark_theme(page)
    screenshot(page, ARTIFACTS, "submit_form_dark")
    return job_id


def test_the_notebook_toolbar_opens_the_form_in_the_main_area_and_submits_the_notebook(tmp_path):
    fresh_artifacts(ARTIFACTS)
    root = tmp_path / "root"
    os.makedirs(root)
    # a kernelspec: the Lab starts it without asking (no "Select Kernel" dialog over the page)
    kernelspec = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": kernelspec}, "cells": [
        {"cell_type": "code", "id": "c1", "metadata": {}, "outputs": [], "execution_count": None,
         "source": "import sys\nprint('notebook on the cluster')"}]}
    (root / NOTEBOOK).write_text(json.dumps(nb))
    lab = Lab(str(root), log_path=os.path.join(ARTIFACTS, "jupyter-lab.log")).start()
    job_id = None
    try:
        with chromium_page(1440, 960, ARTIFACTS, lab) as page:
            job_id = _walk(page, lab)

        # the job runs the notebook as saved from the Lab, with the unsaved edit (the converted
        # script the server staged: hyperpod_lab/submit/notebook_script.py)
        job = lab.get(f"hyperpod/jobs/{job_id}")["job"]
        with open(job["spec"]["script"]) as f:
            script = f.read()
        assert "notebook on the cluster" in script and "edited in the lab" in script, script
    finally:
        cancel_job_quietly(lab, job_id)
        lab.stop()
    for name in ("submit_form_main", "submit_form_narrow", "submit_form_dark"):
        assert os.path.getsize(os.path.join(ARTIFACTS, name + ".png")) > 10000
