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

from hyperpod_lab import envexec
from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.errors import RemoteCommandError
from hyperpod_lab.private_dir import LocalTreeOps
from hyperpod_lab.schedulers.remote.base import Remote
from hyperpod_lab.schedulers.remote.local import LocalRemote
from hyperpod_lab.submit.clusters import ClusterProfile

log = logging.getLogger("hyperpod_lab.remote")


class MountedRemote(Remote):
    """Local-mount mode (issue 16, item 3): this machine mounts the cluster's shared storage (a
    SageMaker Studio space with the cluster's FSx attached; the dev cluster, whose nodes are this
    host), so every file below the profile's ``shared_root`` is read and written here, at the
    same place below ``local_mount``, and SSH carries only scheduler commands.

    Staging writes the job directory locally (the same ``O_EXCL``/``O_NOFOLLOW``, 0700/0600 rules
    as :mod:`hyperpod_lab.envexec`) and then runs ``sbatch`` in one command; events, logs, rank
    files, fault requests and ``find_native_id``'s ``native_id`` are read and written locally. A
    path outside ``shared_root`` (none the backends use) still goes to the wrapped Remote.

    The files are written as this machine's user: the cluster user must be the same uid on the
    shared file system (``local_mount = "auto"`` checks it on its probe; see :func:`connect`).

    Args:
        ssh: the login node's Remote (commands; attributes such as ``alive``, ``reconnect``,
            ``ops`` are its own).
        shared_root: the profile's ``shared_root`` (the cluster's path).
        local_mount: where this machine sees ``shared_root``.
        how: ``"profile"`` (the profile said where) or ``"probe"`` (detected).
    """

    def __init__(self, ssh: Remote, shared_root: str, local_mount: str, how: str = "profile"):
        self.ssh = ssh
        self.shared_root = posixpath.normpath(shared_root)
        self.local_mount = os.path.normpath(local_mount)
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
        """This machine's file operations, below ``local_mount``: the files staged from here are
        written here (a path outside ``shared_root`` goes over the wrapped Remote)."""
        return LocalTreeOps(to_local=lambda p: self.local_path(p) or p)

    def local_path(self, path):
        p = posixpath.normpath(path)
        root = self.shared_root.rstrip("/") or "/"
        if p == root:
            return self.local_mount
        prefix = root if root.endswith("/") else root + "/"
        if not p.startswith(prefix):
            return None
        return os.path.join(self.local_mount, p[len(prefix):])

    # ---- commands: the login node --------------------------------------------------------
    def run(self, argv, check=True, timeout_s=60.0, input=None, idempotent=False):
        return self.ssh.run(argv, check=check, timeout_s=timeout_s, input=input, idempotent=idempotent)

    def stage_and_run(self, staging, argv, env, python, event=None, timeout_s=60.0):
        """Stage locally, then one command: ``argv`` with ``env`` from its standard input
        (``python -c <envexec> -- argv``; ``env SLURM_UMASK=...`` style words would put values in
        a command line). The event is not appended here (returns False): the caller appends it
        through this Remote, locally, where a reader here sees it at once."""
        folder = self.local_path(staging.folder)
        if folder is None:
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
        lp = self.local_path(path)
        return (self._local, lp) if lp is not None else (self.ssh, path)

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
        folder = self.local_path(staging.folder)
        if folder is None:
            return self.ssh.stage(staging)
        Remote.stage(self, staging)

    def close(self):
        self.ssh.close()


#: file system types whose mounts :func:`mount_candidates` looks in for a cluster's shared storage
NETWORK_FS = ("lustre", "nfs", "nfs4", "cifs", "smb3", "ceph", "glusterfs", "gpfs", "beegfs", "virtiofs", "9p")


def mount_candidates(shared_root: str, mounts_file: str = "/proc/self/mounts", most: int = 64) -> list[str]:
    """Local directories that may be the cluster's ``shared_root``: the same path here, then,
    for each network or FUSE file system mounted here (``mounts_file``), its mount point joined
    with each tail of ``shared_root`` (``/fsx/users/me`` on the cluster may be ``M/fsx/users/me``,
    ``M/users/me``, ``M/me`` or ``M`` here). Existing directories only, at most ``most``."""
    root = posixpath.normpath(shared_root)
    parts = [p for p in root.split("/") if p]
    tails = ["/".join(parts[i:]) for i in range(len(parts) + 1)]
    out = [root] if os.path.isdir(root) else []
    try:
        with open(mounts_file) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        fields = line.split()
        if len(fields) < 3 or not (fields[2] in NETWORK_FS or fields[2].startswith("fuse")):
            continue
        mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        for t in tails:
            cand = os.path.join(mnt, t) if t else mnt
            if cand not in out and os.path.isdir(cand):
                out.append(cand)
                if len(out) >= most:
                    return out
    return out


def detect_local_mount(remote: Remote, shared_root: str, candidates: list[str] | None = None) -> tuple[str | None, str]:
    """Find where this machine sees the cluster's ``shared_root``: write a probe file (random
    name and content, 0600) into the user's job tree ``<shared_root>/hyperpod-lab/<user>/jobs/``
    through ``remote`` (SFTP; the tree created and checked first, ``Remote.ensure_job_root``), look
    for it below each of ``candidates`` (default :func:`mount_candidates`), remove it.

    A candidate counts only when the probe there is a regular file with the same content and
    owned by this process's user: files staged from here must belong to the cluster user.

    Returns:
        ``(local path of shared_root or None, what was found, as one sentence)``.
    """
    token = secrets.token_hex(16)
    base = remote.ensure_job_root(posixpath.normpath(shared_root))
    rel = posixpath.relpath(base, posixpath.normpath(shared_root))
    name = f".mount-probe-{token}"
    probe = posixpath.join(base, name)
    remote.write_bytes(probe, token.encode(), mode=0o600)
    notes: list[str] = []
    try:
        cands = mount_candidates(shared_root) if candidates is None else candidates
        for cand in cands:
            p = os.path.join(cand, *rel.split("/"), name)
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
            return cand, f"the probe written over SFTP to {probe} is {p} here"
        where = ", ".join(cands) or "no candidate directory"
        return None, f"the probe written over SFTP to {probe} was not found here (looked in {where})" + (
            "; " + "; ".join(notes) if notes else "")
    finally:
        try:
            remote.remove(probe)
        except Exception:
            pass


def with_local_mount(profile: ClusterProfile, ssh: Remote) -> Remote:
    """``ssh`` wrapped in a :class:`MountedRemote` when the profile's ``local_mount`` says so:
    a path (checked to be a directory here), or ``"auto"`` (:func:`detect_local_mount`; not
    found: ``ssh`` itself, SFTP for files). Raises ConfigError for a path that is no directory."""
    lm = getattr(profile, "local_mount", None)
    if not lm or not profile.shared_root:
        return ssh
    if lm == "auto":
        found, why = detect_local_mount(ssh, profile.shared_root)
        log.info("hyperpod_lab: cluster '%s' local_mount auto: %s", profile.name, why)
        return MountedRemote(ssh, profile.shared_root, found, how="probe") if found else ssh
    path = os.path.abspath(os.path.expanduser(lm))
    if not os.path.isdir(path):
        from hyperpod_lab.errors import ConfigError

        raise ConfigError(f"cluster '{profile.name}': local_mount {lm!r} is not a directory on this machine; "
                          f"set it to where this machine mounts the cluster's {profile.shared_root}, to \"auto\" "
                          f"(found by a probe file), or remove it (files then go over SFTP)")
    return MountedRemote(ssh, profile.shared_root, path)
