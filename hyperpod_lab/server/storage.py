"""The clusters' shared storage in JupyterLab's file browser: jupyter-fs over fsspec's SFTP.

Three small pieces; listing, reading, writing and the file browser are the libraries' code:

* :class:`HyperPodFileSystem`: fsspec's ``SFTPFileSystem`` (paramiko) under its own protocol,
  ``hyperpod://<cluster>/<absolute path>``, that replaces only how the SSH connection is made:
  the cluster profile's route (:mod:`hyperpod_lab.schedulers.remote.route`: ``~/.ssh/config``,
  ProxyJump jump hosts, ProxyCommand, SSM sessions, host keys verified with ``RejectPolicy``),
  the profile's ``op_timeout_s`` on every SFTP reply, reconnect after a dropped link. Read-only
  unless ``writable=True``; even then nothing below a ``checkpoints`` directory can be written,
  renamed or deleted. Registered with fsspec (``fsspec.specs`` entry point and
  :func:`register`), so ``fsspec.open("hyperpod://local-slurm/fsx/...")`` works in a notebook too.
* :func:`jupyterfs_resources`: one jupyter-fs resource per Slurm cluster profile, rooted at its
  ``shared_root`` (job directories ``<shared_root>/hyperpod-lab/jobs/<job id>``, their
  checkpoints, logs and events, and the user's data).
* a jupyter-server extension (``hyperpod_lab.server.storage``, enabled by
  ``jupyter-config/server-config/hyperpod_lab_storage.json`` together with ``jupyterfs``) whose
  link step, before the contents manager is made, puts those resources into
  ``JupyterFs.resources`` and makes the contents manager :class:`HyperPodMetaManager`
  (jupyter-fs's ``MetaManager``, whose calls into a cluster's drive run in that drive's own
  worker thread so that a slow or dead cluster never blocks the server's event loop).

Settings (Jupyter config, section ``HyperPodStorage``): ``enabled`` (default true), ``writable``
(default false: the cluster trees are read-only in the Lab). See ``docs/storage.md``.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import posixpath
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from fsspec.implementations.sftp import SFTPFileSystem
from fsspec.spec import AbstractFileSystem

from hyperpod_lab.jobdir import CHECKPOINTS_DIRNAME

log = logging.getLogger("hyperpod_lab.server.storage")

PROTOCOL = "hyperpod"
#: cluster names that can be the host part of a ``hyperpod://`` URL (others get no resource)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: a path with this component is a job's checkpoint tree: never written, renamed or deleted here
PROTECTED_DIR = CHECKPOINTS_DIRNAME


#: seconds a cluster whose connection failed is not tried again (jupyter-fs re-creates a failed
#: resource on every ``POST /jupyterfs/resources``, on the server's event loop: an unreachable
#: cluster would hold the server for its connect timeout at each Lab page load)
RETRY_AFTER_S = 60.0
_FAILED: dict[str, tuple[float, str]] = {}
_FAILED_LOCK = threading.Lock()


class StorageError(RuntimeError):
    """The cluster's storage cannot be reached or used (the message names the cluster, the hop
    and the fix). A RuntimeError, which jupyter-fs reports as a resource that failed to load."""


def _read_only_error(cluster: str, op: str, path: str, why: str) -> PermissionError:
    return PermissionError(f"cluster '{cluster}': cannot {op} {path}: {why}")


class _GuardedSFTP:
    """The paramiko SFTPClient of one connection, its calls made one at a time (paramiko's SFTP
    client does not sort concurrent replies) and a lost or late reply turned into a clear
    TimeoutError after which the connection is dropped (the session is out of step)."""

    def __init__(self, link: "_Link", sftp, gen: int):
        self._link, self._sftp, self._gen = link, sftp, gen

    def __getattr__(self, name):
        attr = getattr(self._sftp, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            import paramiko

            link = self._link
            with link.lock:
                try:
                    out = attr(*args, **kwargs)
                    if name == "listdir_iter":  # a generator: its replies come while iterating
                        out = list(out)
                    return out
                except (socket.timeout, TimeoutError, EOFError, paramiko.SSHException) as e:
                    what = f"sftp {name}({', '.join(str(a) for a in args[:1])})"
                    link.drop(self._gen, f"{what}: {type(e).__name__} {e}".strip())
                    raise TimeoutError(f"cluster '{link.cluster}' ({link.where}): no answer to {what} "
                                       f"within {link.op_timeout_s:g} s (op_timeout_s) or the link "
                                       f"dropped; the next call reconnects") from None

        return call


class _Link:
    """One SSH connection (and its SFTP session) to a cluster's login node, shared by every
    :class:`HyperPodFileSystem` of that cluster (fsspec keeps one instance per thread)."""

    def __init__(self, cluster: str, route, op_timeout_s: float):
        self.cluster, self.route, self.op_timeout_s = cluster, route, op_timeout_s
        self.where = route.target.label
        self.lock = threading.RLock()
        self.conn = None
        self.sftp = None
        self.gen = 0
        self.reconnects = 0

    def ensure(self) -> None:
        """Connected, or StorageError; a cluster that failed is not tried again for
        :data:`RETRY_AFTER_S` (the cached error comes back at once)."""
        with self.lock:
            if self.conn is not None and self.conn.active:
                return
            with _FAILED_LOCK:
                failed = _FAILED.get(self.cluster)
            if failed is not None and time.monotonic() - failed[0] < RETRY_AFTER_S:
                left = RETRY_AFTER_S - (time.monotonic() - failed[0])
                raise StorageError(f"{failed[1]} (not tried again for {left:.0f} s)")
            try:
                self.connect()
            except StorageError as e:
                with _FAILED_LOCK:
                    _FAILED[self.cluster] = (time.monotonic(), str(e))
                raise
            with _FAILED_LOCK:
                _FAILED.pop(self.cluster, None)

    def connect(self) -> None:
        from hyperpod_lab.errors import HyperPodLabError
        from hyperpod_lab.schedulers.remote.route import open_route

        with self.lock:
            if self.conn is not None:
                self.drop(self.gen, self.conn.dead_reason or "the connection had closed")
            try:
                o = open_route(self.route, self.cluster)
            except HyperPodLabError as e:
                raise StorageError(str(e)) from None
            try:
                sftp = self._start_sftp(o)
            except Exception as e:
                o.close()
                raise StorageError(f"cluster '{self.cluster}' ({self.where}): the SFTP subsystem did not start "
                                   f"within {self.op_timeout_s:g} s (op_timeout_s): {type(e).__name__} {e}; is "
                                   f"sftp enabled in the login node's sshd, and does its file system answer?") from None
            self.conn, self.sftp = o, sftp
            self.gen += 1

    def _start_sftp(self, o):
        """The SFTP client on a new channel of ``o``, every step bounded by ``op_timeout_s``
        (paramiko waits for the subsystem reply without a timeout: a timer closes the channel, as
        :class:`~hyperpod_lab.schedulers.remote.SSHRemote` does)."""
        import paramiko

        from hyperpod_lab.schedulers.remote import answered_within

        t = self.op_timeout_s
        chan = o.transport.open_session(timeout=t)
        chan.settimeout(t)  # every reply read, the version exchange's included
        answered_within(chan, t, lambda: chan.invoke_subsystem("sftp"), "starting the SFTP subsystem")
        return paramiko.SFTPClient(chan)

    def drop(self, gen: int, why: str) -> None:
        with self.lock:
            if gen != self.gen or self.conn is None:
                return
            o, self.conn, self.sftp = self.conn, None, None
        log.warning("hyperpod_lab: storage of cluster '%s': dropped the connection: %s", self.cluster, why)
        try:
            o.close()
        except Exception:  # already gone
            pass

    def guarded(self) -> _GuardedSFTP:
        """The SFTP client now, (re)connecting first when the link was dropped or found dead."""
        with self.lock:
            if self.conn is None or not self.conn.active:
                self.connect()
                self.reconnects += 1
            return _GuardedSFTP(self, self.sftp, self.gen)

    def close(self) -> None:
        with self.lock:
            self.gen += 1
            o, self.conn, self.sftp = self.conn, None, None
        if o is not None:
            o.close()


_LINKS: dict[tuple, _Link] = {}
_LINKS_LOCK = threading.Lock()


def _resolve(cluster: str):
    """(profile, route) of a slurm cluster profile. Raises StorageError."""
    from hyperpod_lab.errors import HyperPodLabError
    from hyperpod_lab.schedulers.remote.route import resolve_route
    from hyperpod_lab.submit.clusters import get_profile

    try:
        profile = get_profile(cluster)
        if profile.orchestrator != "slurm":
            raise StorageError(f"cluster '{cluster}' is a {profile.orchestrator} cluster; "
                               f"{PROTOCOL}:// reaches the shared storage of slurm clusters over SFTP")
        return profile, resolve_route(profile)
    except HyperPodLabError as e:
        raise StorageError(str(e)) from None


def _link_for(cluster: str) -> _Link:
    """The cluster's shared, connected :class:`_Link`. Raises StorageError."""
    profile, route = _resolve(cluster)
    op_timeout_s = float(getattr(profile, "op_timeout_s", None) or 30.0)
    key = (cluster, repr(route), op_timeout_s)
    with _LINKS_LOCK:
        link = _LINKS.get(key)
        if link is None:
            link = _LINKS[key] = _Link(cluster, route, op_timeout_s)
    link.ensure()
    return link


def connect_all(clusters: list[str]) -> dict[str, str | None]:
    """Connect to ``clusters`` side by side (the server's start waits for the slowest, not the
    sum); returns name -> None (connected) or the error. The links are then shared with the
    file systems jupyter-fs makes."""
    if not clusters:
        return {}

    def one(name):
        try:
            _link_for(name)
            return None
        except Exception as e:  # StorageError; anything else is reported the same way
            return str(e)

    with ThreadPoolExecutor(max_workers=min(8, len(clusters)), thread_name_prefix="hyperpod-fs-connect") as ex:
        return dict(zip(clusters, ex.map(one, clusters)))


class HyperPodFileSystem(SFTPFileSystem):
    """A cluster's files over SFTP, reached the way submission reaches the cluster.

    URL: ``hyperpod://<cluster profile name>/<absolute path on the cluster>``. Everything but the
    connection is fsspec's ``SFTPFileSystem`` (``ls``, ``info``, ``cat``, ``open``, ``get``...).
    The connection of a cluster is shared by its instances (fsspec makes one per thread).

    Args:
        host: the cluster profile's name (a slurm profile of ``clusters.toml``).
        writable: allow writes, renames and deletes (default False: read-only). Paths with a
            ``checkpoints`` component stay read-only either way.

    Attributes:
        cluster: the profile name; profile: the :class:`~hyperpod_lab.submit.clusters.ClusterProfile`.
        op_timeout_s: seconds one SFTP request may wait for its reply (the profile's).
        reconnects: times the connection was reopened after a drop.

    ``info``/``ls`` give ``mtime`` and ``time`` as POSIX seconds (float, as fsspec's local file
    system and jupyter-fs expect); :meth:`modified` gives a UTC datetime.

    Raises:
        StorageError: the profile is unknown, not a slurm cluster, or the login node cannot be
            reached (unknown host key, refused key, no answer within ``connect_timeout_s``, SFTP
            not started within ``op_timeout_s``); for :data:`RETRY_AFTER_S` after such a
            failure, the same error at once.
        PermissionError: a write, rename or delete on a read-only tree.
        TimeoutError: an SFTP request got no reply within ``op_timeout_s`` (connection dropped).
    """

    protocol = (PROTOCOL,)

    def __init__(self, host, writable: bool = False, **kwargs):
        if self._cached:
            return
        AbstractFileSystem.__init__(self, **kwargs)
        self.cluster = str(host)
        self.writable = bool(writable)
        self.temppath = kwargs.pop("temppath", "/tmp")
        self.host = self.cluster
        self.ssh_kwargs = {}
        self._link = _link_for(self.cluster)
        self.profile, self.route = _resolve(self.cluster)
        self.op_timeout_s = self._link.op_timeout_s
        self.where = self._link.where

    # ---- the connection: the submission's route, shared ----------------------------------
    @property
    def ftp(self):
        """The SFTP client now, (re)connecting first when the link was dropped or found dead."""
        return self._link.guarded()

    @property
    def client(self):
        """The login node's paramiko SSHClient (None while dropped)."""
        o = self._link.conn
        return o.client if o is not None else None

    @property
    def reconnects(self) -> int:
        return self._link.reconnects

    def close(self) -> None:
        """Close the cluster's connection (jump hosts and proxy commands too); the next call reconnects."""
        self._link.close()

    # ---- URLs ----------------------------------------------------------------------------
    @staticmethod
    def _get_kwargs_from_urls(urlpath):
        host = urlsplit(urlpath).netloc  # as written: profile names are case-sensitive
        return {"host": host} if host else {}

    # ---- fsspec's stat, with POSIX seconds ------------------------------------------------
    @staticmethod
    def _decode_stat(stat, parent_path=None):
        out = SFTPFileSystem._decode_stat(stat, parent_path)
        for key in ("mtime", "time"):
            if isinstance(out.get(key), datetime.datetime):
                out[key] = out[key].timestamp()
        return out

    def ls(self, path, detail=False, **kwargs):
        """fsspec's listing; ``kwargs`` (such as jupyter-fs's ``refresh=True``) are accepted as
        AbstractFileSystem.ls accepts them (nothing is cached here: every listing asks the cluster)."""
        return super().ls(path, detail=detail)

    def modified(self, path):
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    created = modified

    # ---- read-only unless writable; checkpoints always --------------------------------------
    def _check_write(self, op: str, *paths) -> None:
        for p in paths:
            p = self._strip_protocol(p)
            if not self.writable:
                raise _read_only_error(self.cluster, op, p, "the cluster's storage is read-only in the Lab "
                                       "(set HyperPodStorage.writable = true in the Jupyter server config to allow "
                                       "writes; checkpoints stay read-only)")
            if PROTECTED_DIR in posixpath.normpath(p).split("/"):
                raise _read_only_error(self.cluster, op, p, f"files below a '{PROTECTED_DIR}' directory are a "
                                       f"job's checkpoints and are never changed from the Lab")

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        if set(mode) & set("wax+"):
            self._check_write("write", path)
        return super()._open(path, mode=mode, block_size=block_size, **kwargs)

    def mkdir(self, path, create_parents=True, mode=0o700):
        self._check_write("create directory", path)
        return super().mkdir(path, create_parents=create_parents, mode=mode)

    def makedirs(self, path, exist_ok=False, mode=0o700):
        self._check_write("create directory", path)
        return super().makedirs(path, exist_ok=exist_ok, mode=mode)

    def rmdir(self, path):
        self._check_write("delete", path)
        return super().rmdir(path)

    def rm(self, path, recursive=False, maxdepth=None):
        for p in [path] if isinstance(path, str) else list(path):
            self._check_write("delete", p)
        return super().rm(path, recursive=recursive, maxdepth=maxdepth)

    def _rm(self, path):
        self._check_write("delete", path)
        return super()._rm(path)

    def mv(self, old, new, **kwargs):
        self._check_write("rename", old, new)
        return super().mv(old, new)

    def put_file(self, lpath, rpath, callback=None, **kwargs):
        self._check_write("write", rpath)
        return super().put_file(lpath, rpath, callback=callback, **kwargs)


def register() -> None:
    """Register :class:`HyperPodFileSystem` with fsspec under ``hyperpod://`` (the package's
    ``fsspec.specs`` entry point does the same for an installed hyperpod-lab)."""
    import fsspec

    fsspec.register_implementation(PROTOCOL, HyperPodFileSystem, clobber=True)


def resource_url(profile) -> str:
    """``hyperpod://<name><shared_root>`` of a slurm profile."""
    return f"{PROTOCOL}://{profile.name}{posixpath.normpath(profile.shared_root)}"


def jupyterfs_resources(profiles=None, writable: bool = False) -> list[dict]:
    """jupyter-fs resources, one per slurm cluster profile with a ``shared_root``.

    Args:
        profiles: name -> ClusterProfile (default: :func:`hyperpod_lab.submit.clusters.load_profiles`).
        writable: passed to :class:`HyperPodFileSystem` (checkpoints stay read-only).

    Returns:
        ``[{"name": "<cluster>: <shared_root>", "url": "hyperpod://<cluster><shared_root>",
        "type": "fsspec", "auth": "none", "defaultWritable": writable, "kwargs": {"writable":
        writable}}, ...]``; a profile whose name cannot be a URL host (characters other than
        letters, digits, ``.``, ``_``, ``-``), or with a field still ``FILL-IN`` (written by
        ``clusters discover``), is left out with a warning.
    """
    if profiles is None:
        from hyperpod_lab.submit.clusters import load_profiles

        profiles = load_profiles()
    out = []
    for name, p in sorted(profiles.items()):
        if p.orchestrator != "slurm" or not p.shared_root:
            continue
        if p.unfilled():
            log.warning("hyperpod_lab: cluster '%s' gets no file-browser tree until %s is filled in (clusters.toml)",
                        name, ", ".join(p.unfilled()))
            continue
        if not _NAME.fullmatch(name):
            log.warning("hyperpod_lab: cluster '%s' gets no file-browser tree: its name must be letters, digits, "
                        "'.', '_' or '-' to be the host of a %s:// URL; rename the profile", name, PROTOCOL)
            continue
        out.append({"name": f"{name}: {posixpath.normpath(p.shared_root)}", "url": resource_url(p),
                    "type": "fsspec", "auth": "none", "defaultWritable": bool(writable),
                    "kwargs": {"writable": bool(writable)}})
    return out


# ---------------------------------------------------------------- jupyter-fs's MetaManager

def _drive_of(manager, args, kwargs) -> str:
    for a in (*args, *kwargs.values()):
        if isinstance(a, str) and ":" in a:
            drive = a.strip("/").split(":", 1)[0]
            if drive and drive in manager._managers:
                return drive
    return ""


def _http_error(e: Exception) -> Exception:
    """What a drive's error becomes for the contents API: a refused write (PermissionError,
    also when jupyter-fs wrapped it in a 500) is 403, a cluster that does not answer
    (TimeoutError, StorageError) 504, both with our message; anything else as it was."""
    from tornado.web import HTTPError

    cause = e if not isinstance(e, HTTPError) else (e.__context__ or e.__cause__)
    if isinstance(cause, PermissionError):
        return HTTPError(403, str(cause), reason="read-only")
    if isinstance(cause, (TimeoutError, StorageError)):
        return HTTPError(504, str(cause), reason="cluster storage did not answer")
    return e


def _threaded(name: str):
    from jupyterfs.metamanager import MetaManager, MetaManagerShared

    sync = getattr(MetaManagerShared, name)
    inline = getattr(MetaManager, name)

    async def method(self, *args, **kwargs):
        drive = _drive_of(self, args, kwargs)
        if not drive:  # the local root: as jupyter-fs does it
            out = inline(self, *args, **kwargs)
            return await out if asyncio.iscoroutine(out) else out
        with self._hp_lock:
            ex = self._hp_executors.get(drive)
            if ex is None:
                ex = self._hp_executors[drive] = ThreadPoolExecutor(1, thread_name_prefix=f"hyperpod-fs-{drive}")
        try:
            out = await asyncio.get_running_loop().run_in_executor(ex, functools.partial(sync, self, *args, **kwargs))
        except Exception as e:
            raise _http_error(e) from None
        if name == "is_hidden":  # a drive's own allow_hidden decides (the handlers ask the MetaManager's)
            return bool(out) and not self._managers[drive].allow_hidden
        return out

    method.__name__ = name
    return method


def _meta_manager_class():
    from jupyterfs.metamanager import MetaManager

    names = ("is_hidden", "dir_exists", "file_exists", "exists", "save", "rename", "get", "delete",
             "create_checkpoint", "list_checkpoints", "restore_checkpoint", "delete_checkpoint")

    def __init__(self, *args, **kwargs):
        self._hp_lock = threading.Lock()
        self._hp_executors = {}
        MetaManager.__init__(self, *args, **kwargs)

    ns = {"__init__": __init__, "__module__": __name__,
          "__doc__": "jupyter-fs's MetaManager; each non-local drive's calls run in that drive's own worker "
                     "thread (one at a time), off the server's event loop."}
    ns.update({n: _threaded(n) for n in names})
    return type("HyperPodMetaManager", (MetaManager,), ns)


def __getattr__(name):  # HyperPodMetaManager is built on first use: importing this module needs no jupyter-fs
    if name == "HyperPodMetaManager":
        cls = _meta_manager_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


# ---------------------------------------------------------------- the jupyter-server extension

def _settings(serverapp) -> dict:
    given = dict((getattr(serverapp, "config", None) or {}).get("HyperPodStorage", {}) or {})
    return {"enabled": bool(given.get("enabled", True)), "writable": bool(given.get("writable", False))}


def _jupyter_server_extension_points():
    return [{"module": "hyperpod_lab.server.storage"}]


def _link_jupyter_server_extension(serverapp):
    """Before the contents manager is made: one jupyter-fs resource per slurm cluster, and
    :class:`HyperPodMetaManager` as the contents manager (unless another jupyter-fs manager is
    configured). Never fails the server: a problem is logged and the Lab starts without the trees."""
    settings = _settings(serverapp)
    if not settings["enabled"]:
        serverapp.log.info("hyperpod_lab: cluster storage trees off (HyperPodStorage.enabled = false)")
        return
    try:
        from jupyterfs.metamanager import MetaManagerShared
        from traitlets.config import Config
    except ImportError as e:
        serverapp.log.warning("hyperpod_lab: no cluster storage in the file browser: jupyter-fs is not installed "
                              "(%s); pip install jupyter-fs", e)
        return
    register()
    try:
        ours = jupyterfs_resources(writable=settings["writable"])
    except Exception as e:  # ConfigError: the Lab still starts, the message says what to fix
        serverapp.log.warning("hyperpod_lab: no cluster storage in the file browser: %s", e)
        return
    given = list((serverapp.config.get("JupyterFs", {}) or {}).get("resources", []) or [])
    urls = {r.get("url") for r in given if isinstance(r, dict)}
    merged = given + [r for r in ours if r["url"] not in urls]
    update = {"JupyterFs": {"resources": merged}, "FSSpecManager": {"allow_hidden": True}}
    failed = connect_all([r["url"].split("/")[2] for r in ours])
    for name, err in failed.items():
        if err:
            serverapp.log.warning("hyperpod_lab: no file-browser tree for cluster '%s': %s", name, err)
    cm = serverapp.contents_manager_class
    if not (isinstance(cm, type) and issubclass(cm, MetaManagerShared)):
        serverapp.contents_manager_class = __getattr__("HyperPodMetaManager")
    serverapp.update_config(Config(update))
    serverapp.log.info("hyperpod_lab: cluster storage in the file browser: %s",
                       ", ".join(r["url"] for r in ours) or "no slurm cluster profiles")


#: ``/api/contents/<drive>:<dir>/checkpoints`` and ``.../checkpoints/<name>``: jupyter-server routes
#: these to its file-checkpoint API (``CheckpointsHandler``: GET lists a file's saved versions;
#: ``ModifyCheckpointsHandler``: no GET, 405), so a job's ``checkpoints`` directory and its
#: ``step-N`` directories could not be listed. On a jupyter-fs drive (``<8 hex>:``) such a path is
#: served as the directory when it is one, and as jupyter-server's checkpoint API otherwise (the
#: Lab lists a file's checkpoints at ``<file>/checkpoints`` when it opens it). The path is matched
#: as sent: the Lab sends the drive's ``:`` as ``%3A``.
DRIVE_CHECKPOINTS_DIR = (r"/api/contents(?P<path>/[0-9a-f]{8}(?::|%3[aA])(?:[^/]+/)*?[^/]*?)/?/checkpoints"
                         r"(?:/(?P<checkpoint_id>[\w-]+))?/?")


def _drive_checkpoints_handler():
    from jupyter_server.auth.decorator import authorized
    from jupyter_server.services.contents.handlers import CheckpointsHandler, ContentsHandler, ModifyCheckpointsHandler
    from jupyter_server.utils import ensure_async
    from tornado.web import HTTPError, authenticated

    class DriveCheckpointsDirHandler(ContentsHandler):
        """A jupyter-fs drive's ``<dir>/checkpoints[/<name>]``: the contents API when that is a
        directory, jupyter-server's checkpoint API (the same handlers' code) when it is not."""

        @staticmethod
        def _dir(path: str, checkpoint_id) -> str:
            return path.rstrip("/") + "/checkpoints" + (f"/{checkpoint_id}" if checkpoint_id else "")

        async def _is_dir(self, path, checkpoint_id) -> bool:
            return bool(await ensure_async(self.contents_manager.dir_exists(self._dir(path, checkpoint_id))))

        @authenticated
        @authorized
        async def get(self, path="", checkpoint_id=None):
            if await self._is_dir(path, checkpoint_id):
                return await ContentsHandler.get(self, self._dir(path, checkpoint_id))
            if checkpoint_id is None:
                return await CheckpointsHandler.get(self, path)
            raise HTTPError(405)

        @authenticated
        @authorized
        async def post(self, path="", checkpoint_id=None):
            if checkpoint_id is None:
                return await CheckpointsHandler.post(self, path)
            return await ModifyCheckpointsHandler.post(self, path, checkpoint_id)

        @authenticated
        @authorized
        async def delete(self, path="", checkpoint_id=None):
            if checkpoint_id is not None and not await self._is_dir(path, checkpoint_id):
                return await ModifyCheckpointsHandler.delete(self, path, checkpoint_id)
            return await ContentsHandler.delete(self, self._dir(path, checkpoint_id))

        @authenticated
        @authorized
        async def put(self, path="", checkpoint_id=None):
            return await ContentsHandler.put(self, self._dir(path, checkpoint_id))

        @authenticated
        @authorized
        async def patch(self, path="", checkpoint_id=None):
            return await ContentsHandler.patch(self, self._dir(path, checkpoint_id))

    return DriveCheckpointsDirHandler


def _load_jupyter_server_extension(serverapp):
    """jupyter-fs serves the trees (``jupyterfs`` extension); here, only the route that lets a
    drive's ``checkpoints`` directories be listed (:data:`DRIVE_CHECKPOINTS_DIR`), placed before
    jupyter-server's own checkpoint routes."""
    from jupyter_server.utils import url_path_join

    web_app = serverapp.web_app
    rules = web_app.default_router.rules
    n = len(rules)
    web_app.add_handlers(".*$", [(url_path_join(web_app.settings["base_url"], DRIVE_CHECKPOINTS_DIR),
                                  _drive_checkpoints_handler())])
    if len(rules) == n + 1:  # add_handlers inserts before the last (fallback) rule: move it to the front
        idx = len(rules) - 2
        rules.insert(0, rules.pop(idx))
