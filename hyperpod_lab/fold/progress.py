"""A job's progress summary for the server's JobView and the notebook widget: the job facts
fold (:mod:`hyperpod_lab.fold.facts`) constructed from a JobSpec dict. Standard library only."""

from __future__ import annotations

from hyperpod_lab.fold.facts import JobFacts, event_dict

__all__ = ["Progress", "event_dict"]


class Progress(JobFacts):
    """:class:`~hyperpod_lab.fold.facts.JobFacts` with the server's argument order.

    ``to_dict()`` keys the server and the widgets read: ``step`` (last completed 0-based step),
    ``total_steps`` (a step event's ``total_steps`` metric, else the script's ``--steps N``
    argument, else None), ``loss``, ``steps_per_s``, ``last_event`` (Event JSON), ``faults``
    (failure incidents), ``recoveries`` (incidents recovered), ``downtime_s`` (total seconds)
    and ``last_downtime_s`` (seconds or None); the other facts follow (see JobFacts).

    Args:
        spec: the job's JobSpec dict (for ``total_steps``).
        saved: a ``to_dict()`` result to continue from.
    """

    def __init__(self, spec: dict | None = None, saved: dict | None = None):
        super().__init__(saved, spec=spec)
