/**
 * The models' interfaces: the state of the HyperPod panel, one interface per concern, composed
 * into `IHyperPodModel`, and the token through which the plugin provides it.
 */
import { Token } from '@lumino/coreutils';
import { ISignal } from '@lumino/signaling';

import type { HyperPodAPIError } from '../api/errors';
import { IJobEvent } from '../api/events';
import { FaultKind, IFaultInfo } from '../api/faults';
import {
  IAdviceQuery,
  ICluster,
  IClusterDetail,
  IDiscoveredCluster,
  IDiscoverQuery,
  IGoodputAdvice,
  IJobSpec,
  IJobView,
  IMeasuredGoodput,
  ISubmitOptions
} from '../api/rest';

/** A notice the extension shows (fault, recovery): the notices model emits, the plugin notifies. */
export interface IJobNotice {
  /** `fault` or `recovery`. */
  kind: 'fault' | 'recovery';
  /** The job. */
  jobId: string;
  /** One line for the user. */
  message: string;
}

/** The cluster profiles and each one's reachability and nodes. */
export interface IClustersModel {
  /** Cluster profiles, as the server lists them. */
  readonly clusters: ICluster[];
  /** Health of each cluster by name (filled in by `refresh`). */
  readonly details: ReadonlyMap<string, IClusterDetail>;
  /** Why the last list could not be read, or null. */
  readonly error: string | null;
  /** The clusters or their health changed. */
  readonly changed: ISignal<IClustersModel, void>;
  /** `error` changed. */
  readonly errorChanged: ISignal<IClustersModel, void>;
  /** Reload the list and each cluster's health; never throws (see `error`). */
  refresh(): Promise<void>;
}

/** The job list, kept fresh by one shared poll. */
export interface IJobsModel {
  /** Jobs, newest first. */
  readonly jobs: IJobView[];
  /** Why the last list could not be read, or null. */
  readonly error: string | null;
  /** The job list changed (a poll, a submit, a cancel, a streamed status). */
  readonly changed: ISignal<IJobsModel, void>;
  /** A job was submitted from this page (emitted before `changed`). */
  readonly submitted: ISignal<IJobsModel, IJobView>;
  /** `error` changed. */
  readonly errorChanged: ISignal<IJobsModel, void>;
  /** The job with this id, or null. */
  get(jobId: string): IJobView | null;
  /** Put a newer view of a job in the list (replacing the one with its id, or first). */
  put(job: IJobView): void;
  /** Reload the list now; never throws (see `error`). */
  refresh(): Promise<void>;
  /**
   * Submit a job.
   * @throws {HyperPodAPIError} as `network.submitJob`
   */
  submit(spec: Partial<IJobSpec>, notebook?: string | null, options?: ISubmitOptions): Promise<IJobView>;
  /**
   * Cancel a job.
   * @throws {HyperPodAPIError} as `network.cancelJob`
   */
  cancel(jobId: string): Promise<IJobView>;
}

/** The event stream of one job (the selected one), resumed from its cursor after a drop. */
export interface IJobStreamModel {
  /** The streamed job's id, or null. */
  readonly jobId: string | null;
  /** Events of the streamed job, in arrival order, each once. */
  readonly events: IJobEvent[];
  /** The stream cursor after the last event received (opaque), or null. */
  readonly cursor: string | null;
  /** Whether the server said the job ended and sent all its events. */
  readonly ended: boolean;
  /** Another job (or none) is streamed; `events` was reset. */
  readonly jobChanged: ISignal<IJobStreamModel, void>;
  /** New events arrived (the new ones). */
  readonly eventsAdded: ISignal<IJobStreamModel, IJobEvent[]>;
  /** The server sent the streamed job's view (its status or its progress counts changed). */
  readonly statusReceived: ISignal<IJobStreamModel, IJobView>;
  /** The server sent every event of the ended job. */
  readonly endReceived: ISignal<IJobStreamModel, void>;
  /** Stream the events of `jobId` (null: none), from its first event. */
  open(jobId: string | null): void;
}

/** Fault and recovery notices, from the increases of `progress.faults` / `progress.recoveries`. */
export interface INoticesModel {
  /** A job's fault or recovery count went up. */
  readonly notice: ISignal<INoticesModel, IJobNotice>;
}

/** The goodput advice for the submit form's inputs (`GET goodput/advice`). */
export interface IAdviceModel {
  /** The advice for the last query, or null (none asked, or an error). */
  readonly advice: IGoodputAdvice | null;
  /** Why the last advice could not be had (the server's error names the input), or null. */
  readonly error: HyperPodAPIError | null;
  /** Whether an advice request is waiting or running. */
  readonly loading: boolean;
  /** The advice, its error or its loading state changed. */
  readonly changed: ISignal<IAdviceModel, void>;
  /**
   * Ask for the advice for `query` after a quiet time without a newer call; answers of older
   * queries are dropped. `null` cancels and clears the advice.
   */
  request(query: IAdviceQuery | null): void;
}

/** The streamed job's measured goodput (`GET jobs/{id}/goodput`), read again as events come. */
export interface IMeasuredGoodputModel {
  /** The measurement, or null. */
  readonly measured: IMeasuredGoodput | null;
  /** Why there is no measurement (e.g. no step events yet), or null. */
  readonly error: string | null;
  /** The measurement was read again (or reset for another job). */
  readonly changed: ISignal<IMeasuredGoodputModel, void>;
}

/** Discovery of the HyperPod clusters of an AWS region, and writing their profiles. */
export interface IDiscoveryModel {
  /** The query and the clusters of the last discovery, or null before one (and after an error). */
  readonly discovered: { query: IDiscoverQuery; clusters: IDiscoveredCluster[] } | null;
  /** Why the last discovery or profile write failed (the server's message), or null. */
  readonly error: string | null;
  /** `listing` or `writing` while a request runs, else null. */
  readonly busy: 'listing' | 'writing' | null;
  /** The profiles the last "add profiles" wrote or kept, or null. */
  readonly written: { name: string; what: string }[] | null;
  /** The result, error, busy state or written profiles changed. */
  readonly changed: ISignal<IDiscoveryModel, void>;
  /** List the HyperPod clusters of `query`'s region; never throws (see `error`). */
  discover(query: IDiscoverQuery): Promise<void>;
  /** List the clusters of the last discovery's region again, if there was one and none runs. */
  rediscover(): Promise<void>;
  /**
   * Write a profile for each cluster of the last discovery (existing ones are kept), then
   * reload the clusters; never throws (see `error`).
   */
  addProfiles(): Promise<void>;
}

/**
 * The state of the HyperPod panel: one model per concern, composed, and the selection that
 * ties the job list to the event stream and the measured goodput.
 */
export interface IHyperPodModel {
  /** Cluster profiles and health. */
  readonly clusters: IClustersModel;
  /** The job list. */
  readonly jobs: IJobsModel;
  /** The selected job's event stream. */
  readonly stream: IJobStreamModel;
  /** Fault and recovery notices. */
  readonly notices: INoticesModel;
  /** The submit form's goodput advice. */
  readonly advice: IAdviceModel;
  /** The selected job's measured goodput. */
  readonly measured: IMeasuredGoodputModel;
  /** HyperPod cluster discovery. */
  readonly discovery: IDiscoveryModel;
  /** The selected job id, or null. */
  readonly selectedId: string | null;
  /** The selected job's view, or null. */
  readonly selected: IJobView | null;
  /** Another job (or none) was selected. */
  readonly selectionChanged: ISignal<IHyperPodModel, void>;
  /** The server error to show (of the cluster or the job list), or null. */
  readonly error: string | null;
  /** `error` changed. */
  readonly errorChanged: ISignal<IHyperPodModel, void>;
  /** Select a job (or none) and stream its events. */
  select(jobId: string | null): void;
  /**
   * Submit a job and select it.
   * @throws {HyperPodAPIError} as `network.submitJob`
   */
  submit(spec: Partial<IJobSpec>, notebook?: string | null, options?: ISubmitOptions): Promise<IJobView>;
  /**
   * Cancel the selected job.
   * @throws {HyperPodAPIError} as `network.cancelJob`; Error when no job is selected
   */
  cancelSelected(): Promise<IJobView>;
  /**
   * Inject a fault into `rank` of the selected job: `kind` (default `kill`: SIGKILL; also `node`,
   * `exception`, `hang`, `slow`) and, for `slow`, its `factor` (default 2).
   * @throws {HyperPodAPIError} as `network.injectFault`; Error when no job is selected
   */
  injectFailure(
    rank: number,
    kind?: FaultKind,
    factor?: number
  ): Promise<IFaultInfo>;
  /**
   * Log text of the selected job for `rank` (null: the whole job output).
   * @throws {HyperPodAPIError} as `network.getLogs`; Error when no job is selected
   */
  logs(rank: number | null): Promise<string>;
  /** Reload clusters and jobs, and the last discovery's region. */
  refresh(): Promise<void>;
  /** Load clusters and jobs, then keep the jobs fresh. */
  start(): void;
  /** Stop timers and the stream. */
  dispose(): void;
}

/** The token through which the plugin provides the HyperPod panel's state. */
export const IHyperPodModel = new Token<IHyperPodModel>(
  'hyperpod-lab:IHyperPodModel',
  'The state of the HyperPod panel: clusters, jobs, the selected job stream, notices, goodput and discovery.'
);
