"""Private directories: created 0700 without following links, verified before use.

The memory tier's shared-memory root (``$HYPERPOD_LAB_SHM_DIR``, default
``/dev/shm/hyperpod-lab``), the job directories under it, and the default job directory under the
system temporary directory live in places every user of the node can write to. Whoever creates
such a directory first owns it, and could plant files in it (issue 13, finding 1). So every
directory of such a tree goes through :func:`ensure_private_dir`: ``os.mkdir(path, 0o700)`` (which
never follows a link at ``path``: an existing link makes it fail with ``EEXIST``), then
``os.lstat`` must show a real directory owned by this process's effective uid whose mode grants
nobody else write access. A directory of ours that others may only read or enter (e.g. ``0755``
left by an older hyperpod-lab) is tightened to ``0700``: nobody else could have written into it.
Anything else is refused with :class:`PrivateDirError`, naming the path and the fix.

Job directories on a cluster's shared storage live in a tree of the user's own,
``<shared_root>/hyperpod-lab/<user>/jobs/<job id>``; :func:`ensure_job_tree` creates that tree and
checks every folder above a job directory (no link, owned by root or the user, not writable by
others unless sticky) before one is created, locally or over SFTP (issue 24, finding 9).
"""

from __future__ import annotations

import os
import re
import stat

from hyperpod_lab import envexec
from hyperpod_lab.envexec import LocalTreeOps, trust_problem
from hyperpod_lab.errors import ConfigError
from hyperpod_lab.jobdir import JOB_TREE, RESERVED_USER_NAMES, USER_JOBS_DIRNAME

__all__ = ["PrivateDirError", "ensure_private_dir", "check_private_dir", "UntrustedDirError", "user_folder_name", "trust_problem", "job_tree_parts", "ensure_job_tree",
           "LocalTreeOps"]


class PrivateDirError(PermissionError):
    """A directory that must be private is not: another owner, writable by others, or a link."""


def _refuse(path: str, problem: str, env: str | None) -> PrivateDirError:
    fix = f"remove it, or set ${env} to a directory of your own" if env else "remove it"
    return PrivateDirError(f"{path} {problem}; hyperpod-lab keeps checkpoints there only in a directory owned by "
                           f"you (uid {os.geteuid()}), mode 0700, not a symbolic link: {fix}")


def check_private_dir(path: str, *, env: str | None = None) -> None:
    """Verify that ``path`` is a private directory of ours (see the module docstring).

    Args:
        path: the directory.
        env: the environment variable that chooses it, named in the error's fix.

    Raises:
        PrivateDirError: it is a symbolic link or not a directory, is owned by another uid, or
            grants group/other write access.
        FileNotFoundError: it does not exist.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise _refuse(path, "is a symbolic link", env)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a directory", env)
    if st.st_uid != os.geteuid():
        raise _refuse(path, f"is owned by uid {st.st_uid}, not by you", env)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        raise _refuse(path, f"has mode {mode:04o}: others may write into it", env)
    if mode & 0o077:
        os.chmod(path, 0o700)  # ours, and nobody else could write into it: just close it


def ensure_private_dir(path: str, *, top: str | None = None, env: str | None = None) -> str:
    """Create (if needed) and verify every directory from ``top`` down to ``path`` as private.

    Directories above ``top`` are created with ``os.makedirs`` when missing and not checked
    (e.g. ``/dev/shm``, or the parent a user chose for ``$HYPERPOD_LAB_SHM_DIR``).

    Args:
        path: the directory to use.
        top: the first directory of the private tree (``path`` itself or one of its ancestors);
            default ``path``.
        env: the environment variable that chooses the tree, named in the error's fix.

    Returns:
        ``os.path.abspath(path)``.

    Raises:
        PrivateDirError: a directory of the tree is not private (see :func:`check_private_dir`).
        ValueError: ``top`` is not ``path`` or one of its ancestors.
        OSError: a directory cannot be created.
    """
    path = os.path.abspath(path)
    top = os.path.abspath(top) if top else path
    if path != top and not path.startswith(top.rstrip(os.sep) + os.sep):
        raise ValueError(f"{top} is not {path} or one of its parents")
    parent = os.path.dirname(top)
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
    parts = [] if path == top else os.path.relpath(path, top).split(os.sep)
    cur = top
    for part in [None] + parts:
        if part is not None:
            cur = os.path.join(cur, part)
        try:
            os.mkdir(cur, 0o700)
        except FileExistsError:
            pass
        check_private_dir(cur, env=env)
    return path


# ---- job folders below a cluster's shared root ---------------------------------------------
#
# ``<shared_root>`` is shared storage every user of a cluster can reach (``/fsx``). hyperpod-lab
# keeps each user's jobs in a tree of that user's own:
#
#     <shared_root>/hyperpod-lab/              shared: root's (an administrator made it, 1777 or
#                                              0755) or this user's (created 0755 when missing)
#     <shared_root>/hyperpod-lab/<user>/       this user's, 0700
#     <shared_root>/hyperpod-lab/<user>/jobs/  this user's, 0700; a job directory below it
#
# Before a job directory is created there, every directory from ``<shared_root>`` down to
# ``jobs/`` is checked (:func:`ensure_job_tree`): whoever could rename or replace one of them
# could redirect the job's files (a ``hyperpod-lab`` planted as a link to a 0777 folder would
# receive them), so each must be a real directory (no link below ``<shared_root>``) owned by root
# or this user, and not writable by group or others unless sticky (1777, like ``/tmp``: others
# may add entries but not move ours).


_USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}")


class UntrustedDirError(ConfigError, PermissionError):
    """A directory above a job directory could be changed by another user, or is a link (a
    ConfigError: the server answers 400 with the message, which names the folder and the fix)."""


def user_folder_name(user: str) -> str:
    """``user`` (the cluster login name) as the name of the user's folder below :data:`JOB_TREE`.

    Raises:
        UntrustedDirError: not a POSIX-style login name (letters, digits, ``_.@-``, at most 64,
            not starting with ``.`` or ``-``), or one of :data:`RESERVED_USER_NAMES`.
    """
    if not isinstance(user, str) or not _USER_NAME.fullmatch(user) or user in RESERVED_USER_NAMES:
        raise UntrustedDirError(f"the cluster user name {str(user)[:80]!r} cannot name a folder below "
                                f"<shared_root>/{JOB_TREE}/ (letters, digits and _.@- only, not "
                                f"{' or '.join(RESERVED_USER_NAMES)}); set the profile's user, or shared_root to a "
                                f"folder of your own")
    return user


def job_tree_parts(user: str) -> tuple[tuple[str, int], ...]:
    """The folders of ``user``'s job tree below the shared root and the mode each is created at:
    ``hyperpod-lab`` 0755 (shared: others need to enter it), ``<user>`` and ``jobs`` 0700."""
    return ((JOB_TREE, 0o755), (user_folder_name(user), 0o700), (USER_JOBS_DIRNAME, 0o700))


def ensure_job_tree(shared_root: str, user: str, fs) -> str:
    """Create (if missing) and check the user's job tree below ``shared_root`` (see the comment
    above :class:`UntrustedDirError`); return ``<shared_root>/hyperpod-lab/<user>/jobs`` (POSIX path).
    The rule is :func:`hyperpod_lab.envexec.trust_problem`, the walk :func:`hyperpod_lab.envexec.ensure_tree`
    (the same code checks the tree on a Slurm login node when a job is staged there).

    Args:
        shared_root: the cluster's shared root (POSIX path, as ``fs`` sees the cluster); made
            (``mkdir -p``, 0700) when missing, else checked with ``stat`` (it may be a link).
        user: the cluster login name (:func:`user_folder_name`).
        fs: the file operations where the tree lives, an object with ``lstat(path)`` and
            ``stat(path)`` (attributes with ``st_mode``/``st_uid``; FileNotFoundError when missing),
            ``mkdir(path, mode)`` (FileExistsError when it exists), ``makedirs(path)``,
            ``chmod(path, mode)`` and ``uid()`` (the uid files are created as there). Locally
            :class:`LocalTreeOps`; over SFTP ``SSHRemote.tree_ops()``.

    Raises:
        UntrustedDirError: a folder of the tree is a link, not a directory, owned by another
            user, or writable by others without the sticky bit; the user name is unusable.
        OSError: a folder cannot be created.
    """
    parts = job_tree_parts(user)
    try:
        return envexec.ensure_tree(shared_root, parts, fs)
    except envexec.UntrustedTree as e:
        raise UntrustedDirError(str(e)) from None
