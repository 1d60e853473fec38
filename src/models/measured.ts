/** The streamed job's measured goodput, read again as its events come in. */
import { ISignal, Signal } from '@lumino/signaling';

import * as api from '../api/network';
import { IMeasuredGoodput } from '../api/rest';
import { IJobStreamModel, IMeasuredGoodputModel } from './tokens';
import { LatestRequest } from './latest';

/** Shortest time between two reads of the measured goodput, ms. */
const MEASURE_INTERVAL_MS = 5000;

/** Delay before reading it after new events (a burst of history makes one read), ms. */
const MEASURE_SETTLE_MS = 300;

/**
 * `GET jobs/{id}/goodput` of the streamed job: after `MEASURE_SETTLE_MS` of new events (or the
 * stream's end), at most once per `MEASURE_INTERVAL_MS`, never two reads at once, and only
 * while `active()` and the tab is visible (a hidden panel reads when it is shown again).
 */
export class MeasuredGoodputModel implements IMeasuredGoodputModel {
  /**
   * @param stream - the stream whose job is measured
   * @param options.active - whether the panel is visible
   */
  constructor(
    private readonly _stream: IJobStreamModel,
    options: { active?: () => boolean } = {}
  ) {
    this._active = options.active ?? (() => true);
    _stream.jobChanged.connect(this._reset, this);
    _stream.eventsAdded.connect(this._schedule, this);
    _stream.endReceived.connect(this._schedule, this); // the final figures
  }

  /** The measurement, or null. */
  get measured(): IMeasuredGoodput | null {
    return this._measured;
  }
  /** Why there is no measurement (e.g. no step events yet), or null. */
  get error(): string | null {
    return this._error;
  }
  /** The measurement was read again (or reset for another job). */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Stop reading, disconnect the listeners. */
  dispose(): void {
    this._disposed = true;
    this._reset();
    Signal.clearData(this);
  }

  private _reset(): void {
    if (this._timer !== null) {
      window.clearTimeout(this._timer);
      this._timer = null;
    }
    this._latest.cancel();
    this._dirty = false;
    this._readAt = 0;
    if (this._measured !== null || this._error !== null) {
      this._measured = null;
      this._error = null;
      this._changed.emit();
    }
  }

  private _schedule(): void {
    this._dirty = true;
    if (this._timer !== null || this._reading || this._disposed) {
      return;
    }
    const wait = Math.max(MEASURE_SETTLE_MS, this._readAt + MEASURE_INTERVAL_MS - Date.now());
    this._timer = window.setTimeout(() => {
      this._timer = null;
      const jobId = this._stream.jobId;
      if (!jobId || !this._dirty) {
        return;
      }
      if (!this._active() || document.hidden) {
        this._readAt = Date.now(); // look again in an interval
        this._schedule();
        return;
      }
      void this._read(jobId);
    }, wait);
  }

  private async _read(jobId: string): Promise<void> {
    this._dirty = false;
    this._reading = true;
    const outcome = await this._latest.run(() => api.getJobGoodput(jobId));
    this._reading = false;
    if (this._disposed) {
      return;
    }
    if (outcome !== null) {
      if (outcome.ok) {
        this._measured = outcome.value;
        this._error = null;
      } else {
        // 400 before the first steps: keep showing what there is, say why
        this._error = outcome.error.message;
      }
      this._readAt = Date.now();
      this._changed.emit();
    }
    if (this._dirty) {
      this._schedule(); // events came in while reading (or another job's)
    }
  }

  private _active: () => boolean;
  private _measured: IMeasuredGoodput | null = null;
  private _error: string | null = null;
  private _readAt = 0;
  private _timer: number | null = null;
  private _latest = new LatestRequest();
  private _reading = false;
  private _dirty = false;
  private _disposed = false;
  private _changed = new Signal<this, void>(this);
}
