"""The seam when the notebook host mounts the cluster's shared storage: files read locally, SSH
only for scheduler commands; and the detection of such a mount."""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import secrets
import stat
from dataclasses import dataclass, field

from hyperpod_lab import envexec
from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.errors import ConfigError, RemoteCommandError
from hyperpod_lab.jobdir import user_jobs_root
from hyperpod_lab.private_dir import LocalTreeOps
from hyperpod_lab.schedulers.remote.base import Remote
from hyperpod_lab.schedulers.remote.local import LocalRemote
from hyperpod_lab.submit.clusters import ClusterProfile

log = logging.getLogger("hyperpod_lab.remote")


def _inside(path: str, top: str) -> bool:
    """``path`` is ``top`` or below it (both normalised, same separator rules)."""
    return path == top or top == "/" or path.startswith(top + "/")


@dataclass(frozen=True)
class MountMap:
    """What this machine's mount of the cluster's shared storage shows, and where: the cluster
    directory ``cluster_dir`` (a POSIX path as the nodes see it, e.g. ``/fsx/team-a``) is the
    local directory ``local_dir`` (e.g. ``/mnt/studio-fsx``). A SageMaker Studio space mounts a
    domain's FSx for Lustre at its own path and may expose only a sub-directory of the file
    system (``FSxLustreFileSystemConfig.FileSystemPath``, SageMaker API reference:
    https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_FSxLustreFileSystemConfig.html),
    so both halves can differ from the cluster's ``/fsx``.

    The one mapping between cluster paths and local paths in local-mount mode: staging, event,
    log and rank-file reading (:class:`MountedRemote`), the server's file-system notifications
    (``Remote.local_path``) and discarding a refused job's directory all go through it. Paths the
    job itself sees (in its batch script and environment) stay cluster paths.

    Args:
        cluster_dir: absolute POSIX path on the cluster.
        local_dir: absolute local path.
        profile: the cluster profile's name (for error messages).
    """

    cluster_dir: str
    local_dir: str
    profile: str = field(default="?", compare=False)

    def __post_init__(self):
        if not posixpath.isabs(self.cluster_dir) or not os.path.isabs(self.local_dir):
            raise ConfigError(f"cluster '{self.profile}': the local mount's paths must be absolute, got cluster "
                              f"{self.cluster_dir!r} and local {self.local_dir!r}")
        object.__setattr__(self, "cluster_dir", posixpath.normpath(self.cluster_dir))
        object.__setattr__(self, "local_dir", os.path.normpath(self.local_dir))

    def shows(self, cluster_path: str) -> bool:
        """``cluster_path`` (absolute POSIX path) is ``cluster_dir`` or below it."""
        return posixpath.isabs(cluster_path) and _inside(posixpath.normpath(cluster_path), self.cluster_dir)

    def to_local(self, cluster_path: str) -> str:
        """The local path of ``cluster_path``.

        Raises:
            ConfigError: ``cluster_path`` is not below ``cluster_dir`` (the mount does not show
                it); the message names both directories and the fix.
        """
        if not self.shows(cluster_path):
            raise ConfigError(
                f"cluster '{self.profile}': {cluster_path} is outside what this machine's mount shows "
                f"({self.local_dir} here is the cluster's {self.cluster_dir}). Fix: set the profile's "
                f"local_mount_cluster_path to the cluster directory that {self.local_dir} shows (or \"auto\"), and "
                f"keep the jobs inside it: shared_root, or at least <shared_root>/hyperpod-lab/<user>/jobs, must be "
                f"at or below {self.cluster_dir}; or remove local_mount (files then go over SFTP)")
        rel = posixpath.relpath(posixpath.normpath(cluster_path), self.cluster_dir)
        return self.local_dir if rel == "." else os.path.join(self.local_dir, *rel.split("/"))

    def to_cluster(self, local_path: str) -> str:
        """The cluster path of the local path ``local_path`` (made absolute).

        Raises:
            ConfigError: ``local_path`` is not below ``local_dir``.
        """
        p = os.path.normpath(os.path.abspath(local_path))
        if not _inside(p, self.local_dir):
            raise ConfigError(f"cluster '{self.profile}': {local_path} is not below {self.local_dir}, this machine's "
                              f"mount of the cluster's {self.cluster_dir}; only paths below it are the cluster's")
        rel = os.path.relpath(p, self.local_dir)
        return self.cluster_dir if rel == "." else posixpath.join(self.cluster_dir, *rel.split(os.sep))


class _SplitTreeOps:
    """:func:`hyperpod_lab.envexec.ensure_tree`'s operations in local-mount mode: the folders the
    mount shows here (``LocalTreeOps``), the ones above a sub-directory mount (the shared root,
    ``hyperpod-lab/`` when the mount shows only a user's folder) through the login node's
    ``tree_ops`` (SFTP). The uid is this machine's (the cluster user's, see :class:`MountedRemote`)."""

    def __init__(self, mount: MountMap, ssh: Remote):
        self.mount, self._local, self._ssh, self._remote = mount, LocalTreeOps(to_local=mount.to_local), ssh, None

    def _ops(self, path):
        if self.mount.shows(path):
            return self._local
        if self._remote is None:
            self._remote = self._ssh.tree_ops()
        return self._remote

    def lstat(self, path):
        return self._ops(path).lstat(path)

    def stat(self, path):
        return self._ops(path).stat(path)

    def mkdir(self, path, mode):
        return self._ops(path).mkdir(path, mode)

    def makedirs(self, path):
        return self._ops(path).makedirs(path)

    def chmod(self, path, mode):
        return self._ops(path).chmod(path, mode)

    def uid(self):
        return os.geteuid()


class MountedRemote(Remote):
    """Local-mount mode (issue 16, item 3): this machine mounts the cluster's shared storage (a
    SageMaker Studio space with the cluster's FSx attached; the dev cluster, whose nodes are this
    host), so every job file is read and written here, at the place :class:`MountMap` gives,
    and SSH carries only scheduler commands. The mount may show the cluster's ``shared_root``, a
    directory above it, or a sub-directory that holds the user's job tree (issue 29, item 7).

    Staging writes the job directory locally (the same ``O_EXCL``/``O_NOFOLLOW``, 0700/0600 rules
    as :mod:`hyperpod_lab.envexec`) and then runs ``sbatch`` in one command; events, logs, rank
    files, fault requests and ``find_native_id``'s ``native_id`` are read and written locally. A
    path below ``shared_root`` that the mount does not show is refused (ConfigError naming the
    fix, :meth:`MountMap.to_local`); one outside ``shared_root`` (none the backends use) still
    goes to the wrapped Remote. Checking the job tree's folders above a sub-directory mount
    (``shared_root``, ``hyperpod-lab/``) takes a few ``lstat`` over SFTP per submit.

    The files are written as this machine's user: the cluster user must be the same uid on the
    shared file system (``local_mount = "auto"`` checks it on its probe; see :func:`connect`).

    Args:
        ssh: the login node's Remote (commands; attributes such as ``alive``, ``reconnect``,
            ``ops`` are its own).
        shared_root: the profile's ``shared_root`` (the cluster's path).
        mount: what the mount shows and where (:class:`MountMap`); or a local path, which then
            shows ``shared_root`` itself.
        how: ``"profile"`` (the profile said where) or ``"probe"`` (detected).

    Attributes:
        mount: the :class:`MountMap`; ``local_mount``: its ``local_dir``.
    """

    def __init__(self, ssh: Remote, shared_root: str, mount: "MountMap | str", how: str = "profile"):
        self.ssh = ssh
        self.shared_root = posixpath.normpath(shared_root)
        self.mount = mount if isinstance(mount, MountMap) else MountMap(self.shared_root, mount)
        self.local_mount = self.mount.local_dir
        self.how = how
        self._local = LocalRemote()

    def __getattr__(self, name):  # the login node's connection state: alive, reconnect, ops, host ...
        ssh = self.__dict__.get("ssh")
        if ssh is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(ssh, name)

    def user_name(self):
        """The login node's user (the files here are written as the same uid)."""
        return self.ssh.user_name()

    def tree_ops(self):
        """This machine's file operations for the folders the mount shows: the files staged from
        here are written here; folders above a sub-directory mount over the wrapped Remote."""
        return _SplitTreeOps(self.mount, self.ssh)

    def local_path(self, path):
        """Where this machine sees the cluster path ``path`` (:meth:`MountMap.to_local`), or None
        when the mount does not show it."""
        return self.mount.to_local(path) if self.mount.shows(path) else None

    # ---- commands: the login node --------------------------------------------------------
    def run(self, argv, check=True, timeout_s=60.0, input=None, idempotent=False):
        return self.ssh.run(argv, check=check, timeout_s=timeout_s, input=input, idempotent=idempotent)

    def stage_and_run(self, staging, argv, env, python, event=None, timeout_s=60.0):
        """Stage locally, then one command: ``argv`` with ``env`` from its standard input
        (``python -c <envexec> -- argv``; ``env SLURM_UMASK=...`` style words would put values in
        a command line). The event is not appended here (returns False): the caller appends it
        through this Remote, locally, where a reader here sees it at once."""
        files, folder = self._on(staging.folder)
        if files is not self._local:
            return self.ssh.stage_and_run(staging, argv, env, python, event=event, timeout_s=timeout_s)
        self.ensure_tree(staging)  # here, below local_mount (tree_ops)
        envexec.make_job_folder(folder, staging.dirs)
        for f in staging.files:
            envexec.write_new(os.path.join(folder, f.rel), f.mode, [f.data])
        if env:
            full, data = envexec.program_argv(python) + list(argv), json.dumps(env).encode()
        else:
            full, data = list(argv), None
        try:
            res = self.ssh.run(full, check=False, timeout_s=timeout_s, input=data)
        except RemoteCommandError as e:
            raise RemoteCommandError(list(argv), e.exit_status, e.stderr) from None
        if res.exit_status != 0:
            raise RemoteCommandError(list(argv), res.exit_status, res.stderr or res.stdout)
        return res, False

    # ---- files: this machine, below local_mount ------------------------------------------
    def _on(self, path):
        """``(this machine's files, local path)`` for a path the mount shows; ``(the login
        node's, path)`` for one outside ``shared_root``. Raises ConfigError for a path below
        ``shared_root`` that the mount does not show (:meth:`MountMap.to_local`)."""
        if self.mount.shows(path) or _inside(posixpath.normpath(path), self.shared_root):
            return self._local, self.mount.to_local(path)
        return self.ssh, path

    def read_from(self, path, offset=0, length=None):
        files, p = self._on(path)
        return files.read_from(p, offset, length)

    def read_tails(self, directory, starts, wants=None, max_bytes=None):
        """Every grown event file's bytes in one call: here for a directory below the mount,
        else the wrapped Remote's (see :func:`hyperpod_lab.events.read_tails`)."""
        from hyperpod_lab.events import read_tails

        files, p = self._on(directory)
        return read_tails(files, p, starts, wants, max_bytes)

    def listdir(self, path):
        files, p = self._on(path)
        return files.listdir(p)

    def list_files(self, path):
        files, p = self._on(path)
        return files.list_files(p)

    def append_bytes(self, path, data):
        files, p = self._on(path)
        return files.append_bytes(p, data)

    def create_new(self, path):
        files, p = self._on(path)
        return files.create_new(p)

    def makedirs(self, path):
        files, p = self._on(path)
        return files.makedirs(p)  # LocalFiles: 0700

    def exists(self, path):
        files, p = self._on(path)
        return os.path.lexists(p) if files is self._local else files.exists(p)

    def remove(self, path):
        files, p = self._on(path)
        if files is not self._local:
            return files.remove(p)
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass

    def write_bytes(self, path, data, mode=0o600):
        """Atomic (a private temporary file, then rename), never through a link."""
        files, p = self._on(path)
        if files is not self._local:
            return files.write_bytes(p, data, mode=mode)
        self._local.makedirs(os.path.dirname(p))
        write_atomic(p, data, mode=mode, fsync=False)

    def stage(self, staging):
        files, _ = self._on(staging.folder)
        if files is not self._local:
            return self.ssh.stage(staging)
        Remote.stage(self, staging)

    def close(self):
        self.ssh.close()


#: file system types whose mounts :func:`mount_candidates` looks in for a cluster's shared storage
NETWORK_FS = ("lustre", "nfs", "nfs4", "cifs", "smb3", "ceph", "glusterfs", "gpfs", "beegfs", "virtiofs", "9p")
#: mount points below these are never candidates (the kernel's own file systems)
_SYSTEM_MOUNTS = ("/proc", "/sys", "/dev")


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_candidates(shared_root: str, mountinfo_file: str = "/proc/self/mountinfo", most: int = 64) -> list[str]:
    """Local directories that may show (part of) the cluster's shared storage: ``shared_root``
    itself when it is a directory here, then the mount point of each network or FUSE file system
    and of each mount that shows a sub-directory of its file system (``mountinfo``'s root field
    not ``/``: a bind mount, or an FSx for Lustre / NFS mount of a sub-directory, as Studio's
    ``FileSystemPath`` makes), in ``mountinfo_file`` order (proc(5), ``/proc/[pid]/mountinfo``).
    Existing directories only, none below /proc, /sys, /dev; at most ``most``."""
    out = [posixpath.normpath(shared_root)] if os.path.isdir(shared_root) else []
    try:
        with open(mountinfo_file) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype = line.split(" - ", 1)[1].split()[0]
        root, mnt = _unescape(fields[3]), _unescape(fields[4])
        if not (fstype in NETWORK_FS or fstype.startswith("fuse") or root != "/"):
            continue
        if any(_inside(mnt, s) for s in _SYSTEM_MOUNTS) or mnt in out or not os.path.isdir(mnt):
            continue
        out.append(mnt)
        if len(out) >= most:
            break
    return out


def detect_local_mount(remote: Remote, shared_root: str, candidates: list[str] | None = None,
                       profile: str = "?") -> tuple[MountMap | None, str]:
    """Find where this machine sees the cluster's storage, and which cluster directory it shows:
    write a probe file (random name and content, 0600) into the user's job tree
    ``<shared_root>/hyperpod-lab/<user>/jobs/`` through ``remote`` (SFTP; the tree created and
    checked first, ``Remote.ensure_job_root``), look for it below each of ``candidates`` (default
    :func:`mount_candidates`), remove it.

    Search bounds: for each candidate directory ``M`` and each folder ``A`` from the job tree up
    to ``/`` (the cluster directories ``M`` may show, deepest first), one ``lstat`` of
    ``M/<the probe's path below A>``; so at most 64 x (depth of the job tree + 1) ``lstat``s, no
    directory is listed or walked. Where it is found, ``M`` shows the cluster's ``A``.

    A candidate counts only when the probe there is a regular file with the same content and
    owned by this process's user: files staged from here must belong to the cluster user.

    Returns:
        ``(the mapping or None, what was found, as one sentence)``.
    """
    token = secrets.token_hex(16)
    base = posixpath.normpath(remote.ensure_job_root(posixpath.normpath(shared_root)))
    name = f".mount-probe-{token}"
    probe = posixpath.join(base, name)
    shown = [base]
    while shown[-1] != "/":
        shown.append(posixpath.dirname(shown[-1]))
    remote.write_bytes(probe, token.encode(), mode=0o600)
    notes: list[str] = []
    try:
        cands = mount_candidates(shared_root) if candidates is None else candidates
        for cand in cands:
            for top in shown:
                p = os.path.join(cand, *posixpath.relpath(probe, top).split("/"))
                try:
                    st = os.lstat(p)
                except OSError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if st.st_uid != os.geteuid():
                    notes.append(f"{cand} holds the probe but as uid {st.st_uid}, not this user's {os.geteuid()} "
                                 f"(files staged from here would not be the cluster user's)")
                    continue
                try:
                    with open(p, "rb") as f:
                        if f.read(64) != token.encode():
                            continue
                except OSError:
                    continue
                return MountMap(top, cand, profile), (f"the probe written over SFTP to {probe} is {p} here: "
                                                      f"{cand} shows the cluster's {top}")
        where = ", ".join(cands) or "no candidate directory"
        return None, (f"the probe written over SFTP to {probe} was not found here (looked below {where}, for each "
                      f"as the cluster's {base} or a folder above it)") + ("; " + "; ".join(notes) if notes else "")
    finally:
        try:
            remote.remove(probe)
        except Exception:
            pass


def with_local_mount(profile: ClusterProfile, ssh: Remote) -> Remote:
    """``ssh`` wrapped in a :class:`MountedRemote` when the profile's ``local_mount`` says so:
    a path (checked to be a directory here) showing the cluster's ``local_mount_cluster_path``
    (default ``shared_root``; ``"auto"``: found by :func:`detect_local_mount` below that path),
    or ``"auto"`` (:func:`detect_local_mount` finds both; not found: ``ssh`` itself, SFTP for
    files).

    Raises:
        ConfigError: ``local_mount`` is no directory here; ``local_mount_cluster_path = "auto"``
            found no probe below it; the mount does not show the user's job tree
            ``<shared_root>/hyperpod-lab/<user>/jobs`` (each message names the fix).
    """
    lm = getattr(profile, "local_mount", None)
    if not lm or not profile.shared_root:
        return ssh
    if lm == "auto":
        found, why = detect_local_mount(ssh, profile.shared_root, profile=profile.name)
        log.info("hyperpod_lab: cluster '%s' local_mount auto: %s", profile.name, why)
        return MountedRemote(ssh, profile.shared_root, found, how="probe") if found else ssh
    path = os.path.abspath(os.path.expanduser(lm))
    if not os.path.isdir(path):
        raise ConfigError(f"cluster '{profile.name}': local_mount {lm!r} is not a directory on this machine; "
                          f"set it to where this machine mounts the cluster's storage (with local_mount_cluster_path, "
                          f"the cluster directory it shows; default {profile.shared_root}), to \"auto\" "
                          f"(found by a probe file), or remove it (files then go over SFTP)")
    shows = getattr(profile, "local_mount_cluster_path", None)
    how = "profile"
    if shows == "auto":
        mount, why = detect_local_mount(ssh, profile.shared_root, candidates=[path], profile=profile.name)
        log.info("hyperpod_lab: cluster '%s' local_mount_cluster_path auto: %s", profile.name, why)
        if mount is None:
            raise ConfigError(f"cluster '{profile.name}': local_mount_cluster_path = \"auto\": {why}. Fix: check that "
                              f"{path} is the mount of the cluster's shared storage, or set local_mount_cluster_path "
                              f"to the cluster directory it shows")
        how = "probe"
    else:
        mount = MountMap(shows or profile.shared_root, path, profile.name)
    mount.to_local(user_jobs_root(posixpath.normpath(profile.shared_root), ssh.user_name()))  # refused: ConfigError
    return MountedRemote(ssh, profile.shared_root, mount, how=how)
