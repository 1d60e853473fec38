/** Text of numbers and events, shared by the models (notices) and the views. */
import { FAULT_REASONS, HEALTH_WRITER_PREFIX, IJobEvent } from './api/events';

/** Format a number with at most `digits` significant digits, or an em dash. */
export function fmt(value: number | null | undefined, digits = 3): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '—';
  }
  return Number(value.toPrecision(digits)).toString();
}

/** `1 fault`, `2 faults`: a count and the word in the form that fits it. */
export function plural(n: number, one: string, many: string = `${one}s`): string {
  return `${n} ${n === 1 ? one : many}`;
}

/** The node an event names: its `node`, else a health checker's writer `health-<node>`. */
export function nodeOf(ev: IJobEvent): string {
  if (typeof ev.data.node === 'string' && ev.data.node) {
    return ev.data.node;
  }
  return ev.writer.startsWith(HEALTH_WRITER_PREFIX) ? ev.writer.slice(HEALTH_WRITER_PREFIX.length) : '?';
}

/** Whether a `health.checked` event reports a failed check. */
export function healthFailed(ev: IJobEvent): boolean {
  const checks = ev.data.checks;
  return (
    ev.data.ok === false ||
    (!!checks &&
      typeof checks === 'object' &&
      Object.values(checks as object).some(c => (c as { status?: unknown } | null)?.status === 'failed'))
  );
}

/** One line describing an event, as the timeline, the job list and the notices show it. */
export function describeEvent(ev: IJobEvent): string {
  const d = ev.data;
  const num = (v: unknown): string => (typeof v === 'number' ? fmt(v) : String(v));
  const rank = d.rank !== undefined ? ` (rank ${d.rank})` : '';
  switch (ev.kind) {
    case 'submitted':
      return `submitted to ${d.cluster} (${d.world_size} ranks)`;
    case 'started':
      return `started, world size ${d.world_size}`;
    case 'step':
      return `step ${d.step}, loss ${num(d.loss)}`;
    case 'checkpoint.saved':
      return `checkpoint step ${d.step} saved to ${d.tier}${rank}`;
    case 'checkpoint.restored':
      return `checkpoint step ${d.step} restored from ${d.tier}${rank}`;
    case 'checkpoint.corrupt':
      return `corrupt ${d.tier} checkpoint step ${d.step} skipped`;
    case 'checkpoint.failed':
      return `${d.tier} checkpoint step ${d.step} failed: ${d.reason}`;
    case 'fault.detected':
      if (d.reason === FAULT_REASONS.nodeDown) {
        const ranks = Array.isArray(d.rank)
          ? ` (${d.rank.length === 1 ? 'rank' : 'ranks'} ${d.rank.join(', ')})`
          : rank;
        return `fault: node ${d.node} down (Slurm: ${d.slurm_state ?? 'DOWN'})${ranks}`;
      }
      if (d.reason === FAULT_REASONS.hang) {
        const section = d.section ? ` in section ${d.section}` : '';
        return `hang: rank ${d.rank} on ${d.node} made no progress for ${num(d.stalled_s)} s${section}`;
      }
      return `fault: rank ${d.rank} on ${d.node} died (${d.signal ?? `exit ${d.exitcode}`})`;
    case 'recovery.started':
      return `recovery started (${d.reason})`;
    case 'recovery.completed':
      return `recovered in ${num(d.downtime_s)} s ${recoveredFrom(d)}`;
    case 'elastic.scaled':
      return `scaled: world size ${d.old_world_size ?? '?'} → ${d.new_world_size ?? '?'}`;
    case 'health.checked': {
      const checks = d.checks && typeof d.checks === 'object' ? (d.checks as { [name: string]: unknown }) : {};
      const failed = Object.entries(checks)
        .filter(([, c]) => (c as { status?: unknown } | null)?.status === 'failed')
        .map(([name]) => name);
      const secs = typeof d.seconds === 'number' ? `${fmt(d.seconds)} s` : '? s';
      if (healthFailed(ev)) {
        return `health checks failed on ${nodeOf(ev)}: ${failed.join(', ') || '?'} (${secs})`;
      }
      return `health checks passed on ${nodeOf(ev)} (${plural(Object.keys(checks).length, 'check')}, ${secs})`;
    }
    case 'health.failed':
      return `health check failed on ${nodeOf(ev)}: ${d.check}${d.detail ? ` — ${d.detail}` : ''}`;
    case 'node.excluded': {
      const faults = typeof d.faults === 'number' && d.faults > 0 ? ` (${plural(d.faults, 'fault')})` : '';
      return `${nodeOf(ev)} excluded: ${d.reason ?? 'no reason given'}${faults}`;
    }
    case 'straggler.detected':
      return `straggler: rank ${d.rank} on ${d.node} is ${num(d.score)}x slower (${num(d.step_s)} s a step vs ${num(d.median_step_s)} s; ${d.action ?? 'report'})`;
    case 'job.failed':
      return `job failed: ${d.reason} (${d.restarts} restarts; no requeue)`;
    case 'finished':
      return `finished: ${d.status}${d.steps !== undefined ? `, ${d.steps} steps` : ''}`;
    default:
      return ev.kind;
  }
}

/**
 * Where a `recovery.completed` resumed from, in words (docs/events.md): a tier and step, a
 * checkpointless heal from the live replicas, or a restart with no checkpoint at all.
 */
export function recoveredFrom(d: { [key: string]: unknown }): string {
  const step = typeof d.restored_step === 'number' ? d.restored_step : typeof d.resumed_step === 'number' ? d.resumed_step : null;
  if (d.mode === 'checkpointless') {
    return `from the live replicas${step === null ? '' : ` (step ${step})`}`;
  }
  if (!d.restored_from || d.restored_from === 'none') {
    return 'from step 0 (no checkpoint yet)';
  }
  return `from ${d.restored_from}${step === null ? '' : ` at step ${step}`}`;
}
