/**
 * The "Cluster queue" panel (left area): a Slurm cluster's nodes by state (with the reason a node
 * is down or drained), its partitions, and every user's pending and running jobs, ours marked with
 * the reason they wait and their place among the pending jobs of their partition. Read-only.
 *
 * It asks `GET hyperpod/clusters/<name>/queue` every `interval_s` while it is shown (not while
 * hidden); the server answers every tab from one snapshot per interval (`docs/queue.md`). Job
 * names, users and node reasons are other people's text: they only ever reach the DOM as text
 * nodes (`h()`), never as HTML.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import { button, captionedTable, clock, errorBox, h, liveBox, uid } from '../widgets/dom';
import { fetchClusters, fetchQueue, IQueueJob, IQueueNode, IQueueView } from './rest';

/** The id of the left-area panel. */
export const QUEUE_PANEL_ID = 'hyperpod-lab-queue';

/** The node groups, in the order the summary shows them. */
export const NODE_GROUPS = ['idle', 'alloc', 'mixed', 'down', 'drain', 'other'];

/** Most job rows drawn (a big cluster's queue is summed up beyond it). */
export const MAX_JOB_ROWS = 500;

/** The wait of a pending row: `#2 in dev · Priority`; of another row its time and nodes. */
export function jobWait(job: IQueueJob): string {
  if (job.status === 'pending') {
    const place = job.position !== null ? `#${job.position} in ${job.partition}` : job.partition;
    return job.reason ? `${place} · ${job.reason}` : place;
  }
  return job.nodelist ? `${job.time} on ${job.nodelist}` : job.time;
}

/** A node's CPUs: `1/2 CPUs` (allocated/total), or `2 CPUs`. */
function nodeCpus(node: IQueueNode): string {
  if (node.cpus === null) {
    return '';
  }
  return node.cpus_alloc !== null ? `${node.cpus_alloc}/${node.cpus} CPUs` : `${node.cpus} CPUs`;
}

/** The panel; it renders each answer anew (nothing of a previous answer is kept). */
export class QueuePanel extends Widget {
  constructor() {
    super();
    this.id = QUEUE_PANEL_ID;
    this.addClass('jp-HyperPodSidebar'); // the side panel's frame, as the HyperPod sidebar's
    this.addClass('jp-HyperPodQueue');
    this.node.setAttribute('data-testid', 'hp-queue');
    this.title.caption = 'Cluster queue';
    const selectId = uid('hp-queue-cluster');
    this._select = h('select', { id: selectId, 'data-testid': 'hp-queue-cluster' });
    this._select.addEventListener('change', () => void this.refresh());
    const refresh = button('hp-queue-refresh', 'Refresh', { title: 'Ask for the queue now' });
    refresh.addEventListener('click', () => void this.refresh());
    this._status = liveBox('jp-HyperPod-dim jp-HyperPodQueue-status', 'hp-queue-status');
    this._error = errorBox('hp-queue-error');
    this._body = h('div', { class: 'jp-HyperPodQueue-body', 'data-testid': 'hp-queue-body' });
    this.node.append(
      h('h2', { class: 'jp-HyperPodSidebar-heading' }, 'Cluster queue'),
      h('div', { class: 'jp-HyperPodQueue-head' },
        h('label', { for: selectId }, 'Cluster'), this._select, refresh),
      this._status,
      this._error,
      this._body
    );
  }

  /** The last answer shown, or null. */
  get view(): IQueueView | null {
    return this._view;
  }

  /** Ask for the selected cluster's queue now and render it (the cluster list first, once). */
  async refresh(): Promise<void> {
    if (this._busy) {
      return;
    }
    this._busy = true;
    try {
      if (!this._clustersLoaded) {
        await this._loadClusters();
      }
      const cluster = this._select.value;
      if (!cluster) {
        this._showError('No cluster profiles: add one (hyperpod-lab clusters add, or Discover in the HyperPod panel).');
        return;
      }
      const view = await fetchQueue(cluster);
      if (view.cluster !== this._select.value) {
        return; // the selection changed meanwhile: its own refresh renders it
      }
      this._view = view;
      this._interval = Math.max(1, view.interval_s || 10);
      this._showError(null);
      this._render(view);
    } catch (error) {
      this._showError((error as Error).message);
    } finally {
      this._busy = false;
    }
  }

  protected override onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._tick();
  }

  protected override onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._stop();
  }

  override dispose(): void {
    this._stop();
    super.dispose();
  }

  /** Refresh now, then every interval while shown. */
  private _tick(): void {
    this._stop();
    void this.refresh().then(() => {
      if (this.isVisible && !this.isDisposed) {
        this._timer = window.setTimeout(() => this._tick(), this._interval * 1000);
      }
    });
  }

  private _stop(): void {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
  }

  /** Fill the cluster list, Slurm clusters first (the others have no queue view). */
  private async _loadClusters(): Promise<void> {
    const clusters = await fetchClusters();
    const order = [...clusters].sort(
      (a, b) => Number(b.orchestrator === 'slurm') - Number(a.orchestrator === 'slurm') || a.name.localeCompare(b.name)
    );
    this._select.replaceChildren(
      ...order.map(c => h('option', { value: c.name, title: `${c.name}: ${c.orchestrator}` }, c.name))
    );
    this._clustersLoaded = true;
  }

  private _showError(message: string | null): void {
    this._error.hidden = message === null;
    this._error.textContent = message ?? '';
  }

  private _render(view: IQueueView): void {
    const when = clock(view.fetched_at);
    this._status.textContent = view.supported
      ? `${view.jobs.length} jobs, ${view.nodes.length} nodes · as of ${when} (every ${view.interval_s} s)`
      : '';
    if (!view.supported) {
      this._body.replaceChildren(
        h('p', { class: 'jp-HyperPodQueue-unsupported', 'data-testid': 'hp-queue-unsupported' },
          view.message ?? 'The queue view is Slurm-only.')
      );
      return;
    }
    this._body.replaceChildren(
      this._counts(view),
      this._mine(view),
      this._nodes(view),
      this._partitions(view),
      this._jobs(view)
    );
  }

  /** `idle 1 · mixed 1 · down 1`: the nodes per group. */
  private _counts(view: IQueueView): HTMLElement {
    return h('ul', { class: 'jp-HyperPodQueue-counts', 'data-testid': 'hp-queue-counts', 'aria-label': 'Nodes by state' },
      ...NODE_GROUPS.filter(g => view.counts[g]).map(g =>
        h('li', { class: `jp-HyperPodQueue-group jp-mod-${g}`, 'data-group': g, 'data-count': view.counts[g] },
          `${g} ${view.counts[g]}`)));
  }

  /** Our pending jobs: why each waits and its place in its partition. */
  private _mine(view: IQueueView): HTMLElement {
    const pending = view.jobs.filter(j => j.mine && j.status === 'pending');
    const total = new Map<string, number>();
    for (const j of view.jobs) {
      if (j.status === 'pending') {
        total.set(j.partition, (total.get(j.partition) ?? 0) + 1);
      }
    }
    const list = h('ul', { class: 'jp-HyperPodQueue-mine', 'data-testid': 'hp-queue-mine', 'aria-label': 'Your pending jobs' });
    for (const j of pending) {
      list.append(h('li', { 'data-job-id': j.id },
        h('strong', {}, `${j.id} ${j.job_id ?? j.name}`),
        ` — #${j.position ?? '?'} of ${total.get(j.partition) ?? '?'} pending in ${j.partition}`,
        j.reason ? ` · ${j.reason}` : ''));
    }
    return h('section', { class: 'jp-HyperPodQueue-section' },
      h('h3', { class: 'jp-HyperPod-subheading' }, 'Your pending jobs'),
      pending.length ? list : h('p', { class: 'jp-HyperPod-dim' }, 'none'));
  }

  private _nodes(view: IQueueView): HTMLElement {
    const body = h('tbody');
    for (const n of view.nodes) {
      body.append(h('tr', { class: `jp-mod-${n.group}`, 'data-testid': 'hp-queue-node', 'data-node': n.name, 'data-group': n.group },
        h('td', {}, n.name),
        h('td', { class: 'jp-HyperPodQueue-state' }, n.state),
        h('td', {}, nodeCpus(n)),
        h('td', { class: 'jp-HyperPodQueue-reason', 'data-testid': 'hp-queue-node-reason' }, n.reason ?? '')));
    }
    return h('section', { class: 'jp-HyperPodQueue-section' },
      captionedTable('hp-queue-nodes', 'Nodes', ['Node', 'State', 'CPUs', 'Reason'], body));
  }

  private _partitions(view: IQueueView): HTMLElement {
    const body = h('tbody');
    for (const p of view.partitions) {
      const counts = NODE_GROUPS.filter(g => p.counts[g]).map(g => `${g} ${p.counts[g]}`).join(', ');
      body.append(h('tr', { 'data-testid': 'hp-queue-partition', 'data-partition': p.name },
        h('td', {}, p.default ? `${p.name} (default)` : p.name),
        h('td', {}, p.avail),
        h('td', {}, `${p.nodes.length}: ${counts}`),
        h('td', {}, p.time_limit)));
    }
    return h('section', { class: 'jp-HyperPodQueue-section' },
      captionedTable('hp-queue-partitions', 'Partitions', ['Partition', 'Avail', 'Nodes', 'Limit'], body));
  }

  /** Every job as a three-line entry (id, user and state; the name; where it waits or runs): a
   * table's columns do not fit the side panel's width. */
  private _jobs(view: IQueueView): HTMLElement {
    const list = h('ul', { class: 'jp-HyperPodQueue-jobs', 'data-testid': 'hp-queue-jobs', 'aria-label': 'Jobs' });
    for (const j of view.jobs.slice(0, MAX_JOB_ROWS)) {
      list.append(h('li', {
        class: `jp-HyperPodQueue-job jp-mod-${j.status}${j.mine ? ' jp-mod-mine' : ''}`, 'data-testid': 'hp-queue-job',
        'data-job-id': j.id, 'data-user': j.user, 'data-status': j.status, 'data-mine': j.mine ? 'true' : 'false',
        'data-position': j.position
      },
        h('div', { class: 'jp-HyperPodQueue-jobHead' },
          h('span', { class: 'jp-HyperPodQueue-jobId' }, j.id),
          h('span', { class: 'jp-HyperPodQueue-user' }, j.user),
          h('span', { class: 'jp-HyperPodQueue-state' }, j.state)),
        h('div', { class: 'jp-HyperPodQueue-name', 'data-testid': 'hp-queue-job-name' }, j.name),
        h('div', { class: 'jp-HyperPod-dim', 'data-testid': 'hp-queue-job-wait' }, jobWait(j))));
    }
    const more = view.jobs.length - MAX_JOB_ROWS;
    return h('section', { class: 'jp-HyperPodQueue-section' },
      h('h3', { class: 'jp-HyperPod-subheading' }, `Jobs (${view.jobs.length})`),
      list,
      more > 0 ? h('p', { class: 'jp-HyperPod-dim' }, `${more} more jobs not shown`) : null);
  }

  private _select: HTMLSelectElement;
  private _status: HTMLDivElement;
  private _error: HTMLDivElement;
  private _body: HTMLDivElement;
  private _view: IQueueView | null = null;
  private _busy = false;
  private _clustersLoaded = false;
  private _interval = 10;
  private _timer: number | null = null;
}
