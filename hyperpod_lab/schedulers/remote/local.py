"""The seam on this machine: commands by ``subprocess`` without a shell, files directly."""

from __future__ import annotations

import os
import subprocess

from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.errors import RemoteCommandError
from hyperpod_lab.events import LocalFiles
from hyperpod_lab.schedulers.remote.base import CommandResult, Remote, quote_argv


class LocalRemote(LocalFiles, Remote):
    """This machine: subprocess without a shell, and the local file system (reads, appends and
    directories as :class:`hyperpod_lab.events.LocalFiles`)."""

    def run(self, argv, check=True, timeout_s=60.0, input=None, idempotent=False):
        quote_argv(argv)  # same validation as over SSH
        try:
            p = subprocess.run(list(argv), capture_output=True, timeout=timeout_s,
                               input=input if input is not None else b"")
        except FileNotFoundError:
            raise RemoteCommandError(list(argv), 127, f"{argv[0]}: command not found") from None
        except subprocess.TimeoutExpired:
            raise RemoteCommandError(list(argv), -1, f"not finished within {timeout_s:g} s on this machine "
                                                     f"(killed)") from None
        res = CommandResult(p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"))
        if check and res.exit_status != 0:
            raise RemoteCommandError(list(argv), res.exit_status, res.stderr or res.stdout)
        return res

    def write_bytes(self, path, data, mode=0o600):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_atomic(path, data, mode=mode)
