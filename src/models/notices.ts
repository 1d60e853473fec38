/**
 * Fault and recovery notices. What "a fault" and "a recovery" are is the server's fold of the
 * job's events (`progress.faults`, `progress.recoveries`, `progress.last_downtime_s`); this
 * model only notices when those counts go up, for every job, streamed or not.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { describeEvent, fmt, plural } from '../format';
import { IJobEvent } from '../api/events';
import { IJobProgress } from '../api/rest';
import { IJobNotice, IJobsModel, IJobStreamModel, INoticesModel } from './tokens';

/** How long a fault notice of the streamed job waits for its `fault.detected` event, ms. */
const FAULT_EVENT_WAIT_MS = 2000;

/** Events older than this before the stream was opened are history, not news, seconds. */
const HISTORY_SLACK_S = 5;

/** The counts of a job as last noticed. */
type Counts = Pick<IJobProgress, 'faults' | 'recoveries'>;

/**
 * Emits a `fault` notice when a job's `progress.faults` goes up and a `recovery` notice when
 * its `progress.recoveries` does, whether the new counts came from the job list or from the
 * stream's `status` message. What happened before a job was first seen is history: no notice.
 *
 * The counts decide whether there is a notice; events only word it. A fault notice of the
 * streamed job names the first `fault.detected` report the stream delivered live since the
 * job's last recovery notice (the reports after it, until the next recovery, are of the same
 * fault), waiting up to `FAULT_EVENT_WAIT_MS` for it when the counts came first; for other
 * jobs it names `progress.last_event` when that is the fault's report. A recovery notice gives
 * `progress.last_downtime_s`.
 */
export class NoticesModel implements INoticesModel {
  /**
   * @param _jobs - the job list whose progress counts are watched
   * @param _stream - the selected job's stream, whose live fault reports word its notices
   */
  constructor(
    private readonly _jobs: IJobsModel,
    private readonly _stream: IJobStreamModel
  ) {
    _jobs.changed.connect(this._check, this);
    _jobs.submitted.connect((_, job) => {
      this._known.set(job.job_id, { faults: 0, recoveries: 0 }); // all of it is news
    }, this);
    _stream.jobChanged.connect(() => {
      this._flushFault();
      this._openedAt = Date.now() / 1000;
      this._report = null;
      this._collecting = true;
      this._lastRecovery = null;
    }, this);
    _stream.eventsAdded.connect((_, events) => this._onEvents(events), this);
  }

  /** A job's fault or recovery count went up. */
  get notice(): ISignal<this, IJobNotice> {
    return this._notice;
  }

  /** Stop waiting, disconnect the listeners. */
  dispose(): void {
    if (this._pending !== null) {
      window.clearTimeout(this._pending.timer);
      this._pending = null;
    }
    Signal.clearData(this);
  }

  private _check(): void {
    for (const job of this._jobs.jobs) {
      const p = job.progress;
      if (!p) {
        continue;
      }
      const known = this._known.get(job.job_id);
      if (!known) {
        this._known.set(job.job_id, { faults: p.faults, recoveries: p.recoveries });
        continue;
      }
      if (p.faults > known.faults) {
        known.faults = p.faults;
        this._fault(job.job_id);
      }
      if (p.recoveries > known.recoveries) {
        known.recoveries = p.recoveries;
        this._recovery(job.job_id, p);
      }
    }
  }

  private _onEvents(events: IJobEvent[]): void {
    for (const ev of events) {
      if (ev.time < this._openedAt - HISTORY_SLACK_S) {
        continue; // history replayed on connect
      }
      if (ev.kind === 'recovery.completed') {
        this._lastRecovery = ev;
      } else if (ev.kind === 'fault.detected' && this._collecting && this._report === null) {
        this._report = ev;
        if (this._pending?.jobId === ev.job_id) {
          this._flushFault();
        }
      }
    }
  }

  private _fault(jobId: string): void {
    if (this._pending?.jobId === jobId) {
      return; // already waiting for this job's report; the notice gives the newest count
    }
    this._flushFault();
    if (jobId === this._stream.jobId && this._report === null) {
      // the stream's report may come just after the counts
      const timer = window.setTimeout(() => this._flushFault(), FAULT_EVENT_WAIT_MS);
      this._pending = { jobId, timer };
      return;
    }
    this._emitFault(jobId);
  }

  private _flushFault(): void {
    const pending = this._pending;
    if (pending !== null) {
      window.clearTimeout(pending.timer);
      this._pending = null;
      this._emitFault(pending.jobId);
    }
  }

  private _emitFault(jobId: string): void {
    const p = this._jobs.get(jobId)?.progress;
    let ev = lastEventOf(p, 'fault.detected');
    if (jobId === this._stream.jobId) {
      ev = this._report ?? ev;
      this._report = null;
      this._collecting = false; // further reports are of this fault, until its recovery
    }
    const what = ev ? describeEvent(ev) : 'a rank failed';
    const count = p ? ` (${plural(p.faults, 'fault')} so far)` : '';
    this._notice.emit({ kind: 'fault', jobId, message: `${jobId}: ${what}${count}` });
  }

  private _recovery(jobId: string, p: IJobProgress): void {
    const streamed = jobId === this._stream.jobId;
    let what = 'recovered';
    if (typeof p.last_downtime_s === 'number') {
      what = `recovered in ${fmt(p.last_downtime_s)} s`;
      if (p.recoveries > 1 && typeof p.downtime_s === 'number') {
        what += ` (${fmt(p.downtime_s)} s down over ${plural(p.recoveries, 'recovery', 'recoveries')})`;
      }
    } else if (p.last_downtime_s === undefined) {
      // a server from before `last_downtime_s`: the recovery's report says it
      const ev = (streamed ? this._lastRecovery : null) ?? lastEventOf(p, 'recovery.completed');
      what = ev ? describeEvent(ev) : what;
    }
    if (streamed) {
      this._collecting = true; // the next report is of a new fault
      this._report = null;
    }
    this._notice.emit({ kind: 'recovery', jobId, message: `${jobId}: ${what}` });
  }

  private _known = new Map<string, Counts>();
  private _openedAt = 0;
  private _collecting = true;
  private _report: IJobEvent | null = null;
  private _lastRecovery: IJobEvent | null = null;
  private _pending: { jobId: string; timer: number } | null = null;
  private _notice = new Signal<this, IJobNotice>(this);
}

/** `progress.last_event` when it is of `kind`, else null. */
function lastEventOf(p: IJobProgress | undefined, kind: string): IJobEvent | null {
  return p?.last_event?.kind === kind ? p.last_event : null;
}
