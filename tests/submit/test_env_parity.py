"""Environment parity (issue 18, item 4): the notebook's environment against the cluster
interpreter's, on the real dev cluster over its real sshd (hyperpod_lab/submit/envparity.py).

The "cluster interpreter" of these tests is a SECOND virtual environment made here (``python -m
venv``, no system site-packages) and named as the ``python`` of a separate cluster profile that
otherwise is the dev cluster's (written into a tmp clusters config; the shared ``local-slurm``
profile is left alone). It holds two STAND-IN distributions, real installable packages built
with ``pip wheel`` from a tmp directory and installed with pip:

* ``torch`` 2.12.0: ``torch/__init__.py`` sets ``__version__`` and ``torch/version.py`` has
  ``cuda = None`` (a CPU build). A real second torch is a multi-GB download CI cannot afford;
  the probe reads exactly these two things (the distribution's version and ``version.cuda``).
* ``hyperpod-lab`` 0.0.1: ``hyperpod_lab/__init__.py`` (``__version__``) and
  ``hyperpod_lab/events.py`` (``SCHEMA_VERSION = 1``): an incompatible release (another
  major.minor) whose import works.

It has no PyYAML, so a script importing ``yaml`` shows a package missing on the cluster.
"""

from __future__ import annotations

import dataclasses
import getpass
import importlib.metadata
import io
import json
import os
import stat
import subprocess
import sys
import textwrap
import uuid

import pytest
import tomli_w

from hyperpod_lab import cli
from hyperpod_lab.errors import EnvironmentMismatch, SpecError
from hyperpod_lab.schedulers.remote import SSHRemote
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit import envparity
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.clusters import ClusterProfile
from hyperpod_lab.submit.jobs import JobStore

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = os.path.join(HERE, "scripts", "steps.py")
NOTEBOOK_TORCH = importlib.metadata.version("torch")  # 2.13.0+cpu here
NOTEBOOK_HPL = importlib.metadata.version("hyperpod-lab")
PROFILE = "envparity-old"

SCRIPT = textwrap.dedent("""\
    import json, os
    import numpy as np
    import torch
    import yaml
    from hyperpod_lab import runtime
    """)


def _stand_in(root, dist: str, files: dict[str, str], version: str) -> str:
    """A stand-in distribution's source tree (setuptools, built offline with the notebook's setuptools)."""
    src = root / f"src-{dist}"
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    pkgs = sorted({rel.split("/")[0] for rel in files})
    (src / "pyproject.toml").write_text(textwrap.dedent(f"""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{dist}"
        version = "{version}"
        description = "STAND-IN for the environment parity tests (not the real {dist})"
        [tool.setuptools]
        packages = {pkgs!r}
        """))
    return str(src)


@pytest.fixture(scope="module")
def cluster_python(tmp_path_factory) -> str:
    """The second venv's interpreter, with the stand-in torch 2.12.0 and hyperpod-lab 0.0.1."""
    import importlib.util

    if importlib.util.find_spec("setuptools") is None:
        pytest.fail("setuptools is not installed (the stand-in wheels are built with it, offline); run "
                    "'.venv/bin/pip install -e .[test]'", pytrace=False)
    root = tmp_path_factory.mktemp("cluster-env")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    torch_src = _stand_in(root, "torch", {
        "torch/__init__.py": "__version__ = '2.12.0'  # STAND-IN torch for tests/submit/test_env_parity.py\n",
        "torch/version.py": "from typing import Optional\n__version__ = '2.12.0'\ncuda: Optional[str] = None\n"},
        "2.12.0")
    hpl_src = _stand_in(root, "hyperpod-lab", {
        "hyperpod_lab/__init__.py": "__version__ = '0.0.1'  # STAND-IN hyperpod-lab for tests/submit/test_env_parity.py\n",
        "hyperpod_lab/events.py": "SCHEMA_VERSION = 1\n"}, "0.0.1")
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(pip + ["wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", str(wheels),
                          torch_src, hpl_src], check=True, capture_output=True)
    subprocess.run(pip + ["--python", str(venv / "bin" / "python"), "install", "--no-index", "--no-deps",
                          *map(str, sorted(wheels.iterdir()))], check=True, capture_output=True)
    return str(venv / "bin" / "python")


@pytest.fixture
def old_cluster(dev_cluster, cluster_python, tmp_path, monkeypatch) -> ClusterProfile:
    """The dev cluster with the second venv as its interpreter, in a tmp clusters config."""
    prof = dataclasses.replace(dev_cluster, name=PROFILE, python=cluster_python).validate()
    config = tmp_path / "clusters.toml"
    with open(config, "wb") as f:
        tomli_w.dump({"clusters": {dev_cluster.name: dev_cluster.to_toml_table(), PROFILE: prof.to_toml_table()}}, f)
    monkeypatch.setenv("HYPERPOD_LAB_CONFIG", str(config))
    envparity.forget()
    return prof


@pytest.fixture
def script(tmp_path) -> str:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    return str(path)


def _row(report: dict, item: str) -> dict:
    rows = [d for d in report["differences"] if d["item"] == item]
    assert rows, [d["item"] for d in report["differences"]]
    return rows[0]


def test_the_diff_catches_torch_and_a_missing_package_over_the_real_sshd(old_cluster, client, script):
    sched = client.scheduler(PROFILE)
    assert isinstance(sched.remote, SSHRemote)  # the same route as a submission
    sched.remote.ops.clear()
    report = envparity.env_diff(old_cluster, script, remote=sched.remote)
    assert dict(sched.remote.ops) == {"exec": 1}, sched.remote.ops  # one probe command, no SFTP
    assert report["remote"]["executable"] == old_cluster.python
    torch_row = _row(report, "torch")
    assert torch_row["severity"] == "warning", torch_row
    assert torch_row["local"] == NOTEBOOK_TORCH and "2.13.0" in torch_row["local"] and torch_row["remote"] == "2.12.0"
    assert "2.13.0" in torch_row["message"] and "2.12.0" in torch_row["message"]
    assert _row(report, "torch CUDA build")["remote"] == "CPU"  # the stand-in's version.cuda = None
    yaml_row = _row(report, "package yaml")
    assert yaml_row["severity"] == "warning" and yaml_row["remote"] is None and "PyYAML" in yaml_row["local"]
    assert "yaml" in yaml_row["message"] and "missing on the cluster" in yaml_row["message"]
    assert [d["item"] for d in report["differences"] if d["item"].startswith("package")] == \
        ["package numpy", "package yaml"]  # stdlib (json, os), torch and hyperpod_lab are not packages rows
    hpl = _row(report, "hyperpod-lab")
    assert hpl["severity"] == "error" and (hpl["local"], hpl["remote"]) == (NOTEBOOK_HPL, "0.0.1")
    assert report["summary"] == "error"
    # the CLI: a table, exit status 1 on an error-level difference
    out = io.StringIO()
    assert cli.run(["env", "diff", script, "--cluster", PROFILE], out=out, client=client) == 1
    text = out.getvalue()
    assert "2.12.0" in text and NOTEBOOK_TORCH in text and "package yaml" in text and "summary: error" in text


def test_an_incompatible_hyperpod_lab_refuses_the_submission_before_anything_is_staged(old_cluster, client):
    sched = client.scheduler(PROFILE)
    jobs_root = os.path.dirname(sched.job_dir("x"))
    before = set(os.listdir(jobs_root)) if os.path.isdir(jobs_root) else set()
    sched.remote.ops.clear()
    with pytest.raises(EnvironmentMismatch) as e:
        client.submit(JobSpec(script=STEPS, name="envparity-refused", cluster=PROFILE, nodes=1))
    msg = str(e.value)
    assert f"hyperpod-lab {NOTEBOOK_HPL} (notebook) and 0.0.1 (cluster)" in msg, msg
    assert f"pip install hyperpod-lab=={NOTEBOOK_HPL} on the cluster interpreter ({old_cluster.python})" in msg
    assert "--skip-env-check" in msg
    assert envparity.cached(old_cluster) is None  # a refusal is not cached: the next submit probes again
    assert dict(sched.remote.ops) == {"exec": 1}, sched.remote.ops  # the probe only: no staging, no sbatch
    assert client.store.list() == []  # no job record
    after = set(os.listdir(jobs_root)) if os.path.isdir(jobs_root) else set()
    assert not [d for d in after - before if d.startswith("envparity-refused")]
    # the CLI (and so %hyperpod) refuses the same way
    with pytest.raises(EnvironmentMismatch, match="0.0.1"):
        cli.run(["submit", STEPS, "--cluster", PROFILE, "--nodes", "1", "--name", "envparity-cli"],
                out=io.StringIO(), client=client)
    assert client.store.list() == []
    # --skip-env-check submits anyway (the stand-in interpreter cannot run the job: it is cancelled)
    job_id = cli.run(["submit", STEPS, "--cluster", PROFILE, "--nodes", "1", "--name", "envparity-skip",
                      "--skip-env-check"], out=io.StringIO(), client=client)
    try:
        assert [r.job_id for r in client.store.list()] == [job_id]
    finally:
        client.cancel(job_id)


def test_a_compatible_cluster_is_accepted_with_at_most_one_exec_more_per_submission(dev_cluster, client):
    """The dev cluster's own interpreter (the notebook's): accepted. With no probe cached a submit
    is two execs (the probe and the submit), with the probe cached (60 s) one, never more."""
    sched = client.scheduler(dev_cluster.name)
    jobs = []
    try:
        for drop_cache, execs in ((True, 2), (False, 1), (True, 2), (False, 1)):
            if drop_cache:
                envparity.forget()
            sched.remote.ops.clear()
            rec = client.submit(JobSpec(script=STEPS, name="envparity-ok", cluster=dev_cluster.name, nodes=1,
                                        args=["--steps", "1", "--sleep", "0"]))
            jobs.append(rec.job_id)
            assert dict(sched.remote.ops) == {"exec": execs}, (drop_cache, sched.remote.ops)
    finally:
        for job_id in jobs:
            client.cancel(job_id)


def test_export_writes_the_notebooks_pins_to_the_clusters_shared_storage(old_cluster, client):
    name = f"t-{uuid.uuid4().hex[:8]}"
    out = io.StringIO()
    assert cli.run(["env", "export", "--cluster", PROFILE, "--name", name], out=out, client=client) == 0
    user = client.scheduler(PROFILE).remote.user_name()  # envs live in the user's own folder
    path = f"{old_cluster.shared_root}/hyperpod-lab/{user}/envs/{name}/requirements.txt"
    try:
        text = out.getvalue()
        assert path in text and f"{old_cluster.python} -m venv" in text and "/bin/pip install -r" in text, text
        sftp = client.scheduler(PROFILE).remote
        assert isinstance(sftp, SSHRemote)
        req = sftp.read_from(path).decode()  # read back over SFTP
        lines = req.splitlines()
        assert f"torch=={NOTEBOOK_TORCH}" in lines, req[:2000]
        assert f"numpy=={importlib.metadata.version('numpy')}" in lines
        assert any(ln.startswith("# hyperpod-lab==") and "editable" in ln for ln in lines) \
            or f"hyperpod-lab=={NOTEBOOK_HPL}" in lines
        if "+cpu" in NOTEBOOK_TORCH:
            assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o644  # the dev cluster's storage is this host's
        with pytest.raises(SpecError, match="name"):
            cli.run(["env", "export", "--cluster", PROFILE, "--name", "../x"], out=io.StringIO(), client=client)
    finally:
        import shutil

        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_the_same_interpreter_is_all_ok_and_eks_is_reported_not_supported(tmp_path, client, script):
    out = io.StringIO()
    assert cli.run(["env", "diff", script, "--cluster", "local"], out=out, client=client) == 0
    assert "summary: ok" in out.getvalue() and "WARNING" not in out.getvalue(), out.getvalue()
    eks = ClusterProfile(name="eks-x", orchestrator="eks", eks_cluster="x", region="us-west-2", image="img:1")
    with pytest.raises(envparity.EnvCheckUnsupported, match="running pod"):
        envparity.probe_cluster(eks)
    gone = dataclasses.replace(client.scheduler("local").profile, python="/nonexistent/bin/python")
    with pytest.raises(EnvironmentMismatch, match="/nonexistent/bin/python.*was not found"):
        envparity.probe_cluster(gone, use_cache=False)


def _env(python="3.11.7", torch=("2.13.0", None), hpl=("0.1.0", 1, None), mods=None):
    return {"python": python, "torch": torch and {"version": torch[0], "cuda": torch[1]},
            "hyperpod_lab": hpl and {"version": hpl[0], "schema": hpl[1], "error": hpl[2]},
            "modules": mods or {}, "modules_asked": sorted(mods or {}), "executable": "/c/python"}


def test_the_severity_rules():
    sev = lambda local, remote: {d.item: d.severity for d in envparity.diff(local, remote)}  # noqa: E731
    assert set(sev(_env(), _env()).values()) == {"ok"}
    assert sev(_env(), _env(python="3.11.9"))["python"] == "ok"  # micro versions may differ
    assert sev(_env(), _env(python="3.12.1"))["python"] == "warning"
    assert sev(_env(), _env(torch=("2.13.0", "12.4")))["torch CUDA build"] == "warning"
    assert sev(_env(), _env(torch=None))["torch"] == "warning"
    assert sev(_env(), _env(hpl=("0.1.7", 1, None)))["hyperpod-lab"] == "ok"  # same major.minor
    assert sev(_env(), _env(hpl=("0.2.0", 1, None)))["hyperpod-lab"] == "error"
    assert sev(_env(), _env(hpl=("0.1.0", 2, None)))["event schema"] == "error"
    assert sev(_env(), _env(hpl=None))["hyperpod-lab"] == "error"
    assert sev(_env(), _env(hpl=("0.1.0", None, "ImportError: boom")))["hyperpod-lab"] == "error"
    pkg = {"numpy": {"found": True, "dists": {"numpy": "2.0.0"}}}
    assert sev(_env(mods=pkg), _env(mods={"numpy": {"found": True, "dists": {"numpy": "1.26.4"}}}))["package numpy"] \
        == "warning"
    assert sev(_env(mods=pkg), _env(mods=pkg))["package numpy"] == "ok"


def test_a_bad_script_is_a_spec_error_naming_it(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    with pytest.raises(SpecError, match="not valid Python"):
        envparity.collect_local(str(bad))
    with pytest.raises(SpecError, match="cannot be read"):
        envparity.collect_local(str(tmp_path / "missing.py"))


def test_the_rest_route_returns_the_diff_and_404_for_an_unknown_cluster(old_cluster, script, tmp_path):
    from jupyter_server_proc import JupyterServer

    root = os.path.dirname(script)
    os.makedirs(tmp_path / "server")
    srv = JupyterServer(root, str(tmp_path / "server")).start()
    try:
        status, body = srv.call("GET", f"/hyperpod/clusters/{PROFILE}/env?script=train.py")
        assert status == 200, body
        assert body["supported"] is True and body["summary"] == "error"
        torch_row = _row(body, "torch")
        assert (torch_row["severity"], torch_row["remote"]) == ("warning", "2.12.0") and "2.13.0" in torch_row["local"]
        assert _row(body, "package yaml")["severity"] == "warning"
        # a notebook is read through its code cells (magics and shell lines dropped), as a submission reads it
        nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [
            {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
             "source": "%load_ext hyperpod_lab\n!pip list\nimport yaml\n"}]}
        with open(os.path.join(root, "nb.ipynb"), "w") as f:
            json.dump(nb, f)
        status, body = srv.call("GET", f"/hyperpod/clusters/{PROFILE}/env?script=nb.ipynb")
        assert status == 200 and body["script"] == "nb.ipynb", body
        assert [d["item"] for d in body["differences"] if d["item"].startswith("package")] == ["package yaml"]
        # EKS: not probed (the interpreter is in the job's image), said so, not an error
        with open(os.environ["HYPERPOD_LAB_CONFIG"], "rb") as f:
            import tomllib

            doc = tomllib.load(f)
        doc["clusters"]["eks-x"] = {"orchestrator": "eks", "eks_cluster": "x", "region": "us-west-2", "image": "i:1"}
        with open(os.environ["HYPERPOD_LAB_CONFIG"], "wb") as f:
            tomli_w.dump(doc, f)
        status, body = srv.call("GET", "/hyperpod/clusters/eks-x/env")
        assert status == 200 and body["supported"] is False and "running pod" in body["message"], body
        status, body = srv.call("POST", "/hyperpod/clusters/eks-x/env/export", {})
        assert status == 409 and "pods" in body["error"]["message"], body
        status, body = srv.call("GET", "/hyperpod/clusters/no-such-cluster/env")
        assert status == 404 and "no-such-cluster" in body["error"]["message"], body
        status, body = srv.call("GET", f"/hyperpod/clusters/{PROFILE}/env?script=../../etc/passwd")
        assert status == 400 and body["error"]["field"] == "script", body
        status, body = srv.call("POST", f"/hyperpod/clusters/{PROFILE}/env/export", {"name": "a b"})
        assert status == 400 and body["error"]["field"] == "name", body
        # submitting through the server is refused the same way (409), nothing recorded
        status, body = srv.call("POST", "/hyperpod/jobs", {"spec": {"script": "train.py", "cluster": PROFILE,
                                                                    "nodes": 1}})
        assert status == 409 and body["error"]["type"] == "EnvironmentMismatch", body
        assert "0.0.1" in body["error"]["message"]
        # skip_env_check: the CLI's --skip-env-check over REST (the form's "Submit anyway"); a boolean only
        spec = {"script": "train.py", "cluster": PROFILE, "nodes": 1, "name": "envparity-rest-skip"}
        status, body = srv.call("POST", "/hyperpod/jobs", {"spec": spec, "skip_env_check": "yes"})
        assert status == 400 and body["error"]["field"] == "skip_env_check", body
        status, body = srv.call("POST", "/hyperpod/jobs", {"spec": spec, "skip_env_check": True})
        assert status == 201 and body["job"]["name"] == "envparity-rest-skip", body
        job_id = body["job"]["job_id"]  # the stand-in interpreter cannot run it: cancelled
        status, body = srv.call("POST", f"/hyperpod/jobs/{job_id}/cancel", {})
        assert status == 200, body
    finally:
        srv.stop()


def test_the_submit_form_shows_the_diff_and_blocks_an_incompatible_cluster(old_cluster, dev_cluster, script):
    """Playwright in Debian's Chromium, a real ``jupyter lab``: choosing the stand-in cluster shows
    torch 2.13.0 -> 2.12.0 and disables Submit naming hyperpod-lab 0.0.1; the dev cluster's own
    interpreter matches and re-enables it; Export requirements shows the path and the command."""
    import shutil as _shutil

    from lab_browser import open_hyperpod_tab
    from playwright.sync_api import sync_playwright

    from benchmarks._lab import Lab, launch_chromium

    artifacts = os.path.join(os.path.dirname(HERE), "test-artifacts", "env-parity")
    os.makedirs(artifacts, exist_ok=True)
    root = os.path.dirname(script)
    env_dir = f"{old_cluster.shared_root}/hyperpod-lab/{getpass.getuser()}/envs/notebook"  # the Lab runs as this user
    existed = os.path.isdir(env_dir)
    lab = Lab(root, log_path=os.path.join(artifacts, "jupyter-lab.log")).start()
    try:
        with sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            sidebar = open_hyperpod_tab(page, lab)
            sidebar.locator("[data-testid=hp-open-submit]").click()  # the form opens in the main area
            form = page.locator("[data-testid=hp-submit-page] [data-testid=hp-submit-form]")
            form.get_by_label("Script path", exact=True).fill("train.py")
            form.get_by_label("Cluster", exact=True).select_option(PROFILE)
            env = form.locator("[data-testid=hp-env]")
            env.locator("xpath=self::*[@data-summary='error']").wait_for()
            torch_row = env.locator('[data-testid=hp-env-row][data-item="torch"]')
            assert torch_row.get_attribute("data-severity") == "warning"
            assert "2.12.0" in torch_row.inner_text() and "2.13.0" in torch_row.inner_text()
            assert env.locator('[data-testid=hp-env-row][data-item="package yaml"]').count() == 1
            submit = form.locator("[data-testid=hp-submit]")
            assert submit.is_disabled()
            block = form.locator("[data-testid=hp-env-block]")
            assert block.is_visible() and "0.0.1" in block.inner_text() and "pip install hyperpod-lab==" in \
                block.inner_text()
            # "Submit anyway" (the CLI's --skip-env-check), offered only while the error blocks Submit
            skip = form.locator("[data-testid=hp-env-skip]")
            assert skip.is_visible() and not skip.is_checked()
            skip.check()
            assert not submit.is_disabled() and block.inner_text().startswith("Submitting anyway:")
            skip.uncheck()
            assert submit.is_disabled() and block.inner_text().startswith("Submit is disabled:")
            form.locator("[data-testid=hp-env-section]").scroll_into_view_if_needed()
            page.screenshot(path=os.path.join(artifacts, "1-incompatible.png"))
            # the dev cluster's own interpreter (the notebook's): all the same, Submit enabled again
            skip.check()
            form.get_by_label("Job name", exact=True).fill("envparity-ui-skip")
            submit.click()  # sent with skip_env_check: true, so the server submits instead of answering 409
            row = sidebar.locator("[data-testid=hp-job]", has_text="envparity-ui-skip")
            row.first.wait_for()
            job_id = row.first.get_attribute("data-job-id")
            Client(JobStore()).cancel(job_id)  # the stand-in interpreter cannot run it
            form.locator("[data-testid=hp-env]").wait_for()  # the form stays open after a submission
            form.get_by_label("Cluster", exact=True).select_option(dev_cluster.name)
            env.locator("xpath=self::*[@data-summary='ok']").wait_for()
            assert not submit.is_disabled() and not block.is_visible() and not skip.is_visible()
            form.locator("[data-testid=hp-env-export-button]").click()
            path = form.locator("[data-testid=hp-env-export-path]")
            path.wait_for()
            assert f"{env_dir}/requirements.txt" in path.inner_text()
            assert "-m venv" in form.locator("[data-testid=hp-env-export-command]").inner_text()
            page.screenshot(path=os.path.join(artifacts, "2-ok-exported.png"))
            browser.close()
    finally:
        lab.stop()
        if not existed:
            _shutil.rmtree(env_dir, ignore_errors=True)


def test_export_keeps_the_shared_folder_open_to_other_users_and_writes_into_the_users_own(tmp_path):
    """Issue 24 #9, second half: `env export` run first on a cluster used to `mkdir -p`
    `<shared_root>/hyperpod-lab/envs` at 0700, so the shared `hyperpod-lab/` became one user's
    and every other user's submit was refused. Now it makes (and checks) the user's tree first."""
    from hyperpod_lab.schedulers.remote.local import LocalRemote

    root = tmp_path / "fsx"
    root.mkdir()
    prof = ClusterProfile(name="t", orchestrator="local", shared_root=str(root))
    remote = LocalRemote()
    res = envparity.export(prof, "nb", remote=remote)
    user = remote.user_name()
    assert res["path"] == f"{root}/hyperpod-lab/{user}/envs/nb/requirements.txt"
    assert os.path.isfile(res["path"])
    assert stat.S_IMODE(os.stat(root / "hyperpod-lab").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "hyperpod-lab" / user).st_mode) == 0o700
    assert not os.path.exists(root / "hyperpod-lab" / "envs")
