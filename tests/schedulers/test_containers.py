"""Containers on Slurm (issue 25 #5): a JobSpec's or cluster profile's ``container_image`` runs the
training step through pyxis/enroot (``srun --container-image ... --container-mounts ...``).

Neither pyxis nor enroot can be installed here, so nothing below starts a container. What is
checked, and against what:

* every rendered pyxis option against pyxis's own option table (``spank_opts[]`` of args.c at
  every release and at HEAD, recorded in tests/fixtures/pyxis_options.json by
  tests/fixtures/pyxis_options_gen.py from https://github.com/NVIDIA/pyxis), from v0.19.0 (what
  HyperPod's lifecycle script install_enroot_pyxis.sh in aws-samples/awsome-distributed-training
  installs) to the newest;
* the rendered image reference against enroot 3.4.1's own reference grammar (docker::import's
  regular expression in src/docker.sh, in the same fixture), run by bash here;
* the shape against AWS's reference sbatch scripts (awsome-distributed-training,
  3.test_cases/pytorch/FSDP/slurm/*-training.sbatch, 3.test_cases/megatron/megatron-lm/slurm/gpt3/
  2.distributed-training.sbatch, 3.test_cases/pytorch/ddp/slurm/3.container-train.sbatch:
  ``srun ${AUTO_RESUME} -l "${ARGS[@]}"`` with ``--container-image $IMAGE --container-mounts
  /fsx:/fsx``);
* quoting by running the rendered script under bash with stand-in commands that print their argv.
"""

import json
import os
import subprocess

import pytest

from hyperpod_lab.errors import ConfigError, SpecError
from hyperpod_lab.schedulers.slurm import CONTAINER_PYTHON, SlurmScheduler, container_probe_argv, pyxis_srun_opts, render_sbatch
from hyperpod_lab.spec import JobSpec, enroot_image, validate_container_image
from hyperpod_lab.submit.clusters import ClusterProfile

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "pyxis_options.json")
JOB_DIR = "/fsx/hyperpod-lab/jobs/j"
NGC = "nvcr.io/nvidia/pytorch:25.01-py3"
SQSH = "/fsx/images/pytorch-25.01.sqsh"


def pyxis():
    with open(FIXTURE) as f:
        return json.load(f)


def spec(**kw):
    return JobSpec(script="/home/me/train.py", nodes=2, procs_per_node=8, env={"WANDB_MODE": "off"},
                   secret_env=["HF_TOKEN"], **kw).validate()


def ft(**kw):
    s = spec(**kw)
    s.resiliency.recovery = "checkpointless"
    return s.validate()


def render(s, image, **kw):
    return render_sbatch(s, "j", JOB_DIR, "/opt/venv/bin/python", "/fsx", gpus_per_node=8, efa=True,
                         container_image=image, **kw)


def srun_opts_of(text):
    """The supervisor's training-srun options (``--srun-opt=X`` lines, X unquoted by the shell
    rules shlex follows) and the words of a joining allocation's ``srun`` line."""
    import shlex

    sup = [shlex.split(ln.strip().rstrip("\\"))[0][len("--srun-opt="):]
           for ln in text.splitlines() if ln.strip().startswith("--srun-opt=")]
    lines = text.splitlines()
    join = [shlex.split(ln.rstrip("\\") + lines[i + 1])[1:] for i, ln in enumerate(lines) if ln.startswith("srun ")]
    return sup, (join[0] if join else [])


def test_a_registry_image_runs_the_step_through_pyxis_with_shared_root_and_dev_shm():
    """pyxis README "Usage" (``--container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH``,
    ``--container-mounts=SRC:DST[:FLAGS][,SRC:DST...]``, ``--container-workdir``,
    ``--no-container-mount-home``, ``--container-env=NAME[,NAME...]``); AWS megatron gpt3
    2.distributed-training.sbatch (``--container-image $IMAGE --container-mounts /fsx:/fsx``,
    then ``python -m torch.distributed.run`` from the image). The docker-style registry reference
    is written in enroot's ``REGISTRY#IMAGE`` form; the step's launcher is the image's
    ``python``; the supervisor, Lighthouse and health checks keep the host interpreter."""
    text = render(spec(container_image=NGC), NGC)
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    sup, _ = srun_opts_of(text)
    assert sup[3:] == ["--container-image=nvcr.io#nvidia/pytorch:25.01-py3",
                       "--container-mounts=/fsx:/fsx,/dev/shm:/dev/shm",
                       f"--container-workdir={JOB_DIR}",
                       "--no-container-mount-home",
                       "--container-env=HF_TOKEN,WANDB_MODE"]
    assert sup[:3] == ["--cpus-per-task=8", "--kill-on-bad-exit=0", "--label"]  # the options without a container
    assert f"exec {CONTAINER_PYTHON} -m hyperpod_lab.node.launch " in text
    assert "/opt/venv/bin/python -m hyperpod_lab.node.launch" not in text
    assert text.startswith("#!/bin/bash") and "/opt/venv/bin/python -m hyperpod_lab.node.supervisor" in text
    assert "    --python=/opt/venv/bin/python \\\n" in text  # health checks run on the host
    assert "--health-arg=--expect-gpus=8" in text and "#SBATCH --gpus-per-node=8\n" in text
    assert not any(ln.startswith("#SBATCH --container") for ln in text.splitlines())  # the batch step is the host's


def test_a_sqsh_image_and_a_checkpointless_join_render_the_same_options():
    """A squashfs path (pyxis_slurmstepd.c: a value starting with '.' or '/' is a squashfs file;
    the AWS FSDP and ddp scripts use ``--container-image ${PWD}/pytorch.sqsh``) passes as it is;
    a checkpointless job's groups (placed by the supervisor) and a joining allocation's own
    ``srun`` line carry the same pyxis options, and the Lighthouse stays on the host."""
    job = render(ft(container_image=SQSH), SQSH)
    join = render(ft(container_image=SQSH), SQSH, join_offset=2)
    for text in (job, join):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    sup, _ = srun_opts_of(job)
    _, words = srun_opts_of(join)
    want = [f"--container-image={SQSH}", "--container-mounts=/fsx:/fsx,/dev/shm:/dev/shm",
            f"--container-workdir={JOB_DIR}", "--no-container-mount-home", "--container-env=HF_TOKEN,WANDB_MODE"]
    assert sup[3:] == want
    assert words[words.index("--label") + 1:words.index("--label") + 6] == want
    assert words[words.index("--label") + 7:][:3] == [CONTAINER_PYTHON, "-m", "hyperpod_lab.node.launch"]
    assert "/opt/venv/bin/python -m hyperpod_lab.node.lighthouse" in job


def _rendered_pyxis_options():
    texts = [render(spec(container_image=NGC), NGC), render(ft(container_image=SQSH), SQSH),
             render(ft(container_image=SQSH), SQSH, join_offset=1),
             render_sbatch(JobSpec(script="t.py").validate(), "j", JOB_DIR, "python3", "/fsx", container_image=NGC)]
    opts = []
    for text in texts:
        sup, words = srun_opts_of(text)
        opts += [o for o in sup + words if o.startswith(("--container", "--no-container"))]
    opts += [w for w in container_probe_argv(NGC, "/fsx", ["python3", "-c", "x"]) if "container" in w]
    return opts


def test_every_rendered_pyxis_option_exists_from_hyperpods_pyxis_to_the_newest():
    """Each option rendered is an entry of pyxis's ``spank_opts[]`` (args.c) in every release from
    v0.19.0, the release HyperPod's install_enroot_pyxis.sh installs, to HEAD of NVIDIA/pyxis
    (fixture: tests/fixtures/pyxis_options.json), and takes a value exactly when rendered with
    one (a SPANK option's ``has_arg``). Every other srun option is Slurm's own, in srun(1)."""
    fx = pyxis()
    assert fx["hyperpod"]["pyxis"] == "v0.19.0" and fx["hyperpod"]["enroot"] == "3.4.1"
    order = [v.split()[0] for v in fx["versions"]]
    hp = order.index(fx["hyperpod"]["pyxis"])
    seen = set()
    for opt in _rendered_pyxis_options():
        name, eq, _ = opt.partition("=")
        info = fx["options"].get(name)
        assert info, f"{name} is no pyxis option"
        assert order.index(info["since"].split()[0]) <= hp, (name, info)
        assert info["last"] == fx["versions"][-1], (name, info)
        assert info["takes_value"] == bool(eq), (name, info)
        seen.add(name)
    assert seen == {"--container-image", "--container-mounts", "--container-workdir", "--no-container-mount-home",
                    "--container-env"}


def _enroot_3_4_parse(image):
    """enroot 3.4.1's docker::import on ``docker://<image>`` (pyxis_slurmstepd.c prefixes a
    non-path image with ``docker://``): its own regular expression, run by bash. Returns
    ``{user, registry, image, tag}`` or None where enroot says "Invalid image reference"."""
    fx = pyxis()["enroot_docker_uri"]
    prog = "".join(f'{k}="{v}"\n' for k, v in fx["vars"].items())
    prog += (f'uri="docker://$1"\nif [[ "${{uri}}" =~ {fx["pattern"]} ]]; then\n'
             + "".join(f'printf "%s\\0" "${{BASH_REMATCH[{fx["groups"][g]}]}}"\n' for g in ("user", "registry", "image", "tag"))
             + "else exit 3; fi\n")
    res = subprocess.run(["bash", "-c", prog, "parse", image], capture_output=True)
    if res.returncode == 3:
        return None
    assert res.returncode == 0, res.stderr
    return dict(zip(("user", "registry", "image", "tag"), res.stdout.decode().split("\0")))


@pytest.mark.parametrize("given, registry, image, tag", [
    (NGC, "nvcr.io", "nvidia/pytorch", "25.01-py3"),
    ("nvcr.io#nvidia/pytorch:25.01-py3", "nvcr.io", "nvidia/pytorch", "25.01-py3"),
    ("123456789012.dkr.ecr.us-west-2.amazonaws.com/train/llama:v2", "123456789012.dkr.ecr.us-west-2.amazonaws.com",
     "train/llama", "v2"),
    ("registry.local:5000/team/img", "registry.local:5000", "team/img", ""),
    ("ubuntu:24.04", "", "ubuntu", "24.04"),  # Docker Hub: enroot's default registry
    ("nvidia/cuda:12.8.0-base-ubuntu24.04", "", "nvidia/cuda", "12.8.0-base-ubuntu24.04"),
])
def test_rendered_image_reads_as_meant_by_enroot_3_4(given, registry, image, tag):
    """enroot 3.4.1 (HyperPod's) reads only ``[USER@][REGISTRY#]IMAGE[:TAG]``: the docker spelling
    ``nvcr.io/nvidia/pytorch`` would be a Docker Hub image of that name (checked below), so the
    renderer writes ``nvcr.io#nvidia/pytorch``; enroot 4 reads both (src/docker.sh, commit
    f29a45c "Improve handling of docker-style URI", first in v4.0.0)."""
    validate_container_image("container_image", given)
    got = _enroot_3_4_parse(enroot_image(given))
    assert got == {"user": "", "registry": registry, "image": image, "tag": tag}
    if "/" in given and registry and "#" not in given:  # why the '#': unconverted, enroot 3 asks
        unconverted = _enroot_3_4_parse(given)          # Docker Hub, or refuses the reference
        assert unconverted is None or unconverted["registry"] == ""


def test_a_hostile_image_reaches_pyxis_as_one_word_and_runs_nothing(tmp_path):
    """An image path is user input: quotes, ``$( )``, ``;`` and ``${IFS}`` reach srun (a stand-in
    printing its argv: no Slurm runs here) as one literal word and run nothing, on both the
    supervisor's command line and a joining allocation's srun."""
    hostile = f"{tmp_path}/x/$(touch${{IFS}}{tmp_path}/pwned)'q';id`id`.sqsh"
    validate_container_image("container_image", hostile)
    stub = tmp_path / "bin"
    stub.mkdir()
    printer = '#!/bin/bash\nfor a in "$@"; do printf "%s\\0" "$a"; done\n'
    for name in ("srun", "python3"):
        (stub / name).write_text(printer)
        (stub / name).chmod(0o755)
    (stub / "scontrol").write_text("#!/bin/bash\necho n1\n")
    (stub / "scontrol").chmod(0o755)
    env = {"PATH": f"{stub}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1"}
    job_dir = str(tmp_path / "job")
    os.makedirs(job_dir)
    for join in (None, 1):
        s = ft(container_image=hostile)
        text = render_sbatch(s, "j", job_dir, "python3", str(tmp_path), join_offset=join, container_image=hostile)
        words = subprocess.run(["bash", "-c", text], env=env, capture_output=True, check=True).stdout.split(b"\0")
        want = ("--container-image=" + hostile).encode()
        assert (b"--srun-opt=" + want if join is None else want) in words
    assert not (tmp_path / "pwned").exists()
    for bad in ("nvcr.io/nvidia/pytorch:25.01;id", "a b", "x\n#SBATCH --uid=0", "nvcr.io/x,/etc:/etc",
                "$(id)", "./rel.sqsh", "docker://ubuntu", "ubuntu@sha256:" + "0" * 64, ""):
        with pytest.raises(SpecError, match="^container_image: "):
            JobSpec(script="t.py", container_image=bad).validate()


def test_a_shared_root_pyxis_cannot_mount_is_refused_by_name():
    """pyxis's --container-mounts splits entries on ',' and fields on ':' (args.c,
    spank_option_mount / parse_mount_option): a shared root holding either cannot be bound."""
    for root in ("/fs,x", "/fs:x", "/fs x"):
        with pytest.raises(SpecError, match="container_image: the shared root .* --container-mounts"):
            pyxis_srun_opts(SQSH, root, root + "/j")
    with pytest.raises(SpecError, match="not under the shared root"):
        pyxis_srun_opts(SQSH, "/fsx", "/home/me/j")


def test_the_jobspec_image_overrides_the_profiles_and_is_recorded(tmp_path):
    """The profile's ``container_image`` is the default; a JobSpec's own wins; the scheduler's
    render (what ``submit --dry-run`` prints) shows the one used."""
    from hyperpod_lab.schedulers.remote import LocalRemote

    prof = ClusterProfile(name="hp", orchestrator="slurm", host="login", shared_root=str(tmp_path),
                          container_image=SQSH).validate()
    sched = SlurmScheduler(prof, LocalRemote())
    plain = JobSpec(script="t.py").validate()
    assert f"--srun-opt=--container-image={SQSH} " in sched.render(plain, "j")
    own = JobSpec(script="t.py", container_image=NGC).validate()
    text = sched.render(own, "j")
    assert "'--container-image=nvcr.io#nvidia/pytorch:25.01-py3'" in text and SQSH not in text
    bare = SlurmScheduler(ClusterProfile(name="c", orchestrator="slurm", host="login", shared_root=str(tmp_path)),
                          LocalRemote())
    assert "container" not in bare.render(plain, "j")
    assert JobSpec.from_json(own.to_json()).container_image == NGC
    assert JobSpec.from_dict({"script": "t.py"}).container_image is None  # a spec.json of before stays valid


def test_profile_container_image_is_validated_and_slurm_only():
    with pytest.raises(ConfigError, match="container_image: 'a b'"):
        ClusterProfile(name="c", orchestrator="slurm", host="h", shared_root="/fsx", container_image="a b").validate()
    with pytest.raises(ConfigError, match="container_image is for slurm clusters"):
        ClusterProfile(name="e", orchestrator="eks", kube_context="k", container_image=NGC).validate()
    prof = ClusterProfile.from_toml_table("hp", {"orchestrator": "slurm", "host": "h", "shared_root": "/fsx",
                                                "container_image": NGC})
    assert prof.container_image == NGC and prof.to_toml_table()["container_image"] == NGC


def test_without_an_image_nothing_changes():
    """No ``container_image``: no pyxis option anywhere and the host interpreter launches the step
    (the golden files of test_slurm_render.py hold the whole scripts)."""
    for s in (spec(), ft()):
        for kw in ({}, {"join_offset": 1}) if s.resiliency.recovery == "checkpointless" else ({},):
            text = render(s, None, **kw)
            assert "container" not in text and "/opt/venv/bin/python -m hyperpod_lab.node.launch" in text
            assert text == render_sbatch(s, "j", JOB_DIR, "/opt/venv/bin/python", "/fsx", gpus_per_node=8, efa=True, **kw)


def test_the_image_probe_command_renders_the_images_interpreter():
    """The environment probe of an image (rendered; not yet run by the submission check): one
    task on one node, ``--immediate`` so a full cluster refuses instead of queueing the probe,
    the same pyxis options as the job, the image's ``python`` with the probe's own arguments."""
    from hyperpod_lab.submit.envparity import probe_argv

    probe = probe_argv("/opt/venv/bin/python", ["torch"])
    argv = container_probe_argv(NGC, "/fsx", probe, partition="dev")
    assert argv[:5] == ["srun", "--nodes=1", "--ntasks=1", "--immediate=60", "--partition=dev"]
    assert argv[5:9] == ["--container-image=nvcr.io#nvidia/pytorch:25.01-py3",
                         "--container-mounts=/fsx:/fsx,/dev/shm:/dev/shm", "--container-workdir=/fsx",
                         "--no-container-mount-home"]
    assert argv[9:] == [CONTAINER_PYTHON, *probe[1:]] and argv[10] == "-I"


def test_the_cli_and_magic_flag_fills_the_spec_and_other_backends_refuse_it(tmp_path, client):
    """``hyperpod-lab submit --container-image IMG`` (the ``%hyperpod submit`` magic parses the same
    flags) sets ``container_image``; the local backend (torchrun here, no pyxis) refuses it."""
    from hyperpod_lab.cli.commands import build_parser, spec_from_args

    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    a = build_parser().parse_args(["submit", str(script), "--cluster", "local", "--container-image", NGC])
    s = spec_from_args(a, [])
    assert s.container_image == NGC
    with pytest.raises(SpecError, match="container_image: .*cluster 'local' is local"):
        client.prepare(s)
    with pytest.raises(SpecError, match="container_image"):
        spec_from_args(build_parser().parse_args(["submit", str(script), "--container-image", "a;b"]), [])
