/**
 * The alerts the user's rules fired, each handed on once (`fired`) while the Lab is open: a poll
 * of `GET hyperpod/alerts` with its cursor, and the keys already shown kept in the browser's
 * localStorage, so a reload or a second tab does not show them again.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { getFiredAlerts, IFiredAlert } from '../api/alerts';
import { clearTimer } from './timer';

/** How often the server is asked, ms (every minute while it has no alerts file). */
const POLL_MS = 5000;
const IDLE_POLL_MS = 60000;

/** The localStorage entry of the keys shown, and how many are kept. */
const SHOWN_KEY = 'hyperpod-lab:alerts-shown';
const MAX_SHOWN = 500;

/** Polls the fired alerts and emits each new one once. */
export class AlertFeed {
  /** A fired alert not shown before. */
  get fired(): ISignal<this, IFiredAlert> {
    return this._fired;
  }

  /** Ask now, then every `POLL_MS`, until `dispose`. */
  start(): void {
    if (this._timer === null && !this._disposed) {
      void this._poll();
    }
  }

  /** Stop polling, disconnect the listeners. */
  dispose(): void {
    this._disposed = true;
    this._timer = clearTimer(this._timer);
    Signal.clearData(this);
  }

  private async _poll(): Promise<void> {
    let wait = POLL_MS;
    try {
      const answer = await getFiredAlerts(this._after);
      if (answer.epoch !== this._epoch) {
        // the server restarted: its numbers start again, so read all it kept (the keys tell
        // which were shown)
        const stale = this._after !== 0;
        this._epoch = answer.epoch;
        this._after = 0;
        if (stale) {
          return this._poll();
        }
      }
      if (!answer.enabled) {
        wait = IDLE_POLL_MS;
      }
      this._after = answer.next;
      const shown = readShown();
      for (const alert of answer.alerts) {
        if (this._disposed || shown.includes(alert.key)) {
          continue;
        }
        shown.push(alert.key);
        writeShown(shown);
        this._fired.emit(alert);
      }
    } catch {
      wait = POLL_MS * 2; // the server is away: the job list shows that; ask again later
    }
    if (!this._disposed) {
      this._timer = window.setTimeout(() => void this._poll(), wait);
    }
  }

  private _after = 0;
  private _epoch: number | null = null;
  private _timer: number | null = null;
  private _disposed = false;
  private _fired = new Signal<this, IFiredAlert>(this);
}

/** The keys shown so far (none when localStorage is not there or holds something else). */
function readShown(): string[] {
  try {
    const value = JSON.parse(window.localStorage.getItem(SHOWN_KEY) ?? '[]');
    return Array.isArray(value) ? value.filter(k => typeof k === 'string') : [];
  } catch {
    return [];
  }
}

/** Keep the newest `MAX_SHOWN` keys shown. */
function writeShown(keys: string[]): void {
  try {
    window.localStorage.setItem(SHOWN_KEY, JSON.stringify(keys.slice(-MAX_SHOWN)));
  } catch {
    // storage full or off: this page still shows each once (its cursor)
  }
}
