/**
 * The dashboard's per-rank swim lanes: one lane per rank plus `job`, spans for runs of steps and
 * of checkpoints per tier, marks for faults, hangs, recoveries, stragglers, health, exclusions
 * and scaling. A time axis (seconds since the job's first event) that zooms and pans by wheel,
 * drag, buttons and keys (+/- zoom, arrows pan, 0 fits). Elements are built once per data set and
 * only repositioned (in one animation frame) when the view changes.
 */
import { IDashboardMark, IDashboardSpan, IJobDashboard } from '../../api/rest';
import { button, fmt, h } from '../dom';

/** Checkpoint tiers in display order (sub-bands of a lane, fastest first). */
const TIERS = ['memory', 'peer', 'replica', 'persistent', 's3'];

/** Zoom factor of one key press / button press. */
const ZOOM_STEP = 1.5;

interface IPlaced {
  el: HTMLElement;
  t0: number;
  t1: number;
}

/** The swim lanes of one job. */
export class SwimLanes {
  /**
   * @param onActivate - a mark was clicked or Enter/Space pressed on it
   */
  constructor(onActivate: (mark: IDashboardMark) => void) {
    this._onActivate = onActivate;
    const zoomIn = button('hp-dash-zoom-in', '+', { title: 'Zoom in (+)', 'aria-label': 'Zoom in' });
    const zoomOut = button('hp-dash-zoom-out', '−', { title: 'Zoom out (-)', 'aria-label': 'Zoom out' });
    const left = button('hp-dash-pan-left', '←', { title: 'Pan left (←)', 'aria-label': 'Pan left' });
    const right = button('hp-dash-pan-right', '→', { title: 'Pan right (→)', 'aria-label': 'Pan right' });
    const fit = button('hp-dash-zoom-fit', 'Fit', { title: 'Show the whole job (0)' });
    zoomIn.addEventListener('click', () => this.zoom(1 / ZOOM_STEP));
    zoomOut.addEventListener('click', () => this.zoom(ZOOM_STEP));
    left.addEventListener('click', () => this.pan(-0.25));
    right.addEventListener('click', () => this.pan(0.25));
    fit.addEventListener('click', () => this.fit());
    this._range = h('span', { class: 'jp-HyperPodDash-range jp-HyperPod-dim', 'data-testid': 'hp-dash-range', 'aria-live': 'polite' });
    this._axis = h('div', { class: 'jp-HyperPodDash-axis', 'aria-hidden': 'true' });
    this._rows = h('div', { class: 'jp-HyperPodDash-laneRows', role: 'list', 'aria-label': 'Lanes: the job and each rank' });
    this.node = h(
      'div',
      {
        class: 'jp-HyperPodDash-lanes',
        'data-testid': 'hp-dash-lanes',
        role: 'group',
        'aria-label': 'Swim lanes. Keys: + and - zoom, left and right arrows pan, 0 fits, up and down move between lanes',
        tabindex: 0
      },
      h('div', { class: 'jp-HyperPodDash-toolbar' }, zoomIn, zoomOut, left, right, fit, this._range),
      this._axis,
      this._rows,
      h('div', { class: 'jp-HyperPodDash-legend jp-HyperPod-dim' },
        ...['step', ...TIERS].map(k => h('span', { class: `jp-HyperPodDash-key jp-mod-${k}` }, k === 'step' ? 'steps' : `${k} checkpoints`)),
        ...['fault', 'hang', 'recovery', 'restore', 'straggler', 'health', 'exclusion', 'scaling'].map(k =>
          h('span', { class: `jp-HyperPodDash-key jp-HyperPodDash-markKey jp-mod-${k}` }, k)))
    );
    this.node.addEventListener('keydown', e => this._onKey(e));
    this._rows.addEventListener('wheel', e => this._onWheel(e), { passive: false });
    this._rows.addEventListener('pointerdown', e => this._onPointerDown(e));
  }

  /** The element to add to a page. */
  readonly node: HTMLDivElement;

  /** The visible time range, seconds since the epoch. */
  get view(): [number, number] {
    return [this._v0, this._v1];
  }

  /** Lanes' elements repositioned so far (tests, benchmarks). */
  get layouts(): number {
    return this._layouts;
  }

  /**
   * Show a (new) dashboard answer. The view is kept when the user zoomed or panned; otherwise it
   * follows the job's whole range.
   */
  setData(d: IJobDashboard): void {
    const first = this._data === null;
    this._data = d;
    const t0 = d.t0 ?? 0;
    const t1 = Math.max(d.t1 ?? t0, t0 + 1);
    this._full = [t0, t1];
    if (first || !this._zoomed) {
      this._v0 = t0;
      this._v1 = t1;
    }
    this._build();
    this._layout();
  }

  /** Zoom by `factor` (< 1 zooms in) around `center` (0..1 of the visible width). */
  zoom(factor: number, center = 0.5): void {
    const w = this._v1 - this._v0;
    const full = this._full[1] - this._full[0];
    const nw = Math.min(full, Math.max(full * 1e-6, 0.01, w * factor));
    const at = this._v0 + w * center;
    this._setView(at - nw * center, at - nw * center + nw);
  }

  /** Pan by `fraction` of the visible width (negative: earlier). */
  pan(fraction: number): void {
    const w = this._v1 - this._v0;
    this._setView(this._v0 + w * fraction, this._v1 + w * fraction);
  }

  /** Show the whole job. */
  fit(): void {
    this._zoomed = false;
    this._v0 = this._full[0];
    this._v1 = this._full[1];
    this._schedule();
  }

  private _setView(v0: number, v1: number): void {
    const [f0, f1] = this._full;
    const w = v1 - v0;
    if (v0 < f0) {
      v0 = f0;
      v1 = f0 + w;
    }
    if (v1 > f1) {
      v1 = f1;
      v0 = Math.max(f0, f1 - w);
    }
    this._v0 = v0;
    this._v1 = v1;
    this._zoomed = v0 > f0 || v1 < f1;
    this._schedule();
  }

  private _schedule(): void {
    if (this._frame === 0) {
      this._frame = requestAnimationFrame(() => {
        this._frame = 0;
        this._layout();
      });
    }
  }

  private _build(): void {
    const d = this._data!;
    const focusedLane = (document.activeElement as HTMLElement | null)?.closest?.('[data-lane]')?.getAttribute('data-lane');
    this._rows.textContent = '';
    this._placed = [];
    const lanes = ['job', ...d.nodes].filter((l, i, a) => a.indexOf(l) === i);
    for (const l of Object.keys(d.lanes)) {
      if (!lanes.includes(l)) {
        lanes.push(l);
      }
    }
    for (const lane of lanes) {
      const ln = d.lanes[lane] ?? { spans: [], marks: [] };
      const track = h('div', { class: 'jp-HyperPodDash-track' });
      for (const s of ln.spans) {
        track.appendChild(this._span(lane, s));
      }
      for (const m of ln.marks) {
        track.appendChild(this._mark(m));
      }
      const name = lane === 'job' ? 'Job' : `Rank ${lane}`;
      const faults = ln.marks.filter(m => m.cat === 'fault' || m.cat === 'hang').length;
      const row = h(
        'div',
        {
          class: 'jp-HyperPodDash-lane',
          role: 'listitem',
          tabindex: -1,
          'data-testid': 'hp-dash-lane',
          'data-lane': lane,
          'aria-label': `${name}: ${ln.spans.length} runs, ${ln.marks.length} marks${faults ? `, ${faults} faults` : ''}`
        },
        h('div', { class: 'jp-HyperPodDash-laneLabel' }, name),
        track
      );
      this._rows.appendChild(row);
      if (lane === focusedLane) {
        row.focus();
      }
    }
  }

  private _span(lane: string, s: IDashboardSpan): HTMLElement {
    const tier = s.tier ?? '';
    const band = s.kind === 'step' ? 0 : 1 + Math.max(0, TIERS.indexOf(tier) === -1 ? TIERS.length : TIERS.indexOf(tier));
    const steps = s.step0 === s.step1 ? `step ${s.step0}` : `steps ${s.step0}-${s.step1}`;
    const label = s.kind === 'step' ? `${steps} (${s.count} step events)` : `${tier} checkpoints ${steps} (x${s.count})`;
    const el = h('div', {
      class: `jp-HyperPodDash-span jp-mod-${s.kind === 'step' ? 'step' : tier}`,
      'data-kind': s.kind,
      'data-tier': tier || null,
      'data-step0': s.step0,
      'data-step1': s.step1,
      'data-count': s.count,
      'data-lane': lane,
      title: `${lane === 'job' ? 'job' : `rank ${lane}`}: ${label}`,
      style: `top: ${band === 0 ? 2 : 10 + (band - 1) * 5}px`
    });
    this._placed.push({ el, t0: s.t0, t1: s.t1 });
    return el;
  }

  private _mark(m: IDashboardMark): HTMLElement {
    const rel = this._data ? m.t - (this._data.t0 ?? m.t) : 0;
    const el = h('button', {
      type: 'button',
      // a fault another rank's caused (root_cause false) is drawn fainter than the root cause
      class: `jp-HyperPodDash-mark jp-mod-${m.cat}${m.root_cause === false ? ' jp-mod-secondary' : ''}`,
      'data-testid': 'hp-dash-mark',
      'data-kind': m.kind,
      'data-cat': m.cat,
      'data-rank': m.rank ?? '',
      'data-t': m.t,
      'aria-label': `${m.label} at ${fmt(rel)} s`,
      title: `${m.label} (at ${fmt(rel)} s)`
    });
    el.addEventListener('click', () => this._onActivate(m));
    this._placed.push({ el, t0: m.t, t1: m.t });
    return el;
  }

  private _layout(): void {
    this._layouts += 1;
    const v0 = this._v0;
    const w = Math.max(1e-9, this._v1 - this._v0);
    for (const p of this._placed) {
      const a = (p.t0 - v0) / w;
      const b = (p.t1 - v0) / w;
      const hidden = b < -0.01 || a > 1.01;
      if (hidden) {
        p.el.style.display = 'none';
        continue;
      }
      p.el.style.display = '';
      p.el.style.left = `${(Math.max(-0.01, a) * 100).toFixed(3)}%`;
      if (p.t1 > p.t0 || p.el.classList.contains('jp-HyperPodDash-span')) {
        p.el.style.width = `max(2px, ${((Math.min(1.01, b) - Math.max(-0.01, a)) * 100).toFixed(3)}%)`;
      }
    }
    const base = this._full[0];
    const r0 = v0 - base;
    const r1 = this._v1 - base;
    this._range.textContent = `${fmt(r0)} s – ${fmt(r1)} s of ${fmt(this._full[1] - base)} s`;
    this._range.setAttribute('data-t0', String(r0));
    this._range.setAttribute('data-t1', String(r1));
    this.node.setAttribute('data-view', `${r0.toFixed(3)} ${r1.toFixed(3)}`);
    // the axis: about six round ticks
    const raw = w / 6;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const tick = [1, 2, 5, 10].map(x => x * mag).find(x => x >= raw) ?? raw;
    this._axis.textContent = '';
    for (let t = Math.ceil(r0 / tick) * tick; t <= r1; t += tick) {
      this._axis.appendChild(
        h('span', { class: 'jp-HyperPodDash-tick', style: `left: calc(var(--hp-dash-label-width) + (100% - var(--hp-dash-label-width)) * ${((t - r0) / w).toFixed(4)})` }, `${fmt(t)} s`)
      );
    }
  }

  private _onKey(e: KeyboardEvent): void {
    const target = e.target as HTMLElement;
    if (target.tagName === 'INPUT') {
      return;
    }
    let handled = true;
    switch (e.key) {
      case '+':
      case '=':
        this.zoom(1 / ZOOM_STEP);
        break;
      case '-':
      case '_':
        this.zoom(ZOOM_STEP);
        break;
      case 'ArrowLeft':
        this.pan(-0.1);
        break;
      case 'ArrowRight':
        this.pan(0.1);
        break;
      case '0':
        this.fit();
        break;
      case 'ArrowDown':
      case 'ArrowUp': {
        const rows = Array.from(this._rows.querySelectorAll<HTMLElement>('[data-lane].jp-HyperPodDash-lane'));
        const current = target.closest('.jp-HyperPodDash-lane') as HTMLElement | null;
        const i = current ? rows.indexOf(current) : -1;
        const next = rows[Math.max(0, Math.min(rows.length - 1, i + (e.key === 'ArrowDown' ? 1 : -1)))];
        next?.focus();
        break;
      }
      default:
        handled = false;
    }
    if (handled) {
      e.preventDefault();
      e.stopPropagation();
    }
  }

  private _onWheel(e: WheelEvent): void {
    const track = (e.target as HTMLElement).closest('.jp-HyperPodDash-lane')?.querySelector('.jp-HyperPodDash-track') as HTMLElement | null;
    const rect = (track ?? this._rows).getBoundingClientRect();
    const center = Math.min(1, Math.max(0, (e.clientX - rect.left) / Math.max(1, rect.width)));
    e.preventDefault();
    if (e.shiftKey || Math.abs(e.deltaX) > Math.abs(e.deltaY)) {
      this.pan((e.shiftKey ? e.deltaY : e.deltaX) / Math.max(1, rect.width));
    } else {
      this.zoom(Math.exp(e.deltaY * 0.002), center);
    }
  }

  private _onPointerDown(e: PointerEvent): void {
    if ((e.target as HTMLElement).closest('button') || e.button !== 0) {
      return;
    }
    const track = this._rows.querySelector('.jp-HyperPodDash-track') as HTMLElement | null;
    const width = Math.max(1, (track ?? this._rows).getBoundingClientRect().width);
    let last = e.clientX;
    const move = (ev: PointerEvent) => {
      const dx = ev.clientX - last;
      last = ev.clientX;
      if (dx !== 0) {
        this.pan(-dx / width);
      }
    };
    const up = () => {
      window.removeEventListener('pointermove', move);
      window.removeEventListener('pointerup', up);
      this._rows.classList.remove('jp-mod-dragging');
    };
    this._rows.classList.add('jp-mod-dragging');
    window.addEventListener('pointermove', move);
    window.addEventListener('pointerup', up);
  }

  private _onActivate: (mark: IDashboardMark) => void;
  private _data: IJobDashboard | null = null;
  private _full: [number, number] = [0, 1];
  private _v0 = 0;
  private _v1 = 1;
  private _zoomed = false;
  private _frame = 0;
  private _layouts = 0;
  private _placed: IPlaced[] = [];
  private _range: HTMLSpanElement;
  private _axis: HTMLDivElement;
  private _rows: HTMLDivElement;
}
