/** The selected job: state, controls, live timeline, loss chart and per-rank logs. */
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { describeEvent, healthFailed, plural } from '../format';
import { IJobEvent } from '../api/events';
import { IJobProgress, IMeasuredGoodput, isTerminal } from '../api/rest';
import { IHyperPodModel } from '../models/tokens';
import { button, captionedTable, clock, duration, fmt, h, labelledList, liveBox, percent, uid } from './dom';
import { renderLossChart } from './lossChart';

/** Where a job's wall time went, in display order: `lost_s` key (or `useful`) and label. */
const TIME_PARTS: [string, string][] = [
  ['useful', 'Useful steps'],
  ['health_check', 'Pre-flight health checks'],
  ['checkpoint', 'Checkpoint stalls'],
  ['hang', 'Hung before detection'],
  ['detect', 'Failure detection'],
  ['restart', 'Restart'],
  ['restore', 'Checkpoint restore'],
  ['recompute', 'Recomputed steps'],
  ['straggle', 'Waiting for stragglers'],
  ['other', 'Other (start-up, rounding)']
];

/**
 * Parts shown only when the job spent time on them (jobs without health checks, hangs or
 * stragglers show no row). hang: a hung rank's stall before the watchdog detected it (the
 * `fault.detected` {reason: hang} `stalled_s`); straggle: steps slowed by a flagged straggler
 * (its `compute_s - median_compute_s` per step while flagged), taken from the steps' time.
 */
const OPTIONAL_PARTS = new Set(['health_check', 'hang', 'straggle']);

/** Colours of the parts the stylesheet does not colour. */
const PART_COLORS: { [key: string]: string } = {
  health_check: 'var(--jp-brand-color1)',
  hang: 'var(--jp-error-color0)',
  straggle: 'var(--jp-warn-color0)'
};

/**
 * `n2 (faulted twice), n3 (health check failed: shm)`: the nodes the job excluded as the server
 * folded them, or '' when none.
 */
export function excludedSummary(p: IJobProgress | undefined): string {
  return (p?.excluded_nodes ?? [])
    .map(x => (x.reason ? `${x.node} (${x.reason})` : x.node))
    .join(', ');
}

/**
 * `rank 3 on n2 (2.0x)`: the ranks flagged as stragglers now, as the server folded them, or ''.
 */
export function stragglerSummary(p: IJobProgress | undefined): string {
  return (p?.stragglers ?? [])
    .map(x => `rank ${x.rank} on ${x.node ?? '?'}${typeof x.score === 'number' ? ` (${x.score.toFixed(1)}x)` : ''}`)
    .join(', ');
}

/**
 * `health checks: 3 nodes passed, 1 failed (n2: shm)`: the nodes' newest pre-flight results, or
 * '' before any.
 */
export function healthSummary(p: IJobProgress | undefined): string {
  const nodes = Object.entries(p?.health ?? {});
  if (nodes.length === 0) {
    return '';
  }
  const failed = nodes.filter(([, r]) => !r.ok);
  const passed = nodes.length - failed.length;
  const which = failed.map(([n, r]) => `${n}: ${Object.keys(r.failed).join(', ') || 'failed'}`).join('; ');
  return (
    `health checks: ${plural(passed, 'node')} passed` +
    (failed.length ? `, ${failed.length} failed (${which})` : '')
  );
}

/**
 * `2 faults, 1 recovery, 14.2 s down`: the job's fault facts as the server folded them, or ''
 * before the first fault.
 */
export function faultSummary(p: IJobProgress | undefined): string {
  if (!p || !(p.faults || p.recoveries)) {
    return '';
  }
  const down = typeof p.downtime_s === 'number' && p.downtime_s > 0 ? `, ${duration(p.downtime_s)} down` : '';
  return `${plural(p.faults, 'fault')}, ${plural(p.recoveries, 'recovery', 'recoveries')}${down}`;
}

/** Timeline items kept in the DOM (the oldest are dropped). */
const MAX_TIMELINE = 400;

/** CSS modifier of a timeline item by its event (kind, and whether a health check failed). */
function kindClass(ev: IJobEvent): string {
  const kind = ev.kind;
  if (kind === 'fault.detected' || kind === 'checkpoint.corrupt' || kind === 'checkpoint.failed' || kind === 'job.failed') {
    return 'jp-mod-fault';
  }
  if (kind === 'health.failed' || (kind === 'health.checked' && healthFailed(ev))) {
    return 'jp-mod-fault jp-mod-health';
  }
  if (kind === 'health.checked') {
    return 'jp-mod-lifecycle jp-mod-health';
  }
  if (kind === 'straggler.detected') {
    return 'jp-mod-recovering jp-mod-straggler';
  }
  if (kind === 'node.excluded') {
    return 'jp-mod-recovering jp-mod-excluded';
  }
  if (kind === 'recovery.completed') {
    return 'jp-mod-recovery';
  }
  if (kind === 'recovery.started') {
    return 'jp-mod-recovering';
  }
  if (kind.startsWith('checkpoint.')) {
    return 'jp-mod-checkpoint';
  }
  if (kind === 'elastic.scaled') {
    return 'jp-mod-scaled';
  }
  return 'jp-mod-lifecycle';
}

/**
 * Render a job's measured goodput into `box`: the value, a stacked bar of where the wall time
 * went and its table (`hp-goodput-value`, `hp-goodput-bar`, `hp-goodput-lost`); while `m` is
 * null, why (`error`) or that it comes after the first steps. Used by the job view and the
 * job dashboard.
 */
export function renderGoodput(box: HTMLElement, m: IMeasuredGoodput | null, error: string | null): void {
  box.textContent = '';
  if (!m) {
    const why = error;
    box.appendChild(
      h(
        'div',
        { class: 'jp-HyperPod-dim', 'data-testid': 'hp-goodput-pending' },
        why ? `Not measured yet: ${why}` : 'Measured after the first steps.'
      )
    );
    return;
  }
  const recoveries = plural(m.faults, 'recovery', 'recoveries');
  box.appendChild(
    h(
      'div',
      { class: 'jp-HyperPod-goodputValue' },
      'Measured goodput ',
      h(
        'strong',
        { 'data-testid': 'hp-goodput-value', 'data-goodput': m.goodput ?? '' },
        percent(m.goodput)
      ),
      h(
        'span',
        { class: 'jp-HyperPod-dim' },
        ` of ${duration(m.wall_s)} wall · ${m.steps} steps` +
          `${m.step_time_s !== null ? ` of ${fmt(m.step_time_s)} s` : ''} · ${recoveries}`
      )
    )
  );
  const wall = m.wall_s > 0 ? m.wall_s : null;
  const parts = TIME_PARTS.map(([key, label]) => {
    const s = key === 'useful' ? m.useful_s : m.lost_s[key];
    return { key, label, s: s ?? null };
  }).filter(p => !OPTIONAL_PARTS.has(p.key) || (p.s !== null && p.s > 0));
  const bar = h('div', {
    class: 'jp-HyperPod-timeBar',
    role: 'img',
    'data-testid': 'hp-goodput-bar',
    'aria-label':
      'Wall time: ' +
      parts
        .filter(p => p.s !== null && wall)
        .map(p => `${p.label} ${percent(p.s! / wall!)}`)
        .join(', ')
  });
  const body = h('tbody');
  for (const p of parts) {
    const frac = p.s !== null && wall ? p.s / wall : null;
    if (frac !== null && frac > 0) {
      bar.appendChild(
        h('span', {
          class: `jp-HyperPod-timePart jp-mod-${p.key}`,
          style:
            `width: ${Math.min(100, frac * 100).toFixed(2)}%` +
            (PART_COLORS[p.key] ? `; background: ${PART_COLORS[p.key]}` : ''),
          title: `${p.label}: ${duration(p.s)}`
        })
      );
    }
    body.appendChild(
      h(
        'tr',
        { 'data-cause': p.key, 'data-seconds': p.s ?? '' },
        h(
          'th',
          { scope: 'row' },
          h('span', {
            class: `jp-HyperPod-swatch jp-mod-${p.key}`,
            style: PART_COLORS[p.key] ? `background: ${PART_COLORS[p.key]}` : null
          }),
          p.label
        ),
        h('td', { class: 'jp-mod-number' }, p.s === null ? '—' : `${fmt(p.s)} s`),
        h('td', { class: 'jp-mod-number' }, percent(frac))
      )
    );
  }
  box.append(
    bar,
    captionedTable('hp-goodput-lost', 'Where the wall time went', ['Part', 'Time', 'Of wall'], body)
  );
}

/**
 * The job view. Renders `model.selected`, the stream's events and the measured goodput; its
 * buttons call the model and report failures through `onError`.
 */
export class JobView extends Widget {
  /**
   * @param _model - the panel state
   * @param _onError - shows a failed action to the user
   */
  constructor(
    private readonly _model: IHyperPodModel,
    private readonly _onError: (action: string, error: Error) => void
  ) {
    super();
    this.addClass('jp-HyperPod-jobView');
    this.node.setAttribute('data-testid', 'hp-job-view');
    this._model.selectionChanged.connect(this._rebuild, this);
    this._model.stream.eventsAdded.connect(this._onEvents, this);
    this._model.jobs.changed.connect(this._renderHeader, this);
    this._model.measured.changed.connect(this._renderGoodput, this);
    this._rebuild();
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    Signal.disconnectReceiver(this); // the model's signals connected in the constructor
    super.dispose();
  }

  /** The rank the "Inject failure" button kills. */
  get faultRank(): number {
    const n = Number(this._rankInput?.value ?? '1');
    return Number.isInteger(n) && n >= 0 ? n : 1;
  }

  private _onEvents(_: unknown, events: IJobEvent[]): void {
    this._append(events);
  }

  private _rebuild(): void {
    this.node.textContent = '';
    this._points = [];
    this._faultSteps = [];
    this._recoverySteps = [];
    this._runs.clear();
    this._lastStep = null;
    const id = this._model.selectedId;
    this.node.hidden = id === null;
    if (id === null) {
      return;
    }
    this._header = h('div', { class: 'jp-HyperPod-jobHeader' });
    this._status = h('span', { class: 'jp-HyperPod-state', 'data-testid': 'hp-job-status' });
    this._progress = h('div', { class: 'jp-HyperPod-progress', 'data-testid': 'hp-job-progress' });
    this._nodes = h('div', { class: 'jp-HyperPod-dim jp-HyperPod-jobNodes', 'data-testid': 'hp-job-nodes' });
    this._header.append(
      h('div', { class: 'jp-HyperPod-jobTitle' }, h('span', { 'data-testid': 'hp-job-id' }, id), ' ', this._status),
      this._progress,
      this._nodes
    );

    const rankId = uid('hp-rank');
    this._rankInput = h('input', {
      id: rankId,
      type: 'number',
      min: 0,
      step: 1,
      value: 1,
      class: 'jp-HyperPod-rank',
      'data-testid': 'hp-fault-rank'
    });
    this._rankInput.value = '1';
    this._cancel = button('hp-cancel', 'Cancel');
    this._inject = button('hp-inject', 'Inject failure', { class: 'jp-HyperPod-button jp-mod-warn' });
    this._cancel.addEventListener('click', () => {
      this._model.cancelSelected().catch(e => this._onError('Cancel', e));
    });
    this._inject.addEventListener('click', () => {
      const rank = this.faultRank;
      this._inject.disabled = true;
      this._model
        .injectFailure(rank)
        .catch(e => this._onError('Inject failure', e))
        .finally(() => this._renderHeader());
    });
    const controls = h(
      'div',
      { class: 'jp-HyperPod-controls' },
      this._cancel,
      h('label', { for: rankId }, 'rank'),
      this._rankInput,
      this._inject
    );

    this._last = h('div', { class: 'jp-HyperPod-lastEvent', 'data-testid': 'hp-last-event' }, 'waiting for events…');
    this._chart = h('div', { class: 'jp-HyperPod-chart' }, renderLossChart([]));
    this._goodput = liveBox('jp-HyperPod-goodput', 'hp-goodput');
    this._timeline = labelledList('ol', 'jp-HyperPod-timeline', 'hp-timeline', 'Job timeline', {
      'aria-live': 'polite'
    });

    const logRankId = uid('hp-log-rank');
    const logRank = h('input', { id: logRankId, type: 'number', min: 0, step: 1, placeholder: 'all', 'data-testid': 'hp-log-rank' });
    const logs = h('pre', { class: 'jp-HyperPod-logs', 'data-testid': 'hp-logs', tabindex: 0 });
    const loadLogs = button('hp-load-logs', 'Show logs', { type: 'submit' });
    const logForm = h('form', { class: 'jp-HyperPod-logForm', 'aria-label': 'Logs' },
      h('label', { for: logRankId }, 'Logs of rank'), logRank, loadLogs);
    logForm.addEventListener('submit', ev => {
      ev.preventDefault();
      const rank = logRank.value.trim() === '' ? null : Number(logRank.value);
      logs.textContent = 'loading…';
      this._model
        .logs(rank)
        .then(text => {
          logs.textContent = text || '(empty)';
        })
        .catch(e => {
          logs.textContent = '';
          this._onError('Logs', e);
        });
    });

    this.node.append(
      this._header,
      controls,
      this._last,
      h('h4', { class: 'jp-HyperPod-subheading' }, 'Loss'),
      this._chart,
      h('h4', { class: 'jp-HyperPod-subheading' }, 'Goodput'),
      this._goodput,
      h('h4', { class: 'jp-HyperPod-subheading' }, 'Timeline'),
      this._timeline,
      h('h4', { class: 'jp-HyperPod-subheading' }, 'Logs'),
      logForm,
      logs
    );
    this._renderHeader();
    this._renderGoodput();
    this._append(this._model.stream.events);
  }

  /** Measured goodput and where the wall time went (see `renderGoodput`). */
  private _renderGoodput(): void {
    if (this._goodput) {
      renderGoodput(this._goodput, this._model.measured.measured, this._model.measured.error);
    }
  }

  private _renderHeader(): void {
    const job = this._model.selected;
    if (!job || !this._status) {
      return;
    }
    this._status.textContent = job.status;
    this._status.className = `jp-HyperPod-state jp-mod-${job.status}`;
    this._status.setAttribute('data-state', job.status);
    const p = job.progress;
    const spec = job.spec;
    const parts = [
      `${job.cluster}`,
      `${spec?.nodes ?? '?'}×${spec?.procs_per_node ?? '?'} ranks`
    ];
    const step = this._lastStep ?? p?.step ?? null;
    if (step !== null) {
      parts.push(`step ${step + 1}${p?.total_steps ? `/${p.total_steps}` : ''}`);
    }
    if (p?.steps_per_s) {
      parts.push(`${fmt(p.steps_per_s)} steps/s`);
    }
    const faults = faultSummary(p);
    if (faults) {
      parts.push(faults);
    }
    this._progress.textContent = parts.join(' · ');
    const excluded = excludedSummary(p);
    const health = healthSummary(p);
    const stragglers = stragglerSummary(p);
    const lines = [excluded ? `excluded nodes: ${excluded}` : '', stragglers ? `stragglers: ${stragglers}` : '', health].filter(
      x => x
    );
    this._nodes.textContent = lines.join(' · ');
    this._nodes.hidden = lines.length === 0;
    this._nodes.setAttribute('data-excluded-nodes', (p?.excluded_nodes ?? []).map(x => x.node).join(' '));
    this._nodes.setAttribute('data-stragglers', (p?.stragglers ?? []).map(x => String(x.rank)).join(' '));
    const terminal = isTerminal(job.status);
    this._cancel.disabled = terminal;
    this._inject.disabled = job.status !== 'running';
  }

  private _append(events: IJobEvent[]): void {
    if (!this._timeline || events.length === 0) {
      return;
    }
    let chartDirty = false;
    const tl = this._timeline;
    const follow = tl.scrollHeight - tl.scrollTop - tl.clientHeight < 24;
    for (const ev of events) {
      const d = ev.data;
      if (ev.kind === 'step' && typeof d.step === 'number' && typeof d.loss === 'number') {
        this._points.push([d.step, d.loss]);
        this._lastStep = d.step;
        chartDirty = true;
      } else {
        this._addTimelineItem(ev);
        if (ev.kind === 'fault.detected' && this._lastStep !== null) {
          this._faultSteps.push(this._lastStep);
          chartDirty = true;
        } else if (ev.kind === 'recovery.completed' && typeof d.restored_step === 'number') {
          this._recoverySteps.push(d.restored_step);
          chartDirty = true;
        }
      }
    }
    if (follow) {
      tl.scrollTop = tl.scrollHeight; // keep the newest in view unless the user scrolled up
    }
    const last = events[events.length - 1];
    this._last.textContent = `last event ${clock(last.time)}: ${describeEvent(last)}`;
    this._last.setAttribute('data-kind', last.kind);
    this._last.setAttribute('data-writer', last.writer);
    this._last.setAttribute('data-seq', String(last.seq));
    this._last.setAttribute('data-time', String(last.time));
    // one attribute per event, for observers (benchmarks/event_latency.py)
    this._last.setAttribute('data-key', `${last.writer}:${last.seq}`);
    if (chartDirty && this._chartFrame === 0) {
      this._chartFrame = requestAnimationFrame(() => {
        this._chartFrame = 0;
        this._chart.replaceChildren(
          renderLossChart(this._points, this._faultSteps, this._recoverySteps)
        );
      });
    }
    this._renderHeader();
  }

  private _addTimelineItem(ev: IJobEvent): void {
    const d = ev.data;
    if (ev.kind === 'checkpoint.saved' || ev.kind === 'checkpoint.restored') {
      // per-rank checkpoint events of a tier, with nothing else in between, make one item:
      // "checkpoints 0–12 saved to memory (2 writers)"
      const key = `${ev.kind}:${d.tier}`;
      const run = this._runs.get(key);
      if (run && typeof d.step === 'number') {
        run.writers.add(ev.writer);
        run.first = Math.min(run.first, d.step);
        run.last = Math.max(run.last, d.step);
        const steps = run.first === run.last ? `step ${run.last}` : `steps ${run.first}–${run.last}`;
        const verb = ev.kind === 'checkpoint.saved' ? 'saved to' : 'restored from';
        run.li.setAttribute('data-step', String(run.last));
        run.li.lastElementChild!.textContent =
          `checkpoint ${steps} ${verb} ${d.tier} (${run.writers.size} writer${run.writers.size === 1 ? '' : 's'})`;
        return;
      }
      const li = this._timelineItem(ev);
      if (typeof d.step === 'number') {
        this._runs.set(key, { li, writers: new Set([ev.writer]), first: d.step, last: d.step });
      }
      return;
    }
    this._runs.clear(); // something else happened: later checkpoints start new items
    this._timelineItem(ev);
  }

  private _timelineItem(ev: IJobEvent): HTMLLIElement {
    const d = ev.data;
    const li = h(
      'li',
      {
        class: `jp-HyperPod-event ${kindClass(ev)}`,
        'data-kind': ev.kind,
        'data-writer': ev.writer,
        'data-seq': ev.seq,
        'data-step': typeof d.step === 'number' ? d.step : null,
        'data-downtime': ev.kind === 'recovery.completed' ? String(d.downtime_s) : null
      },
      h('time', { class: 'jp-HyperPod-eventTime' }, clock(ev.time)),
      h('span', { class: 'jp-HyperPod-eventText' }, describeEvent(ev))
    );
    this._timeline.appendChild(li);
    while (this._timeline.childElementCount > MAX_TIMELINE) {
      this._timeline.firstElementChild!.remove();
    }
    return li;
  }

  private _header!: HTMLDivElement;
  private _status!: HTMLSpanElement;
  private _progress!: HTMLDivElement;
  private _nodes!: HTMLDivElement;
  private _rankInput!: HTMLInputElement;
  private _cancel!: HTMLButtonElement;
  private _inject!: HTMLButtonElement;
  private _last!: HTMLDivElement;
  private _chart!: HTMLDivElement;
  private _goodput!: HTMLDivElement;
  private _timeline!: HTMLOListElement;
  private _chartFrame = 0;
  private _points: [number, number][] = [];
  private _faultSteps: number[] = [];
  private _recoverySteps: number[] = [];
  private _lastStep: number | null = null;
  private _runs = new Map<
    string,
    { li: HTMLLIElement; writers: Set<string>; first: number; last: number }
  >();
}
