/**
 * The dashboard's swim lanes: `job` and one lane per node (its ranks' spans and marks merged by
 * the server), spans for runs of steps and of checkpoints per tier, marks for faults, hangs,
 * recoveries, stragglers, health, exclusions and scaling. A node's lane expands to its ranks'
 * own lanes (asked of the server for that one node). A time axis (seconds since the job's first
 * event) that zooms and pans by wheel, drag, buttons and keys (+/- zoom, arrows pan, 0 fits).
 *
 * Virtualised (issue 27): the lanes scroll in a viewport of fixed-height rows and only the rows
 * in view (plus `OVERSCAN` on each side) are in the DOM, so a job of 256 nodes has about 20 lane
 * elements, not 257. A row's elements are built when it scrolls into view and only
 * repositioned (in one animation frame) when the time view changes.
 */
import { IDashboardLane, IDashboardMark, IDashboardSpan, IJobDashboard } from '../../api/rest';
import { button, fmt, h } from '../dom';

/** Checkpoint tiers in display order (sub-bands of a lane, fastest first). */
const TIERS = ['memory', 'peer', 'replica', 'persistent', 's3'];

/** Zoom factor of one key press / button press. */
const ZOOM_STEP = 1.5;

/** A lane's height, px (as `.jp-HyperPodDash-lane` in style/dashboard.css). */
export const ROW_PX = 40;
/** Rows built above and below the ones in view. */
export const OVERSCAN = 4;

interface IPlaced {
  el: HTMLElement;
  t0: number;
  t1: number;
}

/** One row of the lanes: the job's, a node's, or (expanded) one of its ranks'. */
interface IRow {
  kind: 'job' | 'node' | 'rank';
  /** `job`, the node's name, or the rank. */
  lane: string;
  /** null: the node's ranks are being read. */
  data: IDashboardLane | null;
  /** The node of a rank row. */
  node?: string;
}

/** A row in the DOM and the elements it placed on the time axis. */
interface IBuilt {
  row: HTMLElement;
  placed: IPlaced[];
}

/** The swim lanes of one job. */
export class SwimLanes {
  /**
   * @param onActivate - a mark was clicked or Enter/Space pressed on it
   * @param onExpand - a node's lane was opened (its name) or closed (null): read the dashboard
   *   again with that node's ranks (`?node=`), then `setData`
   */
  constructor(onActivate: (mark: IDashboardMark) => void, onExpand: (node: string | null) => void = () => undefined) {
    this._onActivate = onActivate;
    this._onExpand = onExpand;
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
    this._spacer = h('div', { class: 'jp-HyperPodDash-laneSpacer' });
    this._rows = h('div', { class: 'jp-HyperPodDash-laneRows', 'data-testid': 'hp-dash-lane-rows', role: 'list', 'aria-label': 'Lanes: the job and each node (a node opens to its ranks)' }, this._spacer);
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
    this._rows.addEventListener('scroll', () => this._scheduleRows(), { passive: true });
  }

  /** The node whose ranks are shown (or asked for), or null. */
  get expanded(): string | null {
    return this._expanded;
  }

  /** Lane rows in the DOM now (tests, benchmarks). */
  get rendered(): number {
    return this._built.size;
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
    this._model();
    this._renderRows(true);
    this._layout();
  }

  /** Open node `node`'s lane to its ranks (null: close it); asks `onExpand` for their lanes. */
  expand(node: string | null): void {
    this._expanded = node;
    this._model();
    this._renderRows(true);
    this._layout();
    this._onExpand(node);
  }

  /** Scroll so that row `i` is in view. */
  scrollToRow(i: number): void {
    const top = i * ROW_PX;
    const view = this._rows.clientHeight || ROW_PX * 12;
    if (top < this._rows.scrollTop) {
      this._rows.scrollTop = top;
    } else if (top + ROW_PX > this._rows.scrollTop + view) {
      this._rows.scrollTop = top + ROW_PX - view;
    }
    this._renderRows(false);
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

  private _scheduleRows(): void {
    if (this._rowFrame === 0) {
      this._rowFrame = requestAnimationFrame(() => {
        this._rowFrame = 0;
        if (this._renderRows(false)) {
          this._layout();
        }
      });
    }
  }

  /** The rows: job, then each node (the expanded one followed by its ranks). */
  private _model(): void {
    const d = this._data!;
    const rows: IRow[] = [{ kind: 'job', lane: 'job', data: d.lanes.job ?? { spans: [], marks: [] } }];
    const nodes = d.nodes ?? Object.keys(d.lanes).filter(l => l !== 'job');
    for (const node of nodes) {
      rows.push({ kind: 'node', lane: node, data: d.lanes[node] ?? { spans: [], marks: [] } });
      if (node === this._expanded) {
        const got = d.expanded && d.expanded.node === node ? d.expanded.lanes : null;
        if (got === null) {
          rows.push({ kind: 'rank', lane: '', data: null, node });
        } else {
          for (const rank of Object.keys(got).sort((x, y) => Number(x) - Number(y))) {
            rows.push({ kind: 'rank', lane: rank, data: got[rank], node });
          }
        }
      }
    }
    this._rowModel = rows;
    this._spacer.style.height = `${rows.length * ROW_PX}px`;
    this.node.setAttribute('data-lanes', String(rows.length));
  }

  /**
   * Put the rows in view (plus OVERSCAN) in the DOM and take the others out. `rebuild`: the data
   * changed, build every row in view again. Returns whether any row was added.
   */
  private _renderRows(rebuild: boolean): boolean {
    const focusedLane = (document.activeElement as HTMLElement | null)?.closest?.('[data-row]')?.getAttribute('data-row');
    const view = this._rows.clientHeight || ROW_PX * 12;
    const first = Math.max(0, Math.floor(this._rows.scrollTop / ROW_PX) - OVERSCAN);
    const last = Math.min(this._rowModel.length, Math.ceil((this._rows.scrollTop + view) / ROW_PX) + OVERSCAN);
    let added = false;
    for (const [key, built] of this._built) {
      const i = Number(key.split('|')[0]);
      if (rebuild || i < first || i >= last) {
        built.row.remove();
        this._built.delete(key);
      }
    }
    for (let i = first; i < last; i++) {
      const r = this._rowModel[i];
      const key = `${i}|${r.kind}|${r.lane}`;
      if (this._built.has(key)) {
        continue;
      }
      const built = this._buildRow(r, i);
      this._built.set(key, built);
      this._rows.appendChild(built.row);
      added = true;
      if (built.row.getAttribute('data-row') === focusedLane) {
        built.row.focus({ preventScroll: true });
      }
    }
    this._placed = [];
    for (const b of this._built.values()) {
      this._placed.push(...b.placed);
    }
    return added;
  }

  private _buildRow(r: IRow, i: number): IBuilt {
    const placed: IPlaced[] = [];
    const ln = r.data ?? { spans: [], marks: [] };
    const track = h('div', { class: 'jp-HyperPodDash-track' });
    for (const s of ln.spans) {
      track.appendChild(this._span(r.kind === 'node' ? `node ${r.lane}` : r.kind === 'rank' ? `rank ${r.lane}` : 'job', r.lane, s, placed));
    }
    for (const m of ln.marks) {
      track.appendChild(this._mark(m, placed));
    }
    const faults = ln.marks.filter(m => m.cat === 'fault' || m.cat === 'hang').length;
    let label: HTMLElement;
    let name: string;
    if (r.kind === 'node') {
      const open = r.lane === this._expanded;
      name = `Node ${r.lane} (${ln.ranks ?? ''})`;
      const toggle = h('button', {
        type: 'button',
        class: 'jp-HyperPodDash-expand',
        'data-testid': 'hp-dash-expand',
        'aria-expanded': open ? 'true' : 'false',
        title: open ? `Close ${r.lane}'s ranks` : `Show the lane of each of ${r.lane}'s ${ln.rank_count ?? ''} ranks`
      }, `${open ? '▾' : '▸'} ${r.lane}`);
      toggle.addEventListener('click', () => this.expand(open ? null : r.lane));
      // a checkpointless job's replica group on the node (a group per node: its lane is the group's)
      const group = typeof ln.replica_group === 'number' ? ` · group ${ln.replica_group}` : '';
      label = h('div', { class: 'jp-HyperPodDash-laneLabel', title: `${r.lane}: ${ln.ranks ?? ''}${group}` }, toggle,
        h('span', { class: 'jp-HyperPodDash-laneRanks jp-HyperPod-dim', 'data-group': ln.replica_group ?? null }, `${ln.ranks ?? ''}${group}`));
    } else if (r.kind === 'rank') {
      name = r.data === null ? `Ranks of ${r.node}: reading` : `Rank ${r.lane} on ${r.node}`;
      label = h('div', { class: 'jp-HyperPodDash-laneLabel jp-mod-rank' }, r.data === null ? 'reading…' : `rank ${r.lane}`);
    } else {
      name = 'Job';
      label = h('div', { class: 'jp-HyperPodDash-laneLabel' }, 'Job');
    }
    const row = h(
      'div',
      {
        class: `jp-HyperPodDash-lane jp-mod-${r.kind}`,
        role: 'listitem',
        tabindex: -1,
        'data-testid': 'hp-dash-lane',
        'data-kind': r.kind,
        'data-lane': r.lane,
        'data-node': r.kind === 'rank' ? r.node : null,
        'data-row': `${r.kind}:${r.lane}`,
        'data-index': i,
        'data-faults': faults,
        style: `top: ${i * ROW_PX}px`,
        'aria-label': `${name}: ${ln.spans.length} runs, ${ln.marks.length} marks${faults ? `, ${faults} faults` : ''}`
      },
      label,
      track
    );
    return { row, placed };
  }

  private _span(who: string, lane: string, s: IDashboardSpan, placed: IPlaced[]): HTMLElement {
    const tier = s.tier ?? '';
    const band = s.kind === 'step' ? 0 : 1 + Math.max(0, TIERS.indexOf(tier) === -1 ? TIERS.length : TIERS.indexOf(tier));
    const steps = s.step0 === s.step1 ? `step ${s.step0}` : `steps ${s.step0}-${s.step1}`;
    const of = s.ranks && s.ranks > 1 ? ` of ${s.ranks} ranks` : '';
    const label = s.kind === 'step' ? `${steps} (${s.count} step events${of})` : `${tier} checkpoints ${steps} (x${s.count}${of})`;
    const el = h('div', {
      class: `jp-HyperPodDash-span jp-mod-${s.kind === 'step' ? 'step' : tier}`,
      'data-kind': s.kind,
      'data-tier': tier || null,
      'data-step0': s.step0,
      'data-step1': s.step1,
      'data-count': s.count,
      'data-lane': lane,
      title: `${who}: ${label}`,
      style: `top: ${band === 0 ? 2 : 10 + (band - 1) * 5}px`
    });
    placed.push({ el, t0: s.t0, t1: s.t1 });
    return el;
  }

  private _mark(m: IDashboardMark, placed: IPlaced[]): HTMLElement {
    const rel = this._data ? m.t - (this._data.t0 ?? m.t) : 0;
    const el = h('button', {
      type: 'button',
      // a fault another rank's caused (root_cause false) is drawn fainter than the root cause
      class: `jp-HyperPodDash-mark jp-mod-${m.cat}${m.root_cause === false ? ' jp-mod-secondary' : ''}`,
      'data-testid': 'hp-dash-mark',
      'data-kind': m.kind,
      'data-cat': m.cat,
      'data-rank': m.rank ?? '',
      'data-ranks': m.ranks ? m.ranks.join(',') : null,
      'data-t': m.t,
      'aria-label': `${m.label} at ${fmt(rel)} s`,
      title: `${m.label} (at ${fmt(rel)} s)`
    });
    el.addEventListener('click', () => this._onActivate(m));
    placed.push({ el, t0: m.t, t1: m.t });
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
        // rows out of view are not in the DOM: move by index, scroll it into view, then focus it
        const current = target.closest('.jp-HyperPodDash-lane') as HTMLElement | null;
        const i = current ? Number(current.getAttribute('data-index')) : -1;
        const next = Math.max(0, Math.min(this._rowModel.length - 1, i + (e.key === 'ArrowDown' ? 1 : -1)));
        this.scrollToRow(next);
        this._rows.querySelector<HTMLElement>(`.jp-HyperPodDash-lane[data-index="${next}"]`)?.focus({ preventScroll: true });
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
    if ((e.target as HTMLElement).closest('.jp-HyperPodDash-laneLabel') && !e.shiftKey) {
      return; // over the lanes' names: the wheel scrolls the lanes
    }
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
  private _onExpand: (node: string | null) => void;
  private _expanded: string | null = null;
  private _rowModel: IRow[] = [];
  private _built = new Map<string, IBuilt>();
  private _rowFrame = 0;
  private _spacer: HTMLDivElement;
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
