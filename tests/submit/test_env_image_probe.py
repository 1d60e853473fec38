"""The environment check of a container image (issue 25 #5): ``hyperpod-lab env diff
--container-image IMAGE`` (or a Slurm profile's ``container_image``) asks the image's interpreter,
through pyxis's ``srun --container-image``, on a compute node.

pyxis and enroot cannot be installed here (they need a container runtime and root-owned hooks in
slurmd; docs/containers.md), so:

* against the real dev cluster (real sshd, real Slurm 22.05 srun, no pyxis) the probe must name
  the missing pyxis: srun's own answer to an unknown option ("srun: unrecognized option
  '--container-image=...'", exit 255, as this machine's /usr/bin/srun prints it);
* the happy path runs the rendered command through ``PyxisStandIn``, a FAKE pyxis (named so):
  it checks the srun and pyxis words (pyxis README "Usage": --container-image,
  --container-mounts SRC:DST[,SRC:DST], --container-workdir, --no-container-mount-home) and runs
  what follows them, the probe, with this machine's interpreter standing in for the image's
  ``python``.
"""

from __future__ import annotations

import dataclasses
import io
import sys

import pytest

from hyperpod_lab import cli
from hyperpod_lab.errors import EnvironmentMismatch, SpecError
from hyperpod_lab.schedulers.remote.local import LocalRemote
from hyperpod_lab.schedulers.slurm import CONTAINER_PYTHON
from hyperpod_lab.submit import envparity
from hyperpod_lab.submit.clusters import ClusterProfile

IMAGE = "nvcr.io/nvidia/pytorch:25.01-py3"


class PyxisStandIn(LocalRemote):
    """FAKE pyxis on a local 'login node' (pyxis cannot run here): runs ``srun <options>
    python <probe...>`` as ``<this interpreter> <probe...>`` after checking the options; records
    each argv. ``answer`` replaces the run with a canned (exit status, stdout, stderr)."""

    def __init__(self, answer=None):
        super().__init__()
        self.argvs: list[list[str]] = []
        self.answer = answer

    def run(self, argv, check=True, timeout_s=60.0, input=None, idempotent=False):
        argv = list(argv)
        self.argvs.append(argv)
        assert argv[0] == "srun", argv
        at = argv.index(CONTAINER_PYTHON)
        opts = argv[1:at]
        assert all(o.startswith("--") for o in opts), opts  # every srun/pyxis word is one --option=value
        if self.answer is not None:
            from hyperpod_lab.schedulers.remote import CommandResult

            return CommandResult(*self.answer)
        return super().run([sys.executable, *argv[at + 1:]], check=check, timeout_s=timeout_s, input=input)


def slurm_profile(tmp_path, **kw) -> ClusterProfile:
    return ClusterProfile(name="pyxis-cluster", orchestrator="slurm", host="login.example", user="u",
                          shared_root=str(tmp_path / "fsx"), python="/opt/venv/bin/python", **kw).validate()


def test_the_image_is_probed_with_pyxis_options_and_its_answer_is_diffed(tmp_path):
    prof = slurm_profile(tmp_path)
    remote = PyxisStandIn()
    report = envparity.env_diff(prof, None, remote=remote, container_image=IMAGE)
    [argv] = remote.argvs  # one command
    assert argv[:4] == ["srun", "--nodes=1", "--ntasks=1", "--immediate=60"]
    assert "--container-image=nvcr.io#nvidia/pytorch:25.01-py3" in argv  # enroot's REGISTRY#IMAGE
    assert f"--container-mounts={prof.shared_root}:{prof.shared_root},/dev/shm:/dev/shm" in argv
    assert "--no-container-mount-home" in argv
    assert argv[argv.index(CONTAINER_PYTHON) + 1] == "-I"  # the probe, as for the host interpreter
    assert report["python"] == f"{CONTAINER_PYTHON} in {IMAGE}" and report["container_image"] == IMAGE
    assert report["remote"]["executable"] == sys.executable and report["remote"]["container_image"] == IMAGE
    assert report["summary"] == "ok", report["differences"]


def test_the_profiles_image_is_the_default_and_the_cli_flag_overrides_it(tmp_path):
    prof = slurm_profile(tmp_path, container_image="/fsx/images/train.sqsh")
    remote = PyxisStandIn()
    assert envparity.env_diff(prof, None, remote=remote)["container_image"] == "/fsx/images/train.sqsh"
    assert "--container-image=/fsx/images/train.sqsh" in remote.argvs[0]
    plain = envparity.env_diff(dataclasses.replace(prof, container_image=None), None, remote=PyxisStandIn(),
                               container_image=IMAGE)
    assert plain["container_image"] == IMAGE
    with pytest.raises(SpecError, match="container_image"):
        envparity.probe_image(prof, "docker://evil image", remote=PyxisStandIn())


def test_an_image_without_python_is_named(tmp_path):
    remote = PyxisStandIn(answer=(127, "", "slurmstepd: error: execve(): python: No such file or directory\n"))
    with pytest.raises(EnvironmentMismatch, match=r"did not answer the environment probe.*exit status 127"):
        envparity.env_diff(slurm_profile(tmp_path), None, remote=remote, container_image=IMAGE)


def test_no_free_node_is_named_not_waited_for(tmp_path):
    remote = PyxisStandIn(answer=(1, "", "srun: error: Unable to allocate resources: Immediate execution impossible\n"))
    with pytest.raises(EnvironmentMismatch, match=r"no node was free within 60 s"):
        envparity.probe_image(slurm_profile(tmp_path), IMAGE, remote=remote)


def test_a_real_slurm_without_pyxis_is_named_over_the_real_sshd(dev_cluster, client):
    """The dev cluster: real sshd route, real srun (Slurm 22.05, no pyxis plugin)."""
    sched = client.scheduler(dev_cluster.name)
    sched.remote.ops.clear()
    image = f"{dev_cluster.shared_root}/images/train.sqsh"
    with pytest.raises(EnvironmentMismatch, match=r"pyxis \(and enroot\) are not installed") as e:
        envparity.env_diff(dev_cluster, None, remote=sched.remote, container_image=image)
    assert "unrecognized option '--container-image" in str(e.value)
    assert dict(sched.remote.ops) == {"exec": 1}, sched.remote.ops
    # the CLI says the same and exits non-zero
    out = io.StringIO()
    with pytest.raises(EnvironmentMismatch, match="pyxis"):
        cli.run(["env", "diff", "--cluster", dev_cluster.name, "--container-image", image], out=out, client=client)
