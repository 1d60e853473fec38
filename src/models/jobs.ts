/** The job list, kept fresh by one poll that the browser tabs of a server share. */
import { ISignal, Signal } from '@lumino/signaling';

import * as api from '../api/network';
import { IJobSpec, IJobView, ISubmitOptions } from '../api/rest';
import { IJobsModel } from './tokens';
import { ServerStateModel } from './serverState';

/**
 * The job list.
 *
 * Jobs are refreshed by one `GET hyperpod/jobs` every `pollMs` (the server answers from its
 * cache; it never polls the cluster per request). The browser tabs of one Jupyter server
 * share that poll: each tab broadcasts the list it fetched (`BroadcastChannel`), and a tab
 * that received a list recently enough skips its own request, so N open tabs cost the server
 * about one request per interval, not N. `changed` fires when the list changed (a poll, a
 * submit, a cancel, a streamed status), `error` says why the last list could not be read.
 */
export class JobsModel extends ServerStateModel implements IJobsModel {
  /**
   * @param options.pollMs - refresh interval while `active()`, ms (default 3000)
   * @param options.idlePollMs - interval while not active (panel or tab hidden), ms (default 30000)
   * @param options.active - whether the panel is visible
   */
  constructor(
    options: { pollMs?: number; idlePollMs?: number; active?: () => boolean } = {}
  ) {
    super();
    this._pollMs = options.pollMs ?? 3000;
    this._idlePollMs = options.idlePollMs ?? 30000;
    this._active = options.active ?? (() => true);
    if (typeof BroadcastChannel !== 'undefined') {
      this._channel = new BroadcastChannel(`hyperpod-lab:jobs:${api.serverScope()}`);
      this._channel.onmessage = (msg: MessageEvent) => {
        const jobs = (msg.data as { jobs?: IJobView[] } | null)?.jobs;
        if (Array.isArray(jobs)) {
          this._apply(jobs);
        }
      };
    }
  }

  /** Jobs, newest first. */
  get jobs(): IJobView[] {
    return this._jobs;
  }
  /** A job was submitted from this page (emitted before `changed`). */
  get submitted(): ISignal<this, IJobView> {
    return this._submitted;
  }
  /** The job with this id, or null. */
  get(jobId: string): IJobView | null {
    return this._jobs.find(j => j.job_id === jobId) ?? null;
  }

  /** Put a newer view of a job in the list (replacing the one with its id, or first). */
  put(job: IJobView): void {
    const known = this._jobs.some(j => j.job_id === job.job_id);
    this._jobs = known
      ? this._jobs.map(j => (j.job_id === job.job_id ? job : j))
      : [job, ...this._jobs];
    this._changed.emit();
  }

  /** Refresh now, then every `pollMs` (`idlePollMs` while not active), until `dispose`. */
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
        void this.refresh().finally(() => {
          this._polling = false;
        });
      }
    }, Math.min(this._pollMs / 3, 1000));
  }

  /** Reload the list and share it with the other tabs; never throws (see `error`). */
  async refresh(): Promise<void> {
    let jobs: IJobView[];
    try {
      jobs = await api.listJobs();
      this._setError(null);
    } catch (e) {
      this._setError((e as Error).message);
      this._listAt = Date.now(); // retry after an interval, not at every tick
      return;
    }
    this._apply(jobs);
    this._channel?.postMessage({ jobs });
  }

  /**
   * Submit a job and put it first in the list.
   * @throws {HyperPodAPIError} as `network.submitJob`
   */
  async submit(
    spec: Partial<IJobSpec>,
    notebook: string | null = null,
    options: ISubmitOptions = {}
  ): Promise<IJobView> {
    const job = await api.submitJob(spec, notebook, options);
    this._submitted.emit(job);
    this.put(job);
    return job;
  }

  /**
   * Cancel a job and put its new view in the list.
   * @throws {HyperPodAPIError} as `network.cancelJob`
   */
  async cancel(jobId: string): Promise<IJobView> {
    const job = await api.cancelJob(jobId);
    this.put(job);
    return job;
  }

  /** Stop the poll and the channel, disconnect the listeners. */
  override dispose(): void {
    this._disposed = true;
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
    this._channel?.close();
    this._channel = null;
    super.dispose();
  }

  private _apply(jobs: IJobView[]): void {
    this._listAt = Date.now();
    this._jitter = 0.85 + 0.3 * Math.random();
    const signature = JSON.stringify(jobs);
    if (signature === this._signature) {
      return; // nothing changed: no re-render
    }
    this._signature = signature;
    this._jobs = jobs;
    this._changed.emit();
  }

  private _pollMs: number;
  private _idlePollMs: number;
  private _active: () => boolean;
  private _polling = false;
  private _listAt = 0;
  private _signature = '';
  private _jitter = 1;
  private _channel: BroadcastChannel | null = null;
  private _timer: number | null = null;
  private _disposed = false;
  private _jobs: IJobView[] = [];
  private _submitted = new Signal<this, IJobView>(this);
}
