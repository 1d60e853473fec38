"""The HyperPod sidebar end to end: a real ``jupyter lab`` (token auth, unauthenticated access
off), Debian's Chromium driven by Playwright, and the real dev cluster (Slurm over SSH).

One walk through the states: the sidebar lists ``local-slurm`` with its nodes; the example is
submitted from the form (a main-area tab); its events stream into the timeline and the loss chart; "Inject
failure" SIGKILLs rank 1; the fault (red, with a notification) and the recovery (green, with its
downtime) appear; a notebook in the same Lab runs ``%hyperpod watch JOB`` and the widget's
progress bar advances; the dark theme is applied; Cancel (keyboard) ends the job. Goodput
(issue 8): the form shows the recommended checkpoint interval and projected goodput for the
chosen node count (the same numbers as ``hyperpod_lab.goodput.advise``), and the job view the
measured goodput and where the lost time went, with the recovery's restart time once it
recovered. A screenshot of each state goes to ``test-artifacts/lab-ui/``.
"""

from __future__ import annotations

import os
import re
import shutil
import time

import pytest
from lab_browser import chromium_page, dark_theme, open_hyperpod_tab, playwright_or_fail, screenshot

from benchmarks._lab import Lab, launch_chromium, run_command

ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "test-artifacts", "lab-ui")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


_playwright = playwright_or_fail


@pytest.fixture
def lab_root(tmp_path):
    """The Lab's root directory: the example script, as a user's project would hold it."""
    os.makedirs(tmp_path / "examples")
    shutil.copy(os.path.join(REPO, "examples", "train_lm.py"), tmp_path / "examples" / "train_lm.py")
    return str(tmp_path)



def _shot(page, name: str) -> str:
    return screenshot(page, ARTIFACTS, name)


def _css_var(page, name: str) -> str:
    return page.evaluate("(n) => getComputedStyle(document.body).getPropertyValue(n).trim()", name)


def _rgb(page, css_color: str) -> str:
    """A CSS colour as the browser computes it (``rgb(r, g, b)``)."""
    return page.evaluate("""(c) => { const d = document.createElement('div'); d.style.color = c;
        document.body.appendChild(d); const v = getComputedStyle(d).color; d.remove(); return v; }""", css_color)


def _progress_fraction(page) -> float | None:
    """Fill of the first ipywidgets progress bar in the page, 0..1 (None before it exists)."""
    return page.evaluate("""() => {
        const bar = document.querySelector('.jupyter-widgets.widget-hprogress');
        if (!bar) return null;
        const fill = bar.querySelector('.progress-bar');
        const outer = bar.querySelector('.progress') || bar;
        if (!fill) return null;
        return fill.getBoundingClientRect().width / Math.max(1, outer.getBoundingClientRect().width);
    }""")


def test_sidebar_streams_a_fault_and_its_recovery(dev_cluster, lab_root):
    sync_playwright = _playwright()
    if os.path.isdir(ARTIFACTS):
        shutil.rmtree(ARTIFACTS)
    os.makedirs(ARTIFACTS)
    # a REST submission may pass only the server's allowlisted variables as secret_env
    # (docs/architecture.md, Trust): this test's one, as a user's jupyter_server_config would
    lab = Lab(lab_root, log_path=os.path.join(ARTIFACTS, "jupyter-lab.log"),
              env={"HYPERPOD_LAB_UI_SECRET": "ui-secret-value-123"},
              args=["--HyperPodLab.secret_env_allowlist=HYPERPOD_LAB_UI_SECRET"]).start()
    job_id = page = None
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 950})
            sidebar = open_hyperpod_tab(page, lab)
            sidebar.wait_for(state="visible")

            # 1. the cluster is listed, reachable, with its Slurm nodes
            cluster = sidebar.locator('[data-testid=hp-cluster][data-cluster="local-slurm"]')
            cluster.wait_for()
            page.wait_for_selector('[data-testid=hp-cluster][data-cluster="local-slurm"][data-state="up"]')
            assert {"n1", "n2"} <= set(cluster.locator("[data-node]").evaluate_all(
                "els => els.map(e => e.dataset.node)"))
            commands = ["hyperpod:open", "hyperpod:submit", "hyperpod:refresh", "hyperpod:cancel-selected",
                        "hyperpod:inject-failure"]
            assert page.evaluate("(ids) => ids.filter(id => !window.jupyterapp.commands.hasCommand(id))",
                                 commands) == []
            _shot(page, "1-clusters")

            # 2. submit the example from the form (a main-area tab opened from the sidebar; Enter in a
            # field submits it)
            sidebar.locator("[data-testid=hp-open-submit]").click()
            form = page.locator("[data-testid=hp-submit-page] [data-testid=hp-submit-form]")
            form.get_by_label("Script path", exact=True).fill("examples/train_lm.py")
            form.get_by_label("Script arguments", exact=True).fill("--steps 70 --step-sleep 0.6")
            form.get_by_label("Job name", exact=True).fill("lab-ui")
            form.get_by_label("Secret variables", exact=True).fill("HYPERPOD_LAB_UI_SECRET")
            form.get_by_label("Cluster", exact=True).select_option("local-slurm")
            form.get_by_label("Nodes", exact=True).fill("2")
            # the goodput advice for 2 nodes: the server's advise() numbers, per recovery mode
            from hyperpod_lab import goodput

            expected = goodput.advise(2, "0.04%", 5.0, 1.0)["modes"]
            advice = form.locator("[data-testid=hp-advice]")
            page.wait_for_function("""() => { const e = document.querySelector('[data-testid=hp-advice-mtbf]');
                return e && /^2 nodes/.test(e.textContent); }""", timeout=15000)
            for mode in ("checkpoint-restart", "checkpointless"):
                row = advice.locator(f'[data-testid=hp-advice-mode][data-mode="{mode}"]')
                interval = row.locator("[data-testid=hp-advice-interval]")
                assert int(interval.get_attribute("data-steps")) == expected[mode]["interval_steps"]
                assert f"{expected[mode]['interval_steps']} steps" in interval.inner_text()
                assert row.locator("[data-testid=hp-advice-goodput]").inner_text() == \
                    f"{expected[mode]['goodput'] * 100:.2f} %"
            # a higher failure rate gives a shorter interval; a bare rate above 1 is refused
            # with the unit expected, at its field
            before = int(advice.locator('[data-mode="checkpoint-restart"] [data-testid=hp-advice-interval]')
                         .get_attribute("data-steps"))
            rate = form.get_by_label("Failure rate per node-hour", exact=True)
            rate.fill("1%")
            page.wait_for_function("""(n) => { const e = document.querySelector(
                '[data-mode="checkpoint-restart"] [data-testid=hp-advice-interval]');
                return e && Number(e.dataset.steps) < n; }""", arg=before, timeout=15000)
            rate.fill("4")
            form.locator("[data-testid=hp-advice-error]").wait_for(timeout=15000)
            assert "%" in form.locator("[data-testid=hp-advice-error]").inner_text()
            assert rate.get_attribute("aria-invalid") == "true"
            rate.fill("0.04%")
            advice.locator('[data-mode="checkpoint-restart"]').wait_for(timeout=15000)
            advice.scroll_into_view_if_needed()
            _shot(page, "1b-advice")
            form.get_by_label("Processes per node", exact=True).fill("1")
            form.get_by_label("Persistent every", exact=True).fill("20")
            form.get_by_label("Memory tier every", exact=True).fill("1")
            form.get_by_label("Max retries", exact=True).fill("3")
            form.get_by_label("Processes per node", exact=True).press("Enter")
            job = sidebar.locator('[data-testid=hp-job][data-state][data-job-id^="lab-ui-"]').first
            job.wait_for()
            job_id = job.get_attribute("data-job-id")
            assert job_id and job_id.startswith("lab-ui-")
            view = sidebar.locator("[data-testid=hp-job-view]")
            assert view.locator("[data-testid=hp-job-id]").inner_text() == job_id
            rec = lab.get(f"hyperpod/jobs/{job_id}")["job"]
            assert rec["spec"]["checkpoint"]["memory_every_steps"] == 1
            assert rec["spec"]["nodes"] == 2 and rec["spec"]["args"] == ["--steps", "70", "--step-sleep", "0.6"]
            # a secret from the form: its name in the spec, its value (the server's env) nowhere
            assert rec["spec"]["secret_env"] == ["HYPERPOD_LAB_UI_SECRET"] and "ui-secret-value" not in str(rec)

            # 3. events stream into the timeline and the loss chart while it runs
            timeline = view.locator("[data-testid=hp-timeline]")
            timeline.locator('[data-kind="submitted"]').wait_for()
            timeline.locator('[data-kind="started"]').first.wait_for(timeout=120000)
            timeline.locator('[data-kind="checkpoint.saved"]').first.wait_for(timeout=60000)
            page.wait_for_function(
                "() => Number(document.querySelector('[data-testid=hp-loss-chart]').dataset.points) >= 3")
            page.wait_for_selector('[data-testid=hp-job-status][data-state="running"]')
            # the measured goodput of the steps so far (read again as events come in)
            value = view.locator("[data-testid=hp-goodput-value]")
            page.wait_for_function("""() => { const e = document.querySelector('[data-testid=hp-goodput-value]');
                return e && e.dataset.goodput !== ''; }""", timeout=30000)
            assert 0 < float(value.get_attribute("data-goodput")) <= 1
            assert re.fullmatch(r"\d+\.\d\d %", value.inner_text())
            causes = view.locator("[data-testid=hp-goodput-lost] [data-cause]").evaluate_all(
                "els => els.map(e => e.dataset.cause)")
            # health_check: the supervisor's pre-flight health checks ran before training (Slurm)
            assert causes == ["useful", "health_check", "checkpoint", "detect", "restart", "restore", "recompute",
                              "other"]
            _shot(page, "2-running")

            # 4. inject a failure into rank 1 from the sidebar
            assert view.locator("[data-testid=hp-fault-rank]").input_value() == "1"
            view.locator("[data-testid=hp-inject]").click()
            fault = timeline.locator('[data-kind="fault.detected"]').first
            fault.wait_for(timeout=60000)
            assert "rank 1" in fault.inner_text()
            red = _rgb(page, _css_var(page, "--jp-error-color1"))
            assert fault.evaluate("e => getComputedStyle(e).color") == red
            page.locator(".Toastify__toast", has_text="rank 1").first.wait_for(timeout=15000)
            _shot(page, "3-fault")

            # 5. the recovery, green, with its downtime
            recovery = timeline.locator('[data-kind="recovery.completed"]').first
            recovery.wait_for(timeout=120000)
            downtime = float(recovery.get_attribute("data-downtime"))
            assert 0 < downtime < 120
            assert re.search(r"recovered in [0-9.]+ s", recovery.inner_text())
            green = _rgb(page, _css_var(page, "--jp-success-color1"))
            assert recovery.evaluate("e => getComputedStyle(e).color") == green
            assert green != red
            assert view.locator(".jp-HyperPod-lossChart-fault").count() >= 1
            page.locator(".Toastify__toast", has_text="recovered in").first.wait_for(timeout=15000)
            _shot(page, "4-recovered")
            # the lost time now includes the recovery's restart
            page.wait_for_function("""() => { const e = document.querySelector(
                '[data-testid=hp-goodput-lost] [data-cause=restart]');
                return e && Number(e.dataset.seconds) > 0; }""", timeout=30000)
            view.locator("[data-testid=hp-goodput]").screenshot(path=os.path.join(ARTIFACTS, "4b-goodput.png"))

            # per-rank logs (keyboard: Enter in the rank field)
            view.locator("[data-testid=hp-log-rank]").fill("0")
            view.locator("[data-testid=hp-log-rank]").press("Enter")
            page.wait_for_function(
                "() => /step/.test(document.querySelector('[data-testid=hp-logs]').textContent)", timeout=30000)

            # 6. a notebook in this Lab watches the job: the progress bar advances
            run_command(page, "notebook:create-new", {"kernelName": "python3"})
            page.wait_for_selector(".jp-NotebookPanel .jp-Cell .cm-content")
            page.get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle")).first.wait_for(timeout=90000)
            cell = page.locator(".jp-NotebookPanel:visible .jp-Cell .cm-content").first
            cell.click()
            page.keyboard.type(f"%load_ext hyperpod_lab\n%hyperpod watch {job_id}")
            page.keyboard.press("Shift+Enter")
            page.wait_for_selector(".jp-NotebookPanel:visible .jp-InputPrompt:has-text('[1]:')", timeout=60000)
            page.wait_for_selector(".jupyter-widgets.widget-hprogress", timeout=60000)
            first_fill = None
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                f = _progress_fraction(page)
                if first_fill is None and f is not None:
                    first_fill = f
                elif f is not None and first_fill is not None and f > first_fill + 0.01:
                    break
                time.sleep(0.5)
            last_fill = _progress_fraction(page)
            assert first_fill is not None and last_fill > first_fill + 0.01, (first_fill, last_fill)
            _shot(page, "5-notebook-widget")

            # the form submits the current notebook (saved first: the server reads the file);
            # the server's SpecError is shown at its field
            page.keyboard.type('print("train here")')  # the notebook's next cell, not run
            page.locator('.jp-NotebookPanel:visible .jp-Toolbar-item[data-jp-item-name="hyperpod-submit"] button').click()
            form = page.locator("[data-testid=hp-submit-page]:visible [data-testid=hp-submit-form]")
            assert form.get_by_label("Current notebook", exact=True).is_checked()  # the notebook's own form
            form.get_by_label("Min nodes", exact=True).fill("2")
            form.get_by_label("Max nodes", exact=True).fill("1")
            with page.expect_response(lambda r: r.url.split("?")[0].endswith("/hyperpod/jobs")
                                      and r.request.method == "POST") as answer:
                form.get_by_label("Max nodes", exact=True).press("Enter")
            assert answer.value.status == 400
            body = answer.value.request.post_data_json
            assert body["notebook"].endswith(".ipynb") and body["spec"]["script"] == body["notebook"]
            assert body["spec"]["elastic"]["min_nodes"] == 2 and body["spec"]["elastic"]["max_nodes"] == 1
            error = form.locator("[data-testid=hp-submit-error]")
            error.wait_for(state="visible")
            assert "min_nodes 2 is greater than max_nodes 1" in error.inner_text()
            assert form.get_by_label("Min nodes", exact=True).get_attribute("aria-invalid") == "true"

            # 7. the dark theme: the panel follows the theme variables
            light_bg = sidebar.evaluate("e => getComputedStyle(e).backgroundColor")
            dark_theme(page)
            page.wait_for_function(
                "(bg) => getComputedStyle(document.querySelector('[data-testid=hp-sidebar]')).backgroundColor !== bg",
                arg=light_bg)
            assert fault.evaluate("e => getComputedStyle(e).color") == _rgb(page, _css_var(page, "--jp-error-color1"))
            _shot(page, "6-dark")

            # 8. cancel from the sidebar (keyboard: focus the button, press Enter)
            cancel = view.locator("[data-testid=hp-cancel]")
            cancel.focus()
            page.keyboard.press("Enter")
            page.wait_for_selector('[data-testid=hp-job-status][data-state="cancelled"], '
                                   '[data-testid=hp-job-status][data-state="completed"]', timeout=60000)
            _shot(page, "7-ended")

            # 9. the job's dashboard: each node's pre-flight health checks (run by the Slurm
            # supervisor before training), passed, in the theme's success colour
            sidebar.locator(f'[data-testid=hp-job][data-job-id="{job_id}"] [data-testid=hp-open-dashboard]').click()
            dash = page.locator(f'[data-testid=hp-dashboard][data-job-id="{job_id}"][data-state=drawn]')
            dash.wait_for()
            checked = dash.locator('[data-testid=hp-dash-timeline] li[data-kind="health.checked"]')
            checked.first.wait_for()
            assert set(checked.evaluate_all("els => els.map(e => e.dataset.ok)")) == {"true"}
            assert "health checks passed on" in checked.first.inner_text()
            green = _rgb(page, _css_var(page, "--jp-success-color1"))
            assert checked.first.evaluate("e => getComputedStyle(e).color") == green
            browser.close()
    except Exception:
        try:
            _shot(page, "failure")
        except Exception:
            pass
        print(lab.log_tail())
        raise
    finally:
        if job_id:
            try:  # leave no job running on the shared dev cluster
                lab.post(f"hyperpod/jobs/{job_id}/cancel", {})
            except Exception:
                pass
        lab.stop()
    for name in ("1-clusters", "1b-advice", "2-running", "3-fault", "4-recovered", "5-notebook-widget", "6-dark",
                 "7-ended"):
        assert os.path.getsize(os.path.join(ARTIFACTS, name + ".png")) > 10000
    assert os.path.getsize(os.path.join(ARTIFACTS, "4b-goodput.png")) > 2000


def test_discover_hyperpod_clusters_from_the_sidebar(tmp_path, monkeypatch):
    """Issue 7: "Discover HyperPod clusters" in the sidebar against a real moto server on loopback
    (the SageMaker API; no dev cluster needed). The palette command opens it with the region
    focused; Enter lists both clusters with orchestrator, status, instance groups and node health;
    "Add profiles" writes their profiles and the cluster list shows them; the sidebar's Refresh
    lists the region's clusters again; a malformed region shows the server's error inline."""
    _playwright()  # fails before moto and the Lab start when Playwright or Chromium is missing
    import boto3

    from tests.moto_server import MotoServer

    os.makedirs(ARTIFACTS, exist_ok=True)
    moto = MotoServer(str(tmp_path / "moto.log")).start()
    sm = boto3.client("sagemaker", endpoint_url=moto.url, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    # moto's quirks: ThreadsPerCore must be 1 and the lifecycle script must live in s3://sagemaker*
    ig = [{"InstanceGroupName": "workers", "InstanceType": "ml.c5.xlarge", "InstanceCount": 2, "ThreadsPerCore": 1,
           "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-lifecycle-bkt/lc/", "OnCreate": "on_create.sh"},
           "ExecutionRole": "arn:aws:iam::123456789012:role/SageMakerRole"}]
    for name in ("ui-disc-a", "ui-disc-b"):
        sm.create_cluster(ClusterName=name, InstanceGroups=ig)
    # the Lab's AWS: moto's endpoint and fake keys only, nothing from the machine's AWS config
    for k in ("AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    config = tmp_path / "clusters.toml"
    env = {"AWS_ENDPOINT_URL_SAGEMAKER": moto.url, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"), "AWS_EC2_METADATA_DISABLED": "true",
           "HYPERPOD_LAB_CONFIG": str(config), "HYPERPOD_LAB_DATA_DIR": str(tmp_path / "data")}
    root = tmp_path / "root"
    root.mkdir()
    lab = Lab(str(root), env=env, log_path=str(tmp_path / "jupyter-lab.log")).start()
    try:
        with chromium_page(1400, 950, ARTIFACTS, lab, failure="discover-failure") as page:
            try:
                _walk_discovery(page, lab, config)
            except Exception:
                print(page.locator("[data-testid=hp-sidebar]").inner_text(timeout=5000))
                raise
    finally:
        lab.stop()
        moto.kill()
    assert os.path.getsize(os.path.join(ARTIFACTS, "8-discover.png")) > 10000


def _walk_discovery(page, lab: Lab, config) -> None:
    """The browser steps of the discovery test."""
    page.set_default_timeout(60000)
    page.goto(lab.lab_url(), wait_until="domcontentloaded")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands.hasCommand('hyperpod:discover')")
    assert page.evaluate("() => window.jupyterapp.commands.label('hyperpod:discover')") == \
        "HyperPod: Discover clusters"
    page.evaluate("() => window.jupyterapp.restored.then(() => null)")  # else the layout restore hides it
    sidebar = page.locator("[data-testid=hp-sidebar]")

    # the palette command opens the part with the region field focused; Enter discovers
    run_command(page, "hyperpod:discover")
    clusters = sidebar.locator("[data-testid=hp-clusters] [data-testid=hp-cluster]")
    clusters.first.wait_for()  # the built-in "local" profile; none of the HyperPod clusters yet
    assert not {"ui-disc-a", "ui-disc-b"} & set(clusters.evaluate_all("els => els.map(e => e.dataset.cluster)"))
    section = sidebar.locator("[data-testid=hp-discover]")
    region = section.get_by_label("AWS region", exact=True)
    region.wait_for(state="visible")
    assert page.evaluate("() => document.activeElement.dataset.testid") == "hp-discover-region"
    assert section.get_by_label("AWS profile", exact=True).is_visible()
    page.keyboard.type("us-east-1")
    with page.expect_response(lambda r: "/hyperpod/discover?region=" in r.url and r.request.method == "GET") as answer:
        page.keyboard.press("Enter")
    assert answer.value.status == 200 and "region=us-east-1" in answer.value.url
    found = section.locator("[data-testid=hp-discovered-cluster]")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=hp-discovered-cluster]').length === 2")
    assert found.evaluate_all("els => els.map(e => [e.dataset.cluster, e.dataset.status])") == \
        [["ui-disc-a", "InService"], ["ui-disc-b", "InService"]]
    first = found.first
    assert first.locator("[data-testid=hp-discovered-status]").inner_text() == "InService"
    assert "slurm" in first.inner_text()
    assert "workers: ml.c5.xlarge 2/2" in first.locator("[data-testid=hp-discovered-groups]").inner_text()
    assert first.locator("[data-testid=hp-discovered-health]").inner_text() == "Node health: Running 2"
    assert "2 HyperPod clusters in region us-east-1" in section.locator(
        "[data-testid=hp-discover-status]").inner_text()

    # Add profiles (keyboard): POST, then the sidebar's cluster list shows both
    add = section.locator("[data-testid=hp-discover-add]")
    add.focus()
    with page.expect_response(lambda r: r.url.split("?")[0].endswith("/hyperpod/discover")
                              and r.request.method == "POST") as answer:
        page.keyboard.press("Enter")
    assert answer.value.status == 200
    assert answer.value.request.post_data_json == {"region": "us-east-1", "overwrite": False}
    for name in ("ui-disc-a", "ui-disc-b"):
        clusters.and_(page.locator(f'[data-cluster="{name}"]')).wait_for()
        section.locator(f'[data-testid=hp-discover-written] li[data-profile="{name}"][data-what="written"]'
                        ).wait_for()
    assert {c["name"] for c in lab.get("hyperpod/clusters")["clusters"]} >= {"ui-disc-a", "ui-disc-b"}
    assert "ui-disc-a" in config.read_text()
    _shot(page, "8-discover")

    # the sidebar's Refresh lists the region's HyperPod clusters again
    with page.expect_response(lambda r: "/hyperpod/discover?region=us-east-1" in r.url) as answer:
        sidebar.locator("[data-testid=hp-refresh]").click()
    assert answer.value.status == 200
    page.wait_for_function("() => document.querySelectorAll('[data-testid=hp-discovered-cluster]').length === 2")

    # a malformed region: the server's message, inline; the old list is gone
    region.fill("us east 1")
    with page.expect_response(lambda r: "/hyperpod/discover?region=" in r.url and r.request.method == "GET") as answer:
        region.press("Enter")
    assert answer.value.status == 400
    error = section.locator("[data-testid=hp-discover-error]")
    error.wait_for(state="visible")
    assert "'us east 1' is not an AWS region name" in error.inner_text()
    assert found.count() == 0 and add.is_disabled()
    _shot(page, "8b-discover-error")


def test_missing_chromium_fails_with_the_install_command(monkeypatch):
    """No browser is ever downloaded: without Debian's chromium the UI tests fail and say how to
    install it."""
    import benchmarks._lab

    monkeypatch.setattr(benchmarks._lab, "CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(pytest.fail.Exception, match="apt-get install chromium"):
        _playwright()
