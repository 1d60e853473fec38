"""File-system notifications of new events (watchdog), when a cluster's shared storage is
mounted on the server's machine: the watcher reads a job's files when they change instead of on
its next poll."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

log = logging.getLogger("hyperpod_lab.server")


class DirNotifier:
    """Wakes tailers when their event files change: one ``watchdog`` observer (inotify on Linux,
    its own thread) watching each job's ``events/`` directory, not recursively. A change (a file
    created, written, closed after writing, moved in) calls ``on_change(job_id)`` on the IOLoop;
    reads of the files (opened, closed without writing) do not.

    Args:
        loop: the IOLoop's asyncio loop.
        on_change: called there with the job id.

    Attributes:
        available: watchdog is installed and its observer runs.
    """

    _KINDS = ("created", "modified", "moved", "closed")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_change: Callable[[str], None]):
        self.loop, self.on_change = loop, on_change
        self.watches: dict[str, Any] = {}
        self.observer = None
        try:
            from watchdog.observers import Observer
        except ImportError:
            log.info("hyperpod_lab: watchdog is not installed: event files are read on a timer only")
            return
        try:
            obs = Observer()
            obs.daemon = True
            obs.start()
        except Exception as e:  # e.g. no inotify instance left
            log.warning("hyperpod_lab: file-system notifications unavailable (%s): event files are read on a "
                        "timer only", e)
            return
        self.observer = obs

    @property
    def available(self) -> bool:
        return self.observer is not None

    def watch(self, job_id: str, path: str) -> bool:
        """Watch ``path`` (a job's events directory, on this machine) for ``job_id``. Returns
        whether notifications now come for it (False: unavailable, or the watch failed)."""
        if self.observer is None:
            return False
        if job_id in self.watches:
            return True
        from watchdog.events import FileSystemEventHandler

        notify = self._notify
        kinds = self._KINDS

        class _Handler(FileSystemEventHandler):
            def on_any_event(self, event):
                if not event.is_directory and event.event_type in kinds:
                    notify(job_id)

        try:
            self.watches[job_id] = self.observer.schedule(_Handler(), path, recursive=False)
            return True
        except Exception as e:  # missing directory, inotify watch limit (OSError), ...
            log.warning("hyperpod_lab: no notifications for %s's events (%s): read on a timer", job_id, e)
            return False

    def _notify(self, job_id: str) -> None:  # the observer's thread
        try:
            self.loop.call_soon_threadsafe(self.on_change, job_id)
        except RuntimeError:  # the loop is closed: the server is stopping
            pass

    def unwatch(self, job_id: str) -> None:
        w = self.watches.pop(job_id, None)
        if w is not None and self.observer is not None:
            try:
                self.observer.unschedule(w)
            except Exception:
                pass

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=2)
            self.observer = None
        self.watches.clear()
