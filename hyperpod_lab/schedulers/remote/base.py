"""The seam's interface: :class:`Remote` (commands as argv lists, files), its results and
staging types, and :func:`quote_argv`, the one place an argv becomes a remote command line."""

from __future__ import annotations

import os
import posixpath
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass

from hyperpod_lab import envexec
from hyperpod_lab.errors import ClusterUnreachable, RemoteCommandError
from hyperpod_lab.private_dir import LocalTreeOps, UntrustedDirError, ensure_job_tree


def quote_argv(argv: list[str]) -> str:
    """Join an argv list into one POSIX shell command line, each word quoted.

    Raises ValueError for an empty argv, a non-string word, or a NUL byte (which no shell
    word can carry).
    """
    if not isinstance(argv, (list, tuple)) or not argv:
        raise ValueError("argv must be a non-empty list of strings")
    for word in argv:
        if not isinstance(word, str):
            raise ValueError(f"argv words must be strings, got {type(word).__name__}: {word!r}")
        if "\x00" in word:
            raise ValueError("argv words cannot contain NUL bytes")
    return shlex.join(argv)


@dataclass
class CommandResult:
    """Outcome of one command: exit status, stdout and stderr as text."""

    exit_status: int
    stdout: str
    stderr: str


class CommandOutcomeUnknown(ClusterUnreachable):
    """The connection was lost after a command that must not run twice (``sbatch``, ``scancel``)
    went out: it may or may not have run on the login node. It is not repeated."""


@dataclass(frozen=True)
class StagedFile:
    """One file of a job directory to stage: ``rel`` below the directory, its bytes and mode
    (0600; 0700 for a batch script)."""

    rel: str
    data: bytes
    mode: int = 0o600


@dataclass
class Staging:
    """What staging a new job puts on shared storage: the job directory ``folder`` (as the
    cluster sees it; it must not exist yet), its sub-directories (relative, parents first) and
    files. Everything is private to the user: directories 0700, files 0600 (or 0700).

    ``tree``: ``(shared root, ((name, mode), ...))``, the folders from the shared root down to
    ``folder``'s parent (the user's job tree, :func:`hyperpod_lab.private_dir.job_tree_parts`),
    each made at its mode when missing and checked (no link, root's or the user's, not writable
    by others unless sticky) before ``folder`` is made; None: not checked (EKS, old layout)."""

    folder: str
    dirs: tuple[str, ...]
    files: list[StagedFile]
    tree: tuple | None = None


class Remote(ABC):
    """Runs argv lists and reads/writes files where the cluster's tools and storage are."""

    @abstractmethod
    def run(self, argv: list[str], check: bool = True, timeout_s: float | None = 60.0,
            input: bytes | None = None, idempotent: bool = False) -> CommandResult:
        """Run ``argv`` (``input``: bytes for its standard input, then EOF; the way to pass a
        secret, never in ``argv``); raise RemoteCommandError on a non-zero exit when ``check``, or
        when it gives no output for ``timeout_s`` seconds (exit status -1). ``idempotent``: the
        command only reads, so it may run again after a dropped connection (see
        :class:`SSHRemote`)."""

    @abstractmethod
    def read_from(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """At most ``length`` bytes of ``path`` from ``offset`` (None: to its end). Raises
        FileNotFoundError."""

    @abstractmethod
    def listdir(self, path: str) -> list[str]:
        """Names in ``path``; [] if it does not exist."""

    @abstractmethod
    def list_files(self, path: str) -> dict[str, int]:
        """Regular files in ``path`` (no links, no directories) and their sizes, bytes; {} if missing."""

    @abstractmethod
    def write_bytes(self, path: str, data: bytes, mode: int = 0o600) -> None:
        """Write ``data`` to ``path`` atomically (temporary name, then rename)."""

    @abstractmethod
    def append_bytes(self, path: str, data: bytes) -> None:
        """Append ``data`` to ``path`` (created if missing)."""

    @abstractmethod
    def create_new(self, path: str) -> bool:
        """Create an empty file (0600) unless it exists (``O_EXCL``); True for the one caller that created it."""

    @abstractmethod
    def makedirs(self, path: str) -> None:
        """``mkdir -p``."""

    def user_name(self) -> str:
        """The cluster user's login name (jobs run as this user; it names the user's folder
        below ``<shared_root>/hyperpod-lab/``). Here: this process's effective user."""
        import pwd

        try:
            return pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:  # a uid without a passwd entry (containers)
            return f"uid-{os.geteuid()}"

    def tree_ops(self):
        """The file operations :func:`hyperpod_lab.private_dir.ensure_job_tree` needs (lstat, stat,
        mkdir, chmod, uid) where the cluster's files are; here: this machine's."""
        return LocalTreeOps()

    def ensure_job_root(self, shared_root: str) -> str:
        """Create (when missing) and check the user's job tree below ``shared_root``, every time
        a job is staged (a few ``lstat``s), before the job directory is made:
        :func:`hyperpod_lab.private_dir.ensure_job_tree`. Returns
        ``<shared_root>/hyperpod-lab/<user>/jobs``. (Staging checks its own ``Staging.tree``.)

        Raises:
            UntrustedDirError: a directory of the tree is a link, another user's or writable by
                others without the sticky bit (the message names it and the fix).
            OSError, ClusterUnreachable: as the file operations.
        """
        return ensure_job_tree(shared_root, self.user_name(), self.tree_ops())

    def ensure_tree(self, staging: Staging) -> None:
        """Make and check ``staging.tree`` where this Remote's files are (:func:`hyperpod_lab.envexec.ensure_tree`
        over :meth:`tree_ops`). Raises UntrustedDirError, ValueError (the folder is not in it), OSError."""
        if not staging.tree:
            return
        try:
            last = envexec.ensure_tree(staging.tree[0], staging.tree[1], self.tree_ops())
        except envexec.UntrustedTree as e:
            raise UntrustedDirError(str(e)) from None
        if last != posixpath.dirname(staging.folder):
            raise ValueError(f"{staging.folder} is not in its tree {staging.tree}")

    def local_path(self, path: str) -> str | None:
        """Where this machine sees the cluster path ``path`` (local-mount mode, see
        :class:`MountedRemote`), or None when its files are reached only through this Remote."""
        return None

    def stage(self, staging: Staging) -> None:
        """Create ``staging``'s job directory and write its files, one call each (``makedirs``,
        atomic ``write_bytes``): the local and EKS backends' staging. A Slurm submit stages and
        runs sbatch in one command instead (:meth:`stage_and_run`). ``staging.tree`` is made and
        checked first (:meth:`ensure_tree`). Raises UntrustedDirError, OSError."""
        self.ensure_tree(staging)
        self.makedirs(staging.folder)
        for d in staging.dirs:
            self.makedirs(posixpath.join(staging.folder, d))
        for f in staging.files:
            self.write_bytes(posixpath.join(staging.folder, f.rel), f.data, mode=f.mode)

    def stage_and_run(self, staging: Staging, argv: list[str], env: dict[str, str], python: str,
                      event: dict | None = None, timeout_s: float | None = 60.0) -> tuple[CommandResult, bool]:
        """Stage a new job and run ``argv`` (``sbatch``) on the login node in **one command**:
        :mod:`hyperpod_lab.envexec` (``python -c <its source> --stage -- argv``) reads the files,
        the variables ``env`` (secrets: never in argv or a file) and ``event`` from its standard
        input, writes the files (0700 directories, ``O_EXCL``/``O_NOFOLLOW`` files), runs
        ``argv`` and, when it exits 0, appends ``event`` (``{"path": relative path, "record":
        event dict}``) with ``data.native_id`` = the job id ``argv`` printed. See envexec's
        docstring for why one exec rather than SFTP.

        Returns:
            ``(result, event_written)``: ``result.stdout`` is ``argv``'s output alone.

        Raises:
            UntrustedDirError: a folder of ``staging.tree`` was refused on the login node (nothing ran).
            RemoteCommandError: ``argv`` (or the staging: exit status 2) failed; exit status -1
                when it gave no output for ``timeout_s`` (it may still run).
            CommandOutcomeUnknown: the connection was lost after the command went out.
            ClusterUnreachable: as :meth:`run`.
        """
        files = [(f.rel, f.mode, f.data) for f in staging.files]
        frame = envexec.frame(staging.folder, staging.dirs, files, env, event, tree=staging.tree)
        argv_all = envexec.program_argv(python, stage=True) + list(argv)
        try:
            res = self.run(argv_all, check=False, timeout_s=timeout_s, input=frame)
        except RemoteCommandError as e:  # name the command, not the program's source
            raise RemoteCommandError(list(argv), e.exit_status, e.stderr) from None
        out, written = envexec.split_output(res.stdout)
        res = CommandResult(res.exit_status, out, res.stderr)
        if res.exit_status == 2 and envexec.TRUST_FIX_MARK in res.stderr:  # the tree was refused: nothing ran
            raise UntrustedDirError(res.stderr.strip().removeprefix("envexec: nothing was run, staging failed: "))
        if res.exit_status != 0:
            raise RemoteCommandError(list(argv), res.exit_status, res.stderr or res.stdout)
        return res, bool(written)

    def exists(self, path: str) -> bool:
        try:
            self.read_from(path, 0)
            return True
        except (FileNotFoundError, IsADirectoryError):
            return False

    def close(self) -> None:
        pass
