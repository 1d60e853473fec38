/**
 * The job event stream, schema version 1: the types of the records the Python side writes
 * (`hyperpod_lab.events`), one JSON object per line, each carrying the schema version, the
 * event kind, the job it belongs to, a wall-clock timestamp, the writer that produced it, a
 * per-writer sequence number and a kind-specific payload.
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

/** A health checker's event writer is `health-<node>` (Python: `hyperpod_lab.events.HEALTH_WRITER_PREFIX`). */
export const HEALTH_WRITER_PREFIX = 'health-';

/** The `reason` of a `fault.detected` event that names a cause, not a message (Python: `hyperpod_lab.events.FaultReason`). */
export const FAULT_REASONS = {
  hang: 'hang',
  nodeDown: 'node down'
} as const;
