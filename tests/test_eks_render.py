"""The EKS renderers (pure): HyperPodPyTorchJob, Kubeflow PyTorchJob and the job's ConfigMap,
against golden files, and every rendered resource validated against the official
``sagemaker-hyperpod`` SDK's pydantic model (``_HyperPodPytorchJob``; the Kubeflow pod
templates against its ``Template``) in the separate ``.venv-sdk`` (scripts/setup.sh makes it: the
SDK pins its own versions and brings pytest plugins, so it stays out of ``.venv``). A missing SDK
fails these tests with the install command. Also: the example script renders, unchanged, through
``hyperpod-lab submit --dry-run`` for an EKS profile."""

from __future__ import annotations

import io
import json
import os
import subprocess

import pytest
import yaml

from hyperpod_lab import cli
from hyperpod_lab.clusters import ClusterProfile, save_profile
from hyperpod_lab.errors import ConfigError, SpecError
from hyperpod_lab.schedulers import for_profile
from hyperpod_lab.schedulers.k8s_manifest import (DEEP_HEALTH_CHECK_LABEL, STEP_LOG_PATTERN, render_hyperpod_pytorch_job,
                                                  render_job_configmap, render_kubeflow_pytorch_job, to_yaml)
from hyperpod_lab.spec import ElasticPolicy, JobSpec, ResiliencyPolicy
from goldens import assert_matches_golden

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
GOLDEN = os.path.join(HERE, "golden", "eks")
SDK_PYTHON = os.path.join(REPO, ".venv-sdk", "bin", "python")
JOB_ID = "train-lm-20261123-010203-abcd"


def profile(**kw) -> ClusterProfile:
    base = dict(name="hp-eks", orchestrator="eks", eks_cluster="ml-eks", region="us-west-2",
                image="123456789012.dkr.ecr.us-west-2.amazonaws.com/train:1", pvc="fsx-claim", namespace="ml",
                gpus_per_node=8)
    base.update(kw)
    return ClusterProfile(**base).validate()


SPECS = {
    "fixed": JobSpec(script="/home/me/train_lm.py", name="train lm", cluster="hp-eks", nodes=2, procs_per_node=8,
                     args=["--steps", "100", "$(id)"], env={"WANDB_MODE": "off"}),
    "elastic": JobSpec(script="train_lm.py", name="elastic", cluster="hp-eks", nodes=2, procs_per_node=4,
                       elastic=ElasticPolicy(min_nodes=1, max_nodes=4, global_batch_size=64), time_limit_min=90),
    "no_resume": JobSpec(script="train_lm.py", name="once", cluster="hp-eks", nodes=1, procs_per_node=1,
                         resiliency=ResiliencyPolicy(auto_resume=False, max_retries=2, health_checks=False)),
}


def sdk_validate(jobs=(), templates=(), statuses=()) -> list:
    """Errors the SDK's models report (``[[kind, index, message], ...]``); fails if the SDK is missing."""
    if not os.path.exists(SDK_PYTHON):
        pytest.fail("the sagemaker-hyperpod SDK venv is missing; run 'bash scripts/setup.sh' (it creates .venv-sdk "
                    "with: python3 -m venv .venv-sdk && .venv-sdk/bin/pip install sagemaker-hyperpod==3.12.0)",
                    pytrace=False)
    r = subprocess.run([SDK_PYTHON, os.path.join(HERE, "sdk_validate.py")], capture_output=True, text=True,
                       input=json.dumps({"jobs": list(jobs), "templates": list(templates), "statuses": list(statuses)}),
                       timeout=120)
    if r.returncode != 0:
        pytest.fail(f"the SDK validator did not run (is sagemaker-hyperpod installed in .venv-sdk? "
                    f"'.venv-sdk/bin/pip install sagemaker-hyperpod==3.12.0'):\n{r.stderr[-2000:]}", pytrace=False)
    return json.loads(r.stdout)["errors"]


def rendered():
    p, kf = profile(), profile(operator="kubeflow")
    out = {}
    for key, spec in SPECS.items():
        spec.validate()
        out[f"hyperpod_{key}.yaml"] = render_hyperpod_pytorch_job(spec, JOB_ID, p)
        out[f"kubeflow_{key}.yaml"] = render_kubeflow_pytorch_job(spec, JOB_ID, kf)
    cm = render_job_configmap(SPECS["fixed"], JOB_ID, p, b"import sys\nprint('hello', sys.argv)\n")
    assert JobSpec.from_json(cm["data"]["spec.json"]) == SPECS["fixed"]  # the spec travels whole
    cm["data"]["spec.json"] = "<JobSpec.to_json()>"  # its fields belong to spec.py, not to this golden file
    out["configmap.yaml"] = cm
    return out


@pytest.mark.parametrize("name", sorted(rendered()))
def test_render_matches_golden(name):
    assert_matches_golden(to_yaml(rendered()[name]), os.path.join(GOLDEN, name), "manifest")


def test_every_rendered_resource_is_valid_for_the_sdk():
    res = rendered()
    hp = [r["spec"] for n, r in sorted(res.items()) if n.startswith("hyperpod_")]
    templates = [rs["template"] for n, r in sorted(res.items()) if n.startswith("kubeflow_")
                 for rs in r["spec"]["pytorchReplicaSpecs"].values()]
    assert len(hp) == 3 and len(templates) == 4
    assert sdk_validate(jobs=hp, templates=templates) == []


def test_the_sdk_check_rejects_what_the_operator_would():
    """The validation can fail: an unknown nested field, a missing required one, a top-level typo."""
    good = rendered()["hyperpod_elastic.yaml"]["spec"]
    bad_nested = json.loads(json.dumps(good))
    bad_nested["runPolicy"]["jobMaxRetries"] = 3
    bad_required = json.loads(json.dumps(good))
    del bad_required["runPolicy"]["restartPolicy"]["evalPeriodSeconds"]
    bad_top = dict(good, elasticPolicies=good["elasticPolicy"])
    errors = sdk_validate(jobs=[bad_nested, bad_required, bad_top])
    assert [e[1] for e in errors] == [0, 1, 2]
    assert "jobMaxRetries" in errors[0][2] and "eval_period_seconds" in errors[1][2] and "elasticPolicies" in errors[2][2]


def test_policies_map_to_the_fields():
    hp = render_hyperpod_pytorch_job(SPECS["elastic"], JOB_ID, profile())["spec"]
    assert hp["nprocPerNode"] == "4" and hp["replicaSpecs"][0]["replicas"] == 2
    assert hp["replicaSpecs"][0]["maxReplicas"] == 4
    assert hp["elasticPolicy"] == {"minReplicas": 1, "maxReplicas": 4, "replicaIncrementStep": 1,
                                   "gracefulShutdownTimeoutInSeconds": 120}
    assert hp["runPolicy"]["jobMaxRetryCount"] == 3 and hp["runPolicy"]["restartPolicy"]["evalPeriodSeconds"] > 0
    assert hp["runPolicy"]["activeDeadlineSeconds"] == 90 * 60
    pod = hp["replicaSpecs"][0]["template"]["spec"]
    assert pod["nodeSelector"] == {DEEP_HEALTH_CHECK_LABEL: "Passed"}
    c = pod["containers"][0]
    env = {e["name"]: e["value"] for e in c["env"]}
    # the same variables render_sbatch exports; the checkpoint policy is in the spec they point at
    assert env["HYPERPOD_LAB_JOB_DIR"] == f"/fsx/hyperpod-lab/jobs/{JOB_ID}"
    assert env["HYPERPOD_LAB_SPEC"] == "/opt/hyperpod-lab/job/spec.json" and env["HYPERPOD_LAB_SHARED_ROOT"] == "/fsx"
    assert {"name": "fsx", "mountPath": "/fsx"} in c["volumeMounts"]
    assert {"name": "fsx", "persistentVolumeClaim": {"claimName": "fsx-claim"}} in pod["volumes"]
    assert c["command"][:2] == ["hyperpodrun", "--nnodes=1:4"] and c["ports"] == [{"containerPort": 8080}]
    once = render_hyperpod_pytorch_job(SPECS["no_resume"], JOB_ID, profile())["spec"]
    assert once["runPolicy"]["jobMaxRetryCount"] == 0 and "restartPolicy" not in once["runPolicy"]
    assert "nodeSelector" not in once["replicaSpecs"][0]["template"]["spec"] and "elasticPolicy" not in once
    fixed = render_hyperpod_pytorch_job(SPECS["fixed"], JOB_ID, profile())["spec"]
    assert fixed["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"][-1] == "$$(id)"  # kubelet: $(id)
    kf = render_kubeflow_pytorch_job(SPECS["elastic"], JOB_ID, profile(operator="kubeflow"))["spec"]
    assert kf["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 4, "maxRestarts": 3}
    assert list(kf["pytorchReplicaSpecs"]) == ["Worker"] and kf["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    fixed_kf = render_kubeflow_pytorch_job(SPECS["fixed"], JOB_ID, profile(operator="kubeflow"))["spec"]
    assert [(k, r["replicas"]) for k, r in fixed_kf["pytorchReplicaSpecs"].items()] == [("Master", 1), ("Worker", 1)]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8}, "requests": {"nvidia.com/gpu": 8}}


def test_hang_detection_pattern_matches_the_step_lines():
    import re

    with open(os.path.join(REPO, "examples", "train_lm.py")) as f:
        assert 'log(f"step {step} loss {final_loss:.4f}' in f.read()  # the line the pattern watches
    assert re.match(STEP_LOG_PATTERN, "step 12 loss 2.3456 tok/s 5120").group(1) == "12"
    assert not re.match(STEP_LOG_PATTERN, "train_lm: 1,234 params, corpus 2 bytes")


def test_missing_profile_fields_and_big_scripts_are_clear_errors():
    with pytest.raises(ConfigError, match="set 'image'"):
        render_hyperpod_pytorch_job(SPECS["fixed"], JOB_ID, profile(image=None))
    with pytest.raises(ConfigError, match="set 'pvc'"):
        render_kubeflow_pytorch_job(SPECS["fixed"], JOB_ID, profile(pvc=None))
    with pytest.raises(SpecError, match="1 MiB"):
        render_job_configmap(SPECS["fixed"], JOB_ID, profile(), b"#" * (1 << 20))
    with pytest.raises(ConfigError, match="kube_context"):
        ClusterProfile(name="x", orchestrator="eks").validate()
    with pytest.raises(ConfigError, match="operator must be one of"):
        profile(operator="volcano")
    with pytest.raises(ConfigError, match="fill in image, pvc"):
        for_profile(profile(image="FILL-IN: image", pvc="FILL-IN: claim"))
    with pytest.raises(SpecError, match="file name 'my train.py'"):
        render_job_configmap(JobSpec(script="my train.py").validate(), JOB_ID, profile(), b"")
    if hasattr(ResiliencyPolicy(), "recovery"):  # checkpointless recovery runs on Slurm only
        cpl = JobSpec(script="t.py", nodes=2, resiliency=ResiliencyPolicy(recovery="checkpointless"))
        with pytest.raises(SpecError, match="not available on EKS"):
            render_hyperpod_pytorch_job(cpl, JOB_ID, profile())


def test_the_notebooks_dry_run_cell_renders_for_an_eks_profile(monkeypatch):
    """The quickstart notebook's own ``--dry-run`` cell, with only ``--cluster`` changed."""
    import shlex

    with open(os.path.join(REPO, "examples", "quickstart.ipynb")) as f:
        cells = ["".join(c["source"]) for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    line, = [c for c in cells if "--dry-run" in c and c.startswith("%hyperpod submit")]
    argv = shlex.split(line.removeprefix("%hyperpod "))
    assert argv[argv.index("--cluster") + 1] == "local-slurm"
    argv[argv.index("--cluster") + 1] = "eks-notebook"
    save_profile(profile(name="eks-notebook"))
    monkeypatch.chdir(os.path.join(REPO, "examples"))
    out = io.StringIO()
    cli.run(argv, out=out)
    cm, job = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    with open("train_lm.py") as f:
        assert cm["data"]["train_lm.py"] == f.read()
    assert job["kind"] == "HyperPodPyTorchJob" and job["spec"]["replicaSpecs"][0]["replicas"] == 2
    assert JobSpec.from_json(cm["data"]["spec.json"]).checkpoint.every_steps == 10
    assert sdk_validate(jobs=[job["spec"]]) == []


def test_example_renders_unchanged_through_the_cli_dry_run():
    save_profile(profile(name="eks-dry-run"))
    script = os.path.join(REPO, "examples", "train_lm.py")
    out = io.StringIO()
    cli.run(["submit", script, "--cluster", "eks-dry-run", "--nodes", "2", "--procs-per-node", "2",
             "--elastic", "1:3", "--dry-run", "--", "--steps", "40"], out=out)
    docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    cm, job = docs
    assert cm["kind"] == "ConfigMap" and job["kind"] == "HyperPodPyTorchJob"
    assert job["apiVersion"] == "sagemaker.amazonaws.com/v1" and job["metadata"]["namespace"] == "ml"
    with open(script) as f:
        assert cm["data"]["train_lm.py"] == f.read()  # the script travels byte for byte
    assert JobSpec.from_json(cm["data"]["spec.json"]).elastic.max_nodes == 3
    assert job["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"][-3:] == [
        "/opt/hyperpod-lab/job/train_lm.py", "--steps", "40"]
    assert sdk_validate(jobs=[job["spec"]]) == []
