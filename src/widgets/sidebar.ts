/**
 * The HyperPod left-sidebar panel: clusters, jobs and the selected job, with a button that opens
 * the submit form in the main area (`submit/tabs.ts`).
 */
import { Panel, Widget } from '@lumino/widgets';

import { describeEvent } from '../format';
import { IJobView } from '../api/rest';
import { IHyperPodModel } from '../models/tokens';
import { DiscoverPanel } from './discoverPanel';
import { button, errorBox, fmt, h, labelledList } from './dom';
import { excludedSummary, faultSummary, JobView, stragglerSummary } from './jobView';

/** The id of the left-sidebar panel. */
export const SIDEBAR_ID = 'hyperpod-lab-sidebar';

/** One line of a job's progress for the job list (its fault facts as the server folded them). */
function jobSummary(job: IJobView): string {
  const p = job.progress;
  const parts: string[] = [];
  if (p?.step !== null && p?.step !== undefined) {
    parts.push(`step ${p.step + 1}${p.total_steps ? `/${p.total_steps}` : ''}`);
  }
  if (p?.steps_per_s) {
    parts.push(`${fmt(p.steps_per_s)} steps/s`);
  }
  const faults = faultSummary(p);
  if (faults) {
    parts.push(faults);
  }
  return parts.join(' · ');
}

/**
 * The panel. Views render the model's state and re-render on its signals; user actions go
 * to the model, errors to `onError`.
 */
export class HyperPodSidebar extends Panel {
  /**
   * @param options.model - the panel state
   * @param options.onError - shows a failed action to the user
   * @param options.openSubmit - opens the submit form (in the main area) for the current
   *   notebook; without it the sidebar has no submit button
   */
  constructor(options: {
    model: IHyperPodModel;
    onError: (action: string, error: Error) => void;
    openSubmit?: () => void;
    /** Open a job's dashboard in the main area (the job list's Dashboard button, double-click). */
    openDashboard?: (jobId: string) => void;
  }) {
    super();
    this._model = options.model;
    this._openDashboard = options.openDashboard ?? null;
    this.id = SIDEBAR_ID;
    this.addClass('jp-HyperPodSidebar');
    this.node.setAttribute('data-testid', 'hp-sidebar');
    this.title.caption = 'HyperPod';

    const top = new Widget();
    top.addClass('jp-HyperPodSidebar-top');
    const refresh = button('hp-refresh', 'Refresh', { title: 'Reload clusters and jobs' });
    refresh.addEventListener('click', () => void this._model.refresh());
    let submit: HTMLButtonElement | null = null;
    if (options.openSubmit) {
      const openSubmit = options.openSubmit;
      submit = button('hp-open-submit', 'Submit to cluster…', {
        class: 'jp-HyperPod-button jp-mod-accept jp-HyperPodSidebar-submitButton',
        title: 'Open the submit form in the main area, for the current notebook (or a script)'
      });
      submit.addEventListener('click', () => openSubmit());
    }
    this._error = errorBox('hp-error');
    this._clusters = labelledList('ul', 'jp-HyperPodSidebar-clusterList', 'hp-clusters', 'Clusters');
    this._jobs = labelledList('ul', 'jp-HyperPodSidebar-jobList', 'hp-jobs', 'Jobs');
    this.discover = new DiscoverPanel(this._model.discovery);
    this._discoverDetails = h('details', { class: 'jp-HyperPod-details', 'data-testid': 'hp-discover-section' },
      h('summary', { 'data-testid': 'hp-discover-toggle' }, 'Discover HyperPod clusters'),
      this.discover.node);
    top.node.append(
      h('div', { class: 'jp-HyperPodSidebar-titleRow' }, h('h2', { class: 'jp-HyperPodSidebar-heading' }, 'HyperPod'), refresh),
      this._error,
      ...(submit ? [submit] : []),
      h('h3', { class: 'jp-HyperPod-subheading' }, 'Clusters'),
      this._clusters,
      this._discoverDetails,
      h('h3', { class: 'jp-HyperPod-subheading' }, 'Jobs'),
      this._jobs
    );
    this.addWidget(top);

    this.jobView = new JobView(this._model, options.onError);
    this.addWidget(this.jobView);

    this._model.clusters.changed.connect(this._renderClusters, this);
    this._model.jobs.changed.connect(this._renderJobs, this);
    this._model.selectionChanged.connect(this._renderJobs, this);
    this._model.errorChanged.connect(this._renderError, this);
    this._renderClusters();
    this._renderJobs();
  }

  /** The selected-job view. */
  readonly jobView: JobView;
  /** The "Discover HyperPod clusters" part of the clusters area. */
  readonly discover: DiscoverPanel;

  /** Open the discovery part and focus its region input. */
  openDiscover(): void {
    this._discoverDetails.open = true;
    this.discover.focusFirst();
  }

  private _renderError(): void {
    const err = this._model.error;
    this._error.hidden = err === null;
    this._error.textContent = err ? `HyperPod server: ${err}` : '';
  }

  private _renderClusters(): void {
    const clusters = this._model.clusters.clusters;
    this._clusters.textContent = '';
    if (clusters.length === 0) {
      this._clusters.appendChild(h('li', { class: 'jp-HyperPodSidebar-placeholder' }, 'No clusters configured yet.'));
      return;
    }
    for (const c of clusters) {
      const detail = this._model.clusters.details.get(c.name);
      const state = detail?.state ?? 'checking';
      const nodes = h('ul', { class: 'jp-HyperPod-nodes', 'aria-label': `Nodes of ${c.name}` });
      for (const n of detail?.nodes ?? []) {
        nodes.appendChild(
          h('li', { class: `jp-HyperPod-node jp-mod-${n.state.replace(/[^a-z]/gi, '')}`, 'data-node': n.name },
            `${n.name} ${n.state}${n.cpus ? ` (${n.cpus} CPUs)` : ''}`)
        );
      }
      this._clusters.appendChild(
        h(
          'li',
          { class: 'jp-HyperPod-cluster', 'data-testid': 'hp-cluster', 'data-cluster': c.name, 'data-state': state },
          h('span', { class: 'jp-HyperPod-name' }, c.name),
          ' ',
          h('span', { class: 'jp-HyperPod-dim' }, c.orchestrator),
          ' ',
          h('span', { class: `jp-HyperPod-state jp-mod-${state}` }, state),
          detail?.error ? h('div', { class: 'jp-HyperPod-dim' }, detail.error) : null,
          nodes
        )
      );
    }
  }

  private _renderJobs(): void {
    const jobs = this._model.jobs.jobs;
    // the job button that had the focus gets it back (only one of this list: a job's dashboard
    // tab carries data-job-id too and must keep its focus)
    const active = document.activeElement as HTMLElement | null;
    const focused = active && this._jobs.contains(active) ? active.closest('[data-job-id]')?.getAttribute('data-job-id') : null;
    this._jobs.textContent = '';
    if (jobs.length === 0) {
      this._jobs.appendChild(h('li', { class: 'jp-HyperPodSidebar-placeholder' }, 'No jobs yet.'));
      return;
    }
    const selected = this._model.selectedId;
    for (const job of jobs) {
      const last = job.progress?.last_event;
      const excluded = job.progress?.excluded_nodes ?? [];
      const stragglers = job.progress?.stragglers ?? [];
      const button = h(
        'button',
        {
          type: 'button',
          class: 'jp-HyperPod-jobButton',
          'data-job-id': job.job_id,
          'aria-pressed': job.job_id === selected ? 'true' : 'false',
          title: `Show ${job.job_id}`
        },
        h('span', { class: 'jp-HyperPod-name' }, job.name),
        ' ',
        h('span', { class: `jp-HyperPod-state jp-mod-${job.status}` }, job.status),
        ' ',
        h('span', { class: 'jp-HyperPod-dim' }, jobSummary(job)),
        excluded.length
          ? h(
              'div',
              {
                class: 'jp-HyperPod-dim jp-HyperPod-excludedNodes',
                'data-testid': 'hp-excluded-nodes',
                'data-excluded-nodes': excluded.map(x => x.node).join(' ')
              },
              `excluded: ${excludedSummary(job.progress)}`
            )
          : null,
        stragglers.length
          ? h(
              'div',
              {
                class: 'jp-HyperPod-dim jp-HyperPod-stragglers',
                'data-testid': 'hp-stragglers',
                'data-stragglers': stragglers.map(x => String(x.rank)).join(' ')
              },
              `stragglers: ${stragglerSummary(job.progress)}`
            )
          : null,
        last ? h('div', { class: 'jp-HyperPod-dim jp-HyperPod-jobLast' }, describeEvent(last)) : null
      );
      button.addEventListener('click', () => this._model.select(job.job_id));
      const open = this._openDashboard;
      let dash: HTMLButtonElement | null = null;
      if (open) {
        button.addEventListener('dblclick', () => open(job.job_id));
        dash = h('button', {
          type: 'button',
          class: 'jp-HyperPod-button jp-HyperPod-dashButton',
          'data-testid': 'hp-open-dashboard',
          'data-job-id': job.job_id,
          title: `Open the dashboard of ${job.name} in the main area`,
          'aria-label': `Dashboard of ${job.name}`
        }, 'Dashboard');
        dash.addEventListener('click', () => open(job.job_id));
      }
      this._jobs.appendChild(
        h('li', { class: 'jp-HyperPod-job', 'data-testid': 'hp-job', 'data-job-id': job.job_id, 'data-state': job.status }, button, dash)
      );
      if (job.job_id === focused) {
        button.focus();
      }
    }
  }

  private _model: IHyperPodModel;
  private _openDashboard: ((jobId: string) => void) | null;
  private _error: HTMLDivElement;
  private _clusters: HTMLUListElement;
  private _jobs: HTMLUListElement;
  private _discoverDetails: HTMLDetailsElement;
}
