/**
 * The sidebar's state: clusters, jobs, the selected job and its events. Owns all timers and
 * the event WebSocket; views listen to its signals and only render.
 */
import { ISignal, Signal } from '@lumino/signaling';

import * as api from './request';
import {
  ICluster,
  IClusterDetail,
  IJobEvent,
  IJobSpec,
  IJobView,
  StreamMessage,
  TERMINAL_STATES
} from './tokens';

/** A notice the extension shows (fault, recovery) — the model emits, the plugin notifies. */
export interface IJobNotice {
  /** `fault` or `recovery`. */
  kind: 'fault' | 'recovery';
  /** The job. */
  jobId: string;
  /** One line for the user. */
  message: string;
}

/** Whether a job state is terminal. */
export function isTerminal(status: string): boolean {
  return (TERMINAL_STATES as readonly string[]).includes(status);
}

/** One line describing an event, as the timeline and the job list show it. */
export function describeEvent(ev: IJobEvent): string {
  const d = ev.data;
  const num = (v: unknown, digits = 3): string =>
    typeof v === 'number' ? Number(v.toPrecision(digits)).toString() : String(v);
  switch (ev.kind) {
    case 'submitted':
      return `submitted to ${d.cluster} (${d.world_size} ranks)`;
    case 'started':
      return `started, world size ${d.world_size}`;
    case 'step':
      return `step ${d.step}, loss ${num(d.loss)}`;
    case 'checkpoint.saved':
      return `checkpoint step ${d.step} saved to ${d.tier}${d.rank !== undefined ? ` (rank ${d.rank})` : ''}`;
    case 'checkpoint.restored':
      return `checkpoint step ${d.step} restored from ${d.tier}${d.rank !== undefined ? ` (rank ${d.rank})` : ''}`;
    case 'checkpoint.corrupt':
      return `corrupt ${d.tier} checkpoint step ${d.step} skipped`;
    case 'checkpoint.failed':
      return `${d.tier} checkpoint step ${d.step} failed: ${d.reason}`;
    case 'fault.detected':
      return `fault: rank ${d.rank} on ${d.node} died (${d.signal ?? `exit ${d.exitcode}`})`;
    case 'recovery.started':
      return `recovery started (${d.reason})`;
    case 'recovery.completed':
      return `recovered in ${num(d.downtime_s)} s from ${d.restored_from ?? 'checkpoint'} at step ${d.restored_step}`;
    case 'elastic.scaled':
      return `scaled: world size ${d.old_world_size ?? '?'} → ${d.new_world_size ?? '?'}`;
    case 'finished':
      return `finished: ${d.status}${d.steps !== undefined ? `, ${d.steps} steps` : ''}`;
    default:
      return ev.kind;
  }
}

/** Reconnect delays of the event stream, milliseconds (the last repeats). */
const RECONNECT_MS = [500, 1000, 2000, 5000];

/** Quiet time after the last change of the form before the advice is asked for, ms. */
const ADVICE_DEBOUNCE_MS = 300;

/** Shortest time between two reads of the selected job's measured goodput, ms. */
const MEASURE_INTERVAL_MS = 5000;

/** Delay before reading it after new events (a burst of history makes one read), ms. */
const MEASURE_SETTLE_MS = 300;

/**
 * State of the HyperPod panel.
 *
 * Jobs are refreshed by one `GET hyperpod/jobs` every `pollMs` (the server answers from its
 * cache; it never polls the cluster per request). The browser tabs of one Jupyter server
 * share that poll: each tab broadcasts the list it fetched (`BroadcastChannel`), and a tab
 * that received a list recently enough skips its own request, so N open tabs cost the server
 * about one request per interval, not N. The selected job's events come over its WebSocket;
 * on a drop the model reconnects from the last cursor it saw, so no event is shown twice or
 * lost.
 */
export class HyperPodModel {
  /**
   * @param options.pollMs - job list refresh interval while `active()`, ms (default 3000)
   * @param options.idlePollMs - interval while not active (panel or tab hidden), ms (default 30000)
   * @param options.active - whether the panel is visible
   */
  constructor(
    options: { pollMs?: number; idlePollMs?: number; active?: () => boolean } = {}
  ) {
    this._pollMs = options.pollMs ?? 3000;
    this._idlePollMs = options.idlePollMs ?? 30000;
    this._active = options.active ?? (() => true);
    if (typeof BroadcastChannel !== 'undefined') {
      this._channel = new BroadcastChannel(`hyperpod-lab:jobs:${api.serverScope()}`);
      this._channel.onmessage = (msg: MessageEvent) => {
        const jobs = (msg.data as { jobs?: IJobView[] } | null)?.jobs;
        if (Array.isArray(jobs)) {
          this._applyJobs(jobs);
        }
      };
    }
  }

  /** Cluster profiles. */
  get clusters(): ICluster[] {
    return this._clusters;
  }
  /** Health of each cluster by name (after `refreshClusters`). */
  get clusterDetails(): Map<string, IClusterDetail> {
    return this._details;
  }
  /** Jobs, newest first. */
  get jobs(): IJobView[] {
    return this._jobs;
  }
  /** The selected job id, or null. */
  get selectedId(): string | null {
    return this._selectedId;
  }
  /** The selected job's view, or null. */
  get selected(): IJobView | null {
    return this._jobs.find(j => j.job_id === this._selectedId) ?? null;
  }
  /** Events of the selected job, in arrival order. */
  get events(): IJobEvent[] {
    return this._events;
  }
  /** The stream cursor after the last event received (opaque). */
  get cursor(): string | null {
    return this._cursor;
  }
  /** The last error of a refresh, or null. */
  get error(): string | null {
    return this._error;
  }

  /** Clusters or their health changed. */
  get clustersChanged(): ISignal<this, void> {
    return this._clustersChanged;
  }
  /** The job list changed. */
  get jobsChanged(): ISignal<this, void> {
    return this._jobsChanged;
  }
  /** Another job was selected (events reset). */
  get selectionChanged(): ISignal<this, void> {
    return this._selectionChanged;
  }
  /** New events of the selected job arrived (the new ones). */
  get eventsAdded(): ISignal<this, IJobEvent[]> {
    return this._eventsAdded;
  }
  /** A fault or recovery happened in a job. */
  get notice(): ISignal<this, IJobNotice> {
    return this._notice;
  }
  /** A refresh failed or recovered. */
  get errorChanged(): ISignal<this, void> {
    return this._errorChanged;
  }

  /** The goodput advice for the submit form's inputs, or null (none asked, or an error). */
  get advice(): api.IGoodputAdvice | null {
    return this._advice;
  }
  /** Why the last advice could not be had (the server's error names the input), or null. */
  get adviceError(): api.HyperPodAPIError | null {
    return this._adviceError;
  }
  /** Whether an advice request is waiting or running. */
  get adviceLoading(): boolean {
    return this._adviceTimer !== null || this._adviceSeq !== this._adviceDone;
  }
  /** The advice, its error or its loading state changed. */
  get adviceChanged(): ISignal<this, void> {
    return this._adviceChanged;
  }

  /** The selected job's measured goodput (`GET jobs/{id}/goodput`), or null. */
  get measured(): api.IMeasuredGoodput | null {
    return this._measured;
  }
  /** Why the measured goodput is not available (e.g. no step events yet), or null. */
  get measuredError(): string | null {
    return this._measuredError;
  }
  /** The selected job's measured goodput was read again. */
  get measuredChanged(): ISignal<this, void> {
    return this._measuredChanged;
  }

  /**
   * Ask for the goodput advice for `query`, after `ADVICE_DEBOUNCE_MS` without a newer call;
   * answers of older queries are dropped. `null` cancels and clears the advice.
   */
  requestAdvice(query: api.IAdviceQuery | null): void {
    if (this._adviceTimer !== null) {
      window.clearTimeout(this._adviceTimer);
      this._adviceTimer = null;
    }
    const seq = ++this._adviceSeq;
    if (query === null) {
      this._adviceDone = seq;
      this._advice = null;
      this._adviceError = null;
      this._adviceChanged.emit();
      return;
    }
    this._adviceTimer = window.setTimeout(() => {
      this._adviceTimer = null;
      api
        .getGoodputAdvice(query)
        .then(
          advice => {
            if (seq === this._adviceSeq) {
              this._advice = advice;
              this._adviceError = null;
            }
          },
          e => {
            if (seq === this._adviceSeq) {
              this._advice = null;
              this._adviceError =
                e instanceof api.HyperPodAPIError
                  ? e
                  : new api.HyperPodAPIError(String(e), 0, 'Error');
            }
          }
        )
        .finally(() => {
          if (seq === this._adviceSeq && !this._disposed) {
            this._adviceDone = seq;
            this._adviceChanged.emit();
          }
        });
    }, ADVICE_DEBOUNCE_MS);
    this._adviceChanged.emit(); // loading
  }

  /**
   * What the last discovery found: the query it ran with and the clusters, or null before
   * the first (and after an error).
   */
  get discovered(): { query: api.IDiscoverQuery; clusters: api.IDiscoveredCluster[] } | null {
    return this._discovered;
  }
  /** Why the last discovery or profile write failed (the server's message), or null. */
  get discoverError(): string | null {
    return this._discoverError;
  }
  /** `listing` or `writing` while a discovery request runs, else null. */
  get discoverBusy(): 'listing' | 'writing' | null {
    return this._discoverBusy;
  }
  /** The profiles the last "add profiles" wrote or kept, or null. */
  get discoverWritten(): { name: string; what: string }[] | null {
    return this._discoverWritten;
  }
  /** The discovery's result, error, busy state or written profiles changed. */
  get discoveryChanged(): ISignal<this, void> {
    return this._discoveryChanged;
  }

  /**
   * List the HyperPod clusters of `query.region` (the server calls the SageMaker API). The
   * result or the error lands in `discovered` / `discoverError`; never throws.
   */
  async discover(query: api.IDiscoverQuery): Promise<void> {
    const seq = this._startDiscovery('listing');
    let clusters: api.IDiscoveredCluster[] | null = null;
    let error: string | null = null;
    try {
      clusters = await api.discoverClusters(query);
    } catch (e) {
      error = (e as Error).message;
    }
    if (seq !== this._discoverSeq || this._disposed) {
      return;
    }
    this._discovered = clusters ? { query, clusters } : null;
    this._discoverError = error;
    this._discoverBusy = null;
    this._discoveryChanged.emit();
  }

  /**
   * Write a cluster profile for each cluster of the last discovery's region (existing ones
   * are kept), then reload the cluster list. Never throws: errors land in `discoverError`.
   */
  async addDiscoveredProfiles(): Promise<void> {
    const query = this._discovered?.query;
    if (!query) {
      this._discoverError = 'discover the clusters of a region first';
      this._discoveryChanged.emit();
      return;
    }
    const seq = this._startDiscovery('writing');
    let result: api.IDiscoverWritten | null = null;
    let error: string | null = null;
    try {
      result = await api.writeDiscoveredProfiles(query);
    } catch (e) {
      error = (e as Error).message;
    }
    if (seq !== this._discoverSeq || this._disposed) {
      return;
    }
    if (result) {
      this._discovered = { query, clusters: result.clusters };
      this._discoverWritten = result.written;
    }
    this._discoverError = error;
    this._discoverBusy = null;
    this._discoveryChanged.emit();
    if (result) {
      await this.refreshClusters();
    }
  }

  private _startDiscovery(busy: 'listing' | 'writing'): number {
    this._discoverBusy = busy;
    this._discoverError = null;
    this._discoverWritten = null;
    this._discoveryChanged.emit();
    return ++this._discoverSeq;
  }

  /** Load clusters and jobs, then keep the jobs fresh. */
  start(): void {
    if (this._timer !== null || this._disposed) {
      return;
    }
    void this.refresh();
    this._timer = window.setInterval(() => {
      const interval =
        this._active() && !document.hidden ? this._pollMs : this._idlePollMs;
      // jitter, so that tabs sharing the poll do not all ask at the same moment
      if (Date.now() - this._listAt >= interval * this._jitter && !this._polling) {
        this._polling = true;
        void this.refreshJobs().finally(() => {
          this._polling = false;
        });
      }
    }, Math.min(this._pollMs / 3, 1000));
  }

  /**
   * Reload clusters (with node health) and jobs, and the discovered HyperPod clusters when a
   * region was discovered before (same region and profile).
   */
  async refresh(): Promise<void> {
    const tasks = [this.refreshClusters(), this.refreshJobs()];
    if (this._discovered && this._discoverBusy === null) {
      tasks.push(this.discover(this._discovered.query));
    }
    await Promise.all(tasks);
  }

  /** Reload the cluster list and each cluster's health. */
  async refreshClusters(): Promise<void> {
    try {
      this._clusters = await api.listClusters();
      this._setError(null);
    } catch (e) {
      this._setError((e as Error).message);
      return;
    }
    this._clustersChanged.emit();
    await Promise.all(
      this._clusters.map(async c => {
        try {
          this._details.set(c.name, await api.getCluster(c.name));
        } catch (e) {
          this._details.set(c.name, {
            cluster: c,
            state: 'unreachable',
            error: (e as Error).message,
            nodes: []
          });
        }
        this._clustersChanged.emit();
      })
    );
  }

  /** Reload the job list. */
  async refreshJobs(): Promise<void> {
    let jobs: IJobView[];
    try {
      jobs = await api.listJobs();
      this._setError(null);
    } catch (e) {
      this._setError((e as Error).message);
      this._listAt = Date.now(); // retry after an interval, not at every tick
      return;
    }
    this._applyJobs(jobs);
    this._channel?.postMessage({ jobs });
  }

  private _applyJobs(jobs: IJobView[]): void {
    this._listAt = Date.now();
    this._jitter = 0.85 + 0.3 * Math.random();
    const signature = JSON.stringify(jobs);
    if (signature === this._jobsSignature) {
      return; // nothing changed: no re-render
    }
    this._jobsSignature = signature;
    for (const job of jobs) {
      this._noticeFromCounts(job);
    }
    this._jobs = jobs;
    this._jobsChanged.emit();
  }

  /** Select a job (or none) and stream its events. */
  select(jobId: string | null): void {
    if (jobId === this._selectedId) {
      return;
    }
    this._closeStream();
    this._selectedId = jobId;
    this._events = [];
    this._seen.clear();
    this._cursor = null;
    this._ended = false;
    this._resetMeasured();
    this._selectionChanged.emit();
    if (jobId) {
      this._openStream();
    }
  }

  /**
   * Submit a job and select it.
   * @throws {HyperPodAPIError} as `submitJob`
   */
  async submit(
    spec: Partial<IJobSpec>,
    notebook: string | null = null
  ): Promise<IJobView> {
    const job = await api.submitJob(spec, notebook);
    this._jobs = [job, ...this._jobs.filter(j => j.job_id !== job.job_id)];
    this._counts.set(job.job_id, { faults: 0, recoveries: 0 });
    this._jobsChanged.emit();
    this.select(job.job_id);
    return job;
  }

  /**
   * Cancel the selected job.
   * @throws {HyperPodAPIError} as `cancelJob`; Error when no job is selected
   */
  async cancelSelected(): Promise<IJobView> {
    const id = this._requireSelected();
    const job = await api.cancelJob(id);
    this._replaceJob(job);
    return job;
  }

  /**
   * SIGKILL `rank` of the selected job.
   * @throws {HyperPodAPIError} as `injectFault`; Error when no job is selected
   */
  async injectFailure(rank: number): Promise<api.IFaultInfo> {
    return api.injectFault(this._requireSelected(), rank);
  }

  /**
   * Log text of the selected job for `rank` (null: the whole job output).
   * @throws {HyperPodAPIError} as `getLogs`; Error when no job is selected
   */
  async logs(rank: number | null): Promise<string> {
    return api.getLogs(this._requireSelected(), rank);
  }

  /** Stop timers and the stream. */
  dispose(): void {
    this._disposed = true;
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
    this._channel?.close();
    this._channel = null;
    this._closeStream();
    this._resetMeasured();
    if (this._adviceTimer !== null) {
      window.clearTimeout(this._adviceTimer);
      this._adviceTimer = null;
    }
    Signal.clearData(this);
  }

  private _requireSelected(): string {
    if (!this._selectedId) {
      throw new Error('select a job in the HyperPod panel first');
    }
    return this._selectedId;
  }

  private _replaceJob(job: IJobView): void {
    this._jobs = this._jobs.map(j => (j.job_id === job.job_id ? job : j));
    this._jobsChanged.emit();
  }

  private _setError(error: string | null): void {
    if (error !== this._error) {
      this._error = error;
      this._errorChanged.emit();
    }
  }

  private _openStream(): void {
    const jobId = this._selectedId;
    if (!jobId || this._disposed) {
      return;
    }
    const opened = Date.now() / 1000;
    const ws = api.openEventStream(jobId, this._cursor, msg =>
      this._onMessage(jobId, msg, opened)
    );
    ws.onopen = () => {
      this._attempt = 0;
    };
    ws.onclose = () => {
      if (this._ws !== ws) {
        return;
      }
      this._ws = null;
      if (this._ended) {
        return; // the server sent everything of a finished job
      }
      const delay =
        RECONNECT_MS[Math.min(this._attempt, RECONNECT_MS.length - 1)];
      this._attempt++;
      this._reconnect = window.setTimeout(() => {
        this._reconnect = null;
        if (this._selectedId === jobId && !this._ws) {
          this._openStream();
        }
      }, delay);
    };
    this._ws = ws;
  }

  private _closeStream(): void {
    if (this._reconnect !== null) {
      window.clearTimeout(this._reconnect);
      this._reconnect = null;
    }
    const ws = this._ws;
    this._ws = null;
    if (ws) {
      ws.onclose = null;
      ws.close();
    }
    this._attempt = 0;
  }

  private _onMessage(jobId: string, msg: StreamMessage, opened: number): void {
    if (jobId !== this._selectedId) {
      return;
    }
    if (msg.type === 'event') {
      const ev = msg.event;
      this._cursor = msg.cursor;
      const key = `${ev.writer}\u0000${ev.seq}`;
      if (this._seen.has(key)) {
        return;
      }
      this._seen.add(key);
      this._events.push(ev);
      this._eventsAdded.emit([ev]);
      this._scheduleMeasure();
      // notify live faults/recoveries (not the history replayed on connect)
      if (ev.time >= opened - 5) {
        this._noticeFromEvent(ev);
      }
    } else if (msg.type === 'status') {
      this._replaceJob(msg.job);
    } else if (msg.type === 'end') {
      this._ended = true;
      this._scheduleMeasure(); // the final figures, with the job's last events
    }
  }

  private _resetMeasured(): void {
    if (this._measureTimer !== null) {
      window.clearTimeout(this._measureTimer);
      this._measureTimer = null;
    }
    this._measureSeq++;
    this._measureDirty = false;
    this._measuredAt = 0;
    if (this._measured !== null || this._measuredError !== null) {
      this._measured = null;
      this._measuredError = null;
      this._measuredChanged.emit();
    }
  }

  /**
   * Read the selected job's measured goodput soon: after `MEASURE_SETTLE_MS`, at most once
   * per `MEASURE_INTERVAL_MS`, never two reads at once, and only while the panel is visible
   * (a hidden panel reads when it is shown again).
   */
  private _scheduleMeasure(): void {
    this._measureDirty = true;
    if (this._measureTimer !== null || this._measuring || this._disposed) {
      return;
    }
    const wait = Math.max(
      MEASURE_SETTLE_MS,
      this._measuredAt + MEASURE_INTERVAL_MS - Date.now()
    );
    this._measureTimer = window.setTimeout(() => {
      this._measureTimer = null;
      const jobId = this._selectedId;
      if (!jobId || !this._measureDirty) {
        return;
      }
      if (!this._active() || document.hidden) {
        this._measuredAt = Date.now(); // look again in an interval
        this._scheduleMeasure();
        return;
      }
      this._measureDirty = false;
      this._measuring = true;
      const seq = this._measureSeq;
      api
        .getJobGoodput(jobId)
        .then(
          m => {
            if (seq === this._measureSeq) {
              this._measured = m;
              this._measuredError = null;
            }
          },
          e => {
            if (seq === this._measureSeq) {
              // 400 before the first steps: keep showing nothing, say why
              this._measuredError = (e as Error).message;
            }
          }
        )
        .finally(() => {
          this._measuring = false;
          if (this._disposed) {
            return;
          }
          if (seq === this._measureSeq) {
            this._measuredAt = Date.now();
            this._measuredChanged.emit();
          }
          if (this._measureDirty) {
            this._scheduleMeasure(); // events came in while reading (or another job's)
          }
        });
    }, wait);
  }

  private _noticeFromEvent(ev: IJobEvent): void {
    if (ev.kind === 'fault.detected') {
      // one fault makes several agents report: one notice per burst
      const last = this._lastFaultNotice.get(ev.job_id) ?? 0;
      this._lastFaultNotice.set(ev.job_id, ev.time);
      if (ev.time - last >= 5) {
        this._notice.emit({
          kind: 'fault',
          jobId: ev.job_id,
          message: `${ev.job_id}: ${describeEvent(ev)}`
        });
      }
    } else if (ev.kind === 'recovery.completed') {
      this._notice.emit({
        kind: 'recovery',
        jobId: ev.job_id,
        message: `${ev.job_id}: ${describeEvent(ev)}`
      });
    }
  }

  /** Notices for jobs that are not streamed: from the fault/recovery counts of the list. */
  private _noticeFromCounts(job: IJobView): void {
    const p = job.progress;
    if (!p) {
      return;
    }
    const known = this._counts.get(job.job_id);
    if (!known || job.job_id === this._selectedId) {
      // the selected job's notices come from its stream; and what happened before the
      // page loaded is history, not news
      this._counts.set(job.job_id, {
        faults: p.faults,
        recoveries: p.recoveries
      });
      return;
    }
    if (p.faults > known.faults) {
      known.faults = p.faults;
      this._notice.emit({
        kind: 'fault',
        jobId: job.job_id,
        message: `${job.job_id}: a rank failed (${p.faults} fault${p.faults === 1 ? '' : 's'} so far)`
      });
    }
    if (p.recoveries > known.recoveries) {
      known.recoveries = p.recoveries;
      const last = p.last_event;
      this._notice.emit({
        kind: 'recovery',
        jobId: job.job_id,
        message:
          last && last.kind === 'recovery.completed'
            ? `${job.job_id}: ${describeEvent(last)}`
            : `${job.job_id}: recovered`
      });
    }
  }

  private _pollMs: number;
  private _idlePollMs: number;
  private _active: () => boolean;
  private _polling = false;
  private _listAt = 0;
  private _jobsSignature = '';
  private _jitter = 1;
  private _channel: BroadcastChannel | null = null;
  private _timer: number | null = null;
  private _disposed = false;
  private _clusters: ICluster[] = [];
  private _details = new Map<string, IClusterDetail>();
  private _jobs: IJobView[] = [];
  private _selectedId: string | null = null;
  private _events: IJobEvent[] = [];
  private _seen = new Set<string>();
  private _cursor: string | null = null;
  private _ended = false;
  private _ws: WebSocket | null = null;
  private _attempt = 0;
  private _reconnect: number | null = null;
  private _error: string | null = null;
  private _lastFaultNotice = new Map<string, number>();
  private _counts = new Map<string, { faults: number; recoveries: number }>();
  private _clustersChanged = new Signal<this, void>(this);
  private _jobsChanged = new Signal<this, void>(this);
  private _selectionChanged = new Signal<this, void>(this);
  private _eventsAdded = new Signal<this, IJobEvent[]>(this);
  private _notice = new Signal<this, IJobNotice>(this);
  private _errorChanged = new Signal<this, void>(this);
  private _advice: api.IGoodputAdvice | null = null;
  private _adviceError: api.HyperPodAPIError | null = null;
  private _adviceTimer: number | null = null;
  private _adviceSeq = 0;
  private _adviceDone = 0;
  private _adviceChanged = new Signal<this, void>(this);
  private _measured: api.IMeasuredGoodput | null = null;
  private _measuredError: string | null = null;
  private _measuredAt = 0;
  private _measureTimer: number | null = null;
  private _measureSeq = 0;
  private _measuring = false;
  private _measureDirty = false;
  private _measuredChanged = new Signal<this, void>(this);
  private _discovered: { query: api.IDiscoverQuery; clusters: api.IDiscoveredCluster[] } | null = null;
  private _discoverError: string | null = null;
  private _discoverBusy: 'listing' | 'writing' | null = null;
  private _discoverWritten: { name: string; what: string }[] | null = null;
  private _discoverSeq = 0;
  private _discoveryChanged = new Signal<this, void>(this);
}
