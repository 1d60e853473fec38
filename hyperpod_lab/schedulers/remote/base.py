"""The seam's interface: :class:`Remote` (commands as argv lists, files), its results and
staging types, and :func:`quote_argv`, the one place an argv becomes a remote command line."""

from __future__ import annotations

import posixpath
import shlex
from abc import ABC, abstractmethod
from dataclasses import dataclass

from hyperpod_lab import envexec
from hyperpod_lab.errors import ClusterUnreachable, RemoteCommandError


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
    files. Everything is private to the user: directories 0700, files 0600 (or 0700)."""

    folder: str
    dirs: tuple[str, ...]
    files: list[StagedFile]


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

    def local_path(self, path: str) -> str | None:
        """Where this machine sees the cluster path ``path`` (local-mount mode, see
        :class:`MountedRemote`), or None when its files are reached only through this Remote."""
        return None

    def stage(self, staging: Staging) -> None:
        """Create ``staging``'s job directory and write its files, one call each (``makedirs``,
        atomic ``write_bytes``): the local and EKS backends' staging. A Slurm submit stages and
        runs sbatch in one command instead (:meth:`stage_and_run`)."""
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
            RemoteCommandError: ``argv`` (or the staging: exit status 2) failed; exit status -1
                when it gave no output for ``timeout_s`` (it may still run).
            CommandOutcomeUnknown: the connection was lost after the command went out.
            ClusterUnreachable: as :meth:`run`.
        """
        files = [(f.rel, f.mode, f.data) for f in staging.files]
        frame = envexec.frame(staging.folder, staging.dirs, files, env, event)
        argv_all = envexec.program_argv(python, stage=True) + list(argv)
        try:
            res = self.run(argv_all, check=False, timeout_s=timeout_s, input=frame)
        except RemoteCommandError as e:  # name the command, not the program's source
            raise RemoteCommandError(list(argv), e.exit_status, e.stderr) from None
        out, written = envexec.split_output(res.stdout)
        res = CommandResult(res.exit_status, out, res.stderr)
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
