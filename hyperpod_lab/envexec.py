"""The one program hyperpod-lab runs on a Slurm login node to submit: stage a job's files from
standard input, then run a command (``sbatch``) with extra environment variables also read from
standard input, so that secret values never appear in a command line, a file or a log.

Two modes; in both the command is an argv list (joined with ``remote.quote_argv``, each word
quoted), so nothing a user typed is ever interpreted by a shell:

* ``python -m hyperpod_lab.envexec -- ARGV...``: standard input holds one JSON object
  ``{"NAME": "value", ...}`` (at most :data:`MAX_BYTES`); ARGV is exec'd with them added.
* ``... --stage -- ARGV...``: standard input holds a *staging frame* (:func:`frame`): one header
  line of JSON (the job directory, its sub-directories, each file's path, mode and size, the
  variables, and optionally an event line to append once ARGV succeeded) followed by the files'
  bytes, back to back. The program creates the job directory (``mkdir``: it must not exist yet,
  the job id is fresh) and the sub-directories 0700, writes each file with ``O_CREAT | O_EXCL |
  O_NOFOLLOW`` at its mode (0600, or 0700 for the batch script), runs ARGV with the variables,
  and when ARGV exits 0 appends the event with the job id ARGV printed (``sbatch --parsable``'s
  ``123`` or ``123;cluster``) as ``data.native_id``. Its standard output is ARGV's, then one
  line ``hyperpod-lab-stage: {"event": true|false}`` (:func:`split_output`). Exit status: ARGV's;
  2 for a bad frame or a staging error (nothing was run; the reason on stderr, never a value);
  127 when ARGV's program is not found.

Why one command with the files on its standard input, and not SFTP (issue 16, item 5): over
SFTP, staging cost a round trip per directory level checked, per file opened, written, chmodded,
renamed and closed, then the exec of sbatch, then SFTP again for the ``submitted`` event: about
40 request/answer pairs before the job id came back (542 ms over sbatch alone). A single exec
costs one channel open and one exec request, whatever the number of files; the files, the
secrets and the event travel as data on the channel, never as words of a command line, and
``O_EXCL`` + ``O_NOFOLLOW`` in a directory the program has just created (0700) means nothing
another user prepared can be written through. Pipelined SFTP writes would still need the
directory checks and a separate exec, and would leave the event append as a third step.

The Slurm backend runs it as ``python -I -S -c <this file's source>`` (:func:`program_argv`): the
source is a constant of this package, quoted as one argv word, so the login node needs a Python
3 (the profile's ``python``), not this package or the same version of it. Standard library only.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import stat
import subprocess
import sys

MAX_BYTES = 64 * 1024
MAX_HEADER_BYTES = 1 << 20
MAX_FILE_BYTES = 1 << 30
STAGE_MARK = "hyperpod-lab-stage: "
FILE_MODES = (0o600, 0o700)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_JOB_ID_LINE = re.compile(r"\s*(\d+)(?:;\S+)?\s*")  # sbatch --parsable (as slurm.parse_sbatch)


def check_env(env) -> dict:
    """``env`` when it is a JSON object of variables. Raises ValueError naming the problem (never a value)."""
    if not isinstance(env, dict):
        raise ValueError("the variables are not a JSON object")
    for k, v in env.items():
        if not _NAME.fullmatch(k) or not isinstance(v, str) or "\0" in v:
            raise ValueError(f"variable {k[:100]!r}: names must match {_NAME.pattern} and values be strings without NUL")
    return env


def parse(data: bytes) -> dict:
    """The variables of ``data``. Raises ValueError naming the problem (never a value)."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"more than {MAX_BYTES} bytes of variables on standard input")
    try:
        env = json.loads(data or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("standard input is not a JSON object of variables") from None
    if not isinstance(env, dict):
        raise ValueError("standard input is not a JSON object of variables")
    return check_env(env)


# ---- staging ---------------------------------------------------------------------------------
def frame(folder: str, dirs, files, env: dict, event: dict | None = None, tree=None) -> bytes:
    """The standard input of ``--stage``.

    Args:
        folder: the job directory (absolute; created, must not exist).
        dirs: sub-directories to create (relative, parents first).
        files: ``(relative path, mode, bytes)`` each.
        env: variables for the command.
        event: ``{"path": relative path, "record": event dict}`` to append after the command
            succeeded, its ``data.native_id`` set to the job id the command printed; or None.
        tree: ``(shared root, ((name, mode), ...))``: the folders above ``folder`` to make and
            check first (:func:`ensure_tree`), or None.
    """
    header = {"folder": folder, "dirs": list(dirs), "files": [[p, m, len(b)] for p, m, b in files],
              "env": env, "event": event}
    if tree:
        header["tree"] = [tree[0], [list(p) for p in tree[1]]]
    return b"".join([json.dumps(header, separators=(",", ":")).encode() + b"\n", *(b for _, _, b in files)])


def split_output(stdout: str) -> tuple[str, bool | None]:
    """``(the command's output, whether the event was appended)`` of a ``--stage`` run's
    standard output (None: no report line, the program did not finish)."""
    head, mark, tail = stdout.rpartition(STAGE_MARK)
    if not mark or (head and not head.endswith("\n")):
        return stdout, None
    try:
        report = json.loads(tail.strip())
    except ValueError:
        return stdout, None
    return head, bool(report.get("event")) if isinstance(report, dict) else None


def _rel(path) -> str:
    parts = path.split("/") if isinstance(path, str) and path and "\0" not in path and not path.startswith("/") else []
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"{str(path)[:200]!r} is not a relative path inside the job directory")
    return path


def _job_folder(folder) -> str:
    if not isinstance(folder, str) or not folder.startswith("/") or "\0" in folder \
            or os.path.normpath(folder) != folder or folder == "/":
        raise ValueError(f"{str(folder)[:200]!r} is not an absolute, normalised job directory")
    return folder


# ---- the folders above a job directory (issue 24, finding 9) ----------------------------------
# The one definition of the rule, here because this file runs alone on the login node
# (``python -c <source>``); hyperpod_lab.private_dir uses it on this machine and over SFTP.
TRUST_FIX_MARK = "hyperpod-lab creates job directories only below folders"


class UntrustedTree(PermissionError):
    """A folder above a job directory is a link, another user's, or writable by others without
    the sticky bit; the message names it and the fix."""


def trust_problem(mode: int, uid: int, my_uid: int, link_ok: bool = False):
    """Why a folder with ``lstat`` ``mode``/``uid`` may not hold job directories of ``my_uid``, or
    None: it must be a directory (not a link unless ``link_ok``: the shared root itself, as the
    profile names it), owned by root or ``my_uid``, not writable by group/others unless sticky."""
    if stat.S_ISLNK(mode) and not link_ok:
        return "is a symbolic link"
    if not stat.S_ISDIR(mode):
        return "is not a directory"
    if uid not in (0, my_uid):
        return f"is owned by uid {uid}, neither root nor you (uid {my_uid}): that user could move your jobs"
    perm = stat.S_IMODE(mode)
    if perm & 0o022 and not perm & stat.S_ISVTX:
        return (f"has mode {perm:04o}: group or others may write into it and it is not sticky, so they could "
                f"rename or replace what it holds")
    return None


class LocalTreeOps:
    """:func:`ensure_tree`'s file operations on this machine (``to_local`` maps a cluster path to
    where this machine sees it: a local mount; default the path itself). Re-exported by
    :mod:`hyperpod_lab.private_dir`."""

    def __init__(self, to_local=None):
        self.to_local = to_local or (lambda p: p)

    def lstat(self, path):
        return os.lstat(self.to_local(path))

    def stat(self, path):
        return os.stat(self.to_local(path))

    def mkdir(self, path, mode):
        os.mkdir(self.to_local(path), mode)

    def makedirs(self, path):
        os.makedirs(self.to_local(path), mode=0o700, exist_ok=True)

    def chmod(self, path, mode):
        os.chmod(self.to_local(path), mode)  # a directory mkdir just made (checked with lstat after)

    def uid(self):
        return os.geteuid()


def ensure_tree(root: str, parts, fs=None) -> str:
    """Create (when missing) and check the folders ``root/part1/part2/...``: ``root`` is checked
    with ``stat`` (it may be a link the profile chose; made ``mkdir -p`` 0700 when missing), each
    ``(name, mode)`` of ``parts`` with ``lstat`` after it is made at ``mode`` when missing
    (:func:`trust_problem`). ``fs``: lstat, stat, mkdir, makedirs, chmod, uid (default: this
    machine's). Returns the last folder. Raises UntrustedTree, OSError."""
    fs = fs or LocalTreeOps()
    root = posixpath.normpath(root)
    my_uid = fs.uid()
    try:
        st = fs.stat(root)
    except FileNotFoundError:
        fs.makedirs(root)
        st = fs.stat(root)
    cur, problem = root, trust_problem(st.st_mode, st.st_uid, my_uid, link_ok=True)
    for name, mode in [(None, None)] + [tuple(p) for p in parts]:
        if name is not None:
            if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
                raise ValueError(f"{str(name)[:100]!r} is not a folder name")
            cur = posixpath.join(cur, name)
            try:
                st = fs.lstat(cur)
            except FileNotFoundError:
                try:
                    fs.mkdir(cur, mode)
                    fs.chmod(cur, mode)  # not narrowed by the umask
                except FileExistsError:  # made meanwhile: checked below like any other
                    pass
                st = fs.lstat(cur)
            problem = trust_problem(st.st_mode, st.st_uid, my_uid)
        if problem:
            tree = posixpath.join(root, parts[0][0]) if parts else root
            raise UntrustedTree(
                f"{cur} {problem}. {TRUST_FIX_MARK} that root or you own and others cannot write into (or sticky, "
                f"mode 1777). Fix: remove or move {cur} if it is not yours and not an administrator's; for a "
                f"cluster shared by several users an administrator creates {tree} once (`sudo install -d -o root "
                f"-m 1777 {tree}`); or set this cluster's shared_root to a folder of your own")
    return cur


def make_job_folder(folder: str, dirs, tree=None) -> None:
    """Create ``folder`` (0700; it must not exist yet, its parents are made 0700 as needed) and
    its sub-directories ``dirs`` (0700). ``tree``: ``[root, [[name, mode], ...]]``, the folders
    from the shared root down to ``folder``'s parent, made and checked first (:func:`ensure_tree`).
    Raises ValueError for a bad path, UntrustedTree, OSError (FileExistsError when the folder exists)."""
    _job_folder(folder)
    rels = [_rel(d) for d in dirs]
    if tree:
        if ensure_tree(tree[0], tree[1]) != os.path.dirname(folder):
            raise ValueError(f"{folder[:200]!r} is not in the tree {str(tree)[:200]}")
    os.makedirs(os.path.dirname(folder), mode=0o700, exist_ok=True)
    os.mkdir(folder, 0o700)
    for d in rels:
        os.mkdir(os.path.join(folder, d), 0o700)


def write_new(path: str, mode: int, chunks) -> None:
    """Write a new file ``path`` (``O_EXCL``, never through a link) at ``mode`` (0600 or 0700)
    from the byte strings ``chunks``. Raises ValueError for another mode, OSError."""
    if mode not in FILE_MODES:
        raise ValueError(f"mode {mode!r} of {os.path.basename(path)!r} is not 0600 or 0700")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        for chunk in chunks:
            while chunk:
                chunk = chunk[os.write(fd, chunk):]
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def append_line(path: str, line: bytes) -> None:
    """One ``write()`` of ``line`` on an ``O_APPEND`` descriptor (created 0600, never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


#: the job's change log beside the event files (``hyperpod_lab.tails.CHANGES``; this file runs alone
#: on the login node, so the name is repeated here)
CHANGES_LOG = "changes.log"


def event_line(record: dict, native_id: str) -> bytes:
    """``record`` (an event as ``Event.to_json`` writes it) with ``data.native_id``, as one line."""
    rec = dict(record)
    rec["data"] = dict(rec.get("data") or {}, native_id=native_id)
    return (json.dumps(rec, separators=(",", ":"), sort_keys=True) + "\n").encode()


def job_id_of(stdout: bytes) -> str | None:
    """The job id ``sbatch --parsable`` printed (its last such line), or None."""
    for line in stdout.decode(errors="replace").strip().splitlines()[::-1]:
        m = _JOB_ID_LINE.fullmatch(line)
        if m:
            return m.group(1)
    return None


def _read_exactly(stream, n: int):
    while n > 0:
        chunk = stream.read(min(n, 1 << 20))
        if not chunk:
            raise ValueError("standard input ended before the files it announced")
        n -= len(chunk)
        yield chunk


def _stage_from(stream) -> tuple[dict, dict | None]:
    """Read a frame from ``stream`` and stage it. Returns (variables, event). Raises ValueError, OSError."""
    line = stream.readline(MAX_HEADER_BYTES + 1)
    if len(line) > MAX_HEADER_BYTES or not line.endswith(b"\n"):
        raise ValueError("no header line (JSON, at most 1 MiB) on standard input")
    try:
        header = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("the header line is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError("the header line is not a JSON object")
    env = check_env(header.get("env") or {})
    files = header.get("files") or []
    event = header.get("event")
    if not isinstance(files, list) or not all(isinstance(f, list) and len(f) == 3 and isinstance(f[1], int)
                                              and isinstance(f[2], int) and 0 <= f[2] <= MAX_FILE_BYTES for f in files):
        raise ValueError("'files' must be [[path, mode, size], ...]")
    if event is not None and not (isinstance(event, dict) and isinstance(event.get("record"), dict)):
        raise ValueError("'event' must be {\"path\": ..., \"record\": {...}}")
    folder = _job_folder(header.get("folder"))
    for path, mode, _ in files:
        _rel(path)
        if mode not in FILE_MODES:
            raise ValueError(f"mode {mode!r} of {str(path)[:200]!r} is not 0600 or 0700")
    if event is not None:
        _rel(event.get("path"))
    make_job_folder(folder, header.get("dirs") or [], header.get("tree"))
    for path, mode, size in files:
        write_new(os.path.join(folder, path), mode, _read_exactly(stream, size))
    if stream.read(1):
        raise ValueError("more bytes on standard input than the files announced")
    return env, ({"path": os.path.join(folder, event["path"]), "record": event["record"]} if event else None)


def _stage_and_run(cmd: list) -> int:
    try:
        env, event = _stage_from(sys.stdin.buffer)
    except (ValueError, OSError) as e:
        print(f"envexec: nothing was run, staging failed: {e}", file=sys.stderr)
        return 2
    try:
        p = subprocess.run(cmd, env=dict(os.environ, **env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    except OSError as e:
        print(f"envexec: {cmd[0]}: {e.strerror or e}", file=sys.stderr)
        return 127
    written = False
    if p.returncode == 0 and event is not None:
        native_id = job_id_of(p.stdout)
        if native_id is not None:
            try:
                append_line(event["path"], event_line(event["record"], native_id))
                written = True
            except OSError as e:
                print(f"envexec: the event was not appended: {e}", file=sys.stderr)
            if written:  # named in the job's change log, as every event writer does (a hint: errors pass)
                try:
                    append_line(os.path.join(os.path.dirname(event["path"]), CHANGES_LOG),
                                b"\n" + os.path.basename(event["path"]).encode() + b"\n")
                except OSError:
                    pass
    out = p.stdout
    if out and not out.endswith(b"\n"):
        out += b"\n"
    sys.stdout.buffer.write(out + (STAGE_MARK + json.dumps({"event": written}) + "\n").encode())
    sys.stdout.flush()
    return p.returncode


def main(argv: list | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    stage = bool(argv) and argv[0] == "--stage"
    if stage:
        argv = argv[1:]
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python -m hyperpod_lab.envexec [--stage] -- ARGV...  (variables as JSON, or a staging "
              "frame, on stdin)", file=sys.stderr)
        return 2
    os.umask(0o077)
    if stage:
        return _stage_and_run(argv[1:])
    try:
        env = parse(sys.stdin.buffer.read(MAX_BYTES + 1))
    except ValueError as e:
        print(f"envexec: {e}", file=sys.stderr)
        return 2
    os.execvpe(argv[1], argv[1:], dict(os.environ, **env))
    return 127  # not reached


_SOURCES: dict = {}


def source_argv(python: str, path: str, module: str) -> list:
    """``[python, "-I", "-S", "-c", <the text of the file at path>]``: the argv that runs one of
    this package's standalone programs (standard library only: this module,
    :mod:`hyperpod_lab.tails`) on a login node that need not have the package. Falls back to
    ``[python, "-m", module]`` (which needs the package there) when the file cannot be read. Each
    file is read once (cached by ``path``)."""
    if path not in _SOURCES:
        try:
            with open(os.path.abspath(path), encoding="utf-8") as f:
                _SOURCES[path] = f.read()
        except OSError:
            _SOURCES[path] = ""
    # -I -S: isolated from PYTHON* variables and the user's site, and no site-packages at all
    # (standard library only; the startup of a big environment's .pth files is skipped too)
    return [python, "-I", "-S", "-c", _SOURCES[path]] if _SOURCES[path] else [python, "-m", module]


def program_argv(python: str, stage: bool = False) -> list:
    """The argv that runs this program with ``python`` on a login node: ``python -I -S -c <this
    file's source> [--stage] --`` (the command's words follow), by :func:`source_argv` (``-m
    hyperpod_lab.envexec`` when the source cannot be read)."""
    return source_argv(python, __file__, "hyperpod_lab.envexec") + (["--stage", "--"] if stage else ["--"])


if __name__ == "__main__":
    sys.exit(main())
