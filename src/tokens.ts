/**
 * Types for the hyperpod-lab job event stream, schema version 1.
 *
 * These mirror the JSON records written by the Python side
 * (`hyperpod_lab.events`): one object per line, each carrying the
 * schema version, the event kind, the job it belongs to, a wall-clock
 * timestamp, the writer that produced it, a per-writer sequence number
 * and a kind-specific payload.
 */

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
}

/** A job: its record (`hyperpod_lab.jobs.JobRecord`) plus progress. */
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

/** The resiliency policy of a JobSpec (`hyperpod_lab.spec.ResiliencyPolicy`). */
export interface IResiliencyPolicy {
  auto_resume: boolean;
  max_retries: number;
  health_checks: boolean;
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
  partition: string | null;
  time_limit_min: number | null;
  resiliency: IResiliencyPolicy;
  checkpoint: ICheckpointPolicy;
  elastic: IElasticPolicy;
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
