"""The clusters' shared storage in JupyterLab's file browser: jupyter-fs over fsspec's SFTP.

Three small pieces; listing, reading, writing and the file browser are the libraries' code:

* :class:`HyperPodFileSystem`: fsspec's ``SFTPFileSystem`` (paramiko) under its own protocol,
  ``hyperpod://<cluster>/<absolute path>``, that replaces only how the SSH connection is made:
  the cluster profile's route (:mod:`hyperpod_lab.schedulers.remote.route`: ``~/.ssh/config``,
  ProxyJump jump hosts, ProxyCommand, SSM sessions, host keys verified with ``RejectPolicy``),
  the profile's ``op_timeout_s`` on every SFTP reply, reconnect after a dropped link. With
  ``root`` (the Lab's trees pass ``shared_root``) every call is confined to that directory, by
  its normalised path and by the cluster's realpath (symbolic links that lead out are refused).
  Read-only unless ``writable=True``; even then nothing below a ``checkpoints`` directory (also
  reached through a link) can be written, renamed or deleted, nor any directory that holds one,
  and a delete is checked whole before anything is deleted. Registered with fsspec (``fsspec.specs`` entry point and
  :func:`register`), so ``fsspec.open("hyperpod://local-slurm/fsx/...")`` works in a notebook too.
* :func:`jupyterfs_resources`: one jupyter-fs resource per Slurm cluster profile, rooted at its
  ``shared_root`` (job directories ``<shared_root>/hyperpod-lab/<user>/jobs/<job id>``, their
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
#: a directory is renamed or deleted from the Lab only after every entry below it was checked for
#: a ``checkpoints`` directory; one with more entries than this is refused (do it with ssh)
MAX_CHECKED_ENTRIES = 50_000
#: seconds a listing's plain (non-link) entries count as resolved inside root (jupyter-fs asks
#: ``info`` of every entry right after listing; this saves one realpath round trip per entry)
LISTED_TTL_S = 5.0


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
            ``checkpoints`` component stay read-only either way, also when reached through a
            symbolic link, and so does any directory that holds one (no rename, no delete).
        root: confine every call to this absolute directory on the cluster (jupyter-fs's
            resources pass the profile's ``shared_root``; default None: the whole file system,
            as the SSH login sees it). A path is first normalised (``..`` removed) and must be
            ``root`` or below ``root + "/"``; then the cluster's own ``realpath`` of it (SFTP
            ``normalize``, symbolic links followed) must be below ``realpath(root)`` too.

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
        PermissionError: a write, rename or delete on a read-only tree; a path outside ``root``
            (by ``..``, by a sibling directory whose name starts with root's, or through a
            symbolic link that leads out); a change to a job's checkpoints. The message names the
            path, the rule and the fix; the contents API answers it with 403.
        TimeoutError: an SFTP request got no reply within ``op_timeout_s`` (connection dropped).
    """

    protocol = (PROTOCOL,)

    def __init__(self, host, writable: bool = False, root: str | None = None, **kwargs):
        if self._cached:
            return
        AbstractFileSystem.__init__(self, **kwargs)
        self.cluster = str(host)
        self.writable = bool(writable)
        if root is not None and not str(root).startswith("/"):
            raise ValueError(f"cluster '{self.cluster}': root must be an absolute path on the cluster "
                             f"(its shared_root), got {root!r}")
        self.confine_root = None if root is None else "/" + posixpath.normpath(str(root)).lstrip("/")
        self._root_real: str | None = None
        self._listed: tuple[str, frozenset, float] = ("", frozenset(), 0.0)
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

    def modified(self, path):
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    created = modified

    # ---- confinement to root; read-only unless writable; checkpoints always ------------------
    # Every path a call gets goes through _confine (the one confinement function) before the
    # SFTP request is made, and the request is made on the path _confine returns (normalised,
    # no '..'). Writes, renames and deletes go through _check_write, which confines first.

    def _outside(self, op: str, path: str, why: str) -> PermissionError:
        return _read_only_error(self.cluster, op, path, f"{why} outside the cluster's shared_root "
                                f"{self.confine_root} (the Lab's tree of cluster '{self.cluster}' holds only that "
                                f"directory; reach other paths with ssh)")

    def _inside(self, path: str, root: str) -> bool:
        return root == "/" or path == root or path.startswith(root + "/")

    def _realpath(self, path: str, op: str) -> str:
        """The cluster's realpath of ``path`` (SFTP ``normalize``: links followed); for a path that
        does not exist yet, that of its nearest existing ancestor joined with the rest. A
        dangling link on the way is refused (where it leads cannot be checked)."""
        import errno

        rest: list[str] = []
        p = path
        for _ in range(4096):
            try:
                real = self.ftp.normalize(p)
                return posixpath.join(real, *reversed(rest)) if rest else real
            except OSError as e:
                if getattr(e, "errno", None) != errno.ENOENT or p in ("", "/"):
                    raise
            try:
                self.ftp.lstat(p)
            except OSError:
                pass  # does not exist: resolve its parent
            else:  # exists but cannot be resolved: a link whose target is missing
                raise _read_only_error(self.cluster, op, path, f"{p} is a symbolic link whose target does not "
                                       f"exist, so where it leads cannot be checked against shared_root "
                                       f"{self.confine_root}; remove or fix the link with ssh")
            rest.append(posixpath.basename(p))
            p = posixpath.dirname(p)
        raise _read_only_error(self.cluster, op, path, "too many path components to resolve")

    def _confine(self, path, op: str = "read") -> str:
        """``path`` (a ``hyperpod://`` URL, an absolute path on the cluster, or a path relative
        to root) normalised, after checking that it is inside :attr:`confine_root`: lexically
        (``..`` removed; ``root`` itself or below ``root + "/"``, so a sibling ``<root>-other``
        is outside), then by the cluster's realpath (a symbolic link inside that leads out, also
        a dangling one, is refused). No root: the path, unchecked. Raises PermissionError
        naming the path, where it leads and the fix."""
        p = self._strip_protocol(path)
        root = self.confine_root
        if root is None:
            return posixpath.normpath(p) if p.startswith("/") else p
        norm = "/" + posixpath.normpath(posixpath.join(root, p)).lstrip("/")
        if not self._inside(norm, root):
            raise self._outside(op, str(p), f"{norm} is")
        d, name, t = self._listed
        if posixpath.dirname(norm) == d and posixpath.basename(norm) in name and time.monotonic() - t < LISTED_TTL_S:
            return norm  # a plain file or directory of a listing just made (its parent was resolved)
        if self._root_real is None:
            self._root_real = self.ftp.normalize(root)
        real = self._realpath(norm, op)
        if not self._inside(real, self._root_real):
            raise self._outside(op, str(p), f"{norm} resolves (through a symbolic link) to {real}, which is")
        return norm

    def _protected_error(self, op: str, path: str, protected: str, how: str) -> PermissionError:
        return _read_only_error(self.cluster, op, path, f"{how} {protected}, a job's checkpoints ('{PROTECTED_DIR}' "
                                f"directory): committed checkpoints are immutable from the Lab; use the job's "
                                f"checkpoint tools (its checkpoint.keep_last retention, or ssh on the cluster)")

    def _check_write(self, op: str, *paths) -> list[str]:
        """Each of ``paths`` confined (:meth:`_confine`), the tree writable, and neither the path
        nor where its links lead inside a ``checkpoints`` directory. Returns the normalised
        paths. Raises PermissionError naming the path, the rule and the fix."""
        out = []
        for p in paths:
            norm = self._confine(p, op)
            if not self.writable:
                raise _read_only_error(self.cluster, op, norm, "the cluster's storage is read-only in the Lab "
                                       "(set HyperPodStorage.writable = true in the Jupyter server config to allow "
                                       "writes; checkpoints stay read-only)")
            for cand, how in ((norm, "it is below"), (self._realpath(norm, op), "it resolves (through a symbolic "
                                                                                 "link) to a path below")):
                parts = (cand or "").split("/")
                if PROTECTED_DIR in parts:
                    protected = "/".join(parts[:parts.index(PROTECTED_DIR) + 1])
                    raise self._protected_error(op, norm, protected, how)
            out.append(norm)
        return out

    def _tree_plan(self, op: str, norm: str) -> list[tuple[str, str]]:
        """(kind, path) of ``norm`` and everything below it, children before their directory,
        links not followed (a link is removed or moved as itself). Raises PermissionError when a
        directory or link named ``checkpoints`` is among them (nothing has been changed yet), or
        when there are more than :data:`MAX_CHECKED_ENTRIES`."""
        import stat as st

        top = self.ftp.lstat(norm)
        if not st.S_ISDIR(top.st_mode):
            return [("link" if st.S_ISLNK(top.st_mode) else "file", norm)]
        plan: list[tuple[str, str]] = []
        stack = [(norm, False)]
        n = 0
        while stack:
            d, listed = stack.pop()
            if listed:
                plan.append(("dir", d))
                continue
            stack.append((d, True))
            for a in self.ftp.listdir_iter(d):
                n += 1
                if n > MAX_CHECKED_ENTRIES:
                    raise _read_only_error(self.cluster, op, norm, f"it holds more than {MAX_CHECKED_ENTRIES} entries, "
                                           f"too many to check for a job's checkpoints from the Lab; {op} it with ssh")
                child = posixpath.join(d, a.filename)
                if a.filename == PROTECTED_DIR:
                    raise self._protected_error(op, norm, child, "it holds")
                if st.S_ISDIR(a.st_mode):
                    stack.append((child, False))
                else:
                    plan.append(("link" if st.S_ISLNK(a.st_mode) else "file", child))
        return plan

    def ls(self, path, detail=False, **kwargs):
        """fsspec's listing (entries as ``lstat`` sees them: a link is ``type: link``); ``kwargs``
        (such as jupyter-fs's ``refresh=True``) are accepted as AbstractFileSystem.ls accepts them
        (nothing is cached here: every listing asks the cluster). Confined to :attr:`confine_root`."""
        norm = self._confine(path, "list")
        out = super().ls(norm, detail=True)
        if self.confine_root is not None:
            self._listed = (norm, frozenset(posixpath.basename(e["name"]) for e in out if e["type"] != "link"),
                            time.monotonic())
        return out if detail else sorted(e["name"] for e in out)

    def info(self, path):
        """fsspec's ``info`` (``stat``: links followed), confined to :attr:`confine_root`. A link
        in a directory inside root that leads out (or nowhere) is described as itself (``lstat``,
        ``type: file``, ``link_outside: True``) so that its directory still lists; reading it is
        refused."""
        try:
            norm = self._confine(path, "read")
        except PermissionError:
            link = self._link_leading_out(path)
            if link is None:
                raise
            return link
        return super().info(norm)

    def _link_leading_out(self, path) -> dict | None:
        """``lstat`` info of ``path`` when it is a symbolic link whose directory is inside root
        (the link itself is then an entry of the tree even though where it leads is not)."""
        import stat as st

        if self.confine_root is None:
            return None
        norm = "/" + posixpath.normpath(posixpath.join(self.confine_root, self._strip_protocol(path))).lstrip("/")
        if norm == self.confine_root or not self._inside(norm, self.confine_root):
            return None
        try:
            self._confine(posixpath.dirname(norm), "read")
            lst = self.ftp.lstat(norm)
        except OSError:  # PermissionError too: its directory is outside
            return None
        if not st.S_ISLNK(lst.st_mode):
            return None
        out = self._decode_stat(lst)
        out.update(name=norm, type="file", link_outside=True)
        return out

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        if set(mode) & set("wax+"):
            (norm,) = self._check_write("write", path)
            if kwargs.get("autocommit", True) is False and self.confine_root is not None:
                raise _read_only_error(self.cluster, "write", norm, "autocommit=False writes through a temporary "
                                       f"file in {self.temppath}, outside shared_root; write with autocommit=True")
        else:
            norm = self._confine(path, "read")
        return super()._open(norm, mode=mode, block_size=block_size, **kwargs)

    def get_file(self, rpath, lpath, **kwargs):
        return super().get_file(self._confine(rpath, "read"), lpath, **kwargs)

    def mkdir(self, path, create_parents=True, mode=0o700):
        (norm,) = self._check_write("create directory", path)
        if self.exists(norm):
            raise FileExistsError(f"cluster '{self.cluster}': {norm} exists")
        if create_parents:
            return self.makedirs(norm, mode=mode)
        self.ftp.mkdir(norm, mode)

    def makedirs(self, path, exist_ok=False, mode=0o700):
        """``path`` and its missing parents (only those inside root: the walk up stops there)."""
        (norm,) = self._check_write("create directory", path)
        if self.exists(norm):
            if not exist_ok:
                raise FileExistsError(f"cluster '{self.cluster}': {norm} exists")
            return
        missing, p = [], norm
        while p not in ("/", self.confine_root) and not self.exists(p):
            missing.append(p)
            p = posixpath.dirname(p)
        for p in reversed(missing):
            self.ftp.mkdir(p, mode)

    def rmdir(self, path):
        (norm,) = self._check_write("delete", path)
        return super().rmdir(norm)

    def rm(self, path, recursive=False, maxdepth=None):
        """Delete ``path`` (a list: each), everything below it with ``recursive``. Everything is
        checked before anything is deleted (:meth:`_check_write` on each path,
        :meth:`_tree_plan` below each directory): a refused delete deletes nothing. Links are
        deleted as themselves, never followed."""
        if maxdepth is not None:
            raise ValueError(f"cluster '{self.cluster}': rm(maxdepth=...) is not supported; delete the paths one by one")
        plan: list[tuple[str, str]] = []
        for p in [path] if isinstance(path, str) else list(path):
            (norm,) = self._check_write("delete", p)
            if norm == self.confine_root:
                raise _read_only_error(self.cluster, "delete", norm, "it is the cluster's shared_root itself")
            tree = self._tree_plan("delete", norm)
            if len(tree) > 1 and not recursive:
                raise IsADirectoryError(f"cluster '{self.cluster}': cannot delete {norm}: a directory that is not "
                                        f"empty (pass recursive=True)")
            plan.extend(tree)
        for kind, p in plan:
            if kind == "dir":
                self.ftp.rmdir(p)
            else:
                self.ftp.remove(p)

    def _rm(self, path):
        self.rm(path)

    def mv(self, old, new, **kwargs):
        """Rename ``old`` to ``new`` (SFTP posix-rename). Refused (PermissionError) when either is
        outside root, inside a job's checkpoints, or ``old`` is a directory that holds one."""
        old_n, new_n = self._check_write("rename", old, new)
        if old_n == self.confine_root:
            raise _read_only_error(self.cluster, "rename", old_n, "it is the cluster's shared_root itself")
        self._tree_plan("rename", old_n)
        return super().mv(old_n, new_n)

    def put_file(self, lpath, rpath, callback=None, **kwargs):
        (norm,) = self._check_write("write", rpath)
        return super().put_file(lpath, norm, callback=callback, **kwargs)


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
        writable, "root": "<shared_root>"}}, ...]`` (``root`` confines the tree to shared_root:
        :meth:`HyperPodFileSystem._confine`); a profile whose name cannot be a URL host (characters other than
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
        root = posixpath.normpath(p.shared_root)
        out.append({"name": f"{name}: {root}", "url": resource_url(p),
                    "type": "fsspec", "auth": "none", "defaultWritable": bool(writable),
                    "kwargs": {"writable": bool(writable), "root": root}})
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
    """What a drive's error becomes for the contents API: a refused call (PermissionError: a
    write on a read-only tree, a path outside shared_root, a job's checkpoints; also when
    jupyter-fs wrapped it in a 400 or 500, once or twice) is 403, a cluster that does not answer
    (TimeoutError, StorageError) 504, both with our message; an unwrapped FileNotFoundError
    (jupyter-fs's delete of a missing path) 404; anything else as it was."""
    from tornado.web import HTTPError

    cause, seen = e, 0
    while isinstance(cause, HTTPError) and seen < 8:  # jupyter-fs wraps, at times twice (get -> _read_file)
        cause, seen = cause.__cause__ or cause.__context__, seen + 1
    if isinstance(cause, PermissionError):
        return HTTPError(403, str(cause), reason="read-only")
    if isinstance(cause, (TimeoutError, StorageError)):
        return HTTPError(504, str(cause), reason="cluster storage did not answer")
    if isinstance(e, FileNotFoundError):  # not wrapped by jupyter-fs (its delete): a 404, not a 500
        return HTTPError(404, f"no such file or directory: {e.filename or e}", reason="not found")
    return e


def _confined_resource(resource):
    """A ``hyperpod://<cluster><dir>`` resource (ours, or one configured by hand in
    ``JupyterFs.resources``) with ``kwargs.root`` set to its URL's directory when it names none,
    so that every tree of a cluster is confined to the directory it shows."""
    if not isinstance(resource, dict) or not str(resource.get("url", "")).startswith(f"{PROTOCOL}://"):
        return resource
    kwargs = resource.get("kwargs") or {}
    if isinstance(kwargs, str):
        import json

        try:
            kwargs = json.loads(kwargs)
        except ValueError:
            kwargs = {}
    if kwargs.get("root"):
        return resource
    path = urlsplit(resource["url"]).path or "/"
    return {**resource, "kwargs": {**kwargs, "root": posixpath.normpath(path)}}


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

    def initResource(self, *resources, options=None):
        return MetaManager.initResource(self, *(_confined_resource(r) for r in resources),
                                        options=options if options is not None else {})

    ns = {"__init__": __init__, "initResource": initResource, "__module__": __name__,
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
