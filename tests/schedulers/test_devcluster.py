"""The local dev cluster against real components: Slurm + slurmdbd/MariaDB + munge + sshd.

Needs root (the script installs apt packages and starts daemons). The cluster is left running
at the end: other tests reuse it. HYPERPOD_LAB_CONFIG points at a temporary file, so the
user's cluster config is untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest

from hyperpod_lab import devcluster
from hyperpod_lab.errors import HyperPodLabError
from hyperpod_lab.submit.clusters import get_profile


@pytest.fixture(autouse=True)
def _root():
    if os.geteuid() != 0:
        pytest.fail("dev-cluster needs root (apt install, daemons); run the tests as root", pytrace=False)

PACKAGES_PRESENT = all(shutil.which(b) for b in
                       ("slurmctld", "slurmd", "slurmdbd", "mariadbd", "munged", "sshd"))


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("cfg") / "clusters.toml"
        mp.setenv("HYPERPOD_LAB_CONFIG", str(path))
        yield path


@pytest.fixture(scope="module")
def cluster(config):
    """Bring the cluster up twice; record both durations."""
    t0 = time.monotonic()
    first = devcluster.up(quiet=True)
    t1 = time.monotonic()
    second = devcluster.up(quiet=True)
    t2 = time.monotonic()
    return {"profile": second, "first": first, "t_first": t1 - t0, "t_second": t2 - t1}


def _ssh_connect(p):
    """A paramiko client logged in to the dev cluster of profile ``p`` (known host keys only)."""
    import paramiko

    client = paramiko.SSHClient()
    client.load_host_keys(p.known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(p.host, port=p.port, username=p.user, key_filename=p.key_file,
                   allow_agent=False, look_for_keys=False, timeout=10)
    return client


@pytest.fixture(scope="module")
def ssh(cluster):
    client = _ssh_connect(cluster["profile"])
    yield client
    client.close()


def run(client, cmd: str, timeout: float = 60) -> tuple[int, str, str]:
    _, out, err = client.exec_command(cmd, timeout=timeout)
    rc = out.channel.recv_exit_status()
    return rc, out.read().decode(), err.read().decode()


def test_up_is_fast_and_idempotent(cluster):
    if PACKAGES_PRESENT:
        assert cluster["t_first"] < 30, f"first up took {cluster['t_first']:.1f} s"
    assert cluster["t_second"] < 10, f"second up (no-op) took {cluster['t_second']:.1f} s"
    assert cluster["first"] == cluster["profile"]


def test_up_streams_progress(cluster, capsys):
    devcluster.up()
    out = capsys.readouterr().out
    assert "[dev-cluster] slurmctld: running" in out
    assert "[dev-cluster] ready in" in out


def test_status_reports_daemons_and_nodes(cluster):
    st = devcluster.status()
    assert st["ok"], st["output"]
    assert set(st["nodes"]) == {"n1", "n2", "n3"}  # a 2-node job plus a spare
    assert all(s in ("idle", "mixed", "allocated", "completing") for s in st["nodes"].values())
    for name in ("munged", "mariadb", "slurmdbd", "slurmctld", "slurmd@n1", "slurmd@n2", "slurmd@n3", "sshd", "bastion"):
        assert st["daemons"][name]["state"] == "running", st["output"]
        assert isinstance(st["daemons"][name]["pid"], int)
    assert "n1" in st["sinfo"] and "n2" in st["sinfo"] and "n3" in st["sinfo"]


def test_each_node_has_its_own_mount_namespace(cluster, ssh):
    """A mount made in one node's namespace (a 1 MiB /dev/shm on n2) is seen by that node's job
    steps only: how the health-check tests give one node a real fault."""
    pids = {n: devcluster.node_pid(n) for n in ("n1", "n2", "n3")}
    spaces = {os.readlink(f"/proc/{pid}/ns/mnt") for pid in pids.values()}
    assert len(spaces) == 3 and os.readlink("/proc/self/ns/mnt") not in spaces
    subprocess.run(["nsenter", "--mount", f"--target={pids['n2']}", "mount", "-t", "tmpfs", "-o", "size=1m",
                    "tmpfs", "/dev/shm"], check=True)
    try:
        rc, out, err = run(ssh, "srun -N2 -w n1,n2 --label df -k --output=size /dev/shm")
        assert rc == 0, err
        sizes = {line.split(":")[0]: line.split()[-1] for line in out.splitlines() if line.split()[-1].isdigit()}
        assert sizes["1"] == "1024" and int(sizes["0"]) > 1024, out
    finally:
        subprocess.run(["nsenter", "--mount", f"--target={pids['n2']}", "umount", "/dev/shm"], check=True)


def test_status_of_missing_cluster_is_not_ok(tmp_path):
    st = devcluster.status(base_dir=str(tmp_path / "nothing"))
    assert not st["ok"]
    assert st["daemons"]["slurmctld"]["state"] == "stopped"


def test_profile_written(cluster, config):
    base = devcluster.base_dir()
    p = get_profile("local-slurm")
    assert p == cluster["profile"]
    assert (p.orchestrator, p.host, p.port, p.user) == ("slurm", "127.0.0.1", 2222, "root")
    assert p.key_file == os.path.join(base, "ssh", "id_ed25519") and os.path.isfile(p.key_file)
    assert p.known_hosts == os.path.join(base, "ssh", "known_hosts")
    assert p.shared_root == os.path.join(base, "fsx") and os.path.isdir(p.shared_root)
    import sys
    assert p.python == sys.executable
    assert (p.defaults.partition, p.defaults.nodes, p.defaults.procs_per_node) == ("dev", 2, 1)
    assert config.exists()


def test_known_hosts_holds_the_sshd_host_key(cluster):
    p = cluster["profile"]
    with open(os.path.join(os.path.dirname(p.known_hosts), "ssh_host_ed25519_key.pub")) as f:
        keytype, key = f.read().split()[:2]
    with open(p.known_hosts) as f:
        lines = f.read().splitlines()
    assert f"[127.0.0.1]:2222 {keytype} {key}" in lines
    assert keytype == "ssh-ed25519"


def test_bastion_has_its_own_key_and_forwards_only_to_the_login_node(cluster):
    """The jump host of issue 16: its own host key (in bastion_known_hosts, verified), the
    client key logs in, a direct-tcpip channel reaches the login node's sshd and nothing else,
    and commands do nothing (ForceCommand /bin/true)."""
    import paramiko

    p, b = cluster["profile"], devcluster.bastion()
    with open(os.path.join(os.path.dirname(p.known_hosts), "bastion_host_ed25519_key.pub")) as f:
        keytype, key = f.read().split()[:2]
    with open(b["known_hosts"]) as f:
        assert f.read().splitlines() == [f"[127.0.0.1]:{b['port']} {keytype} {key}"]
    with open(os.path.join(os.path.dirname(p.known_hosts), "ssh_host_ed25519_key.pub")) as f:
        assert f.read().split()[1] != key  # not the login node's key
    client = paramiko.SSHClient()
    client.load_host_keys(b["known_hosts"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(b["host"], port=b["port"], username=b["user"], key_filename=b["key_file"],
                   allow_agent=False, look_for_keys=False, timeout=10)
    try:
        assert run(client, "hostname; echo visible") == (0, "", "")
        t = client.get_transport()
        chan = t.open_channel("direct-tcpip", ("127.0.0.1", p.port), ("127.0.0.1", 0), timeout=10)
        chan.settimeout(10)
        assert chan.recv(64).startswith(b"SSH-2.0-")  # the login node's sshd answers
        chan.close()
        with pytest.raises(paramiko.ChannelException):  # PermitOpen: the slurmctld port is not forwarded
            t.open_channel("direct-tcpip", ("127.0.0.1", 6817), ("127.0.0.1", 0), timeout=10)
    finally:
        client.close()


def test_up_leaves_running_daemons_alone(cluster):
    """'up' on a running cluster restarts nothing (other sessions use it meanwhile)."""
    before = {n: d["pid"] for n, d in devcluster.status()["daemons"].items()}
    devcluster.up(quiet=True)
    after = {n: d["pid"] for n, d in devcluster.status()["daemons"].items()}
    assert after == before and before["bastion"] and before["sshd"] != before["bastion"]


def test_python_arg_goes_into_profile(cluster):
    p = devcluster.up(python="/opt/other/python", quiet=True)
    try:
        assert p.python == "/opt/other/python"
        assert get_profile("local-slurm").python == "/opt/other/python"
    finally:
        devcluster.up(quiet=True)


def test_ssh_rejects_unknown_host_key(cluster):
    import paramiko

    p = cluster["profile"]
    client = paramiko.SSHClient()
    client.load_host_keys(os.devnull)   # no known host key: RejectPolicy must refuse
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        client.connect(p.host, port=p.port, username=p.user, key_filename=p.key_file,
                       allow_agent=False, look_for_keys=False, timeout=10)
    client.close()


def test_sinfo_and_sacct_over_ssh(ssh):
    rc, out, err = run(ssh, "sinfo -h -N -o '%N %P %T'")
    assert rc == 0, err
    nodes = {line.split()[0]: line.split() for line in out.splitlines()}
    assert set(nodes) == {"n1", "n2", "n3"}
    assert all(v[1] == "dev*" for v in nodes.values())
    rc, out, err = run(ssh, "sacct -X -n -S now-1hours")
    assert rc == 0, err
    rc, out, err = run(ssh, "scontrol show config | grep -E '^(ClusterName|ReturnToService|JobRequeue)'")
    assert rc == 0, err
    assert "hyperpod-dev" in out


def _wait_job(client, jid: str, timeout: float = 90) -> str:
    """Poll sacct until the job has a final state; return it."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        rc, out, _ = run(client, f"sacct -X -n -P -j {jid} -o State")
        state = out.strip().split("\n")[0].strip() if rc == 0 else ""
        if state and state not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {jid} not finished after {timeout} s (state {state!r})")


def test_two_node_job_completes(cluster, ssh):
    p = cluster["profile"]
    d = os.path.join(p.shared_root, "tests", f"devcluster-{uuid.uuid4().hex[:8]}")
    os.makedirs(d)
    with open(os.path.join(d, "job.sbatch"), "w") as f:
        f.write("#!/bin/bash\n"
                "#SBATCH -N 2 --ntasks-per-node=1\n"
                "#SBATCH -J devcluster-test\n"
                "#SBATCH -o %x-%j.out\n"
                "srun bash -c 'echo node=$SLURMD_NODENAME nodeid=$SLURM_NODEID'\n")
    rc, out, err = run(ssh, f"cd {d} && sbatch --parsable job.sbatch")
    assert rc == 0, err
    jid = out.strip().split(";")[0]
    assert _wait_job(ssh, jid) == "COMPLETED"
    rc, out, _ = run(ssh, f"sacct -X -n -P -j {jid} -o JobID,State,NNodes,NodeList,ExitCode")
    jobid, state, nnodes, nodelist, exitcode = out.strip().split("|")
    assert (jobid, state, nnodes, exitcode) == (jid, "COMPLETED", "2", "0:0")
    with open(os.path.join(d, f"devcluster-test-{jid}.out")) as f:
        lines = sorted(f.read().split())
    assert lines == ["node=n1", "node=n2", "nodeid=0", "nodeid=1"]


def test_one_cpu_jobs_run_concurrently_on_both_nodes(ssh, cluster):
    d = os.path.join(cluster["profile"].shared_root, "tests")
    os.makedirs(d, exist_ok=True)
    jids = []
    for node in ("n1", "n2"):
        rc, out, err = run(ssh, f"cd {d} && sbatch --parsable -w {node} -n1 -c1 -o /dev/null --wrap 'sleep 4'")
        assert rc == 0, err
        jids.append(out.strip().split(";")[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rc, out, _ = run(ssh, f"squeue -h -j {','.join(jids)} -o %T")
        if out.split() == ["RUNNING", "RUNNING"]:
            break
        time.sleep(0.3)
    else:
        raise AssertionError(f"jobs {jids} never ran together: {out!r}")
    for jid in jids:
        assert _wait_job(ssh, jid) == "COMPLETED"


def test_up_rejects_bad_port():
    with pytest.raises(HyperPodLabError):
        devcluster.up(ssh_port=0, quiet=True)


def test_script_failure_raises_with_tail(config, tmp_path, monkeypatch):
    # a base dir that cannot be created: the script fails early, before touching anything
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(HyperPodLabError) as e:
        devcluster.up(base_dir=str(blocker / "base"), quiet=True)
    assert "dev-cluster up failed" in str(e.value)
    assert "last output" in str(e.value)


def test_down_then_up_keeps_job_ids(cluster, ssh):
    rc, out, err = run(ssh, "sbatch --parsable -o /dev/null --wrap true")
    assert rc == 0, err
    before = int(out.strip().split(";")[0])
    assert _wait_job(ssh, str(before)) == "COMPLETED"
    devcluster.down(quiet=True)
    st = devcluster.status()
    assert not st["ok"]
    assert all(d["state"] == "stopped" for n, d in st["daemons"].items() if n != "munged")
    devcluster.up(quiet=True)
    assert devcluster.status()["ok"]
    c = _ssh_connect(cluster["profile"])
    try:
        rc, out, err = run(c, "sbatch --parsable -o /dev/null --wrap true")
        assert rc == 0, err
        after = int(out.strip().split(";")[0])
        assert after > before          # state and accounting DB kept together: no JobID reuse
        assert _wait_job(c, str(after)) == "COMPLETED"
        rc, out, _ = run(c, f"sacct -X -n -P -j {before} -o JobID")
        assert out.split() == [str(before)]
    finally:
        c.close()


@pytest.mark.parametrize("plant", ["foreign_ssh_dir", "ssh_dir_link", "readable_client_key", "foreign_base",
                                   "readable_bastion_key", "foreign_bastion_config"])
def test_up_refuses_state_it_did_not_create(config, tmp_path, plant):
    """Issue 13, finding 9: another user who pre-creates the state directory (or a key in it)
    before the first 'up' would hold the login node's keys; up refuses, before starting anything.
    Reproduced on the code before the fix, which kept and trusted what it found."""
    base = tmp_path / "dev"
    ssh = base / "ssh"
    if plant == "foreign_base":
        base.mkdir()
        os.chown(base, 65534, 65534)  # nobody
    elif plant == "ssh_dir_link":
        base.mkdir()
        (tmp_path / "theirs").mkdir(mode=0o700)
        os.symlink(tmp_path / "theirs", ssh)
    else:
        ssh.mkdir(parents=True, mode=0o700)
        if plant == "foreign_ssh_dir":
            os.chown(ssh, 65534, 65534)
        elif plant == "readable_bastion_key":
            key = ssh / "bastion_host_ed25519_key"
            key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nplanted\n")
            key.chmod(0o644)
        elif plant == "foreign_bastion_config":
            conf = ssh / "bastion_sshd_config"
            conf.write_text("Port 2298\nPermitOpen any\n")
            os.chown(conf, 65534, 65534)
        else:
            key = ssh / "id_ed25519"
            key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nplanted\n")
            key.chmod(0o644)
    with pytest.raises(HyperPodLabError) as e:
        devcluster.up(base_dir=str(base), ssh_port=2299, quiet=True)
    msg = str(e.value)
    assert "HYPERPOD_LAB_DEV_DIR" in msg and ("did not create it" in msg or "symbolic link" in msg
                                              or "may read" in msg), msg
    assert not (base / "run").exists() and not (base / "slurm").exists()  # nothing started
