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
from goldens import assert_matches_golden

from hyperpod_lab import cli
from hyperpod_lab.errors import ConfigError, SpecError
from hyperpod_lab.schedulers import for_profile
from hyperpod_lab.schedulers.eks.manifest import (
    DEEP_HEALTH_CHECK_LABEL,
    STEP_LOG_PATTERN,
    render_hyperpod_pytorch_job,
    render_job_configmap,
    render_kubeflow_pytorch_job,
    render_lighthouse_service,
    to_yaml,
)
from hyperpod_lab.spec import ElasticPolicy, JobSpec, ResiliencyPolicy
from hyperpod_lab.submit.clusters import ClusterProfile, save_profile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    # issue 28: replica groups as pods under the Lighthouse's pod (and Service), elastic 1..3 groups
    "checkpointless": JobSpec(script="train_lm.py", name="ft", cluster="hp-eks", nodes=2, procs_per_node=2,
                              args=["--steps", "40", "$(id)"], resiliency=ResiliencyPolicy(recovery="checkpointless"),
                              elastic=ElasticPolicy(min_nodes=1, max_nodes=3, global_batch_size=16)),
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
    out["lighthouse_service.yaml"] = render_lighthouse_service(SPECS["checkpointless"], JOB_ID, p)
    return out


@pytest.mark.parametrize("name", sorted(rendered()))
def test_render_matches_golden(name):
    assert_matches_golden(to_yaml(rendered()[name]), os.path.join(GOLDEN, name), "manifest")


def test_every_rendered_resource_is_valid_for_the_sdk():
    res = rendered()
    hp = [r["spec"] for n, r in sorted(res.items()) if n.startswith("hyperpod_")]
    templates = [rs["template"] for n, r in sorted(res.items()) if n.startswith("kubeflow_")
                 for rs in r["spec"]["pytorchReplicaSpecs"].values()]
    assert len(hp) == 4 and len(templates) == 6
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
    # restart mode: hyperpodrun starts one process per pod, our launch agent, which runs the 4 ranks
    assert hp["nprocPerNode"] == "1" and hp["replicaSpecs"][0]["replicas"] == 2
    assert hp["replicaSpecs"][0]["maxReplicas"] == 4
    assert hp["elasticPolicy"] == {"minReplicas": 1, "maxReplicas": 4, "replicaIncrementStep": 1,
                                   "gracefulShutdownTimeoutInSeconds": 120}
    assert hp["runPolicy"]["jobMaxRetryCount"] == 3 and hp["runPolicy"]["restartPolicy"]["evalPeriodSeconds"] > 0
    assert hp["runPolicy"]["activeDeadlineSeconds"] == 90 * 60
    pod = hp["replicaSpecs"][0]["template"]["spec"]
    assert pod["nodeSelector"] == {NODE_HEALTH_LABEL: "Schedulable"}
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
    assert "elasticPolicy" not in once
    fixed = render_hyperpod_pytorch_job(SPECS["fixed"], JOB_ID, profile())["spec"]
    assert fixed["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"][-1] == "$$(id)"  # kubelet: $(id)
    kf = render_kubeflow_pytorch_job(SPECS["elastic"], JOB_ID, profile(operator="kubeflow"))["spec"]
    assert kf["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 4, "maxRestarts": 3}
    assert list(kf["pytorchReplicaSpecs"]) == ["Worker"] and kf["pytorchReplicaSpecs"]["Worker"]["replicas"] == 2
    fixed_kf = render_kubeflow_pytorch_job(SPECS["fixed"], JOB_ID, profile(operator="kubeflow"))["spec"]
    assert [(k, r["replicas"]) for k, r in fixed_kf["pytorchReplicaSpecs"].items()] == [("Master", 1), ("Worker", 1)]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8}, "requests": {"nvidia.com/gpu": 8}}


def test_spares_map_to_the_replica_specs_spares_field():
    """FACTS.md (the sagemaker-hyperpod SDK's model): ``replicaSpecs[].spares``; the SDK model
    accepts it. Kubeflow's PyTorchJob has no such field: a clear error, not a silent drop."""
    spec = JobSpec(script="train.py", nodes=2, procs_per_node=8,
                   resiliency=ResiliencyPolicy(spares=1)).validate()
    hp = render_hyperpod_pytorch_job(spec, JOB_ID, profile())["spec"]
    assert hp["replicaSpecs"][0]["replicas"] == 2 and hp["replicaSpecs"][0]["spares"] == 1
    assert sdk_validate(jobs=[hp]) == []
    assert "spares" not in render_hyperpod_pytorch_job(SPECS["fixed"], JOB_ID, profile())["spec"]["replicaSpecs"][0]
    with pytest.raises(SpecError, match="resiliency.spares"):
        render_kubeflow_pytorch_job(spec, JOB_ID, profile(operator="kubeflow"))


def test_hang_detection_pattern_matches_the_step_lines():
    import re

    with open(os.path.join(REPO, "examples", "train_lm.py")) as f:
        assert 'log(f"step {step} loss {final_loss:.4f}' in f.read()  # the line the pattern watches
    assert re.match(STEP_LOG_PATTERN, "step 12 loss 2.3456 tok/s 5120").group(1) == "12"
    assert not re.match(STEP_LOG_PATTERN, "train_lm: 1,234 params, corpus 2 bytes")


def test_hang_rule_follows_the_runtimes_step_line_and_hang_timeout(tmp_path):
    """The operator's JobHangingDetection rule watches the line the runtime really prints (a real
    ``hp.init()`` + ``ctx.step`` in a fresh process), and its period is the spec's hang timeout plus
    the line's print interval (rounded up), else HANG_AFTER_S."""
    import re
    import sys

    from hyperpod_lab.schedulers.eks.manifest import HANG_AFTER_S, hang_after_s

    code = ("import time\n"
            "import hyperpod_lab.runtime as hp\n"
            "with hp.init() as ctx:\n"
            "    for s in range(3):\n"
            "        ctx.step(s, 0.5 + s)\n"
            "        time.sleep(0.02)  # > the 1 ms print interval: each step's line is printed\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERPOD_LAB_")}
    env.update(HYPERPOD_LAB_JOB_DIR=str(tmp_path / "job"), HYPERPOD_LAB_STEP_EVENT_INTERVAL_S="0.001")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("hyperpod-lab: rank")]
    assert lines == ["hyperpod-lab: rank 0 step 0 loss 0.5", "hyperpod-lab: rank 0 step 1 loss 1.5",
                     "hyperpod-lab: rank 0 step 2 loss 2.5"], out.stdout
    assert [re.match(STEP_LOG_PATTERN, ln).group(1) for ln in lines] == ["0", "1", "2"]

    def rule(spec):
        hp = render_hyperpod_pytorch_job(spec, JOB_ID, profile())["spec"]
        rules = {r["name"]: r for r in hp["runPolicy"]["logMonitoringConfiguration"]}
        assert rules["JobHangingDetection"]["logPattern"] == STEP_LOG_PATTERN
        assert sdk_validate(jobs=[hp]) == []
        return rules["JobHangingDetection"]["expectedRecurringFrequencyInSeconds"]

    assert rule(SPECS["fixed"]) == HANG_AFTER_S == 600
    timed = JobSpec(script="train.py", nodes=2, procs_per_node=8,
                    resiliency=ResiliencyPolicy(hang_timeout_s=45.0)).validate()
    assert rule(timed) == hang_after_s(timed) == 46  # T 45 s + the default 1 s line interval
    slow_lines = JobSpec(script="train.py", nodes=2, procs_per_node=8, env={"HYPERPOD_LAB_STEP_EVENT_INTERVAL_S": "2.5"},
                         resiliency=ResiliencyPolicy(hang_timeout_s=45.2)).validate()
    assert rule(slow_lines) == 48  # ceil(45.2 + 2.5)


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
    # checkpointless hot spares run on Slurm only: on EKS the operator replaces the lost group's pod
    cpl = JobSpec(script="t.py", nodes=2, resiliency=ResiliencyPolicy(recovery="checkpointless", spares=1)).validate()
    for render in (render_hyperpod_pytorch_job, render_kubeflow_pytorch_job):
        with pytest.raises(SpecError, match="hot spares of a checkpointless job run on Slurm only"):
            render(cpl, JOB_ID, profile())


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
    cmd = job["spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"]
    assert cmd[-3:] == ["hyperpod-lab-agent", "--steps", "40"]  # "$@" of the agent's shell line
    assert "--nproc-per-node=2 " in cmd[-4] and cmd[-4].endswith('/opt/hyperpod-lab/job/train_lm.py "$$@"')
    assert sdk_validate(jobs=[job["spec"]]) == []


# ---- conformance with the upstream sources (issue 17) ----------------------------------------
from hyperpod_lab.schedulers.eks.manifest import NODE_HEALTH_LABEL, TTL_AFTER_FINISHED_S, resource_name  # noqa: E402

CRD_SCHEMA = os.path.join(HERE, "fixtures", "kubeflow_pytorchjob_v1.9.0.schema.yaml")


def strict(schema):
    """The CRD schema with unknown fields made errors: the API server prunes fields a structural
    schema does not name (Kubernetes docs, "Field pruning"), so a field we render that it lacks
    would be silently dropped. Objects that keep unknown fields (x-kubernetes-preserve-unknown-
    fields) or are maps (additionalProperties) stay as they are."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_errors(resource):
    import jsonschema

    with open(CRD_SCHEMA) as f:
        schema = strict(yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))
    v = jsonschema.Draft7Validator(schema)
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(resource))


def kubeflow_renders():
    kf = profile(operator="kubeflow", efa=True, shm_size="64Gi")
    out = [r for n, r in sorted(rendered().items()) if n.startswith("kubeflow_")]
    out += [render_kubeflow_pytorch_job(s, JOB_ID, kf) for s in SPECS.values()]
    return out


def test_every_rendered_pytorchjob_is_valid_for_the_kubeflow_crd():
    """kubeflow/training-operator v1.9.0 manifests/base/crds/kubeflow.org_pytorchjobs.yaml,
    openAPIV3Schema (vendored in tests/fixtures with its source): every rendered PyTorchJob
    validates with jsonschema, unknown fields counted as errors; the check can fail."""
    for job in kubeflow_renders():
        assert crd_errors(job) == [], job["metadata"]["name"]
    bad = json.loads(json.dumps(kubeflow_renders()[0]))
    bad["spec"]["runPolicy"]["jobMaxRetryCount"] = 3  # a HyperPod field: the API server would prune it
    bad["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "2"
    errors = crd_errors(bad)
    assert any("jobMaxRetryCount" in e for e in errors) and any("replicas" in e for e in errors)


def test_names_are_dns_1035_and_pod_names_fit_63_characters():
    """kubeflow/training-operator pkg/webhooks/pytorch/pytorchjob_webhook.go validatePyTorchJob:
    ``NameIsDNS1035Label(metadata.name)`` (a letter first); the operator names pods and services
    ``<job>-<replica type>-<index>``, DNS labels of at most 63 characters, for every index up to
    the largest replica count the job can reach (elastic max)."""
    import re

    dns1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
    ids = [JOB_ID, "7b-model-20261123-010203-abcdef0123456789", "9" * 80 + "-20261123-010203-abcdef0123456789",
           "x" * 200 + "-20261123-010203-abcdef0123456789", "Ünïcode name-20261123-010203-00ff00ff00ff00ff"]
    names = [resource_name(i) for i in ids]
    assert len(set(names)) == len(names)
    for name in names:
        assert dns1035.fullmatch(name) and len(name) <= 63, name
        assert len(f"{name}-workers-{10 ** 5 - 1}") <= 63 and len(f"{name}-master-0") <= 63
    big = JobSpec(script="t.py", nodes=1, elastic=ElasticPolicy(min_nodes=1, max_nodes=1000)).validate()
    for job in (render_kubeflow_pytorch_job(big, ids[3], profile(operator="kubeflow")),
                render_hyperpod_pytorch_job(big, ids[3], profile())):
        assert len(f"{job['metadata']['name']}-worker-999") <= 63 and dns1035.fullmatch(job["metadata"]["name"])
    huge = JobSpec(script="t.py", nodes=1, elastic=ElasticPolicy(min_nodes=1, max_nodes=10 ** 6)).validate()
    with pytest.raises(SpecError, match="63 characters"):
        render_kubeflow_pytorch_job(huge, ids[3], profile(operator="kubeflow"))


def test_node_selector_uses_the_health_label_meant_for_scheduling():
    """AWS HyperPod docs, "Health Monitoring System" (node labels) and awsome-distributed-training
    3.test_cases/pytorch/FSDP/kubernetes/llama3_1_8b-fsdp-hpto.yaml (nodeAffinity
    ``sagemaker.amazonaws.com/node-health-status In [Schedulable]``): HyperPodPyTorchJob pods
    require Schedulable nodes; ``deep-health-check-status: Passed`` exists only on nodes that ran
    a deep health check, so it is required only with ``resiliency.deep_health_check``."""
    pod = render_hyperpod_pytorch_job(SPECS["fixed"], JOB_ID, profile())["spec"]["replicaSpecs"][0]["template"]["spec"]
    assert pod["nodeSelector"] == {NODE_HEALTH_LABEL: "Schedulable"}
    deep = JobSpec(script="t.py", resiliency=ResiliencyPolicy(deep_health_check=True)).validate()
    pod = render_hyperpod_pytorch_job(deep, JOB_ID, profile())["spec"]["replicaSpecs"][0]["template"]["spec"]
    assert pod["nodeSelector"] == {NODE_HEALTH_LABEL: "Schedulable", DEEP_HEALTH_CHECK_LABEL: "Passed"}
    kf = render_kubeflow_pytorch_job(SPECS["fixed"], JOB_ID, profile(operator="kubeflow"))["spec"]
    assert "nodeSelector" not in kf["pytorchReplicaSpecs"]["Master"]["template"]["spec"]


def test_dev_shm_is_memory_backed_and_sized():
    """awsome-distributed-training FSDP kubernetes manifests mount a ``shmem`` volume at
    /dev/shm; Kubernetes docs, "emptyDir" (``medium: Memory`` is a tmpfs, ``sizeLimit`` bounds
    it): the memory checkpoint tier writes there, so it gets the profile's ``shm_size``."""
    for job in (render_hyperpod_pytorch_job(SPECS["fixed"], JOB_ID, profile(shm_size="64Gi")),
                render_kubeflow_pytorch_job(SPECS["fixed"], JOB_ID, profile(operator="kubeflow", shm_size="64Gi"))):
        spec = job["spec"]
        tmpl = (spec.get("replicaSpecs") or [None])[0] or spec["pytorchReplicaSpecs"]["Master"]
        pod = tmpl["template"]["spec"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}} in pod["volumes"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    with pytest.raises(ConfigError, match="shm_size"):
        profile(shm_size="lots")


def test_efa_devices_and_variables_when_the_profile_has_efa():
    """awsome-distributed-training 3.test_cases/pytorch/FSDP/kubernetes/llama3_1_8b-fsdp-hpto.yaml:
    ``vpc.amazonaws.com/efa`` in requests and limits, FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1,
    FI_EFA_FORK_SAFE=1; none without the profile's ``efa``."""
    c = render_hyperpod_pytorch_job(SPECS["fixed"], JOB_ID, profile(efa=True, efa_per_node=32))[
        "spec"]["replicaSpecs"][0]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 32} == c["resources"]["requests"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["FI_PROVIDER"] == "efa" and env["FI_EFA_USE_DEVICE_RDMA"] == "1" and env["FI_EFA_FORK_SAFE"] == "1"
    plain = render_hyperpod_pytorch_job(SPECS["fixed"], JOB_ID, profile())["spec"]["replicaSpecs"][0]
    assert "FI_PROVIDER" not in json.dumps(plain) and "efa" not in json.dumps(plain["template"]["spec"]["containers"])


def test_finished_jobs_stay_readable_for_a_while():
    """Kubeflow RunPolicy.ttlSecondsAfterFinished (CRD) and HyperPodPyTorchJob
    runPolicy.ttlSecondsAfterFinished (sagemaker-hyperpod SDK model): the operator deletes a
    finished job after it, so it is set long enough for the watcher to read the final status."""
    hp = render_hyperpod_pytorch_job(SPECS["fixed"], JOB_ID, profile())["spec"]["runPolicy"]
    kf = render_kubeflow_pytorch_job(SPECS["fixed"], JOB_ID, profile(operator="kubeflow"))["spec"]["runPolicy"]
    assert hp["ttlSecondsAfterFinished"] == kf["ttlSecondsAfterFinished"] == TTL_AFTER_FINISHED_S >= 600


def test_elastic_jobs_use_the_min_max_nnodes_form():
    """awsome-distributed-training 3.test_cases/pytorch/FSDP/kubernetes/fsdp.yaml-template:
    torchrun ``--nnodes=$MIN_NODES:$MAX_NODES`` with elasticPolicy; hyperpodrun takes torchrun's
    options. The Kubeflow operator passes it as PET_NNODES from elasticPolicy (no --nnodes)."""
    hp = render_hyperpod_pytorch_job(SPECS["elastic"], JOB_ID, profile())["spec"]
    cmd = hp["replicaSpecs"][0]["template"]["spec"]["containers"][0]["command"]
    assert "--nnodes=1:4" in cmd and hp["elasticPolicy"]["minReplicas"] == 1 and hp["elasticPolicy"]["maxReplicas"] == 4
    kf = render_kubeflow_pytorch_job(SPECS["elastic"], JOB_ID, profile(operator="kubeflow"))["spec"]
    assert not any(w.startswith("--nnodes") for w in kf["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
                   ["containers"][0]["command"])


# ---- checkpointless on EKS (issue 28 items 2 and 3) -------------------------------------------
def _k8s_unescape(text: str) -> str:
    """What the kubelet passes for a command word without variable references: ``$$`` -> ``$``
    (Kubernetes API reference, Container ``command``/``args``: "Double $$ are reduced to a single $")."""
    return text.replace("$$", "$")


def test_checkpointless_renders_groups_as_pods_under_the_lighthouses_service():
    """One pod per replica group running our launch agent (``--standalone``, the Slurm step's
    options), the Lighthouse's own pod selected by the Service whose DNS name the groups get as
    ``$TORCHFT_LIGHTHOUSE``; a fault restarts one pod, never the whole job."""
    from hyperpod_lab.schedulers.eks.manifest import LIGHTHOUSE_PORT, ROLE_LABEL, extra_resources

    spec = SPECS["checkpointless"]
    svc, = extra_resources(spec, JOB_ID, profile())
    assert extra_resources(spec, JOB_ID, profile(operator="kubeflow")) == []
    assert extra_resources(SPECS["fixed"], JOB_ID, profile()) == []
    for job in (render_hyperpod_pytorch_job(spec, JOB_ID, profile()),
                render_kubeflow_pytorch_job(spec, JOB_ID, profile(operator="kubeflow"))):
        body = job["spec"]
        if job["kind"] == "HyperPodPyTorchJob":
            (lh, groups) = body["replicaSpecs"]
            assert (lh["name"], lh["replicas"], groups["name"], groups["replicas"], groups["maxReplicas"]) == (
                "lighthouse", 1, "workers", 2, 3)
            assert body["runPolicy"]["restartPolicy"]["maxFullJobRestarts"] == 0  # pod restarts only
            assert body["elasticPolicy"]["minReplicas"] == 1 and body["elasticPolicy"]["maxReplicas"] == 3
        else:  # Kubeflow: the Master is the Lighthouse (the job succeeds with it), Worker i is group i
            lh, groups = body["pytorchReplicaSpecs"]["Master"], body["pytorchReplicaSpecs"]["Worker"]
            assert lh["replicas"] == 1 and groups["replicas"] == 2
            assert lh["restartPolicy"] == groups["restartPolicy"] == "OnFailure"
            assert body["elasticPolicy"] == {"minReplicas": 1, "maxReplicas": 3, "maxRestarts": 3}
        lh_pod, g_pod = lh["template"], groups["template"]
        # the Service selects the Lighthouse's pod and no group's
        sel = svc["spec"]["selector"].items()
        assert sel <= lh_pod["metadata"]["labels"].items() and not sel <= g_pod["metadata"]["labels"].items()
        assert lh_pod["metadata"]["labels"][ROLE_LABEL] == "lighthouse"
        lc, gc = lh_pod["spec"]["containers"][0], g_pod["spec"]["containers"][0]
        assert lc["command"][:3] == ["python", "-m", "hyperpod_lab.node.lighthouse"]
        assert f"--port={LIGHTHOUSE_PORT}" in lc["command"] and "--until-finished" in lc["command"]
        assert "--min-replicas=1" in lc["command"] and lc["ports"] == [{"containerPort": LIGHTHOUSE_PORT}]
        assert {"name": "HYPERPOD_LAB_LIGHTHOUSE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} \
            in lc["env"]
        assert "resources" not in lc  # no GPUs for the Lighthouse
        env = {e["name"]: e.get("value") for e in gc["env"]}
        if job["kind"] == "HyperPodPyTorchJob":  # our Service's DNS name
            assert env["TORCHFT_LIGHTHOUSE"] == f"http://{svc['metadata']['name']}.ml.svc:{LIGHTHOUSE_PORT}"
            assert svc["spec"]["ports"][0]["targetPort"] == LIGHTHOUSE_PORT
        else:  # the Service the training operator gives the Master pod, as its MASTER_ADDR
            assert env["TORCHFT_LIGHTHOUSE"] == f"http://{JOB_ID}-master-0:{LIGHTHOUSE_PORT}"
        assert env["HYPERPOD_LAB_REPLICA_GROUPS"] == "2" and env["HYPERPOD_LAB_JOB_DIR"] == f"/fsx/hyperpod-lab/jobs/{JOB_ID}"
        assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in gc["env"]
        assert gc["command"][:2] == ["/bin/sh", "-c"] and gc["command"][3:] == ["hyperpod-lab-group", "--steps", "40",
                                                                                "$$(id)"]
        assert "exec python -m hyperpod_lab.node.launch --standalone --nnodes=1 --nproc-per-node=2 " \
               "--max-restarts=3 --monitor-interval=0.1" in _k8s_unescape(gc["command"][2])
        assert "hyperpodrun" not in json.dumps(job)  # our agent in every pod
    assert sdk_validate(jobs=[render_hyperpod_pytorch_job(spec, JOB_ID, profile())["spec"]]) == []
    assert crd_errors(render_kubeflow_pytorch_job(spec, JOB_ID, profile(operator="kubeflow"))) == []


def test_the_group_command_takes_the_group_from_the_pod_name(tmp_path):
    """The rendered ``/bin/sh -c`` text run by a real /bin/sh, as the kubelet passes it: the
    trailing index of ``$POD_NAME`` becomes ``$HYPERPOD_LAB_REPLICA_GROUP`` (and the log folder),
    the script's arguments arrive as given (``$(id)`` not expanded); a pod name without an index
    stops with exit 2. ``python`` on PATH is a STAND-IN here that prints its argv and the group."""
    spec = SPECS["checkpointless"]
    cmd = [_k8s_unescape(w) for w in render_kubeflow_pytorch_job(spec, JOB_ID, profile(operator="kubeflow"))[
        "spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]]
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\necho "group=$HYPERPOD_LAB_REPLICA_GROUP"\nfor a in "$@"; do echo "arg=$a"; done\n')
    stub.chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "POD_NAME": f"{JOB_ID}-worker-12"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"hyperpod-lab: pod {JOB_ID}-worker-12 runs replica group 12" and lines[1] == "group=12"
    assert f"arg=--log-dir=/fsx/hyperpod-lab/jobs/{JOB_ID}/logs/torchrun/group-12" in lines
    assert lines[-4:] == ["arg=/opt/hyperpod-lab/job/train_lm.py", "arg=--steps", "arg=40", "arg=$(id)"]
    bad = subprocess.run(cmd, capture_output=True, text=True, env={**env, "POD_NAME": "lighthouse"}, timeout=30)
    assert bad.returncode == 2 and "ends in no replica group number" in bad.stderr


def test_checkpointless_dry_run_prints_the_lighthouse_service_for_hyperpod():
    """``submit --dry-run --recovery checkpointless`` of the example, unchanged: the ConfigMap, the
    HyperPodPyTorchJob and its Lighthouse Service (the EKS backend creates the three in that order);
    a Kubeflow profile needs no Service of ours (the Master's is the operator's)."""
    script = os.path.join(REPO, "examples", "train_lm.py")
    for name, operator, kinds in (("eks-ft-hp", None, ["ConfigMap", "HyperPodPyTorchJob", "Service"]),
                                  ("eks-ft-kf", "kubeflow", ["ConfigMap", "PyTorchJob"])):
        save_profile(profile(name=name, operator=operator))
        out = io.StringIO()
        cli.run(["submit", script, "--cluster", name, "--nodes", "2", "--procs-per-node", "1",
                 "--recovery", "checkpointless", "--elastic", "1:2", "--dry-run", "--", "--steps", "40"], out=out)
        docs = [d for d in yaml.safe_load_all(out.getvalue()) if d]
        assert [d["kind"] for d in docs] == kinds
        assert JobSpec.from_json(docs[0]["data"]["spec.json"]).resiliency.recovery == "checkpointless"
        if operator is None:
            assert sdk_validate(jobs=[docs[1]["spec"]]) == []
            assert docs[2]["metadata"]["name"] == docs[1]["metadata"]["name"] + "-lighthouse"
        else:
            assert crd_errors(docs[1]) == []
