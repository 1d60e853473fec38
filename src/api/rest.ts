/**
 * The REST / WebSocket contract of the server extension (`hyperpod_lab.server`): the shapes
 * of what the routes under `<base_url>hyperpod/` take and answer.
 */
import { EventKind, IJobEvent, JSONValue } from './events';

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
  /** Experiment tracking: rank 0 logs the job to one MLflow run (docs/tracking.md). */
  tracking?: 'off' | 'mlflow';
  /** The MLflow tracking URI; null: the submitting side's `MLFLOW_TRACKING_URI`, recorded at submit. */
  tracking_uri?: string | null;
  /** Slurm: run the training step in this image through pyxis/enroot; null: the profile's (docs/containers.md). */
  container_image?: string | null;
  version: number;
}

/** Options of a submission besides its JobSpec (`POST jobs`). */
export interface ISubmitOptions {
  /**
   * Submit without comparing the notebook's environment with the cluster interpreter's
   * (`skip_env_check`; the CLI's `--skip-env-check`). Default false.
   */
  skipEnvCheck?: boolean;
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
  /** The request's byte/line budget cut this view ("More" reads on from the cursor). */
  truncated?: boolean;
  /** That budget: bytes read and lines returned per request, whatever the rank count. */
  budget?: { bytes: number; lines: number };
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
  /** Node lanes: how many of the node's ranks the run spans. */
  ranks?: number;
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
  /** null on the job lane (a node lane's mark: the lowest of `ranks`). */
  rank: number | null;
  /** Node lanes: the node's ranks the mark is about. */
  ranks?: number[];
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
  /** A rank its node's agent stopped (SIGTERM) because this rank failed: the failed rank. */
  stopped_by?: number;
}

/** One entry of the compact timeline: a checkpoint span per tier, or a mark. */
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
  /** At most 64 of them (`rank_count`: how many in all). */
  ranks?: number[];
  rank_count?: number;
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

/** A lane: the job's, a node's (with `ranks`, `rank_count`, `faults`) or a rank's. */
export interface IDashboardLane {
  spans: IDashboardSpan[];
  marks: IDashboardMark[];
  /** Node lanes: `ranks 8-15`. */
  ranks?: string;
  rank_count?: number;
  /** Node lanes: fault and hang marks. */
  faults?: number;
  dropped_marks?: number;
  /** Node lanes of a checkpointless job: the node's replica group (null: no event named it). */
  replica_group?: number | null;
}

/** What `GET jobs/{id}/dashboard` answers. */
export interface IJobDashboard {
  job_id: string;
  t0: number | null;
  t1: number | null;
  /** Highest step + 1, or null before any step. */
  steps: number | null;
  /** How many ranks the events named. */
  ranks: number;
  /** The node lanes' names, by lowest rank (`ranks A-B` for ranks no event placed on a node). */
  nodes: string[];
  /** Events folded so far. */
  events: number;
  /** True while more events wait unread (the server folds more on each request): ask again. */
  partial?: boolean;
  dropped_marks?: number;
  /** `job` and one lane per node (its ranks' spans and marks merged). */
  lanes: { [lane: string]: IDashboardLane };
  /** The ranks' own lanes of the node asked for (`?node=`), else null. */
  expanded: { node: string; lanes: { [rank: string]: IDashboardLane } } | null;
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
