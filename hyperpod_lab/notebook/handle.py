"""``Job``: what ``job = %hyperpod submit ...`` returns — the job id (a ``str``, so code that
compares or formats it keeps working) with methods for the job."""

from __future__ import annotations

from hyperpod_lab.events import Event
from hyperpod_lab.submit.jobs import JobRecord


class Job(str):
    """A job id with shortcuts to the core ``Client``.

    Args:
        job_id: hyperpod-lab job id.
        client: a ``hyperpod_lab.submit.client.Client`` (default: a new one over the user's store).
    """

    def __new__(cls, job_id: str, client=None):
        obj = super().__new__(cls, job_id)
        obj._client = client
        return obj

    @property
    def client(self):
        if self._client is None:
            from hyperpod_lab.submit.client import Client

            self._client = Client()
        return self._client

    @property
    def job_id(self) -> str:
        return str(self)

    def record(self) -> JobRecord:
        """The job record, refreshed from the scheduler (one batched poll)."""
        return self.client.status(self.job_id)

    def status(self) -> str:
        """The job's state (``pending``, ``running``, ``completed``, ``failed``, ``cancelled``)."""
        return self.record().status

    def wait(self, timeout_s: float = 600.0) -> JobRecord:
        """Block until the job is terminal; its record. Raises TimeoutError."""
        return self.client.wait(self.job_id, timeout_s=timeout_s)

    def events(self) -> list[Event]:
        """Every event the job has written so far, ordered by time."""
        return self.client.event_reader(self.job_id).poll()

    def monitor(self, **kwargs):
        """A live :class:`hyperpod_lab.notebook.widgets.JobMonitor` (displayed when it is the cell's
        value, e.g. ``job.monitor()`` as the last line). kwargs go to JobMonitor."""
        from hyperpod_lab.notebook.widgets import JobMonitor

        return JobMonitor(self.job_id, client=self.client, **kwargs)

    def __reduce__(self):
        return (Job, (str(self),))
