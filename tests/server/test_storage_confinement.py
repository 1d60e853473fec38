"""The storage browser stays inside each cluster's ``shared_root`` and never changes a job's
checkpoints (issue 24, findings 5 and 6).

All real: a private OpenSSH ``sshd`` on 127.0.0.1 (key-only root login, ``internal-sftp``) stands
for the login node, real files and real symlinks in a tmp tree stand for the shared file system
(``fsx/`` the shared_root, ``fsx-other/`` a sibling with the same prefix, ``outside.txt`` next to
them), and two real jupyter servers with jupyter-fs and ``hyperpod_lab.server.storage`` (one with
the default read-only trees, one with ``HyperPodStorage.writable = true``) are driven over their
REST API. No dev Slurm cluster is used.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time

import pytest
from jupyter_server_proc import JupyterServer
from ports import free_port

from hyperpod_lab.submit.clusters import ClusterProfile

EXTS = {"jupyterfs": True, "hyperpod_lab.server.storage": True}
JOB = "hyperpod-lab/jobs/job-a"
STEP = f"{JOB}/checkpoints/step-3"
OUTSIDE = b"outside shared_root: must never be read or written from the Lab\n"
SIBLING = b"a sibling of shared_root with the same prefix\n"


def _sshd(work: str) -> tuple[subprocess.Popen, dict]:
    """A private sshd on a free port (test helper: the login node). Returns (process, profile kwargs)."""
    for tool in ("/usr/sbin/sshd", "/usr/bin/ssh-keygen"):
        if not os.access(tool, os.X_OK):
            pytest.fail(f"{tool} is missing: apt-get install openssh-server openssh-client")
    ssh = os.path.join(work, "ssh")
    os.makedirs(ssh, mode=0o700)
    host_key, client_key = os.path.join(ssh, "host_ed25519"), os.path.join(ssh, "id_ed25519")
    for k in (host_key, client_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", k], check=True)
    with open(client_key + ".pub") as src, open(os.path.join(ssh, "authorized_keys"), "w") as dst:
        dst.write(src.read())
    port = free_port()
    with open(host_key + ".pub") as f:
        host_pub = " ".join(f.read().split()[:2])
    known_hosts = os.path.join(ssh, "known_hosts")
    with open(known_hosts, "w") as f:
        f.write(f"[127.0.0.1]:{port} {host_pub}\n")
    conf = os.path.join(ssh, "sshd_config")
    with open(conf, "w") as f:
        f.write(f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {ssh}/sshd.pid\n"
                f"AuthorizedKeysFile {ssh}/authorized_keys\nPermitRootLogin prohibit-password\n"
                "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                "UsePAM no\nStrictModes no\nSubsystem sftp internal-sftp\nLogLevel INFO\n")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    log = os.path.join(ssh, "sshd.log")
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", conf], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 10
    import socket
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"sshd did not listen on 127.0.0.1:{port} within 10 s: {open(log).read()}")
    if proc.poll() is not None:
        pytest.fail(f"sshd exited with {proc.returncode}: {open(log).read()}")
    return proc, {"host": "127.0.0.1", "port": port, "user": "root", "key_file": client_key,
                  "known_hosts": known_hosts}


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _make_job(root: str, rel: str) -> str:
    """A job directory as the launcher leaves it: spec.json, events/, logs/ and a committed checkpoint."""
    _write(os.path.join(root, rel, "spec.json"), f'{{"name": "{os.path.basename(rel)}"}}\n'.encode())
    _write(os.path.join(root, rel, "events", "events.jsonl"), b'{"kind": "started"}\n{"kind": "finished"}\n')
    _write(os.path.join(root, rel, "logs", "rank-0.log"), b"step 1\nstep 2\nstep 3\n")
    _write(os.path.join(root, rel, "checkpoints", "step-3", "COMMITTED"), b'{"step": 3, "world_size": 1}\n')
    _write(os.path.join(root, rel, "checkpoints", "step-3", ".metadata"), bytes(range(256)))
    _write(os.path.join(root, rel, "checkpoints", "step-3", "__0_0.distcp"), os.urandom(4096))
    return os.path.join(root, rel)


def _tree(top: str) -> dict[str, bytes | str]:
    """Every file's bytes and every directory (by its path relative to ``top``)."""
    out: dict[str, bytes | str] = {}
    for d, dirs, files in os.walk(top):
        for n in dirs:
            out[os.path.relpath(os.path.join(d, n), top)] = "dir"
        for n in files:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), top)] = f.read()
    return out


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    """The shared file system and its login node: ``fsx/`` (shared_root) with one job that has
    events, logs and a committed checkpoint, symlinks out of it and into the checkpoint;
    ``fsx-other/`` and ``outside.txt`` beside it."""
    base = str(tmp_path_factory.mktemp("confine"))
    top = os.path.join(base, "fs")
    root = os.path.join(top, "fsx")
    _write(os.path.join(top, "outside.txt"), OUTSIDE)
    _write(os.path.join(top, "fsx-other", "secret.txt"), SIBLING)
    for job in (JOB, "hyperpod-lab/jobs/job-rename", "hyperpod-lab/jobs/job-delete"):
        _make_job(root, job)
    _write(os.path.join(root, "notes.txt"), b"my notes\n")
    os.symlink("../outside.txt", os.path.join(root, "link-out"))
    os.symlink(os.path.join(top, "fsx-other"), os.path.join(root, "dir-out"))
    os.symlink(f"{STEP}/COMMITTED", os.path.join(root, "link-committed"))
    os.symlink(f"{JOB}/checkpoints", os.path.join(root, "ckpt-dir-link"))
    os.symlink("../created-outside.txt", os.path.join(root, "dangle-out"))  # a link to a file not there yet
    proc, ssh = _sshd(base)
    profile = ClusterProfile(name="fsbox", orchestrator="slurm", shared_root=root, **ssh).validate()
    import tomli_w

    cfg = os.path.join(base, "clusters.toml")
    with open(cfg, "wb") as f:
        tomli_w.dump({"clusters": {"fsbox": profile.to_toml_table()}}, f)
    yield {"top": top, "root": root, "cfg": cfg}
    proc.terminate()
    proc.wait(timeout=10)


def _server(storage, tmp_path_factory, writable: bool):
    work = str(tmp_path_factory.mktemp("rw" if writable else "ro"))
    local = os.path.join(work, "root")
    os.makedirs(local)
    srv = JupyterServer(local, work)
    with open(srv.config) as f:
        conf = json.load(f)
    conf["ServerApp"]["jpserver_extensions"].update(EXTS)
    conf["HyperPodStorage"] = {"writable": writable}
    with open(srv.config, "w") as f:
        json.dump(conf, f)
    old = os.environ.get("HYPERPOD_LAB_CONFIG")
    os.environ["HYPERPOD_LAB_CONFIG"] = storage["cfg"]
    try:
        srv.start(90.0)
    finally:
        if old is None:
            os.environ.pop("HYPERPOD_LAB_CONFIG", None)
        else:
            os.environ["HYPERPOD_LAB_CONFIG"] = old
    status, res = srv.call("GET", "/jupyterfs/resources")
    assert status == 200 and len(res) == 1 and res[0]["init"] is True, (res, srv.log_text()[-3000:])
    srv.drive = res[0]["drive"]
    return srv


@pytest.fixture(scope="module")
def ro(storage, tmp_path_factory):
    srv = _server(storage, tmp_path_factory, writable=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def rw(storage, tmp_path_factory):
    srv = _server(storage, tmp_path_factory, writable=True)
    yield srv
    srv.stop()


def _get(srv, rel: str):
    return srv.call("GET", f"/api/contents/{srv.drive}:{rel}?content=1")


def _put_text(srv, rel: str, text: str):
    return srv.call("PUT", f"/api/contents/{srv.drive}:{rel}", {"type": "file", "format": "text", "content": text})


def _all_forbidden(srv, *requests) -> None:
    """Each request is 403: ``("PUT", rel, text)`` writes a text file through the contents API,
    any other ``(method, rel, body)`` is sent as is (``rel`` below the drive)."""
    for method, rel, payload in requests:
        if method == "PUT":
            status, body = _put_text(srv, rel, payload)
        else:
            status, body = srv.call(method, f"/api/contents/{srv.drive}:{rel}", payload)
        assert status == 403, (method, rel, status, body)


def _refused(status, body, *words) -> None:
    assert status == 403, (status, body)
    msg = body["message"] if isinstance(body, dict) else str(body)
    for w in words:
        assert w in msg, (w, msg)


def _no_leak(body) -> None:
    text = json.dumps(body)
    assert base64.b64encode(OUTSIDE).decode() not in text and OUTSIDE.decode().strip() not in text
    assert SIBLING.decode().strip() not in text


# ---------------------------------------------------------------- the tree still works

@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_browsing_inside_shared_root_still_works(storage, mode, request):
    srv = request.getfixturevalue(mode)
    status, top = _get(srv, "")
    assert status == 200 and top["type"] == "directory", top
    names = {c["name"] for c in top["content"]}
    assert {"hyperpod-lab", "notes.txt", "link-out", "dir-out", "link-committed", "dangle-out"} <= names, names
    status, step = _get(srv, STEP)
    assert status == 200 and {c["name"] for c in step["content"]} == {"COMMITTED", ".metadata", "__0_0.distcp"}
    status, marker = _get(srv, f"{STEP}/COMMITTED")
    assert status == 200 and json.loads(marker["content"])["step"] == 3, marker
    status, note = _get(srv, "/notes.txt")
    assert status == 200 and note["content"] == "my notes\n", note


# ---------------------------------------------------------------- finding 5: confinement

@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_dotdot_out_of_shared_root_is_refused(storage, mode, request):
    srv = request.getfixturevalue(mode)
    for rel in ("../outside.txt", "hyperpod-lab/../../outside.txt", "/../outside.txt"):
        status, body = _get(srv, rel)
        _refused(status, body, "outside", "shared_root")
        _no_leak(body)
    _all_forbidden(srv, ("PUT", "../outside.txt", "overwritten"), ("PUT", "../new-outside.txt", "created"),
                   ("DELETE", "../outside.txt", None), ("PATCH", "notes.txt", {"path": f"{srv.drive}:../notes.txt"}))
    with open(os.path.join(storage["top"], "outside.txt"), "rb") as f:
        assert f.read() == OUTSIDE
    assert not os.path.exists(os.path.join(storage["top"], "new-outside.txt"))
    assert not os.path.exists(os.path.join(storage["top"], "notes.txt"))
    assert os.path.exists(os.path.join(storage["root"], "notes.txt"))


@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_sibling_with_the_same_prefix_is_refused(storage, mode, request):
    """``<shared_root>-other`` starts with the text of ``<shared_root>``: not inside it."""
    srv = request.getfixturevalue(mode)
    sibling = storage["root"] + "-other"  # /…/fsx-other: "<drive>:/…/fsx-other/x" starts with the root's text
    for rel in (sibling + "/secret.txt", "../fsx-other/secret.txt"):
        status, body = _get(srv, rel)
        _refused(status, body, "outside", "shared_root")
        _no_leak(body)
    status, body = _get(srv, sibling)
    _refused(status, body, "outside")
    status, body = _put_text(srv, sibling + "/secret.txt", "overwritten")
    assert status == 403, (status, body)
    status, body = _put_text(srv, sibling + "/planted.txt", "x")
    assert status == 403, (status, body)
    # (jupyter-server strips a DELETE's leading '/': "<drive>:/…/fsx-other" is then <root>/…/fsx-other)
    status, body = srv.call("DELETE", f"/api/contents/{srv.drive}:../fsx-other/secret.txt")
    assert status == 403, (status, body)
    with open(os.path.join(sibling, "secret.txt"), "rb") as f:
        assert f.read() == SIBLING
    assert os.listdir(sibling) == ["secret.txt"]


@pytest.mark.parametrize("mode", ["ro", "rw"])
def test_symlinks_out_of_shared_root_are_refused(storage, mode, request):
    """``link-out -> ../outside.txt`` and ``dir-out -> <top>/fsx-other``: listed as entries of
    shared_root, but never read, written or walked through."""
    srv = request.getfixturevalue(mode)
    for rel in ("link-out", "dir-out/secret.txt", "dir-out"):
        status, body = _get(srv, rel)
        _refused(status, body, "outside", "shared_root", "link")
        _no_leak(body)
    status, body = srv.call("GET", f"/files/{srv.drive}:link-out")
    assert status == 403, (status, body)
    _no_leak(body)
    _all_forbidden(srv, ("PUT", "link-out", "overwritten"), ("PUT", "dir-out/planted.txt", "x"),
                   ("PUT", "dangle-out", "created through a dangling link"))
    assert not os.path.exists(os.path.join(storage["top"], "created-outside.txt"))
    _all_forbidden(srv, ("DELETE", "dir-out/secret.txt", None), ("POST", "", {"copy_from": f"{srv.drive}:link-out"}))
    with open(os.path.join(storage["top"], "outside.txt"), "rb") as f:
        assert f.read() == OUTSIDE
    assert os.listdir(os.path.join(storage["top"], "fsx-other")) == ["secret.txt"]


# ---------------------------------------------------------------- finding 6: checkpoints

def test_save_through_a_symlink_to_a_committed_marker_is_refused(storage, rw):
    marker = os.path.join(storage["root"], STEP, "COMMITTED")
    with open(marker, "rb") as f:
        before = f.read()
    status, body = _put_text(rw, "link-committed", '{"step": 999}')
    _refused(status, body, "checkpoints", "immutable")
    status, body = _put_text(rw, "ckpt-dir-link/step-3/COMMITTED", '{"step": 999}')
    _refused(status, body, "checkpoints")
    status, body = _put_text(rw, "ckpt-dir-link/step-3/planted.txt", "x")
    _refused(status, body, "checkpoints")
    status, body = rw.call("DELETE", f"/api/contents/{rw.drive}:ckpt-dir-link/step-3")
    _refused(status, body, "checkpoints")
    with open(marker, "rb") as f:
        assert f.read() == before
    assert sorted(os.listdir(os.path.dirname(marker))) == [".metadata", "COMMITTED", "__0_0.distcp"]


def test_renaming_a_job_folder_that_holds_checkpoints_is_refused(storage, rw):
    job = "hyperpod-lab/jobs/job-rename"
    before = _tree(os.path.join(storage["root"], job))
    assert "checkpoints/step-3/COMMITTED" in before
    status, body = rw.call("PATCH", f"/api/contents/{rw.drive}:{job}", {"path": f"{rw.drive}:{job}-moved"})
    _refused(status, body, f"{job}/checkpoints", "immutable")
    status, body = rw.call("PATCH", f"/api/contents/{rw.drive}:hyperpod-lab",
                           {"path": f"{rw.drive}:hyperpod-lab-moved"})
    _refused(status, body, "checkpoints")
    assert not os.path.exists(os.path.join(storage["root"], job + "-moved"))
    assert not os.path.exists(os.path.join(storage["root"], "hyperpod-lab-moved"))
    assert _tree(os.path.join(storage["root"], job)) == before


def test_deleting_a_job_folder_that_holds_checkpoints_deletes_nothing(storage, rw):
    """Checked before anything is deleted: events/, logs/, spec.json and the checkpoint all stay,
    byte for byte."""
    job = "hyperpod-lab/jobs/job-delete"
    before = _tree(os.path.join(storage["root"], job))
    assert "events/events.jsonl" in before and "checkpoints/step-3/COMMITTED" in before
    status, body = rw.call("DELETE", f"/api/contents/{rw.drive}:{job}")
    after = _tree(os.path.join(storage["root"], job))
    assert sorted(set(before) - set(after)) == [] and after == before  # nothing deleted, nothing changed
    _refused(status, body, f"{job}/checkpoints", "immutable")
    status, body = rw.call("DELETE", f"/api/contents/{rw.drive}:hyperpod-lab")
    _refused(status, body, "checkpoints")
    assert _tree(os.path.join(storage["root"], job)) == before


def test_writable_tree_still_writes_renames_and_deletes_elsewhere(storage, rw, ro):
    """The guards refuse only what they must: a job folder without checkpoints can go."""
    root = storage["root"]
    status, body = rw.call("PUT", f"/api/contents/{rw.drive}:scratch", {"type": "directory"})
    assert status in (200, 201), (status, body)
    status, body = _put_text(rw, "scratch/new.txt", "hello")
    assert status in (200, 201), (status, body)
    assert open(os.path.join(root, "scratch", "new.txt")).read() == "hello"
    status, body = rw.call("PATCH", f"/api/contents/{rw.drive}:scratch/new.txt", {"path": f"{rw.drive}:scratch/b.txt"})
    assert status == 200, (status, body)
    _write(os.path.join(root, "hyperpod-lab/jobs/job-b/events/events.jsonl"), b"{}\n")
    status, body = rw.call("DELETE", f"/api/contents/{rw.drive}:hyperpod-lab/jobs/job-b")
    assert status == 204, (status, body)
    assert not os.path.exists(os.path.join(root, "hyperpod-lab/jobs/job-b"))
    status, body = rw.call("DELETE", f"/api/contents/{rw.drive}:scratch")
    assert status == 204, (status, body)
    assert not os.path.exists(os.path.join(root, "scratch"))
    # the read-only tree refuses the same write
    status, body = _put_text(ro, "notes.txt", "x")
    _refused(status, body, "read-only")
    assert open(os.path.join(root, "notes.txt")).read() == "my notes\n"


# ---------------------------------------------------------------- the same rules in fsspec itself

def test_hyperpod_filesystem_with_root_confines_every_call(storage, monkeypatch):
    """``hyperpod://`` with ``root`` (what jupyter-fs's resources pass) outside the Lab: every
    call is confined and checked before it changes anything; a resource configured by hand
    without ``root`` gets its URL's directory as root."""
    import fsspec

    from hyperpod_lab.server import storage as st

    monkeypatch.setenv("HYPERPOD_LAB_CONFIG", storage["cfg"])
    st.register()
    root, top = storage["root"], storage["top"]
    fs = fsspec.filesystem("hyperpod", host="fsbox", writable=True, root=root)
    assert fs.cat_file(f"{root}/notes.txt") == b"my notes\n"
    assert fs.cat_file("notes.txt") == b"my notes\n"  # relative to root
    for p in ("../outside.txt", f"{top}/outside.txt", f"{root}-other/secret.txt", f"{root}/link-out",
              f"{root}/dir-out/secret.txt", f"{root}/hyperpod-lab/../../outside.txt"):
        with pytest.raises(PermissionError, match="outside the cluster's shared_root"):
            fs.cat_file(p)
    with pytest.raises(PermissionError, match="outside"):
        fs.ls(f"{root}/dir-out")
    with pytest.raises(PermissionError, match="created-outside.txt, which is outside"):
        fs.pipe_file(f"{root}/dangle-out", b"x")  # a dangling link: where it would write is checked
    entries = {os.path.basename(e["name"]): e for e in fs.ls(root, detail=True)}
    assert fs.info(f"{root}/link-out")["link_outside"] is True and entries["link-out"]["type"] == "link"
    job = _make_job(root, "hyperpod-lab/jobs/job-fsspec")
    before = _tree(job)
    for op in (lambda: fs.rm(job, recursive=True), lambda: fs.mv(job, job + "-moved"),
               lambda: fs.rm([f"{root}/notes.txt", job], recursive=True),
               lambda: fs.pipe_file(f"{root}/link-committed", b"{}")):
        with pytest.raises(PermissionError, match="immutable"):
            op()
    assert _tree(job) == before and open(f"{root}/notes.txt", "rb").read() == b"my notes\n"
    fs.makedirs(f"{root}/made/a/b")
    assert os.path.isdir(f"{root}/made/a/b")
    fs.rm(f"{root}/made", recursive=True)
    assert not os.path.exists(f"{root}/made")
    for p in (f"{root}-other/x", f"{top}/made-outside"):
        with pytest.raises(PermissionError, match="outside"):
            fs.makedirs(p)
    assert not os.path.exists(f"{top}/made-outside") and os.listdir(f"{root}-other") == ["secret.txt"]

    hand = {"name": "mine", "url": f"hyperpod://fsbox{root}", "type": "fsspec", "auth": "none",
            "kwargs": {"writable": True}}
    assert st._confined_resource(hand)["kwargs"] == {"writable": True, "root": root}
    assert st._confined_resource({**hand, "kwargs": {"root": "/x"}})["kwargs"] == {"root": "/x"}
    assert st._confined_resource({"url": "file:///tmp"}) == {"url": "file:///tmp"}
