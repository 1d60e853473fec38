"""A live job monitor for notebooks (ipywidgets): ``%hyperpod watch JOB`` or ``job.monitor()``.

It shows the job's state, a progress bar of steps, a loss plot (matplotlib, drawn into a PNG shown
by an ``ipywidgets.Image``: loss and steps/s by step, from the same aggregation as the Lab's job
dashboard, :class:`hyperpod_lab.fold.aggregate.JobAggregate`; redrawn at most every
``plot_interval_s``, and at the latest ``plot_interval_s`` after the newest step arrived), the
latest events and the fault/recovery timeline of that aggregation
(:meth:`JobAggregate.timeline`, shown as it comes: the same lines as the Lab's dashboard): one
line per run of checkpoints of a tier (all ranks: ``checkpoint peer steps 4-40 (x37) · ranks 0,
1``), one per fault and per recovery (faults red, recoveries green with their downtime), one per
restore (all ranks), the nodes' pre-flight health checks and excluded nodes with the node they
name; the header lists the excluded nodes and, per node as the Lab's lanes (issue 27), the job's
nodes and the ones with faults and their ranks (:meth:`JobAggregate.nodes_line`: ``256 nodes x
8 ranks; faults on n167 (rank 1337)``), one line whatever the rank count.
A background thread reads the job's
events (``Client.event_reader``, the same cursor-based reader the CLI uses) and updates
the widgets' traits; ipykernel sends trait changes made from threads, so the monitor keeps updating
while other cells run. The thread stops when the ``finished`` event arrives or the job is
terminal and no more events come (or on :meth:`JobMonitor.stop`).
"""

from __future__ import annotations

import html
import io
import threading
import time
from typing import Any

import ipywidgets as widgets

from hyperpod_lab.events import Event, EventKind
from hyperpod_lab.fold.aggregate import KIND_TONES, JobAggregate
from hyperpod_lab.fold.progress import Progress

FINISH_GRACE_S = 30.0  # after 'finished', how long to wait for the scheduler's end state (s)
#: the colour of each tone of :data:`hyperpod_lab.fold.aggregate.KIND_TONES` (the CLI styles the same tones)
_TONE_COLORS = {"fault": "#d32f2f", "job-failed": "#b71c1c", "failed": "#c62828", "warning": "#f9a825", "excluded": "#ef6c00",
                "recovering": "#ef6c00", "recovered": "#2e7d32", "checkpoint": "#1565c0", "restore": "#6a1b9a",
                "health": "#00796b", "end": "#424242"}
_HEALTH_CHECKS_FAILED = _TONE_COLORS["failed"]  # a health.checked whose checks failed


def _color(kind: str, default: str) -> str:
    """The colour of an event kind's tone, else ``default``."""
    return _TONE_COLORS.get(KIND_TONES.get(kind, ""), default)


class JobMonitor:
    """Live monitor of one job.

    Args:
        job_id: hyperpod-lab job id.
        client: a ``hyperpod_lab.submit.client.Client`` (default: a new one over the user's store).
        interval_s: seconds between event reads.
        status_interval_s: seconds between scheduler state checks (one batched poll).
        plot_interval_s: the loss plot, timeline and goodput are redrawn at most this often
            (seconds); a redraw held back is done as soon as it is due, new events or not.
        table_rows: events shown in the table (the newest).
        plot_points: at most this many points in the loss plot (the aggregate's min/max
            downsampling keeps peaks).
        start: start the reader thread now.

    Attributes:
        events: every Event read so far; progress: :class:`hyperpod_lab.fold.progress.Progress`;
        aggregate: the :class:`~hyperpod_lab.fold.aggregate.JobAggregate` of those events (the
            timeline and the plot's data); state: last known job status (``running``...);
        done: set when the monitor stopped.
        plot_series: the ``JobAggregate.series(plot_points)`` dict the plot was last drawn from
            (None before the first step); plot_png: that PNG (bytes), also ``plot.value``.
        widget: the ``ipywidgets.VBox`` shown in the notebook.
    """

    def __init__(self, job_id: str, client=None, interval_s: float = 0.5, status_interval_s: float = 3.0,
                 plot_interval_s: float = 2.0, table_rows: int = 12, plot_points: int = 1000, start: bool = True):
        if client is None:
            from hyperpod_lab.submit.client import Client

            client = Client()
        self.job_id, self.client = str(job_id), client
        rec = client.get(self.job_id)  # UnknownJob early, in the caller's cell
        self.interval_s, self.status_interval_s = interval_s, status_interval_s
        self.plot_interval_s, self.table_rows, self.plot_points = plot_interval_s, table_rows, plot_points
        self.events: list[Event] = []
        self.progress = Progress(rec.spec)
        self.aggregate = JobAggregate()
        self.state = rec.status
        self.plot_series: dict[str, Any] | None = None
        self.plot_png: bytes | None = None
        self._plotted: tuple | None = None  # the series the PNG shows (steps, losses, rates)
        self.error: str | None = None
        self.done = threading.Event()
        self._stop = threading.Event()
        self._last_plot = 0.0
        self._plot_pending = False  # events arrived since the last redraw of the plot/timeline
        self.header = widgets.HTML()
        self.bar = widgets.IntProgress(value=0, min=0, max=max(1, self.progress.total_steps or 1),
                                       description="steps", bar_style="info",
                                       layout=widgets.Layout(width="60%"))
        self.bar_label = widgets.Label()
        self.plot_status = widgets.HTML()
        self.plot = widgets.Image(format="png", layout=widgets.Layout(display="none"))
        self.timeline = widgets.HTML()
        self.table = widgets.HTML()
        from hyperpod_lab.goodput.measure import GoodputMeter

        self.meter = GoodputMeter()  # where the wall time went (its own facts fold of the same events)
        self.goodput = widgets.HTML()
        self.widget = widgets.VBox([self.header, widgets.HBox([self.bar, self.bar_label]), self.plot_status,
                                    self.plot, self.timeline, self.goodput, self.table])
        self.widget.add_class("hyperpod-lab-monitor")
        self._render(force_plot=True)
        self._thread = threading.Thread(target=self._run, name=f"hyperpod-monitor-{self.job_id}", daemon=True)
        if start:
            self._thread.start()

    # ---- display -----------------------------------------------------------------------
    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop reading (the widgets keep what they show)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def wait(self, timeout_s: float = 600.0) -> "JobMonitor":
        """Block until the monitor stopped (the job ended). Raises TimeoutError."""
        if not self.done.wait(timeout_s):
            raise TimeoutError(f"monitor of {self.job_id} still running after {timeout_s} s")
        return self

    # ---- the reader thread -------------------------------------------------------------
    def _run(self) -> None:
        try:
            reader = self.client.event_reader(self.job_id)
            next_status, terminal_since, finished_at = 0.0, None, None
            while not self._stop.is_set():
                started = time.monotonic()
                new = reader.poll()
                for ev in new:
                    self._on_event(ev)
                if new or self._plot_pending:  # a throttled redraw is done as soon as it is due
                    self._render()
                if finished_at is None and any(ev.kind == EventKind.FINISHED.value for ev in new):
                    finished_at = time.monotonic()  # training ended; wait briefly for the scheduler's end state
                    next_status = 0.0
                if time.monotonic() >= next_status:
                    self.state = self._status(refresh=True) or self.state
                    next_status = time.monotonic() + (self.interval_s if finished_at else self.status_interval_s)
                    if terminal_since is None and self._terminal():
                        terminal_since = time.monotonic()
                        self._render()
                if terminal_since is not None and not new and (finished_at is not None
                                                               or started > terminal_since + 2 * self.interval_s):
                    break
                if finished_at is not None and time.monotonic() > finished_at + FINISH_GRACE_S:
                    break
                self._stop.wait(self.interval_s)
        except Exception as e:  # shown in the widget, never raised into the kernel's thread
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.state = self._status(refresh=False) or self.state
            self._render(force_plot=True, final=True)
            self.done.set()

    def _terminal(self) -> bool:
        from hyperpod_lab.submit.jobs import JobStatus

        try:
            return JobStatus(self.state).is_terminal()
        except ValueError:
            return False

    def _status(self, refresh: bool) -> str | None:
        try:
            rec = self.client.status(self.job_id) if refresh else self.client.get(self.job_id)
            return rec.status
        except Exception:
            return None

    def _on_event(self, ev: Event) -> None:
        self.events.append(ev)
        self.progress.update(ev)
        self.meter.update(ev)
        self.aggregate.fold(ev)

    # ---- rendering -----------------------------------------------------------------------
    def _render(self, force_plot: bool = False, final: bool = False) -> None:
        p = self.progress
        total = p.total_steps or max(1, (p.step or 0) + 1)
        done_steps = (p.step + 1) if p.step is not None else 0
        self.bar.max = max(1, total)
        self.bar.value = min(done_steps, self.bar.max)
        self.bar.bar_style = {"completed": "success", "failed": "danger", "cancelled": "warning"}.get(self.state, "info")
        self.bar_label.value = f"{done_steps}/{total}" + (f" · {p.steps_per_s:.2f} steps/s" if p.steps_per_s else "")
        loss = f"{p.loss:.4g}" if isinstance(p.loss, (int, float)) else "–"
        state = html.escape(self.state) + (" (monitor stopped)" if final else "")
        err = f" <span style='color:#d32f2f'>{html.escape(self.error)}</span>" if self.error else ""
        excluded = ", ".join(str(x["node"]) for x in p.excluded_nodes)
        excluded = f" · excluded <span class='hp-excluded'>{html.escape(excluded)}</span>" if excluded else ""
        nodes = self.aggregate.nodes_line()
        nodes = f"<div class='hp-nodes'>{html.escape(nodes)}</div>" if nodes else ""
        self.header.value = (f"<b>{html.escape(self.job_id)}</b> · state <b>{state}</b> · loss {loss} · "
                             f"faults {p.faults} · recoveries {p.recoveries}{excluded}{err}{nodes}")
        now = time.monotonic()
        if force_plot or now - self._last_plot >= self.plot_interval_s:
            self._last_plot, self._plot_pending = now, False
            self._draw_plot()
            self.timeline.value = timeline_html(aggregate=self.aggregate)
            self.goodput.value = goodput_html(self.meter)
        else:
            self._plot_pending = True
        self.table.value = events_table(self.events[-self.table_rows:])

    def _draw_plot(self) -> None:
        """Redraw the loss plot from the aggregate's series when it changed since the last
        drawing (a PNG costs ~0.1 s; matplotlib is imported at the first one)."""
        series = self.aggregate.series(self.plot_points)
        if not series["points"]:
            self.plot_status.value = "<div class='hp-plot-status' style='color:gray'>loss: waiting for the first step</div>"
            return
        losses = [v for v in series["loss"] if v is not None]
        key = (tuple(series["step"]), tuple(series["loss"]), tuple(series["steps_per_s"]))  # what the PNG shows
        last = next(((st, v) for st, v in zip(reversed(series["step"]), reversed(series["loss"])) if v is not None), None)
        text = (f"loss {last[1]:.4g} at step {last[0]}" if last else
                "loss: the steps arrived without a finite loss (NaN or inf is reported as null)")
        self.plot_status.value = (f"<div class='hp-plot-status' data-points='{series['points']}'>{html.escape(text)} · "
                                  f"{series['points']} points, steps {series['step'][0]}-{series['step'][-1]}</div>")
        if key == self._plotted:
            return
        png = loss_png(series)
        self.plot_series, self.plot_png, self._plotted = series, png, key
        self.plot.value = png
        self.plot.layout.display = None if losses or any(v is not None for v in series["steps_per_s"]) else "none"


def loss_png(series: dict[str, Any], width_px: int = 520, height_px: int = 240, dpi: int = 100) -> bytes:
    """A PNG (bytes) of a :meth:`JobAggregate.series <hyperpod_lab.fold.aggregate.JobAggregate.series>`
    dict: loss by step (top) and, when any rate is known, steps/s by step (a small plot below,
    same x axis), drawn with matplotlib's object API (``matplotlib.figure.Figure``, Agg;
    pyplot's global state is never touched, so it is safe from the monitor's thread). Null
    losses/rates are gaps.

    Args:
        series: ``{"step": [int], "loss": [float|None], "steps_per_s": [float|None], ...}``.
        width_px, height_px: image size in pixels; dpi: dots per inch.
    """
    from matplotlib.figure import Figure  # ~0.5-2 s the first time: only when there is a plot to draw

    nan = float("nan")
    steps = series["step"]
    loss = [nan if v is None else v for v in series["loss"]]
    rates = [nan if v is None else v for v in series["steps_per_s"]]
    has_rates = any(v == v for v in rates)
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    if has_rates:
        ax, ax2 = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    else:
        ax, ax2 = fig.add_subplot(), None
    marker = "." if len(steps) <= 50 else None
    ax.plot(steps, loss, color="#1565c0", linewidth=1.3, marker=marker)
    ax.set_ylabel("loss")
    ax.grid(True, alpha=0.3)
    if ax2 is not None:
        ax2.plot(steps, rates, color="#ef6c00", linewidth=0.8, marker=marker)
        ax2.set_ylabel("steps/s", fontsize=8)
        ax2.tick_params(labelsize=7)
        ax2.grid(True, alpha=0.3)
    (ax2 or ax).set_xlabel("step")
    fig.tight_layout(pad=0.4, h_pad=0.2)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


#: the goodput breakdown's parts as the monitor names them (``lost_s`` keys of the measurement)
LOST_LABELS = {"health_check": "pre-flight health checks", "checkpoint": "checkpoint stalls",
               "hang": "hung before detection", "detect": "failure detection", "restart": "restart",
               "restore": "checkpoint restore", "recompute": "recomputed steps", "straggle": "waiting for stragglers",
               "other": "other"}


def goodput_html(meter) -> str:
    """One line: the measured goodput and the parts of the wall time lost (each above 0, in the
    order of ``hyperpod_lab.goodput.measure.LOST_PARTS``, hang and straggling time included), from
    a :class:`~hyperpod_lab.goodput.GoodputMeter`."""
    from hyperpod_lab.errors import GoodputInputError

    try:
        m = meter.result()
    except GoodputInputError:
        return "<div class='hp-goodput'>goodput: measured after the first steps</div>"
    wall = m["wall_s"]
    if m["goodput"] is None or wall <= 0:
        return "<div class='hp-goodput'>goodput: measured after two steps of one run</div>"
    parts = [f"<span class='hp-lost' data-cause='{k}' data-seconds='{v:.6g}'>{html.escape(LOST_LABELS.get(k, k))} "
             f"{v / wall * 100:.1f} %</span>" for k, v in m["lost_s"].items() if v]
    return (f"<div class='hp-goodput' data-goodput='{m['goodput']:.6g}'>goodput <b>{m['goodput'] * 100:.1f} %</b> of "
            f"{wall:.1f} s wall" + (" · lost: " + ", ".join(parts) if parts else "") + "</div>")



def timeline_html(events: list[Event] | None = None, *, aggregate: JobAggregate | None = None,
                  limit: int = 40) -> str:
    """:meth:`JobAggregate.timeline` as HTML, its newest ``limit`` lines as they come (the Lab's
    dashboard shows the same lines): checkpoint runs per tier (blue, ``data-tier``), faults
    (red), recoveries (green, with downtime), restores, the nodes' pre-flight health checks
    (passed: teal, failed: red), excluded nodes (orange), stragglers, the job's end. Times are
    ``+seconds`` from the first event.

    Args:
        events: fold these into a new aggregate, or
        aggregate: an aggregate already folded.
    """
    if aggregate is None:
        aggregate = JobAggregate()
        for e in events or []:
            aggregate.fold(e)
    if aggregate.t0 is None:
        return ""
    t0 = aggregate.t0
    items = []
    for e in aggregate.timeline()[-limit:]:
        kind, text = e["kind"], e["label"]
        extra = ""
        if kind == "checkpoint":
            color, cls = _TONE_COLORS["checkpoint"], "hp-checkpoint-saved hp-span"
            extra = f" data-tier='{html.escape(str(e.get('tier')))}' data-count='{e.get('count')}'"
        else:
            color, cls = _color(kind, "#555"), "hp-" + kind.replace(".", "-")
            if kind == EventKind.HEALTH_CHECKED.value and e.get("ok") is False:
                color = _HEALTH_CHECKS_FAILED
        items.append(f"<span class='hp-mark {cls}'{extra} style='display:inline-block;"
                     f"margin:2px;padding:1px 6px;border-radius:8px;border:1px solid {color};color:{color}'>"
                     f"+{e['t'] - t0:.1f}s {html.escape(text)}</span>")
    return "<div class='hp-timeline'>" + ("".join(items) or "<i>no checkpoints or faults yet</i>") + "</div>"


def events_table(events: list[Event]) -> str:
    """An HTML table of events (time, kind, writer, data)."""
    rows = []
    for e in events:
        color = _color(e.kind, "inherit")
        data = ", ".join(f"{k}={_short(v)}" for k, v in sorted(e.data.items()) if k != "path")
        rows.append(f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(e.time))}</td>"
                    f"<td style='color:{color}'>{html.escape(e.kind)}</td><td>{html.escape(e.writer)}</td>"
                    f"<td>{html.escape(data)}</td></tr>")
    return ("<table class='hp-events' style='font-size:12px'><tr><th>time</th><th>kind</th><th>writer</th>"
            "<th>data</th></tr>" + "".join(rows) + "</table>")


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    s = str(v)
    return s if len(s) <= 40 else s[:37] + "..."
