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
"""

from __future__ import annotations

import os
import stat

__all__ = ["PrivateDirError", "ensure_private_dir", "check_private_dir"]


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
