"""The cluster's shared storage in the Lab's file browser (issue 18 item 5): jupyter-fs over
hyperpod_lab.server.storage.HyperPodFileSystem (fsspec's SFTP filesystem on the submission's route),
all real: a real jupyter server with jupyter-fs loaded, a real Slurm job on the dev cluster that
writes checkpoints, SFTP to the dev cluster's sshd, directly and through its bastion (ProxyJump),
and the file browser in Debian's Chromium."""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.request

import pytest
from jupyter_server_proc import JupyterServer
from lab_browser import playwright_or_fail, screenshot
from ports import free_port

from hyperpod_lab import cli, devcluster
from hyperpod_lab.runtime.checkpoint.format import COMMIT_MARKER, METADATA_FILE
from hyperpod_lab.submit.clusters import ClusterProfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "examples", "train_lm.py")
ARTIFACTS = os.path.join(REPO, "test-artifacts", "storage")
EXTS = {"jupyterfs": True, "hyperpod_lab.server.storage": True}


def _bastion_logins() -> int:
    with open(os.path.join(devcluster.base_dir(), "log", "bastion-sshd.log"), errors="replace") as f:
        return sum("Accepted publickey" in line for line in f)


class FreezableRelay:
    """Test helper (a stand-in for a network that stops carrying packets, not product code): a
    TCP relay on 127.0.0.1 to ``target``; :meth:`freeze` stops moving bytes both ways (the
    connections stay open, as with a dead link), :meth:`thaw` resumes."""

    def __init__(self, target: tuple[str, int]):
        import socket
        import threading

        self.target, self._frozen, self._stop = target, threading.Event(), threading.Event()
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._srv.settimeout(0.2)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while not self._stop.is_set():
            try:
                a, _ = self._srv.accept()
            except (socket.timeout, OSError):
                continue
            try:
                b = socket.create_connection(self.target)
            except OSError:
                a.close()
                continue
            for src, dst in ((a, b), (b, a)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src, dst):
        import select

        try:
            while not self._stop.is_set():
                if self._frozen.is_set() or not select.select([src], [], [], 0.1)[0]:
                    time.sleep(0.05) if self._frozen.is_set() else None
                    continue
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except (OSError, ValueError):  # the other direction closed both sockets
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.close()
                except OSError:
                    pass

    def freeze(self):
        self._frozen.set()

    def thaw(self):
        self._frozen.clear()

    def stop(self):
        self._stop.set()
        self._srv.close()


def _clusters_toml(path: str, dev, work: str, relay: FreezableRelay) -> None:
    """Four profiles: the dev cluster direct, the same through the bastion (ProxyJump from an
    OpenSSH config), one whose login node does not answer (a closed port), and one through
    ``relay`` (op_timeout_s 3 s; its known_hosts names the dev login node's key at the relay's
    port)."""
    import tomli_w

    b = devcluster.bastion()
    ssh_config = os.path.join(work, "ssh_config")
    with open(ssh_config, "w") as f:
        f.write(f"Host bastion\n  HostName 127.0.0.1\n  Port {b['port']}\n  User root\n  IdentityFile {b['key_file']}\n"
                f"  UserKnownHostsFile {b['known_hosts']}\n\n"
                f"Host login\n  HostName 127.0.0.1\n  Port {dev.port}\n  User root\n  IdentityFile {dev.key_file}\n"
                f"  ProxyJump bastion\n")
    base = dict(orchestrator="slurm", shared_root=dev.shared_root, python=dev.python, known_hosts=dev.known_hosts)
    profiles = [
        dev,
        ClusterProfile(name="via-jump", host="login", ssh_config=ssh_config, **base),
        ClusterProfile(name="down", host="127.0.0.1", port=free_port(), user="root", key_file=dev.key_file,
                       connect_timeout_s=2.0, **base),
    ]
    with open(dev.known_hosts) as f:
        keys = [ln.split(None, 1)[1] for ln in f if ln.startswith(f"[127.0.0.1]:{dev.port} ")]
    assert keys, f"no [127.0.0.1]:{dev.port} entry in {dev.known_hosts}"
    relay_kh = os.path.join(work, "relay_known_hosts")
    with open(relay_kh, "w") as f:
        f.writelines(f"[127.0.0.1]:{relay.port} {k}" for k in keys)
    base["known_hosts"] = relay_kh
    profiles.append(ClusterProfile(name="flaky", host="127.0.0.1", port=relay.port, user="root", key_file=dev.key_file,
                                   op_timeout_s=3.0, **base))
    doc = {"clusters": {p.name: p.validate().to_toml_table() for p in profiles}}
    with open(path, "wb") as f:
        tomli_w.dump(doc, f)


@pytest.fixture(scope="module")
def ckpt_job(dev_cluster, tmp_path_factory):
    """One short real Slurm job (3 steps, a checkpoint after each) on the dev cluster."""
    from hyperpod_lab.submit.client import Client
    from hyperpod_lab.submit.jobs import JobStore

    client = Client(JobStore(str(tmp_path_factory.mktemp("store") / "jobs")))
    job_id = cli.run(["submit", EXAMPLE, "--cluster", "local-slurm", "--nodes", "1", "--procs-per-node", "1",
                      "--checkpoint-every", "1", "--name", "storage", "--", "--steps", "3", "--d-model", "32",
                      "--n-layers", "1", "--n-heads", "2", "--seq-len", "32"], client=client)
    events = list(client.follow(job_id, interval_s=0.3, timeout_s=240))
    assert events and events[-1].kind == "finished" and events[-1].data["status"] == "succeeded", \
        f"{[e.kind for e in events]}\n{client.logs(job_id)[-3000:]}"
    job_dir = client.get(job_id).job_dir
    ckpts = sorted(d for d in os.listdir(os.path.join(job_dir, "checkpoints")) if d.startswith("step-"))
    assert ckpts, os.listdir(job_dir)
    return {"job_id": job_id, "job_dir": job_dir, "ckpt": os.path.join(job_dir, "checkpoints", ckpts[-1])}


@pytest.fixture(scope="module")
def relay(dev_cluster):
    r = FreezableRelay(("127.0.0.1", dev_cluster.port))
    yield r
    r.stop()


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    """A login node that lets the client in, accepts the sftp subsystem and never answers (test helper)."""
    from hung_sftp import HungSSHServer, new_key_pair

    key_file, key = new_key_pair(str(tmp_path_factory.mktemp("hung-key")))
    srv = HungSSHServer(key).start()
    srv.key_file = key_file
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def clusters_cfg(dev_cluster, relay, hung, tmp_path_factory) -> str:
    """The profiles of :func:`_clusters_toml` and 'hung' (:func:`hung`, op_timeout_s 2 s)."""
    import tomli_w

    work = str(tmp_path_factory.mktemp("storage-clusters"))
    cfg = os.path.join(work, "clusters.toml")
    _clusters_toml(cfg, dev_cluster, work, relay)
    kh = os.path.join(work, "hung_known_hosts")
    with open(kh, "w") as f:
        f.write(hung.known_hosts_line)
    p = ClusterProfile(name="hung", orchestrator="slurm", host="127.0.0.1", port=hung.port, user="root",
                       key_file=hung.key_file, known_hosts=kh, shared_root="/fsx", op_timeout_s=2.0).validate()
    with open(cfg, "rb") as f:
        import tomllib

        doc = tomllib.load(f)
    doc["clusters"]["hung"] = p.to_toml_table()
    with open(cfg, "wb") as f:
        tomli_w.dump(doc, f)
    return cfg


@pytest.fixture(scope="module")
def server(clusters_cfg, tmp_path_factory):
    """A real jupyter server with jupyter-fs and hyperpod_lab.server.storage, its clusters config holding
    the three profiles of :func:`_clusters_toml`."""
    work = str(tmp_path_factory.mktemp("storage-server"))
    root = os.path.join(work, "root")
    os.makedirs(root)
    cfg = clusters_cfg
    srv = JupyterServer(root, work)
    with open(srv.config) as f:
        conf = json.load(f)
    conf["ServerApp"]["jpserver_extensions"].update(EXTS)
    with open(srv.config, "w") as f:
        json.dump(conf, f)
    old = os.environ.get("HYPERPOD_LAB_CONFIG")
    os.environ["HYPERPOD_LAB_CONFIG"] = cfg
    try:
        srv.bastion_logins_before = _bastion_logins()
        t0 = time.monotonic()
        srv.start(90.0)
        srv.start_s = time.monotonic() - t0
    finally:
        os.environ["HYPERPOD_LAB_CONFIG"] = old
    yield srv
    srv.stop()


def _drives(srv) -> dict[str, dict]:
    status, res = srv.call("GET", "/jupyterfs/resources")
    assert status == 200, res
    return {r["url"].split("/")[2]: r for r in res}


def _rel(dev, path: str) -> str:
    return os.path.relpath(path, dev.shared_root)


def _download(srv, path: str) -> bytes:
    req = urllib.request.Request(f"{srv.url}/files/{urllib.request.quote(path)}",
                                 headers={"Authorization": f"token {srv.token}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        return r.read()


@pytest.mark.parametrize("cluster", ["local-slurm", "via-jump"])
def test_checkpoint_listed_opened_and_downloaded_through_jupyterfs(server, ckpt_job, dev_cluster, cluster):
    drives = _drives(server)
    r = drives[cluster]
    assert r["init"] is True and r["type"] == "fsspec" and r["url"] == f"hyperpod://{cluster}{dev_cluster.shared_root}"
    drive, rel = r["drive"], _rel(dev_cluster, ckpt_job["ckpt"])

    # the job directory and its checkpoint directory, listed over SFTP through jupyter-fs
    status, job = server.call("GET", f"/api/contents/{drive}:{_rel(dev_cluster, ckpt_job['job_dir'])}")
    assert status == 200, job
    assert {"checkpoints", "logs", "events", "spec.json"} <= {c["name"] for c in job["content"]}
    status, listing = server.call("GET", f"/api/contents/{drive}:{rel}")
    assert status == 200 and listing["type"] == "directory", listing
    local = sorted(os.listdir(ckpt_job["ckpt"]))
    assert sorted(c["name"] for c in listing["content"]) == local  # .metadata too (allow_hidden)
    sizes = {c["name"]: c["size"] for c in listing["content"]}
    assert sizes == {n: os.path.getsize(os.path.join(ckpt_job["ckpt"], n)) for n in local}

    # the checkpoint's metadata: the commit marker opens as text (JSON: step, world size, file table)
    status, marker = server.call("GET", f"/api/contents/{drive}:{rel}/{COMMIT_MARKER}?content=1")
    assert status == 200 and marker["format"] == "text" and marker["mimetype"] == "text/plain", marker
    meta = json.loads(marker["content"])
    with open(os.path.join(ckpt_job["ckpt"], COMMIT_MARKER)) as f:
        assert meta == json.load(f)
    assert meta["world_size"] == 1 and METADATA_FILE in meta["files"] and meta["step"] == int(rel.rsplit("-", 1)[1])
    # DCP's .metadata is binary (pickled): it comes as base64, byte for byte
    status, dcp = server.call("GET", f"/api/contents/{drive}:{rel}/{METADATA_FILE}?content=1")
    assert status == 200 and dcp["format"] == "base64", {k: dcp[k] for k in dcp if k != "content"}
    with open(os.path.join(ckpt_job["ckpt"], METADATA_FILE), "rb") as f:
        assert base64.b64decode(dcp["content"]) == f.read()

    # a shard, downloaded as the Lab downloads (/files/<path>): the same bytes as on shared storage
    shard = next(n for n in local if n.endswith(".distcp"))
    data = _download(server, f"{drive}:{rel}/{shard}")
    with open(os.path.join(ckpt_job["ckpt"], shard), "rb") as f:
        assert data == f.read()
    assert meta["files"][shard]["bytes"] == len(data)
    if cluster == "via-jump":  # the server's connection (made at its start) went through the bastion
        assert _bastion_logins() > server.bastion_logins_before

    # jupyter-server's file-checkpoint API still answers for a file (the Lab asks when it opens one)
    status, cps = server.call("GET", f"/api/contents/{drive}:{rel}/{COMMIT_MARKER}/checkpoints")
    assert status == 200 and isinstance(cps, list), cps  # jupyter-fs keeps none: its placeholder entry


def test_checkpoints_cannot_be_changed_from_the_lab(server, ckpt_job, dev_cluster):
    drive, rel = _drives(server)["local-slurm"]["drive"], _rel(dev_cluster, ckpt_job["ckpt"])
    marker = os.path.join(ckpt_job["ckpt"], COMMIT_MARKER)
    with open(marker, "rb") as f:
        before = f.read()
    status, body = server.call("DELETE", f"/api/contents/{drive}:{rel}/{COMMIT_MARKER}")
    assert status >= 400 and "read-only" in json.dumps(body), (status, body)
    status, body = server.call("PUT", f"/api/contents/{drive}:{rel}/{COMMIT_MARKER}",
                               {"type": "file", "format": "text", "content": "{}"})
    assert status >= 400 and "read-only" in json.dumps(body), (status, body)
    status, body = server.call("PATCH", f"/api/contents/{drive}:{rel}", {"path": f"{drive}:{rel}-moved"})
    assert status >= 400, (status, body)
    status, body = server.call("PUT", f"/api/contents/{drive}:{_rel(dev_cluster, ckpt_job['job_dir'])}/new.txt",
                               {"type": "file", "format": "text", "content": "x"})
    assert status >= 400 and "read-only" in json.dumps(body), (status, body)
    with open(marker, "rb") as f:
        assert f.read() == before
    assert not os.path.exists(os.path.join(ckpt_job["job_dir"], "new.txt"))


def test_unreachable_cluster_is_an_error_and_the_lab_keeps_working(server, dev_cluster):
    drives = _drives(server)
    assert drives["down"]["init"] is False  # jupyter-fs shows the resource as not loaded
    assert drives["hung"]["init"] is False  # in, but its SFTP never answered: given up after op_timeout_s
    assert drives["local-slurm"]["init"] is True
    assert server.start_s < 60
    # the Lab's POST on each page load: jupyter-fs re-creates failed resources on the event loop;
    # a cluster that failed is not tried again for RETRY_AFTER_S, so the answer comes at once
    t0 = time.monotonic()
    status, res = server.call("POST", "/jupyterfs/resources", {"resources": [], "options": {"_addServerside": True}})
    assert status == 200 and time.monotonic() - t0 < 1.5, (status, time.monotonic() - t0)
    assert {r["url"].split("/")[2]: r["init"] for r in res} == {"local-slurm": True, "via-jump": True, "down": False,
                                                                 "flaky": True, "hung": False}
    status, _ = server.call("GET", "/api/status")
    assert status == 200
    status, root = server.call("GET", "/api/contents/")  # the local tree is the server's root dir as before
    assert status == 200 and root["type"] == "directory"
    log = server.log_text()
    assert "cannot reach" in log and "cluster 'down'" in log
    assert "cluster 'hung'" in log and "SFTP subsystem did not start within 2 s" in log


def test_a_dead_link_fails_the_drive_call_and_never_blocks_the_server(server, relay, dev_cluster):
    """The link to 'flaky' stops carrying packets: a listing there fails after op_timeout_s (3 s)
    with 504 naming the cluster, while the server answers other requests at once (the drive's
    calls run in its own thread); once the link is back, the next listing reconnects."""
    import threading

    drive = _drives(server)["flaky"]["drive"]
    status, body = server.call("GET", f"/api/contents/{drive}:hyperpod-lab")
    assert status == 200 and body["type"] == "directory", body
    relay.freeze()
    try:
        out = {}

        def hung_listing():
            t0 = time.monotonic()
            out["reply"] = server.call("GET", f"/api/contents/{drive}:hyperpod-lab/jobs", timeout_s=60)
            out["s"] = time.monotonic() - t0

        t = threading.Thread(target=hung_listing)
        t.start()
        time.sleep(0.5)
        for path in ("/api/status", "/api/contents/", "/jupyterfs/resources"):
            t0 = time.monotonic()
            status, _ = server.call("GET", path, timeout_s=10)
            assert status == 200 and time.monotonic() - t0 < 1.0, (path, time.monotonic() - t0)
        assert t.is_alive()  # still waiting for the cluster meanwhile
        t.join(30)
    finally:
        relay.thaw()
    status, body = out["reply"]
    assert status == 504 and "cluster 'flaky'" in body["message"], body
    if "op_timeout_s" in body["message"]:  # the drive's open connection stopped answering
        assert 2.5 < out["s"] < 15, out["s"]
    else:  # the drive had dropped its idle connection and reconnected over the frozen link
        # (fresh-clone run fresh9 on 5f1a76d: "SSH handshake failed (Error reading SSH protocol banner)")
        assert "cannot reach login node" in body["message"] and out["s"] < 15, (body, out["s"])
    status, body = server.call("GET", f"/api/contents/{drive}:hyperpod-lab")  # reconnects
    assert status == 200 and body["type"] == "directory", body


def test_one_resource_per_usable_slurm_profile():
    """Slurm profiles with a shared_root get a tree; eks/local profiles, names that cannot be a
    URL host and profiles still holding FILL-IN placeholders do not."""
    from hyperpod_lab.server import storage
    ps = {"hp": ClusterProfile("hp", "slurm", host="h", shared_root="/fsx/"),
          "new": ClusterProfile("new", "slurm", host="FILL-IN-login-node", shared_root="/fsx"),
          "a b": ClusterProfile("a b", "slurm", host="h", shared_root="/fsx"),
          "k8s": ClusterProfile("k8s", "eks", kube_context="ctx"),
          "local": ClusterProfile("local", "local", shared_root="/tmp/x")}
    assert storage.jupyterfs_resources(ps, writable=True) == [
        {"name": "hp: /fsx", "url": "hyperpod://hp/fsx", "type": "fsspec", "auth": "none", "defaultWritable": True,
         "kwargs": {"writable": True, "root": "/fsx"}}]


def test_hyperpod_urls_in_fsspec_read_and_guard_writes(dev_cluster, ckpt_job):
    """hyperpod:// through fsspec itself (as a notebook would use it): reads; read-only by default;
    writable=True writes and deletes, except below a checkpoints directory."""
    import fsspec

    from hyperpod_lab.server import storage
    storage.register()
    url = f"hyperpod://local-slurm{ckpt_job['ckpt']}/{COMMIT_MARKER}"
    with fsspec.open(url, "rb") as f:
        with open(os.path.join(ckpt_job["ckpt"], COMMIT_MARKER), "rb") as want:
            assert f.read() == want.read()
    ro = fsspec.filesystem("hyperpod", host="local-slurm")
    assert isinstance(ro.info(ckpt_job["ckpt"])["mtime"], float)
    with pytest.raises(PermissionError, match="read-only in the Lab"):
        ro.pipe_file(f"{ckpt_job['job_dir']}/note.txt", b"x")
    with pytest.raises(PermissionError, match="read-only"):
        ro.rm(ckpt_job["ckpt"], recursive=True)
    rw = fsspec.filesystem("hyperpod", host="local-slurm", writable=True)
    note = f"{ckpt_job['job_dir']}/note.txt"
    rw.pipe_file(note, b"hello")
    assert open(note, "rb").read() == b"hello"
    rw.rm(note)
    assert not os.path.exists(note)
    for op in (lambda: rw.rm(ckpt_job["ckpt"], recursive=True), lambda: rw.pipe_file(f"{ckpt_job['ckpt']}/x", b"x"),
               lambda: rw.mv(ckpt_job["ckpt"], ckpt_job["ckpt"] + "-moved")):
        with pytest.raises(PermissionError, match="job's checkpoints"):
            op()
    assert sorted(os.listdir(ckpt_job["ckpt"])) == sorted([COMMIT_MARKER, METADATA_FILE, "__0_0.distcp"])
    with pytest.raises(storage.StorageError, match="unknown cluster 'nope'"):
        fsspec.filesystem("hyperpod", host="nope")


# ---------------------------------------------------------------- the file browser in Chromium

_playwright = playwright_or_fail



def _shot(page, name: str) -> str:
    return screenshot(page, ARTIFACTS, name)


def test_file_browser_lists_the_jobs_checkpoint_directory(clusters_cfg, ckpt_job, dev_cluster, tmp_path):
    """jupyter-fs's tree of local-slurm in the Lab's left area: into hyperpod-lab/jobs/<job>/
    checkpoints/<step> by double-clicks; its files (the marker, DCP's .metadata, the shard) are
    listed; the shard downloads (context menu) byte for byte; the marker opens in an editor tab."""
    from benchmarks._lab import Lab, launch_chromium

    sync_playwright = _playwright()
    lab = Lab(str(tmp_path), env={"HYPERPOD_LAB_CONFIG": clusters_cfg})
    os.makedirs(os.path.join(lab._home, "config"), exist_ok=True)
    with open(os.path.join(lab._home, "config", "jupyter_server_config.json"), "w") as f:
        json.dump({"ServerApp": {"jpserver_extensions": EXTS}}, f)
    step = os.path.basename(ckpt_job["ckpt"])
    with lab, sync_playwright() as p:
        browser = launch_chromium(p)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            page.goto(lab.lab_url(), wait_until="domcontentloaded", timeout=60000)
            page.wait_for_selector("#jp-main-dock-panel", timeout=60000)
            tab = page.locator(f"li.lm-TabBar-tab[data-id^='local-slurm:{dev_cluster.shared_root}']")
            tab.wait_for(timeout=30000)
            assert page.locator("li.lm-TabBar-tab[data-id^='down:']").count() == 0  # not loaded: no tree
            tab.click()
            panel = page.locator(".jp-tree-finder-sidebar:not(.lm-mod-hidden) tree-finder-panel")

            path_filter = panel.locator("tree-finder-filter input").first

            def set_filter(text: str) -> None:  # the path column's filter (typing a Delete there is a command)
                path_filter.evaluate("(el, t) => { el.value = t; el.dispatchEvent(new Event('input', "
                                     "{bubbles: true})); }", text)

            def enter(name: str) -> None:
                set_filter(name)  # the jobs directory has many entries: the grid renders the visible ones
                row = panel.locator("span.rt-group-name", has_text=name + "/").first
                row.wait_for(timeout=30000)
                row.dblclick()

            below = os.path.relpath(ckpt_job["job_dir"], dev_cluster.shared_root).split(os.sep)  # hyperpod-lab/<user>/jobs/<id>
            for name in (*below, "checkpoints", step):
                enter(name)
            set_filter("")
            for name in (COMMIT_MARKER, METADATA_FILE, "__0_0.distcp"):
                panel.locator("span.rt-group-name", has_text=name).first.wait_for(timeout=30000)
            crumbs = panel.locator("tree-finder-breadcrumbs").inner_text()
            assert step in crumbs and "checkpoints" in crumbs, crumbs
            _shot(page, "checkpoint-dir")
            # the shard, downloaded with jupyter-fs's context menu: the bytes on the shared storage
            shard = panel.locator("span.rt-group-name", has_text="__0_0.distcp").first
            with page.expect_download(timeout=60000) as dl:
                shard.click(button="right")
                page.locator(".lm-Menu-item:visible", has_text="Download").first.click()
            with open(dl.value.path(), "rb") as got, open(os.path.join(ckpt_job["ckpt"], "__0_0.distcp"), "rb") as want:
                assert got.read() == want.read()
            page.keyboard.press("Escape")
            panel.locator("span.rt-group-name", has_text=COMMIT_MARKER).first.dblclick()
            page.wait_for_function("() => Array.from(document.querySelectorAll('.jp-FileEditor .cm-content'))"
                                   ".some(e => e.innerText.includes('world_size'))", timeout=30000)
            text = page.locator(".jp-FileEditor .cm-content", has_text="world_size").first.inner_text()
            assert '"step": ' + str(int(step.split("-")[1])) in text, text
            _shot(page, "checkpoint-marker-open")
        except Exception:
            _shot(page, "failure")
            raise
        finally:
            browser.close()
