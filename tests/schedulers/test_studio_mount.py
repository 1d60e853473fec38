"""Studio's view of the shared FSx (issue 29, item 7): the notebook's mount shows the cluster's
storage at another path, and maybe only a sub-directory of it.

A SageMaker Studio space mounts a domain's FSx for Lustre at its own path, and
``FSxLustreFileSystemConfig.FileSystemPath`` ("The path to the file system directory that is
accessible in Amazon SageMaker Studio. Permitted users can access only this directory and below",
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_FSxLustreFileSystemConfig.html)
may expose only a sub-directory. So a job directory ``/fsx/team-a/.../jobs/<id>`` on the cluster
is ``/mnt/studio-fsx/.../jobs/<id>`` here. :class:`MountMap` maps one to the other.

The unit tests need no cluster. The dev-cluster test bind-mounts (``mount --bind``, root) a
sub-directory of the dev cluster's shared root at another path, as Studio shows one, submits a
job from the notebook side with ``local_mount_cluster_path = "auto"`` (the probe file finds which
cluster directory the mount shows) and streams its events and logs through the mount, with
SFTP made unusable and every command over SSH recorded: only ``sbatch``, ``squeue``, ``sacct``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile

import pytest

from hyperpod_lab.errors import ConfigError
from hyperpod_lab.schedulers.remote import LocalRemote, MountedRemote, MountMap, mount_candidates, with_local_mount
from hyperpod_lab.submit.clusters import ClusterProfile


# ---- the mapping -------------------------------------------------------------------------------
def test_map_both_ways_a_sub_directory_and_a_directory_above_shared_root():
    # Studio exposes /team-a of the file system the cluster mounts at /fsx
    m = MountMap("/fsx/team-a", "/mnt/studio-fsx", "hp")
    job = "/fsx/team-a/alice/hyperpod-lab/alice/jobs/train-1"
    assert m.to_local(job) == "/mnt/studio-fsx/alice/hyperpod-lab/alice/jobs/train-1"
    assert m.to_cluster("/mnt/studio-fsx/alice/hyperpod-lab/alice/jobs/train-1") == job
    assert m.to_local("/fsx/team-a") == "/mnt/studio-fsx" and m.to_cluster("/mnt/studio-fsx/") == "/fsx/team-a"
    assert m.to_local("/fsx/team-a/x/../y//z") == "/mnt/studio-fsx/y/z"  # normalised
    for p in ("/fsx/team-a/a", "/fsx/team-a"):
        assert m.to_cluster(m.to_local(p)) == p
    # the whole file system shown, '/' as either side
    assert MountMap("/", "/mnt/all").to_local("/fsx/x") == "/mnt/all/fsx/x"
    assert MountMap("/fsx", "/").to_cluster("/a/b") == "/fsx/a/b"


def test_a_path_the_mount_does_not_show_is_refused_naming_the_fix():
    m = MountMap("/fsx/team-a", "/mnt/studio-fsx", "hp")
    for outside in ("/fsx/hyperpod-lab/alice/jobs/j1", "/fsx/team-ab/j1", "/fsx", "/fsx/team-a/../team-b/j"):
        assert not m.shows(outside)
        with pytest.raises(ConfigError) as e:
            m.to_local(outside)
        msg = str(e.value)
        assert "cluster 'hp'" in msg and outside in msg and "/fsx/team-a" in msg and "/mnt/studio-fsx" in msg
        assert "local_mount_cluster_path" in msg and "shared_root" in msg, msg
    with pytest.raises(ConfigError, match="not below /mnt/studio-fsx"):
        m.to_cluster("/mnt/studio-fsx-2/j")
    with pytest.raises(ConfigError, match="absolute"):
        MountMap("fsx", "/mnt/x")


def _profile(tmp_path, **kw) -> ClusterProfile:
    return ClusterProfile(name="studio", orchestrator="slurm", host="login", **kw).validate()


def test_profile_settings_and_the_job_tree_check(tmp_path):
    local = tmp_path / "studio-fsx"
    local.mkdir()
    user = LocalRemote().user_name()
    # default: the mount shows shared_root itself (today's behaviour)
    r = with_local_mount(_profile(tmp_path, shared_root="/fsx", local_mount=str(local)), LocalRemote())
    assert isinstance(r, MountedRemote) and r.mount == MountMap("/fsx", str(local))
    # the mount shows /fsx/team-a, shared_root below it
    r = with_local_mount(_profile(tmp_path, shared_root="/fsx/team-a/ml", local_mount=str(local),
                                  local_mount_cluster_path="/fsx/team-a"), LocalRemote())
    assert r.local_path(f"/fsx/team-a/ml/hyperpod-lab/{user}/jobs/j1") == str(local / "ml" / "hyperpod-lab" / user / "jobs" / "j1")
    # the mount shows only the user's folder below shared_root: still fine (the jobs are in it)
    r = with_local_mount(_profile(tmp_path, shared_root="/fsx", local_mount=str(local),
                                  local_mount_cluster_path=f"/fsx/hyperpod-lab/{user}"), LocalRemote())
    assert r.local_path(f"/fsx/hyperpod-lab/{user}/jobs/j1") == str(local / "jobs" / "j1")
    assert r.local_path("/fsx/hyperpod-lab/other/x") is None
    with pytest.raises(ConfigError, match="outside what this machine's mount shows"):
        r.read_from("/fsx/hyperpod-lab/other/jobs/j1/events/x.jsonl")  # below shared_root, not shown: refused
    # the mount shows a sibling of the job tree: refused when connecting, naming the fix
    with pytest.raises(ConfigError) as e:
        with_local_mount(_profile(tmp_path, shared_root="/fsx", local_mount=str(local),
                                  local_mount_cluster_path="/fsx/team-a"), LocalRemote())
    assert f"/fsx/hyperpod-lab/{user}/jobs" in str(e.value) and "local_mount_cluster_path" in str(e.value)
    # settings checked when the profile is read
    for bad, match in ((dict(local_mount_cluster_path="/fsx/a"), "needs local_mount"),
                       (dict(local_mount="auto", local_mount_cluster_path="/fsx/a"), "finds both"),
                       (dict(local_mount=str(local), local_mount_cluster_path="fsx/a"), "absolute cluster path"),
                       (dict(alerts_webhook_url_env="https://hooks.example/x"), "alerts_webhook_url_env")):
        with pytest.raises(ConfigError, match=match):
            _profile(tmp_path, shared_root="/fsx", **bad)


def test_mount_candidates_lists_network_and_sub_directory_mounts(tmp_path):
    dirs = {n: tmp_path / n for n in ("lustre", "bind", "whole", "tmpfs")}
    for d in dirs.values():
        d.mkdir()
    info = tmp_path / "mountinfo"
    info.write_text(
        f"27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"40 27 0:50 / {dirs['lustre']} rw - lustre 10.0.0.1@tcp:/abcd rw\n"
        f"41 27 254:0 /var/tmp/fsx/team\\040a {dirs['bind']} rw - ext4 /dev/vda rw\n"
        f"42 27 254:0 / {dirs['whole']} rw - ext4 /dev/vdb rw\n"
        f"43 27 0:51 / {dirs['tmpfs']} rw - tmpfs tmpfs rw\n"
        f"44 22 0:52 /x /proc/sys/fs/binfmt_misc rw - binfmt_misc binfmt_misc rw\n")
    got = mount_candidates(str(tmp_path / "no-such-root"), mountinfo_file=str(info))
    assert got == [str(dirs["lustre"]), str(dirs["bind"])], got
    assert mount_candidates(str(dirs["whole"]), mountinfo_file=str(info))[0] == str(dirs["whole"])  # same path first


# ---- on the dev cluster: a bind mount of a sub-directory ---------------------------------------
@contextlib.contextmanager
def _bind_mount(source: str):
    """``source`` bind-mounted at a new directory below /tmp (as Studio shows an FSx sub-directory
    at its own path); unmounted and removed after."""
    if os.geteuid() != 0:
        pytest.fail("the bind-mount test needs root (mount --bind); run it as root", pytrace=False)
    target = tempfile.mkdtemp(prefix="studio-fsx-")
    subprocess.run(["mount", "--bind", source, target], check=True, capture_output=True)
    try:
        yield target
    finally:
        if subprocess.run(["umount", target], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", target], check=True, capture_output=True)
        os.rmdir(target)


def test_a_job_streams_through_a_sub_directory_mount_at_another_path(dev_cluster, client, tmp_path, monkeypatch):
    import tomli_w
    from test_local_mount import STEPS, _command, _no_sftp

    from hyperpod_lab.jobdir import JobPaths
    from hyperpod_lab.schedulers.remote import detect_local_mount
    from hyperpod_lab.spec import JobSpec
    from hyperpod_lab.submit import envparity

    team = os.path.join(dev_cluster.shared_root, f"studio-team-{os.getpid()}")  # what Studio's FileSystemPath exposes
    os.makedirs(team, mode=0o700)
    try:
        with _bind_mount(team) as mnt:
            shared_root = os.path.join(team, "alice")  # the profile's, below what the mount shows
            # the profile as the user writes it: the mount's path, and "auto" for what it shows
            prof = dataclasses.replace(dev_cluster, name=f"studio-{os.getpid()}", shared_root=shared_root,
                                       local_mount=mnt, local_mount_cluster_path="auto").validate()
            with open(tmp_path / "clusters.toml", "wb") as f:
                tomli_w.dump({"clusters": {prof.name: prof.to_toml_table()}}, f)
            monkeypatch.setenv("HYPERPOD_LAB_CONFIG", str(tmp_path / "clusters.toml"))

            sched = client.scheduler(prof.name)
            remote = sched.remote
            # "auto": the probe written over SFTP was found below the mount: it shows the cluster's `team`
            assert isinstance(remote, MountedRemote) and remote.how == "probe", remote
            assert remote.mount == MountMap(team, mnt, prof.name), remote.mount
            # the default search lists the sub-directory mount and finds it there too (the same path,
            # the dev cluster's own, left out: a Studio space has no /var/tmp/hyperpod-lab-dev)
            cands = [c for c in mount_candidates(shared_root) if c != shared_root]
            assert mnt in cands, cands
            found, why = detect_local_mount(remote.ssh, shared_root, candidates=cands, profile=prof.name)
            assert found == MountMap(team, mnt, prof.name), why

            envparity.check_submission(sched.profile, remote=remote)  # the probe cached, as after a first submit
            sent = _no_sftp(remote, monkeypatch)
            opened: list[str] = []
            for name in ("read_from", "listdir", "list_files"):
                real = getattr(remote._local, name)
                monkeypatch.setattr(remote._local, name,
                                    lambda p, *a, _real=real, **k: (opened.append(p), _real(p, *a, **k))[1])

            rec = client.submit(JobSpec.from_dict({"script": STEPS, "cluster": prof.name, "name": "studio-steps",
                                                   "nodes": 1, "args": ["--steps", "5", "--sleep", "0.2"]}))
            # the job's own paths are the cluster's; here they are below the mount
            assert rec.job_dir.startswith(shared_root + "/hyperpod-lab/"), rec.job_dir
            here = remote.mount.to_local(rec.job_dir)
            assert here.startswith(mnt + "/alice/hyperpod-lab/") and os.path.isfile(os.path.join(here, "events", "client.jsonl"))
            with open(remote.mount.to_local(JobPaths(rec.job_dir).sbatch)) as f:
                script = f.read()
            assert f"--chdir={rec.job_dir}" in str(sent) and rec.job_dir in script and mnt not in script, script[:2000]
            events = list(client.follow(rec.job_id, interval_s=0.2, timeout_s=180))
            kinds = [e.kind for e in events]
            assert kinds[0] == "submitted" and "step" in kinds and kinds[-1] == "finished", kinds
            assert client.wait(rec.job_id, timeout_s=120).status == "completed"
            job_log = client.logs(rec.job_id)
            rank_log = client.logs(rec.job_id, rank=0)
            assert f"slurm {rec.native_id}" in job_log and rank_log.strip(), job_log[-2000:]
            # read through the mount, every file; over SSH only scheduler commands, no SFTP
            assert opened and all(p.startswith(mnt + "/") for p in opened), opened[:5]
            assert any("/events" in p for p in opened) and any("log" in p for p in opened), opened
            assert remote.ssh.ops["sftp"] == 0, remote.ssh.ops
            commands = {_command(a) for a in sent}
            assert commands <= {"sbatch", "squeue", "sacct", "scontrol"}, commands
            print(f"\nsub-directory mount {mnt} = cluster {team}: {len(sent)} commands over SSH "
                  f"({sorted(commands)}), 0 SFTP calls; {len(events)} events, {len(opened)} local reads, "
                  f"logs {len(job_log)} + {len(rank_log)} bytes")
            remote.close()
    finally:
        shutil.rmtree(team, ignore_errors=True)
