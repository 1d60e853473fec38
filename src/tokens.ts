/**
 * The contract of the extension: the job event stream types (schema version 1), the REST /
 * WebSocket types of the server extension, and the models' interfaces with the
 * `IHyperPodModel` token through which the plugin provides the panel state.
 *
 * The event types mirror the JSON records written by the Python side
 * (`hyperpod_lab.events`): one object per line, each carrying the
 * schema version, the event kind, the job it belongs to, a wall-clock
 * timestamp, the writer that produced it, a per-writer sequence number
 * and a kind-specific payload.
 */

import { Token } from '@lumino/coreutils';
import { ISignal } from '@lumino/signaling';

import type { HyperPodAPIError } from './request';

/** The event schema version these types describe. */
export const EVENT_SCHEMA_VERSION = 1 as const;

/** Every event kind defined by schema v1, in lifecycle order. */
export const EVENT_KINDS = [
  'submitted',
  'started',
  'step',
  'checkpoint.saved',
  'checkpoint.restored',
  'checkpoint.corrupt',
  'checkpoint.failed',
  'fault.detected',
  'recovery.started',
  'recovery.completed',
  'recovery.fallback',
  'elastic.scaled',
  'health.checked',
  'health.failed',
  'node.excluded',
  'straggler.detected',
  'job.failed',
  'finished'
] as const;

/** One of the event kinds of schema v1. */
export type EventKind = (typeof EVENT_KINDS)[number];

/** A JSON value as it can appear in an event payload. */
export type JSONValue =
  | string
  | number
  | boolean
  | null
  | JSONValue[]
  | { [key: string]: JSONValue };

/** The kind-specific payload of an event. */
export type EventData = { [key: string]: JSONValue };

/** A single job event, schema v1. */
export interface IJobEvent<K extends EventKind = EventKind> {
  /** Schema version; always 1 for these types. */
  v: typeof EVENT_SCHEMA_VERSION;
  /** What happened. */
  kind: K;
  /** The job the event belongs to. */
  job_id: string;
  /** When it happened, in seconds since the Unix epoch (may be fractional). */
  time: number;
  /** Who wrote the event (for example the submitting client or a rank). */
  writer: string;
  /** Sequence number of the event within its writer's stream. */
  seq: number;
  /** Kind-specific payload. */
  data: EventData;
}

/** Whether a string names an event kind of schema v1. */
export function isEventKind(value: unknown): value is EventKind {
  return (
    typeof value === 'string' &&
    (EVENT_KINDS as readonly string[]).includes(value)
  );
}

/** Whether a parsed JSON value has the shape of a schema v1 event. */
export function isJobEvent(value: unknown): value is IJobEvent {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    return false;
  }
  const record = value as { [key: string]: unknown };
  return (
    record.v === EVENT_SCHEMA_VERSION &&
    isEventKind(record.kind) &&
    typeof record.job_id === 'string' &&
    typeof record.time === 'number' &&
    typeof record.writer === 'string' &&
    typeof record.seq === 'number' &&
    Number.isInteger(record.seq) &&
    typeof record.data === 'object' &&
    record.data !== null &&
    !Array.isArray(record.data)
  );
}

/* ---- REST / WebSocket contract of the server extension (`hyperpod_lab.server`) ---- */

/** A cluster profile as `GET hyperpod/clusters` lists it. */
export interface ICluster {
  /** Profile name, e.g. `local-slurm`. */
  name: string;
  /** `slurm`, `eks` or `local`. */
  orchestrator: string;
  /** Login node host (slurm), when any. */
  host?: string | null;
  /** Login node SSH port (slurm), when any. */
  port?: number | null;
  /** Default partition, when any. */
  partition?: string | null;
  /** Other profile fields. */
  [key: string]: JSONValue | undefined;
}

/** One node of a cluster (Slurm: a line of `sinfo -N`). */
export interface IClusterNode {
  /** Node name, e.g. `n1`. */
  name: string;
  /** Scheduler state, e.g. `idle`, `mixed`, `alloc`, `down`. */
  state: string;
  /** CPUs of the node. */
  cpus?: number | null;
  /** Partitions the node belongs to. */
  partitions?: string[];
}

/** `GET hyperpod/clusters/{name}`: the profile, reachability and node health. */
export interface IClusterDetail {
  /** The profile. */
  cluster: ICluster;
  /** `up` or `unreachable`. */
  state: 'up' | 'unreachable' | string;
  /** Why the cluster is unreachable, or null. */
  error: string | null;
  /** The cluster's nodes. */
  nodes: IClusterNode[];
}

/** What a job view knows about progress, from the server's event cache. */
export interface IJobProgress {
  /** Last completed step (0-based), or null before the first. */
  step: number | null;
  /** Steps the job will run in total, when known. */
  total_steps: number | null;
  /** Training loss of the last step event. */
  loss: number | null;
  /** Throughput, optimizer steps per second. */
  steps_per_s: number | null;
  /** The newest event of the job. */
  last_event: IJobEvent | null;
  /** `fault.detected` events so far. */
  faults: number;
  /** `recovery.completed` events so far. */
  recoveries: number;
  /** Total seconds of downtime of the job's recoveries so far (absent from older servers). */
  downtime_s?: number;
  /** Seconds of downtime of the last recovery, or null before the first (absent from older servers). */
  last_downtime_s?: number | null;
  /** Nodes the job excluded (`node.excluded`), in the order first excluded (absent from older servers). */
  excluded_nodes?: IExcludedNode[];
  /** Each node's newest pre-flight health-check result, by node name (absent from older servers). */
  health?: { [node: string]: INodeHealth };
  /** Seconds of the pre-flight health-check runs (absent from older servers). */
  preflight_s?: number;
  /** The ranks flagged as stragglers now (`straggler.detected`; absent from older servers). */
  stragglers?: IStraggler[];
}

/** A rank flagged as a straggler (`progress.stragglers`): consistently slower than the others. */
export interface IStraggler {
  /** Global rank. */
  rank: number;
  /** Its node, or null. */
  node: string | null;
  /** Its median step compute time over the other ranks' (> 1 is slower). */
  score: number | null;
  /** Its median step time, seconds. */
  step_s: number | null;
  /** The other ranks' median step time, seconds. */
  median_step_s: number | null;
}

/** A node the job excluded (`progress.excluded_nodes`): its next placements avoid it. */
export interface IExcludedNode {
  /** Node name, e.g. `n2`. */
  node: string;
  /** Why, e.g. `faulted twice` or `health check failed: shm`; null when only listed by a later event. */
  reason: string | null;
  /** Faults counted on the node in this job, or null. */
  faults: number | null;
  /** When it was excluded, seconds since the epoch. */
  time: number;
}

/** A node's pre-flight health-check result (`progress.health[node]`). */
export interface INodeHealth {
  /** No check failed. */
  ok: boolean;
  /** The failed checks (`gpu`, `shm`, `storage`, `versions`, `clock`) and their detail. */
  failed: { [check: string]: string | null };
  /** The checks that could not run on the node. */
  skipped: string[];
  /** Seconds the node's checks took, or null. */
  seconds: number | null;
  /** When the result came, seconds since the epoch. */
  time: number;
}

/** A job: its record (`hyperpod_lab.submit.jobs.JobRecord`) plus progress. */
export interface IJobView {
  /** hyperpod-lab job id. */
  job_id: string;
  /** Job name as given. */
  name: string;
  /** Cluster profile name. */
  cluster: string;
  /** Orchestrator of the cluster. */
  orchestrator: string;
  /** The scheduler's id (Slurm job id, launcher pid). */
  native_id: string;
  /** Job directory on the cluster's shared storage. */
  job_dir: string;
  /** The JobSpec as submitted. */
  spec: IJobSpec;
  /** `pending`, `running`, `completed`, `failed`, `cancelled` or `unknown`. */
  status: string;
  /** Exit code, when known. */
  exit_code: number | null;
  /** Seconds since the epoch. */
  submitted_at: number;
  /** Seconds since the epoch. */
  updated_at: number;
  /** Why the job ended, when the scheduler said. */
  reason: string | null;
  /** Progress from the job's events. */
  progress?: IJobProgress;
}

/** Terminal job states (no more events after `end`). */
export const TERMINAL_STATES = ['completed', 'failed', 'cancelled'] as const;

/** Whether a job state is terminal. */
export function isTerminal(status: string): boolean {
  return (TERMINAL_STATES as readonly string[]).includes(status);
}

/** The resiliency policy of a JobSpec (`hyperpod_lab.spec.ResiliencyPolicy`). */
export interface IResiliencyPolicy {
  auto_resume: boolean;
  max_retries: number;
  health_checks: boolean;
  /** `restart` or `checkpointless`. */
  recovery?: string;
  /** EKS: only nodes that passed a deep health check. */
  deep_health_check?: boolean;
  /** Spare nodes beyond `nodes`: a spare replaces a lost or excluded node with no requeue. */
  spares?: number;
  /** Restart-storm guard K (1 to 1000, default 3): the job stops retrying after K restarts in a
   * row without step progress, or ended by the same fault with no new checkpoint (docs/restart-storms.md). */
  storm_restarts?: number;
}

/** The checkpoint policy of a JobSpec (`hyperpod_lab.spec.CheckpointPolicy`); intervals in steps. */
export interface ICheckpointPolicy {
  every_steps: number;
  keep_last: number;
  memory_every_steps: number | null;
  s3_uri: string | null;
  s3_every_steps: number | null;
}

/** The elastic policy of a JobSpec (`hyperpod_lab.spec.ElasticPolicy`); bounds in nodes. */
export interface IElasticPolicy {
  min_nodes: number | null;
  max_nodes: number | null;
  global_batch_size: number | null;
  lr_rule: 'none' | 'linear' | 'sqrt';
}

/** A JobSpec as `JobSpec.to_dict()` writes it (`hyperpod_lab.spec.JobSpec`). */
export interface IJobSpec {
  script: string;
  name: string;
  cluster: string;
  nodes: number;
  procs_per_node: number;
  args: string[];
  env: { [key: string]: string };
  /** Names of variables passed from the Jupyter server's environment, never stored. */
  secret_env: string[];
  /** Slurm: the nodes are the job's alone; null: the profile decides (on with GPUs). */
  exclusive?: boolean | null;
  partition: string | null;
  time_limit_min: number | null;
  resiliency: IResiliencyPolicy;
  checkpoint: ICheckpointPolicy;
  elastic: IElasticPolicy;
  /** TensorBoard event files of the step metrics in `<job_dir>/tensorboard` (docs/tensorboard.md). */
  tensorboard?: 'off' | 'rank0' | 'all-ranks';
  version: number;
}

/** A message of the `hyperpod/jobs/{id}/stream` WebSocket. */
export type StreamMessage =
  | { type: 'event'; event: IJobEvent; cursor: string }
  | { type: 'status'; job: IJobView }
  | { type: 'end' };

/** The JSON body of an error response: `{"error": {...}}`. */
export interface IErrorBody {
  error: { type: string; message: string; field?: string };
}

/** What `POST jobs/{id}/faults` answers: the rank that was SIGKILLed. */
export interface IFaultInfo {
  rank: number;
  node?: string;
  pid?: number;
  [key: string]: unknown;
}

/** One line of `GET jobs/{id}/logs/triage`: identical lines of several ranks collapsed. */
export interface ITriageLine {
  /** The line, without its newline (cut at 4096 characters). */
  text: string;
  /** The ranks that printed it, ascending. */
  ranks: number[];
  /** Rank -> byte offset of the line in that rank's log file. */
  offsets: { [rank: string]: number };
  /** Rank -> its log file, relative to the job directory. */
  sources?: { [rank: string]: string };
  /** torchrun's attempt (restart count, 0 first), or null for a backend's own log. */
  attempt?: number | null;
  /** `stdout`, `stderr` or `log`. */
  stream?: string;
}

/** The first failing rank and its traceback (`hyperpod_lab.submit.logtriage.first_failure`). */
export interface ITriageFailure {
  rank: number;
  node: string | null;
  /** Its log file, relative to the job directory (null: no traceback found). */
  source: string | null;
  attempt: number | null;
  /** Byte offset of `Traceback (most recent call last):` in `source`. */
  offset: number | null;
  end: number | null;
  /** The final exception line, e.g. `RuntimeError: ...`. */
  exception: string | null;
  exception_offset: number | null;
  traceback_text: string | null;
  /** `python`, `fatal` or `childfailed`. */
  kind: string | null;
  /** Seconds since the epoch, when known. */
  time: number | null;
  /** How the rank was found: its `fault.detected` event, torchrun's error file, or the logs. */
  found_by: 'event' | 'error_file' | 'log';
}

/** A search match of `GET jobs/{id}/logs/triage?q=...`. */
export interface ITriageMatch {
  rank: number;
  source: string;
  attempt: number | null;
  stream: string;
  offset: number;
  text: string;
}

/** What `GET jobs/{id}/logs/triage` answers (view, search or traceback window). */
export interface ILogTriage {
  job_id: string;
  ranks: number[];
  known_ranks?: number[];
  nodes: { [rank: string]: string | null };
  lines?: ITriageLine[];
  matches?: ITriageMatch[];
  first_failure: ITriageFailure | null;
  /** Send back to read on (follow mode: only new lines; search: the next part). */
  cursor: string;
  sizes?: { [rank: string]: { [source: string]: number | null } };
  /** Rank -> bytes read for this answer. */
  read?: { [rank: string]: number };
  more?: boolean;
  scanned?: number;
  done?: boolean;
  bytes_read: number;
}

/** One recovery mode of `GET goodput/advice` (`hyperpod_lab.goodput.advise`). */
export interface IGoodputMode {
  /** Recommended checkpoint interval, seconds (a whole number of steps). */
  interval_s: number;
  /** Recommended checkpoint interval, steps. */
  interval_steps: number;
  /** First-order Young interval, seconds. */
  young_interval_s: number;
  /** Projected fraction of wall time spent on useful steps, 0..1. */
  goodput: number;
  /** Fractions of wall time lost, by cause (checkpoint, detect, restart, restore, heal, recompute). */
  lost: { [cause: string]: number };
  /** Probability that a failure needs the checkpoint (1 for checkpoint-restart). */
  fallback_probability: number;
}

/** What `GET goodput/advice` answers (fields used by the sidebar; the server sends more). */
export interface IGoodputAdvice {
  instances: number;
  failure_rate_per_instance_hour: number;
  /** Cluster mean time between failures, hours. */
  mtbf_hours: number;
  failures_per_day: number;
  checkpoint_cost_s: number;
  step_time_s: number;
  /** By recovery mode: `checkpoint-restart`, `checkpointless`. */
  modes: { [mode: string]: IGoodputMode };
  /** What the projection assumed or doubts (an implausible rate, the replicas it chose). */
  warnings?: string[];
}

/** The inputs of the advice: instances and the failure rate, checkpoint cost and step time. */
export interface IAdviceQuery {
  /** Instances (nodes), at least 1. */
  instances: number;
  /** Per instance-hour: a fraction (`0.0004`) or a percentage (`0.04%`), as typed. */
  failureRate: string;
  /** Seconds one checkpoint blocks training. */
  checkpointCostS: number;
  /** Seconds per training step. */
  stepTimeS: number;
}

/** What `GET jobs/{id}/goodput` answers (`hyperpod_lab.goodput.measure_from_events`). */
export interface IMeasuredGoodput {
  job_id: string;
  /** First start to the last event, seconds. */
  wall_s: number;
  /** Useful steps. */
  steps: number;
  /** Seconds per step, null with fewer than two steps of one run. */
  step_time_s: number | null;
  useful_s: number | null;
  /** useful_s / wall_s, 0..1, or null (no step time yet). */
  goodput: number | null;
  /** Recoveries measured. */
  faults: number;
  /**
   * Seconds lost by cause: health_check (pre-flight node health checks; absent from older
   * servers), checkpoint, detect, restart, restore, recompute, other (null: unknown).
   */
  lost_s: { [cause: string]: number | null };
  /** lost_s / wall_s. */
  lost_fraction: { [cause: string]: number | null };
}

/** One instance group of a discovered HyperPod cluster. */
export interface IInstanceGroup {
  /** `InstanceGroupName`. */
  name: string;
  /** e.g. `ml.p5.48xlarge`. */
  instance_type: string;
  /** Instances running now. */
  current_count: number;
  /** Instances asked for. */
  target_count: number;
}

/**
 * A HyperPod cluster as `GET discover` describes it (`DiscoveredCluster.to_dict()` of
 * `hyperpod_lab.submit.discovery`: the SageMaker API's `describe_cluster` and `list_cluster_nodes`).
 */
export interface IDiscoveredCluster {
  /** `ClusterName`. */
  name: string;
  arn: string;
  /** `ClusterStatus`: `InService`, `Creating`, `Updating`, `Failed`, ... */
  status: string;
  region: string;
  /** `slurm` or `eks`. */
  orchestrator: string;
  eks_cluster_arn?: string | null;
  node_recovery?: string | null;
  instance_groups: IInstanceGroup[];
  /** Node count per `InstanceStatus.Status` (`Running`, `Pending`, `Failure`, ...). */
  node_health: { [status: string]: number };
  /** Other fields (nodes, events, events_note). */
  [key: string]: unknown;
}

/** What `POST discover` answers: the clusters and, per cluster, the profile it wrote or kept. */
export interface IDiscoverWritten {
  clusters: IDiscoveredCluster[];
  /** `what`: `written` or `kept` (a profile of that name exists and `overwrite` was false). */
  written: { name: string; what: string }[];
}

/** The AWS account the server asks for the clusters (both empty: the server's AWS defaults). */
export interface IDiscoverQuery {
  /** AWS region, e.g. `us-west-2` (empty: `AWS_REGION` / the AWS config on the server). */
  region: string;
  /** AWS named profile (empty: the default credentials chain on the server). */
  profile: string;
}

/* ---- The models: state of the HyperPod panel, provided through `IHyperPodModel` ---- */

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
   * @throws {HyperPodAPIError} as `request.submitJob`
   */
  submit(spec: Partial<IJobSpec>, notebook?: string | null, options?: ISubmitOptions): Promise<IJobView>;
  /**
   * Cancel a job.
   * @throws {HyperPodAPIError} as `request.cancelJob`
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
   * @throws {HyperPodAPIError} as `request.submitJob`
   */
  submit(spec: Partial<IJobSpec>, notebook?: string | null, options?: ISubmitOptions): Promise<IJobView>;
  /**
   * Cancel the selected job.
   * @throws {HyperPodAPIError} as `request.cancelJob`; Error when no job is selected
   */
  cancelSelected(): Promise<IJobView>;
  /**
   * Inject a fault into `rank` of the selected job: `kind` (default `kill`: SIGKILL; also `node`,
   * `exception`, `hang`, `slow`) and, for `slow`, its `factor` (default 2).
   * @throws {HyperPodAPIError} as `request.injectFault`; Error when no job is selected
   */
  injectFailure(
    rank: number,
    kind?: 'kill' | 'node' | 'exception' | 'hang' | 'slow',
    factor?: number
  ): Promise<IFaultInfo>;
  /**
   * Log text of the selected job for `rank` (null: the whole job output).
   * @throws {HyperPodAPIError} as `request.getLogs`; Error when no job is selected
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

// ---- job dashboard (issue 18; GET jobs/{id}/dashboard, hyperpod_lab/fold/aggregate.py) ----------

/** A run on a lane: consecutive steps, or consecutive checkpoints of one tier. */
export interface IDashboardSpan {
  kind: 'step' | 'checkpoint';
  /** First and last event's time, seconds since the epoch. */
  t0: number;
  t1: number;
  /** First and last step of the run. */
  step0: number;
  step1: number;
  /** Events in the run. */
  count: number;
  /** Checkpoints: memory, peer, persistent, s3, replica. */
  tier?: string;
}

/** A point event on a lane (fault, hang, recovery, straggler, health, exclusion, scaling, ...). */
export interface IDashboardMark {
  /** The event kind, e.g. `fault.detected`. */
  kind: EventKind | string;
  /** fault, hang, recovery, restore, straggler, health, exclusion, scaling, checkpoint-error, lifecycle. */
  cat: string;
  /** Seconds since the epoch. */
  t: number;
  /** null on the job lane. */
  rank: number | null;
  label: string;
  writer: string;
  seq: number;
  node?: string;
  step?: number;
  restored_step?: number;
  tier?: string;
  reason?: string;
  downtime_s?: number;
  score?: number;
  /** Faults: false for one another rank's fault caused (e.g. a sibling SIGTERMed). */
  root_cause?: boolean;
}

/** One entry of the compact timeline: a checkpoint span per tier, or a mark. */
/** Options of a submission besides its JobSpec (`POST jobs`). */
export interface ISubmitOptions {
  /**
   * Submit without comparing the notebook's environment with the cluster interpreter's
   * (`skip_env_check`; the CLI's `--skip-env-check`). Default false.
   */
  skipEnvCheck?: boolean;
}

export interface IDashboardTimelineEntry {
  kind: string;
  cat: string;
  t: number;
  label: string;
  t1?: number;
  tier?: string;
  step0?: number;
  step1?: number;
  count?: number;
  ranks?: number[];
  rank?: number | null;
  node?: string;
  /** `health.checked` entries: whether the node's pre-flight checks passed. */
  ok?: boolean;
  writer?: string;
  seq?: number;
}

/** The step series, downsampled by min/max buckets. */
export interface IDashboardSeries {
  step: number[];
  loss: (number | null)[];
  steps_per_s: (number | null)[];
  /** Seconds since the epoch (the bucket's last event). */
  t: number[];
  /** Steps per bucket. */
  width: number;
  points: number;
}

/** What `GET jobs/{id}/dashboard` answers. */
export interface IJobDashboard {
  job_id: string;
  t0: number | null;
  t1: number | null;
  /** Highest step + 1, or null before any step. */
  steps: number | null;
  ranks: number[];
  /** Events folded so far. */
  events: number;
  /** True while more events wait unread (the server folds more on each request): ask again. */
  partial?: boolean;
  dropped_marks?: number;
  /** `job` and one lane per rank (`"0"`, `"1"`, ...). */
  lanes: { [lane: string]: { spans: IDashboardSpan[]; marks: IDashboardMark[] } };
  timeline: IDashboardTimelineEntry[];
  series: IDashboardSeries;
}

// ---- environment parity (GET clusters/{name}/env, POST clusters/{name}/env/export) -----------

/** One compared item of the environment diff (`hyperpod_lab.submit.envparity.Difference`). */
export interface IEnvDifference {
  /** `python`, `torch`, `torch CUDA build`, `hyperpod-lab`, `event schema` or `package <module>`. */
  item: string;
  /** The notebook's value (null: not installed). */
  local: string | null;
  /** The cluster interpreter's value (null: not installed). */
  remote: string | null;
  /** `error` refuses a submission; `warning` may change results; `ok` the same. */
  severity: 'ok' | 'warning' | 'error';
  /** One line naming both values and the fix. */
  message: string;
}

/** What `GET clusters/{name}/env?script=PATH` answers. */
export interface IEnvDiff {
  cluster: string;
  /** False on EKS (the interpreter is in the job's image): `message` says why. */
  supported: boolean;
  message?: string;
  /** The cluster interpreter (the profile's `python`). */
  python?: string;
  script?: string | null;
  summary?: 'ok' | 'warning' | 'error';
  differences?: IEnvDifference[];
}

/** What `POST clusters/{name}/env/export` answers. */
export interface IEnvExport {
  cluster: string;
  name: string;
  /** `<shared_root>/hyperpod-lab/envs/<name>/requirements.txt` on the cluster. */
  path: string;
  venv: string;
  /** The built environment's interpreter, for the profile's `python`. */
  python: string;
  /** The shell command that builds the environment on the cluster. */
  command: string;
  /** Distributions pinned. */
  pins: number;
}
