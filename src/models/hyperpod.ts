/**
 * The state of the HyperPod panel: one model per concern (the other modules of `models/`),
 * composed here into the `IHyperPodModel` the plugin provides. The models own all timers,
 * requests (through `api/network.ts`) and the event WebSocket; views listen to their signals
 * and only render.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { FaultKind, IFaultInfo } from '../api/faults';
import * as api from '../api/network';
import { IJobSpec, IJobView, ISubmitOptions } from '../api/rest';
import { AdviceModel } from './advice';
import { ClustersModel } from './clusters';
import { DiscoveryModel } from './discovery';
import { JobsModel } from './jobs';
import { MeasuredGoodputModel } from './measured';
import { NoticesModel } from './notices';
import { JobStreamModel } from './stream';
import { IHyperPodModel } from './tokens';

/**
 * The composed model. Selecting a job streams its events (`stream`), whose `status` messages
 * update the job list (`jobs`) and whose events make `measured` read the job's goodput again;
 * `notices` watches the fault and recovery counts of every job's `progress`.
 */
export class HyperPodModel implements IHyperPodModel {
  /**
   * @param options.pollMs - job list refresh interval while `active()`, ms (default 3000)
   * @param options.idlePollMs - interval while not active (panel or tab hidden), ms (default 30000)
   * @param options.active - whether the panel is visible
   */
  constructor(
    options: { pollMs?: number; idlePollMs?: number; active?: () => boolean } = {}
  ) {
    this.clusters = new ClustersModel();
    this.jobs = new JobsModel(options);
    this.stream = new JobStreamModel();
    this.notices = new NoticesModel(this.jobs, this.stream);
    this.advice = new AdviceModel();
    this.measured = new MeasuredGoodputModel(this.stream, { active: options.active });
    this.discovery = new DiscoveryModel(this.clusters);
    this.stream.statusReceived.connect((_, job) => this.jobs.put(job), this);
    this.stream.jobChanged.connect(() => this._selectionChanged.emit(), this);
    this.clusters.errorChanged.connect(this._onError, this);
    this.jobs.errorChanged.connect(this._onError, this);
  }

  /** Cluster profiles and health. */
  readonly clusters: ClustersModel;
  /** The job list. */
  readonly jobs: JobsModel;
  /** The selected job's event stream. */
  readonly stream: JobStreamModel;
  /** Fault and recovery notices. */
  readonly notices: NoticesModel;
  /** The submit form's goodput advice. */
  readonly advice: AdviceModel;
  /** The selected job's measured goodput. */
  readonly measured: MeasuredGoodputModel;
  /** HyperPod cluster discovery. */
  readonly discovery: DiscoveryModel;

  /** The selected job id, or null. */
  get selectedId(): string | null {
    return this.stream.jobId;
  }
  /** The selected job's view, or null. */
  get selected(): IJobView | null {
    const id = this.stream.jobId;
    return id === null ? null : this.jobs.get(id);
  }
  /** Another job (or none) was selected. */
  get selectionChanged(): ISignal<this, void> {
    return this._selectionChanged;
  }
  /** The server error to show (of the job list, else of the clusters), or null. */
  get error(): string | null {
    return this.jobs.error ?? this.clusters.error;
  }
  /** `error` changed. */
  get errorChanged(): ISignal<this, void> {
    return this._errorChanged;
  }

  /** Select a job (or none) and stream its events. */
  select(jobId: string | null): void {
    this.stream.open(jobId);
  }

  /**
   * Submit a job and select it.
   * @throws {HyperPodAPIError} as `network.submitJob`
   */
  async submit(
    spec: Partial<IJobSpec>,
    notebook: string | null = null,
    options: ISubmitOptions = {}
  ): Promise<IJobView> {
    const job = await this.jobs.submit(spec, notebook, options);
    this.select(job.job_id);
    return job;
  }

  /**
   * Cancel the selected job.
   * @throws {HyperPodAPIError} as `network.cancelJob`; Error when no job is selected
   */
  async cancelSelected(): Promise<IJobView> {
    return this.jobs.cancel(this._requireSelected());
  }

  /**
   * Inject a fault of `kind` (default `kill`: SIGKILL) into `rank` of the selected job;
   * `factor`: the slowdown of `slow` (default the server's, 2).
   * @throws {HyperPodAPIError} as `network.injectFault`; Error when no job is selected
   */
  async injectFailure(
    rank: number,
    kind: FaultKind = 'kill',
    factor?: number
  ): Promise<IFaultInfo> {
    return api.injectFault(this._requireSelected(), rank, kind, factor);
  }

  /**
   * Log text of the selected job for `rank` (null: the whole job output).
   * @throws {HyperPodAPIError} as `network.getLogs`; Error when no job is selected
   */
  async logs(rank: number | null): Promise<string> {
    return api.getLogs(this._requireSelected(), rank);
  }

  /**
   * Reload clusters (with node health) and jobs, and the discovered HyperPod clusters when a
   * region was discovered before (same region and profile).
   */
  async refresh(): Promise<void> {
    await Promise.all([
      this.clusters.refresh(),
      this.jobs.refresh(),
      this.discovery.rediscover()
    ]);
  }

  /** Load clusters and jobs, then keep the jobs fresh. */
  start(): void {
    void this.clusters.refresh();
    this.jobs.start();
  }

  /** Stop timers and the stream, disconnect every listener. */
  dispose(): void {
    for (const model of [
      this.notices,
      this.measured,
      this.stream,
      this.jobs,
      this.clusters,
      this.advice,
      this.discovery
    ]) {
      model.dispose();
    }
    Signal.clearData(this);
  }

  /** @throws {Error} when no job is selected */
  private _requireSelected(): string {
    const id = this.stream.jobId;
    if (!id) {
      throw new Error('select a job in the HyperPod panel first');
    }
    return id;
  }

  private _onError(): void {
    const error = this.error;
    if (error !== this._error) {
      this._error = error;
      this._errorChanged.emit();
    }
  }

  private _error: string | null = null;
  private _selectionChanged = new Signal<this, void>(this);
  private _errorChanged = new Signal<this, void>(this);
}
