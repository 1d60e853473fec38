"""Reaching a cluster the way people do (issue 16, items 1 and 2): an OpenSSH config whose
``Host login`` goes through the dev cluster's bastion (a second real sshd, 127.0.0.1:2223, that
forwards only to the login node) with ``ProxyJump`` or with ``ProxyCommand ssh -W`` (OpenSSH's
own client), and AWS Systems Manager through a STAND-IN ``aws`` executable.

The STAND-IN ``aws`` (written by :func:`_stand_in_aws`, put first on the test's PATH) is not the
AWS CLI: it checks that it was called with exactly the argv hyperpod-lab must build
(``ssm start-session --target ... --document-name AWS-StartSSHSession --parameters
portNumber=22 --region ...``), then relays its stdin/stdout to the dev cluster's sshd, as the
real ``aws`` + Session Manager plugin relay them to the node's port 22. A stand-in
``session-manager-plugin`` only has to exist (hyperpod-lab checks for it before starting).
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import time

import pytest

from hyperpod_lab import cli, devcluster
from hyperpod_lab.errors import ClusterUnreachable, ConfigError, HostKeyError
from hyperpod_lab.schedulers.remote import SSHRemote, close_all
from hyperpod_lab.schedulers.remote.route import resolve_route, ssm_proxy_argv
from hyperpod_lab.submit.clusters import ClusterProfile, save_profile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = os.path.join(REPO, "tests", "scripts", "steps.py")
SSM_TARGET = "sagemaker-cluster:abc123def456_controller-machine-i-0123456789abcdef0"


# ---------------------------------------------------------------- resolution (no network)

def _write(tmp_path, text: str, name: str = "ssh_config") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _slurm(**kw) -> ClusterProfile:
    base = dict(name="t", orchestrator="slurm", shared_root="/fsx")
    base.update(kw)
    return ClusterProfile(**base).validate()


def test_config_resolution_and_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg = _write(tmp_path, """
Host login
  HostName 127.0.0.1
  Port 2222
  User cfguser
  IdentityFile ~/k1
  ProxyJump jump@bastion:2223,mid
  ServerAliveInterval 15
  ServerAliveCountMax 4
  ConnectTimeout 7
Host bastion
  HostName bastion.example
  User notused
  IdentityFile /keys/bastion
  UserKnownHostsFile /kh/bastion /kh/bastion2
Host mid
  HostName 10.0.0.5
  ProxyCommand nc %h %p
Match host 10.0.0.*
  Port 2200
Host *
  ServerAliveInterval 99
""")
    route = resolve_route(_slurm(host="login", ssh_config=cfg, known_hosts="/kh/profile"))
    bastion, mid, login = route.hops
    assert route.ssh_config == cfg
    # a ProxyJump entry's user@host:port wins over the jump host's own entry
    assert (bastion.hostname, bastion.port, bastion.user) == ("bastion.example", 2223, "jump")
    assert bastion.key_files == ["/keys/bastion"]
    assert bastion.known_hosts == ["/kh/profile", "/kh/bastion", "/kh/bastion2"]  # profile's and config's
    assert bastion.label == "ProxyJump hop 1 (bastion:2223, HostName bastion.example)"
    # the second jump host: Match on its HostName gives the port; its own ProxyCommand is not used
    assert (mid.hostname, mid.port, mid.proxy_argv) == ("10.0.0.5", 2200, None)
    assert mid.label.startswith("ProxyJump hop 2 (mid:2200")
    # the login node: everything from the config, first value wins (15, not Host *'s 99)
    assert (login.hostname, login.port, login.user) == ("127.0.0.1", 2222, "cfguser")
    assert login.key_files == [str(tmp_path / "k1")]
    assert (login.keepalive_s, login.keepalive_count, login.connect_timeout_s) == (15, 4, 7.0)
    assert login.label == "login node login (127.0.0.1:2222)"

    # what the profile states wins over the config; port 22 and 10 s are defaults and give way
    over = resolve_route(_slurm(host="login", ssh_config=cfg, user="root", port=2022, key_file="/p/key",
                                connect_timeout_s=3)).target
    assert (over.port, over.user, over.key_files, over.connect_timeout_s) == (2022, "root", ["/p/key"], 3.0)
    # a jump host whose entry names no user / key uses the profile's
    assert resolve_route(_slurm(host="login", ssh_config=cfg, user="root", key_file="/p/key")).hops[1].key_files \
        == ["/p/key"]

    # no config at all: the profile alone, as before (the dev cluster's case)
    plain = resolve_route(_slurm(host="127.0.0.1", port=2222, user="root", key_file="/k", known_hosts="/kh"))
    (hop,) = plain.hops
    assert (hop.hostname, hop.port, hop.user, hop.key_files, hop.known_hosts, hop.proxy_argv) == \
        ("127.0.0.1", 2222, "root", ["/k"], ["/kh"], None)
    assert plain.ssh_config is None and hop.label == "login node 127.0.0.1:2222"


def test_proxycommand_runs_as_openssh_runs_it(tmp_path):
    cfg = _write(tmp_path, "Host login\n  HostName 127.0.0.1\n  Port 2222\n  ProxyCommand ssh -W %h:%p bastion\n")
    (hop,) = resolve_route(_slurm(host="login", ssh_config=cfg, user="u", key_file="/k", known_hosts="/kh")).hops
    assert hop.proxy_argv == ["/bin/sh", "-c", "exec ssh -W 127.0.0.1:2222 bastion"]
    assert hop.label == "login node login (127.0.0.1:2222) via ProxyCommand"


@pytest.mark.parametrize("text, words", [
    ("Host login\n  ProxyJump b\n  ProxyCommand nc %h %p\n", "both ProxyJump and ProxyCommand"),
    ("Host login\n  ProxyJump a\nHost a\n  ProxyJump b\nHost b\n  ProxyJump a\n", "a loop"),
    ("Host login\n  Port http\n", "Port 'http'"),
    ("Host login\n  ProxyJump user@:22\n", "is not [user@]host[:port]"),
])
def test_contradictory_or_malformed_config_is_a_clear_error(tmp_path, text, words):
    cfg = _write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        resolve_route(_slurm(host="login", ssh_config=cfg, user="u", key_file="/k", known_hosts="/kh"))
    assert words in str(e.value) and cfg in str(e.value), str(e.value)


def test_missing_ssh_config_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match="ssh_config .*nope does not exist"):
        resolve_route(_slurm(host="login", ssh_config=str(tmp_path / "nope")))


@pytest.mark.parametrize("field, value, words", [
    ("ssm_target", "--profile=evil", "ssm_target must look like"),
    ("ssm_target", "i-0abc; rm -rf ~", "ssm_target must look like"),
    ("host", "login;id", "shell characters"),
    ("user", "$(id)", "shell characters"),
    ("region", "-x", "plain name"),
])
def test_values_that_reach_a_command_line_are_validated(field, value, words):
    kw = {"host": "h", field: value} if field != "host" else {field: value}
    with pytest.raises(ConfigError, match=words):
        _slurm(**kw)


def test_ssm_route_is_an_argv_without_a_shell(tmp_path):
    p = _slurm(ssm_target=SSM_TARGET, region="us-west-2", aws_profile="research", user="ubuntu",
               key_file="/k", known_hosts="/kh", ssh_config=_write(tmp_path, "Host *\n  ProxyJump ignored\n"))
    (hop,) = resolve_route(p).hops
    assert hop.proxy_argv == ssm_proxy_argv(p) == [
        "aws", "ssm", "start-session", "--target", SSM_TARGET, "--document-name", "AWS-StartSSHSession",
        "--parameters", "portNumber=22", "--region", "us-west-2", "--profile", "research"]
    assert hop.hostname == SSM_TARGET  # the host key's name in known_hosts
    assert (hop.keepalive_s, hop.keepalive_count) == (60, 3)  # SSM drops idle sessions after 20 min


# ---------------------------------------------------------------- the dev cluster's bastion

@pytest.fixture(scope="module")
def bastion(dev_cluster):
    b = devcluster.bastion()
    assert os.path.isfile(b["known_hosts"]), "dev-cluster up did not start the bastion"
    return b


def _config(tmp_path, dev, bastion, login_path: str, bastion_known_hosts: bool = True) -> str:
    """An OpenSSH config: Host bastion (the dev cluster's jump host) and Host login (its login
    node, 127.0.0.1:2222) reached by ``login_path`` (a ProxyJump or ProxyCommand line)."""
    kh = f"  UserKnownHostsFile {bastion['known_hosts']}\n" if bastion_known_hosts else \
        f"  UserKnownHostsFile {dev.known_hosts}\n"  # the login node's key only
    return _write(tmp_path, f"""
Host bastion
  HostName 127.0.0.1
  Port {bastion['port']}
  User root
  IdentityFile {bastion['key_file']}
  IdentitiesOnly yes
  StrictHostKeyChecking yes
  GlobalKnownHostsFile /dev/null
{kh}
Host login
  HostName 127.0.0.1
  Port {dev.port}
  User root
  IdentityFile {dev.key_file}
  {login_path}
""")


def _profile(dev, name: str, **kw) -> ClusterProfile:
    """A profile like local-slurm's, with the login reached as ``kw`` says."""
    fields = dict(name=name, orchestrator="slurm", shared_root=dev.shared_root, python=dev.python,
                  defaults=dev.defaults, known_hosts=dev.known_hosts)
    fields.update(kw)
    return ClusterProfile(**fields).validate()


def _submit_and_stream(client, name: str) -> list:
    job_id = cli.run(["submit", STEPS, "--cluster", name, "--nodes", "1", "--procs-per-node", "1",
                      "--name", name, "--", "--steps", "3", "--sleep", "0.2"], client=client)
    events = list(client.follow(job_id, interval_s=0.3, timeout_s=180))
    kinds = [e.kind for e in events]
    assert kinds[0] == "submitted" and "started" in kinds and kinds[-1] == "finished", \
        f"{kinds}\n{client.logs(job_id)[-2000:]}"
    assert [e.data["step"] for e in events if e.kind == "step"][:1] == [0]  # step events are rate-limited
    assert events[-1].data["status"] == "succeeded" and events[-1].data["steps"] == 3
    return events


def _bastion_logins() -> int:
    with open(os.path.join(devcluster.base_dir(), "log", "bastion-sshd.log"), errors="replace") as f:
        return sum("Accepted publickey" in line for line in f)


@pytest.mark.parametrize("path", ["ProxyJump", "ProxyCommand"])
def test_submit_and_stream_through_the_bastion(dev_cluster, bastion, client, tmp_path, path):
    if path == "ProxyJump":
        line = "ProxyJump bastion"
    else:  # OpenSSH's own client carries the connection, reading the same config
        line = f"ProxyCommand ssh -F {tmp_path / 'ssh_config'} -o BatchMode=yes -W %h:%p bastion"
    cfg = _config(tmp_path, dev_cluster, bastion, line)
    name = f"via-{path.lower()}"
    # no user, key or port in the profile: the OpenSSH config gives them
    save_profile(_profile(dev_cluster, name, host="login", ssh_config=cfg))
    close_all()
    before = _bastion_logins()
    try:
        remote = client.scheduler(name).remote
        hops = remote.route.hops
        assert [h.alias for h in hops] == (["bastion", "login"] if path == "ProxyJump" else ["login"])
        assert hops[-1].port == dev_cluster.port and hops[-1].user == "root"
        _submit_and_stream(client, name)
        assert _bastion_logins() > before  # it went through the bastion
    finally:
        close_all()


def test_unknown_bastion_key_is_refused_naming_the_hop(dev_cluster, bastion, tmp_path):
    cfg = _config(tmp_path, dev_cluster, bastion, "ProxyJump bastion", bastion_known_hosts=False)
    with pytest.raises(HostKeyError) as e:
        SSHRemote(_profile(dev_cluster, "jump-unknown", host="login", ssh_config=cfg))
    msg = str(e.value)
    assert f"ProxyJump hop 1 (bastion:{bastion['port']}, HostName 127.0.0.1): host key not in known_hosts" in msg, msg
    assert "never trusts an unknown key" in msg


def test_changed_bastion_key_is_refused_naming_the_hop(dev_cluster, bastion, tmp_path):
    import paramiko

    other = paramiko.Ed25519Key(filename=dev_cluster.key_file)  # any ed25519 key that is not the bastion's
    wrong = tmp_path / "wrong_hosts"
    wrong.write_text(f"[127.0.0.1]:{bastion['port']} {other.get_name()} {other.get_base64()}\n")
    cfg = _config(tmp_path, dev_cluster, bastion, "ProxyJump bastion")
    with open(cfg) as f:
        text = f.read().replace(bastion["known_hosts"], str(wrong))
    with open(cfg, "w") as f:
        f.write(text)
    with pytest.raises(HostKeyError, match=r"ProxyJump hop 1 \(bastion:\d+.*\): host key does not match"):
        SSHRemote(_profile(dev_cluster, "jump-changed", host="login", ssh_config=cfg))


def test_bastion_refusing_the_tunnel_names_both_hops(dev_cluster, bastion, tmp_path):
    cfg = _config(tmp_path, dev_cluster, bastion, "ProxyJump bastion")
    # the bastion forwards only to the login node's port (PermitOpen); ask for another
    t0 = time.monotonic()
    with pytest.raises(ClusterUnreachable) as e:
        SSHRemote(_profile(dev_cluster, "jump-elsewhere", host="login", ssh_config=cfg, port=2299))
    msg = str(e.value)
    assert "ProxyJump hop 1 (bastion" in msg and "refused a tunnel to 127.0.0.1:2299" in msg, msg
    assert time.monotonic() - t0 < 10


def test_failing_proxycommand_fails_fast_with_its_stderr(dev_cluster, tmp_path):
    cfg = _write(tmp_path, "Host login\n  HostName 127.0.0.1\n"
                           "  ProxyCommand sh -c 'echo no route to %h >&2; exit 7'\n")
    t0 = time.monotonic()
    with pytest.raises(ClusterUnreachable) as e:
        SSHRemote(_profile(dev_cluster, "proxy-fails", host="login", ssh_config=cfg, user="root",
                           key_file=dev_cluster.key_file, port=dev_cluster.port))
    msg = str(e.value)
    assert "via ProxyCommand" in msg and "exited with status 7" in msg and "no route to 127.0.0.1" in msg, msg
    assert time.monotonic() - t0 < 5  # not the banner timeout


# ---------------------------------------------------------------- SSM through a STAND-IN aws

def _stand_in_aws(bindir, expect_argv: list[str], port: int, plugin: bool = True) -> str:
    """Write the STAND-IN ``aws`` (and ``session-manager-plugin``) into ``bindir``: it checks its
    argv is exactly ``expect_argv``, records it, then relays stdin/stdout to 127.0.0.1:``port``."""
    bindir.mkdir(exist_ok=True)
    (bindir / "expect.json").write_text(json.dumps({"argv": expect_argv, "port": port}))
    aws = bindir / "aws"
    aws.write_text(f"""#!{sys.executable}
# STAND-IN for the AWS CLI + Session Manager plugin, for tests only (tests/schedulers/test_access_paths.py):
# checks the exact argv, then relays the SSH bytes to the dev cluster's sshd.
import json, os, socket, sys, threading
here = os.path.dirname(os.path.abspath(__file__))
spec = json.load(open(os.path.join(here, "expect.json")))
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:] != spec["argv"]:
    sys.stderr.write("stand-in aws: unexpected argv %r, expected %r\\n" % (sys.argv[1:], spec["argv"]))
    sys.exit(2)
s = socket.create_connection(("127.0.0.1", spec["port"]))
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(data)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    os.write(1, data)
""")
    aws.chmod(aws.stat().st_mode | stat.S_IXUSR)
    if plugin:
        p = bindir / "session-manager-plugin"
        p.write_text("#!/bin/sh\n# STAND-IN: only its presence is checked\nexit 0\n")
        p.chmod(0o755)
    return str(bindir)


@pytest.fixture
def ssm_known_hosts(dev_cluster, tmp_path):
    """The login node's host key under the SSM target's name (port 22: no brackets)."""
    with open(os.path.join(os.path.dirname(dev_cluster.known_hosts), "ssh_host_ed25519_key.pub")) as f:
        keytype, key = f.read().split()[:2]
    kh = tmp_path / "ssm_known_hosts"
    kh.write_text(f"{SSM_TARGET} {keytype} {key}\n")
    return str(kh)


def _ssm_profile(dev, known_hosts: str, name: str = "hp-ssm") -> ClusterProfile:
    return _profile(dev, name, ssm_target=SSM_TARGET, region="us-east-1", user="root",
                    key_file=dev.key_file, known_hosts=known_hosts)


def test_ssm_through_a_stand_in_aws_submits_and_streams(dev_cluster, client, tmp_path, monkeypatch,
                                                         ssm_known_hosts):
    expect = ["ssm", "start-session", "--target", SSM_TARGET, "--document-name", "AWS-StartSSHSession",
              "--parameters", "portNumber=22", "--region", "us-east-1"]
    bindir = _stand_in_aws(tmp_path / "bin", expect, dev_cluster.port)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    prof = _ssm_profile(dev_cluster, ssm_known_hosts)
    save_profile(prof)
    close_all()
    try:
        remote = client.scheduler("hp-ssm").remote
        assert remote.route.target.label.endswith("via SSM")
        assert remote.run(["hostname"]).exit_status == 0
        _submit_and_stream(client, "hp-ssm")
    finally:
        close_all()
    calls = [json.loads(line) for line in (tmp_path / "bin" / "calls.jsonl").read_text().splitlines()]
    assert calls and all(c == expect for c in calls)


def test_ssm_host_key_is_verified(dev_cluster, tmp_path, monkeypatch):
    expect = ssm_proxy_argv(_ssm_profile(dev_cluster, "/x"))[1:]
    monkeypatch.setenv("PATH", f"{_stand_in_aws(tmp_path / 'bin', expect, dev_cluster.port)}:{os.environ['PATH']}")
    with pytest.raises(HostKeyError, match=f"login node {SSM_TARGET}:22 via SSM: host key not in known_hosts"):
        SSHRemote(_ssm_profile(dev_cluster, dev_cluster.known_hosts))  # has the key, but as [127.0.0.1]:2222


@pytest.mark.parametrize("missing", ["aws", "session-manager-plugin"])
def test_missing_aws_cli_or_plugin_is_a_clear_error(dev_cluster, tmp_path, monkeypatch, ssm_known_hosts, missing):
    bindir = tmp_path / "bin"
    if missing == "session-manager-plugin":
        _stand_in_aws(bindir, [], dev_cluster.port, plugin=False)
    else:
        bindir.mkdir()
    monkeypatch.setenv("PATH", str(bindir))  # nothing else: no real aws either
    with pytest.raises(ClusterUnreachable) as e:
        SSHRemote(_ssm_profile(dev_cluster, ssm_known_hosts))
    msg = str(e.value)
    if missing == "aws":
        assert "the AWS CLI ('aws') is not on PATH" in msg and "getting-started-install" in msg, msg
    else:
        assert "Session Manager plugin ('session-manager-plugin') is not on PATH" in msg, msg
        assert "session-manager-working-with-install-plugin" in msg


def test_wrong_argv_reaches_no_sshd(dev_cluster, tmp_path, monkeypatch, ssm_known_hosts):
    """The stand-in refuses any other argv: the check above is real."""
    bindir = _stand_in_aws(tmp_path / "bin", ["ssm", "something-else"], dev_cluster.port)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    with pytest.raises(ClusterUnreachable, match="exited with status 2: stand-in aws: unexpected argv"):
        SSHRemote(dataclasses.replace(_ssm_profile(dev_cluster, ssm_known_hosts), connect_timeout_s=5))
