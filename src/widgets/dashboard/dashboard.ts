/**
 * A job's dashboard in the main area (one tab per job): swim lanes, loss and throughput charts,
 * the goodput breakdown, the compact timeline, the events table and the logs. Its data comes
 * from `GET jobs/{id}/dashboard` (the server's fold of the job's events,
 * `hyperpod_lab/fold/aggregate.py`), read again every `REFRESH_MS` while the job runs.
 */
import { Widget } from '@lumino/widgets';
import { Message } from '@lumino/messaging';

import { getJobGoodput, requestAPI } from '../../api/network';
import { EventKind, IJobEvent } from '../../api/events';
import { IDashboardMark, IDashboardTimelineEntry, IJobDashboard, isTerminal } from '../../api/rest';
import { IHyperPodModel } from '../../models/tokens';
import { button, fmt, h, liveBox } from '../dom';
import { renderGoodput } from '../jobView';
import { StepCharts } from './charts';
import { EventsTable, eventRank } from './eventsTable';
import { LogTriagePanel } from '../logTriage';
import { SwimLanes } from './lanes';

/** How often a running job's dashboard is read again, ms. */
export const REFRESH_MS = 2000;
/** Series points asked for. */
export const SERIES_POINTS = 1000;

/** GET jobs/{id}/dashboard (`node`: also that node's ranks' own lanes, in `expanded`). */
export async function getJobDashboard(jobId: string, points = SERIES_POINTS, node: string | null = null): Promise<IJobDashboard> {
  const q = `points=${points}` + (node !== null ? `&node=${encodeURIComponent(node)}` : '');
  return requestAPI<IJobDashboard>(`jobs/${encodeURIComponent(jobId)}/dashboard?${q}`);
}

/** The dashboard of one job. */
export class JobDashboard extends Widget {
  constructor(options: { model: IHyperPodModel; jobId: string }) {
    super();
    this._model = options.model;
    this.jobId = options.jobId;
    this.id = `hp-dashboard-${options.jobId}`;
    this.addClass('jp-HyperPodDash');
    this.node.setAttribute('data-testid', 'hp-dashboard');
    this.node.setAttribute('data-job-id', options.jobId);
    this.node.setAttribute('data-state', 'loading');

    this._title = h('h2', { class: 'jp-HyperPodDash-title' }, options.jobId);
    this._facts = liveBox('jp-HyperPod-dim jp-HyperPodDash-facts', 'hp-dash-facts');
    const refresh = button('hp-dash-refresh', 'Refresh', { title: 'Read the dashboard again' });
    refresh.addEventListener('click', () => void this.refresh());
    this._error = h('div', { class: 'jp-HyperPod-error', role: 'alert', 'data-testid': 'hp-dash-error', hidden: true });

    this.lanes = new SwimLanes(
      m => this._markActivated(m),
      () => void this.refresh()
    );
    this.charts = new StepCharts();
    this._goodput = liveBox('jp-HyperPod-goodput', 'hp-dash-goodput');
    this._timeline = h('ol', { class: 'jp-HyperPodDash-timeline', 'data-testid': 'hp-dash-timeline', 'aria-label': 'Timeline: checkpoint runs and incidents' });
    this.events = new EventsTable(options.jobId, ev => this._eventActivated(ev));
    // the Logs area: the log triage panel (all ranks' logs, a fault's traceback)
    this.logs = new LogTriagePanel(requestAPI, options.jobId);
    this._logHost = h('div', { class: 'jp-HyperPodDash-logs', 'data-testid': 'hp-dash-logs' });

    // the bottom area: Events | Logs tabs (arrow keys move between them)
    this._tabs = [
      { id: 'events', label: 'Events', panel: this.events.node },
      { id: 'logs', label: 'Logs', panel: this._logHost }
    ].map(t => {
      const tab = h('button', {
        type: 'button',
        role: 'tab',
        class: 'jp-HyperPodDash-tab',
        id: `${this.id}-tab-${t.id}`,
        'data-testid': `hp-dash-tab-${t.id}`,
        'aria-controls': `${this.id}-panel-${t.id}`
      }, t.label);
      const panel = h('div', { role: 'tabpanel', id: `${this.id}-panel-${t.id}`, 'aria-labelledby': `${this.id}-tab-${t.id}`, class: 'jp-HyperPodDash-tabPanel' }, t.panel);
      tab.addEventListener('click', () => this.showTab(t.id as 'events' | 'logs'));
      return { id: t.id, tab, panel };
    });
    const tablist = h('div', { role: 'tablist', class: 'jp-HyperPodDash-tabs', 'aria-label': 'Events and logs' }, ...this._tabs.map(t => t.tab));
    tablist.addEventListener('keydown', e => {
      if (e.key !== 'ArrowLeft' && e.key !== 'ArrowRight') {
        return;
      }
      e.preventDefault();
      const i = this._tabs.findIndex(t => t.tab === document.activeElement);
      const next = this._tabs[(i + (e.key === 'ArrowRight' ? 1 : this._tabs.length - 1)) % this._tabs.length];
      this.showTab(next.id as 'events' | 'logs');
      next.tab.focus();
    });

    this.node.append(
      h('header', { class: 'jp-HyperPodDash-header' }, this._title, refresh, this._facts),
      this._error,
      h('section', { class: 'jp-HyperPodDash-section', 'aria-label': 'Lanes' }, h('h3', { class: 'jp-HyperPod-subheading' }, 'Nodes over time'), this.lanes.node),
      h('div', { class: 'jp-HyperPodDash-row' },
        h('section', { class: 'jp-HyperPodDash-section jp-HyperPodDash-grow', 'aria-label': 'Loss and throughput' }, this.charts.node),
        h('section', { class: 'jp-HyperPodDash-section jp-HyperPodDash-side', 'aria-label': 'Goodput and timeline' },
          h('h3', { class: 'jp-HyperPod-subheading' }, 'Goodput'), this._goodput,
          h('h3', { class: 'jp-HyperPod-subheading' }, 'Timeline'), this._timeline)),
      h('section', { class: 'jp-HyperPodDash-section', 'aria-label': 'Events and logs' }, tablist, ...this._tabs.map(t => t.panel))
    );
    this.showTab('events');
    this._themeObserver = new MutationObserver(() => this.charts.themeChanged());
    this._themeObserver.observe(document.body, { attributes: true, attributeFilter: ['data-jp-theme-name', 'data-jp-theme-light'] });
    this._resize = new ResizeObserver(() => this.charts.resize());
    this._resize.observe(this.node);
    this._model.jobs.changed.connect(this._jobChanged, this);
  }

  /** The job shown. */
  readonly jobId: string;
  readonly lanes: SwimLanes;
  readonly charts: StepCharts;
  readonly events: EventsTable;
  readonly logs: LogTriagePanel;

  /** Read the dashboard (and goodput) again and draw it. */
  async refresh(): Promise<void> {
    try {
      const node = this.lanes.expanded;
      const d = await getJobDashboard(this.jobId, SERIES_POINTS, node);
      if (this.isDisposed || node !== this.lanes.expanded) {
        return; // closed, or another node opened, meanwhile: that one's answer is drawn
      }
      this._error.hidden = true;
      this._partial = d.partial === true;
      this._draw(d);
    } catch (e) {
      this._error.hidden = false;
      this._error.textContent = `Dashboard not loaded: ${(e as Error).message}`;
    }
    getJobGoodput(this.jobId).then(
      m => !this.isDisposed && renderGoodput(this._goodput, m, null),
      e => !this.isDisposed && renderGoodput(this._goodput, null, (e as Error).message)
    );
  }

  /** Show the Events or the Logs tab. */
  showTab(id: 'events' | 'logs'): void {
    for (const t of this._tabs) {
      const on = t.id === id;
      t.tab.setAttribute('aria-selected', on ? 'true' : 'false');
      t.tab.tabIndex = on ? 0 : -1;
      t.panel.hidden = !on;
    }
  }

  /**
   * Open a fault's rank's log at its traceback, in the Logs tab (the log triage panel's
   * `openAtFault`: the fault's rank and time pick the traceback).
   */
  openLogAtFault(rank: number, ev: IJobEvent | IDashboardMark | IDashboardTimelineEntry): void {
    this.showTab('logs');
    const fault: IJobEvent =
      'data' in ev
        ? ev
        : {
            v: 1,
            kind: 'fault.detected' as EventKind,
            job_id: this.jobId,
            time: ev.t,
            writer: ev.writer ?? '',
            seq: ev.seq ?? 0,
            data: { rank, node: ev.node ?? null }
          };
    void this.logs.openAtFault({ ...fault, data: { ...fault.data, rank } });
  }

  override dispose(): void {
    if (this.isDisposed) {
      return;
    }
    window.clearTimeout(this._timer);
    this._model.jobs.changed.disconnect(this._jobChanged, this);
    this._themeObserver.disconnect();
    this._resize.disconnect();
    this.charts.dispose();
    this.logs.dispose();
    super.dispose();
  }

  protected override onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (!this.logs.isAttached) {
      Widget.attach(this.logs, this._logHost);
    }
    if (!this._started) {
      this._started = true;
      void this._loop();
      void this.events.loadMore();
    }
  }

  /** Read again every REFRESH_MS while the job runs; once more after it ended (`_jobChanged`). */
  private async _loop(): Promise<void> {
    await this.refresh();
    if (this.isDisposed || (this._ended() && !this._partial)) {
      return; // an ended job read to its end: nothing more will come
    }
    if (!this._ended()) {
      void this.events.refresh();
    }
    // a long job's first fold is read over several requests: the next one at once
    this._timer = window.setTimeout(() => void this._loop(), this._partial ? 200 : REFRESH_MS);
  }

  private _ended(): boolean {
    const job = this._model.jobs.jobs.find(j => j.job_id === this.jobId);
    return job !== undefined && isTerminal(job.status);
  }

  /** The jobs list changed: the header follows the job's state; a job that just ended is read once more. */
  private _jobChanged(): void {
    const job = this._model.jobs.jobs.find(j => j.job_id === this.jobId);
    if (!job) {
      return;
    }
    this._title.textContent = `${job.name} — ${job.status}`;
    this.node.setAttribute('data-job-state', job.status);
    const ended = isTerminal(job.status);
    if (ended && !this._finalRead && this._started) {
      this._finalRead = true;
      window.setTimeout(() => {
        if (!this.isDisposed) {
          void this.refresh();
          void this.events.refresh();
        }
      }, 1000);
    }
  }

  private _draw(d: IJobDashboard): void {
    const job = this._model.jobs.jobs.find(j => j.job_id === this.jobId);
    this._title.textContent = job ? `${job.name} — ${job.status}` : this.jobId;
    this.title.label = `Dashboard: ${job?.name ?? this.jobId}`;
    const span = d.t0 !== null && d.t1 !== null ? d.t1 - d.t0 : null;
    this._facts.textContent =
      `${d.steps ?? 0} steps · ${d.ranks} rank${d.ranks === 1 ? '' : 's'} · ${d.nodes.length} node${d.nodes.length === 1 ? '' : 's'} · ${d.events} events` + (span !== null ? ` · ${fmt(span)} s` : '');
    this.lanes.setData(d);
    this.charts.setData(d.series);
    this._timeline.textContent = '';
    for (const e of d.timeline) {
      const rel = d.t0 !== null ? e.t - d.t0 : 0;
      // a node's pre-flight health checks: passed or failed (a health.failed mark has no `ok`)
      const health = e.cat === 'health' ? (e.ok === true ? ' jp-mod-passed' : ' jp-mod-failed') : '';
      const li = h('li', { class: `jp-HyperPodDash-timelineItem jp-mod-${e.cat}${health}`, 'data-kind': e.kind, 'data-cat': e.cat, tabindex: 0 },
        h('span', { class: 'jp-HyperPod-dim' }, `${fmt(rel)} s `), e.label);
      if (health) {
        li.setAttribute('data-ok', e.ok === true ? 'true' : 'false');
      }
      if (e.kind === 'fault.detected' && typeof e.rank === 'number') {
        const rank = e.rank;
        const open = () => this.openLogAtFault(rank, e);
        li.addEventListener('click', open);
        li.addEventListener('keydown', k => k.key === 'Enter' && open());
      }
      this._timeline.appendChild(li);
    }
    this.node.setAttribute('data-state', 'drawn');
    this.node.setAttribute('data-partial', d.partial ? 'true' : 'false');
    if (d.partial) {
      this._facts.textContent += ' · reading the job\'s events…';
    }
    this.node.setAttribute('data-events', String(d.events));
  }

  private _markActivated(m: IDashboardMark): void {
    if ((m.cat === 'fault' || m.cat === 'hang') && m.rank !== null) {
      this.openLogAtFault(m.rank, m);
    }
  }

  private _eventActivated(ev: IJobEvent): void {
    const rank = eventRank(ev);
    if (ev.kind === 'fault.detected' && rank !== null) {
      this.openLogAtFault(rank, ev);
    }
  }

  private _model: IHyperPodModel;
  private _title: HTMLHeadingElement;
  private _facts: HTMLDivElement;
  private _error: HTMLDivElement;
  private _goodput: HTMLDivElement;
  private _logHost: HTMLDivElement;
  private _timeline: HTMLOListElement;
  private _tabs: { id: string; tab: HTMLButtonElement; panel: HTMLDivElement }[];
  private _themeObserver: MutationObserver;
  private _resize: ResizeObserver;
  private _timer = 0;
  private _started = false;
  private _finalRead = false;
  private _partial = false;
}
