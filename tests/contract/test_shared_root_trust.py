"""Job directories below a cluster's shared root go into a tree of the user's own, and every
folder above them is checked before one is created (issue 24, finding 9):

* a ``<shared_root>/hyperpod-lab`` planted as a link (to a 0777 folder) never receives a job;
* a folder above the job that another user owns, or that others may write into without the
  sticky bit, is refused with an error naming it and the fix;
* one user's jobs never lock another user out: with an administrator's ``hyperpod-lab`` (root,
  1777) each user gets ``hyperpod-lab/<user>/jobs`` (0700, theirs);
* a job recorded with the old layout (``<shared_root>/hyperpod-lab/jobs/<id>``) keeps working.

Real parts: real directories, real processes run as other uids (the tests run as root), the
local backend's real staging, and the dev cluster's sshd on loopback for the SFTP side.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from hyperpod_lab.errors import ConfigError
from hyperpod_lab.jobdir import JobPaths, user_jobs_root
from hyperpod_lab.private_dir import LocalTreeOps, UntrustedDirError, ensure_job_tree
from hyperpod_lab.schedulers.local import LocalScheduler
from hyperpod_lab.schedulers.remote import LocalRemote, SSHRemote
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit.clusters import ClusterProfile
from hyperpod_lab.submit.jobs import JobRecord, new_job_id


@pytest.fixture(autouse=True)
def _needs_root():
    """Fail (never skip) without root: files of other uids, processes as them. The suite runs as
    root (bash scripts/test.sh, .ci/run)."""
    if os.geteuid() != 0:
        pytest.fail("needs root (files of other uids, processes as them): run the suite as root")


@pytest.fixture
def shared():
    """A shared root every uid can enter (pytest's tmp_path is root's 0700)."""
    d = tempfile.mkdtemp(prefix="hp-shared-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _sched(root: str) -> LocalScheduler:
    return LocalScheduler(ClusterProfile(name="t", orchestrator="local", shared_root=root), LocalRemote())


def _spec() -> JobSpec:
    return JobSpec.from_dict({"script": "/x/train.py", "cluster": "t", "name": "trust"})


def test_a_planted_link_never_receives_a_job(shared):
    open_dir = tempfile.mkdtemp(prefix="hp-open-", dir="/tmp")
    os.chmod(open_dir, 0o777)
    try:
        os.symlink(open_dir, os.path.join(shared, "hyperpod-lab"))
        sched = _sched(shared)
        with pytest.raises(UntrustedDirError) as e:
            sched.stage(_spec(), new_job_id("trust"), b"print(1)\n")
        msg = str(e.value)
        assert f"{shared}/hyperpod-lab is a symbolic link" in msg and "Fix:" in msg and "1777" in msg
        assert isinstance(e.value, ConfigError)  # the server answers 400 with the message
        assert os.listdir(open_dir) == []  # nothing went through the link
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


@pytest.mark.parametrize("setup, words", [
    (lambda p: (os.mkdir(p), os.chown(p, 4242, 4242)), "is owned by uid 4242, neither root nor you"),
    (lambda p: (os.mkdir(p), os.chmod(p, 0o777)), "has mode 0777: group or others may write"),
    (lambda p: (os.mkdir(p), os.chmod(p, 0o775)), "has mode 0775"),
    (lambda p: open(p, "w").close(), "is not a directory"),
])
def test_untrusted_parents_are_refused(shared, setup, words):
    setup(os.path.join(shared, "hyperpod-lab"))
    with pytest.raises(UntrustedDirError, match=words):
        _sched(shared).stage(_spec(), new_job_id("trust"), b"print(1)\n")


def test_deeper_levels_are_checked_too(shared):
    user = LocalRemote().user_name()
    os.makedirs(os.path.join(shared, "hyperpod-lab", user))
    os.chmod(os.path.join(shared, "hyperpod-lab"), 0o1777)
    os.symlink("/tmp", os.path.join(shared, "hyperpod-lab", user, "jobs"))
    with pytest.raises(UntrustedDirError, match=f"hyperpod-lab/{user}/jobs is a symbolic link"):
        _sched(shared).stage(_spec(), new_job_id("trust"), b"print(1)\n")


def test_the_shared_root_itself_is_checked(shared):
    os.chmod(shared, 0o777)  # not sticky: anyone could rename hyperpod-lab
    with pytest.raises(UntrustedDirError, match="has mode 0777"):
        _sched(shared).stage(_spec(), new_job_id("trust"), b"print(1)\n")
    os.chmod(shared, 0o1777)  # sticky (like /tmp): fine
    folder = _sched(shared).stage(_spec(), new_job_id("trust"), b"print(1)\n")
    assert os.path.isdir(folder)


def test_the_users_tree_is_created_private(shared):
    sched = _sched(shared)
    folder = sched.stage(_spec(), new_job_id("trust"), b"print(1)\n")
    user = LocalRemote().user_name()
    assert os.path.dirname(folder) == user_jobs_root(shared, user) == sched.remote.ensure_job_root(shared)
    modes = {p: stat.S_IMODE(os.lstat(os.path.join(shared, p)).st_mode)
             for p in ("hyperpod-lab", f"hyperpod-lab/{user}", f"hyperpod-lab/{user}/jobs")}
    assert modes == {"hyperpod-lab": 0o755, f"hyperpod-lab/{user}": 0o700, f"hyperpod-lab/{user}/jobs": 0o700}


# imports first, as root (the interpreter's own files may be root's alone), then the uid for good
_STAGE_AS = r"""
import json, os, sys
import pwd, secrets, posixpath, shutil
from hyperpod_lab.schedulers.local import LocalScheduler
from hyperpod_lab.schedulers.remote import LocalRemote
from hyperpod_lab.spec import JobSpec
from hyperpod_lab.submit.clusters import ClusterProfile
from hyperpod_lab.submit.jobs import new_job_id
uid = int(sys.argv[2])
os.setgroups([]); os.setgid(uid); os.setuid(uid)
sched = LocalScheduler(ClusterProfile(name="t", orchestrator="local", shared_root=sys.argv[1]), LocalRemote())
try:
    folder = sched.stage(JobSpec.from_dict({"script": "/x/train.py", "cluster": "t", "name": "u"}),
                         new_job_id("u"), b"print(1)\n")
    print(json.dumps({"folder": folder}))
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
"""


def _stage_as(uid: int, root: str) -> dict:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.pathsep.join(sys.path), "HOME": "/tmp"}
    out = subprocess.run([sys.executable, "-c", _STAGE_AS, root, str(uid)], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_one_users_jobs_never_lock_another_out(shared):
    """An administrator's ``hyperpod-lab`` (root, 1777): two users submit, each into a folder of
    their own (today's main: the first one's 0700 ``hyperpod-lab/jobs`` refused the second)."""
    tree = os.path.join(shared, "hyperpod-lab")
    os.mkdir(tree)
    os.chmod(tree, 0o1777)
    a, b = _stage_as(4301, shared), _stage_as(4302, shared)
    assert "folder" in a and "folder" in b, (a, b)
    for uid, got in ((4301, a), (4302, b)):
        user_dir = os.path.dirname(os.path.dirname(got["folder"]))
        st = os.lstat(user_dir)
        assert st.st_uid == uid and stat.S_IMODE(st.st_mode) == 0o700
        assert os.lstat(got["folder"]).st_uid == uid
    assert os.path.dirname(a["folder"]) != os.path.dirname(b["folder"])
    # a tree the first user made (theirs, not root's) is refused to the second with the fix
    other = tempfile.mkdtemp(prefix="hp-shared2-", dir="/tmp")
    try:
        os.chmod(other, 0o1777)
        first = _stage_as(4301, other)
        assert "folder" in first
        second = _stage_as(4302, other)
        assert "UntrustedDirError" in second.get("error", "") and "owned by uid 4301" in second["error"]
        assert "sudo install -d -o root -m 1777" in second["error"]
    finally:
        shutil.rmtree(other, ignore_errors=True)


def test_a_job_recorded_in_the_old_layout_keeps_working(shared):
    """Records keep their ``job_dir``: a job staged before the per-user layout is read there."""
    old = JobPaths.for_job(shared, "old-job-1")
    os.makedirs(old.ranks)
    with open(old.native_id, "w") as f:
        f.write("4242\n")
    with open(old.rank_file(0), "w") as f:
        json.dump({"rank": 0, "node": "n1", "pid": 4242}, f)
    sched = _sched(shared)
    rec = JobRecord(job_id="old-job-1", name="old", cluster="t", orchestrator="local", native_id="",
                    job_dir=old.folder, spec={"nodes": 1, "procs_per_node": 1})
    assert sched.find_native_id(rec) == "4242"
    assert sched.rank_info(rec, 0)["node"] == "n1"
    assert old.folder == f"{shared}/hyperpod-lab/jobs/old-job-1"


def test_user_names_that_cannot_name_a_folder(shared):
    for bad in ("jobs", "envs", "../x", "-rf", "a/b", ""):
        with pytest.raises(UntrustedDirError, match="cannot name a folder"):
            ensure_job_tree(shared, bad, LocalTreeOps())


def test_over_sftp_the_same_rules(shared, dev_cluster):
    """The SFTP side (the dev cluster's login node is this host): a planted link is refused, a
    good tree is created with the same modes."""
    remote = SSHRemote(dev_cluster)
    try:
        user = remote.user_name()
        open_dir = tempfile.mkdtemp(prefix="hp-open-", dir="/tmp")
        os.chmod(open_dir, 0o777)
        link_root = tempfile.mkdtemp(prefix="hp-shared-", dir="/tmp")
        try:
            os.symlink(open_dir, os.path.join(link_root, "hyperpod-lab"))
            with pytest.raises(UntrustedDirError, match="is a symbolic link"):
                remote.ensure_job_root(link_root)
            assert os.listdir(open_dir) == []
        finally:
            shutil.rmtree(open_dir, ignore_errors=True)
            shutil.rmtree(link_root, ignore_errors=True)
        got = remote.ensure_job_root(shared)
        assert got == user_jobs_root(shared, user)
        assert stat.S_IMODE(os.lstat(os.path.join(shared, "hyperpod-lab")).st_mode) == 0o755
        assert stat.S_IMODE(os.lstat(got).st_mode) == 0o700
        assert remote.ensure_job_root(shared) == got  # again: all there, all checked
    finally:
        remote.close()


def test_a_slurm_submit_refuses_a_planted_link_on_the_login_node(dev_cluster):
    """Slurm stages in one command on the login node (envexec): the same check runs there, before
    anything is written or sbatch runs; the error names the folder and the fix."""
    import dataclasses

    from hyperpod_lab.schedulers.slurm import SlurmScheduler

    open_dir = tempfile.mkdtemp(prefix="hp-open-", dir="/tmp")
    os.chmod(open_dir, 0o777)
    link_root = tempfile.mkdtemp(prefix="hp-shared-", dir="/tmp")
    os.symlink(open_dir, os.path.join(link_root, "hyperpod-lab"))
    remote = SSHRemote(dev_cluster)
    try:
        sched = SlurmScheduler(dataclasses.replace(dev_cluster, shared_root=link_root), remote)
        spec = JobSpec.from_dict({"script": "/x/train.py", "cluster": dev_cluster.name, "name": "trust-slurm"})
        with pytest.raises(UntrustedDirError) as e:
            sched.submit(spec, new_job_id("trust-slurm"), b"print(1)\n")
        assert f"{link_root}/hyperpod-lab is a symbolic link" in str(e.value) and "Fix:" in str(e.value)
        assert os.listdir(open_dir) == []
        assert remote.ops["sftp"] == 0  # still one exec, no SFTP
    finally:
        remote.close()
        shutil.rmtree(open_dir, ignore_errors=True)
        shutil.rmtree(link_root, ignore_errors=True)
