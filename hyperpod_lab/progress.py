"""A job's progress summary (step, total steps, loss, throughput, last event, fault and
recovery counts), folded from its events. Shared by the server's JobView and the notebook
widget. Standard library only."""

from __future__ import annotations

import json
from typing import Any

from hyperpod_lab.events import Event, EventKind


def _total_steps_from_spec(spec: dict) -> int | None:
    args = list(spec.get("args") or [])
    for i, a in enumerate(args):
        if a == "--steps" and i + 1 < len(args) and str(args[i + 1]).isdigit():
            return int(args[i + 1])
        if isinstance(a, str) and a.startswith("--steps=") and a[8:].isdigit():
            return int(a[8:])
    return None


class Progress:
    """A job's progress summary, folded from its events.

    Fields (``to_dict``): ``step`` (last completed 0-based step), ``total_steps`` (a step
    event's ``total_steps`` metric, else the script's ``--steps N`` argument, else None),
    ``loss``, ``steps_per_s``, ``last_event`` (Event JSON), ``faults`` (``fault.detected``
    events), ``recoveries`` (``recovery.completed`` events).
    """

    def __init__(self, spec: dict | None = None, saved: dict | None = None):
        d = saved or {}
        self.step = d.get("step")
        self.total_steps = d.get("total_steps", _total_steps_from_spec(spec or {}))
        self.loss = d.get("loss")
        self.steps_per_s = d.get("steps_per_s")
        self.last_event = d.get("last_event")
        self.faults = int(d.get("faults", 0))
        self.recoveries = int(d.get("recoveries", 0))

    def update(self, ev: Event) -> None:
        self.last_event = event_dict(ev)
        if ev.kind == EventKind.STEP.value:
            self.step = ev.data.get("step", self.step)
            self.loss = ev.data.get("loss", self.loss)
            self.steps_per_s = ev.data.get("steps_per_s", self.steps_per_s)
            if isinstance(ev.data.get("total_steps"), int):
                self.total_steps = ev.data["total_steps"]
        elif ev.kind == EventKind.FAULT_DETECTED.value:
            self.faults += 1
        elif ev.kind == EventKind.RECOVERY_COMPLETED.value:
            self.recoveries += 1
        elif ev.kind == EventKind.FINISHED.value:
            steps = ev.data.get("steps")
            if isinstance(steps, int) and steps > 0:
                self.step = steps - 1
            if ev.data.get("final_loss") is not None:
                self.loss = ev.data["final_loss"]

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "total_steps": self.total_steps, "loss": self.loss,
                "steps_per_s": self.steps_per_s, "last_event": self.last_event,
                "faults": self.faults, "recoveries": self.recoveries}


def event_dict(ev: Event) -> dict[str, Any]:
    return json.loads(ev.to_json())
