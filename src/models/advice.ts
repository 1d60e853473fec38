/** The goodput advice for the submit form's inputs. */
import { ISignal, Signal } from '@lumino/signaling';

import { HyperPodAPIError } from '../api/errors';
import * as api from '../api/network';
import { IAdviceQuery, IGoodputAdvice } from '../api/rest';
import { IAdviceModel } from './tokens';
import { LatestRequest } from './latest';
import { clearTimer } from './timer';

/** Quiet time after the last change of the form before the advice is asked for, ms. */
const ADVICE_DEBOUNCE_MS = 300;

/** `GET goodput/advice` for the form's inputs, debounced; the newest query's answer wins. */
export class AdviceModel implements IAdviceModel {
  /** The advice for the last query, or null (none asked, or an error). */
  get advice(): IGoodputAdvice | null {
    return this._advice;
  }
  /** Why the last advice could not be had (the server's error names the input), or null. */
  get error(): HyperPodAPIError | null {
    return this._error;
  }
  /** Whether an advice request is waiting or running. */
  get loading(): boolean {
    return this._timer !== null || this._latest.running;
  }
  /** The advice, its error or its loading state changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /**
   * Ask for the advice for `query` after `ADVICE_DEBOUNCE_MS` without a newer call; answers of
   * older queries are dropped. `null` cancels and clears the advice.
   */
  request(query: IAdviceQuery | null): void {
    this._timer = clearTimer(this._timer);
    this._latest.cancel();
    if (query === null) {
      this._advice = null;
      this._error = null;
    } else {
      this._timer = window.setTimeout(() => {
        this._timer = null;
        void this._fetch(query);
      }, ADVICE_DEBOUNCE_MS);
    }
    this._changed.emit(); // cleared, or loading
  }

  /** Drop the pending request, disconnect the listeners. */
  dispose(): void {
    this._disposed = true;
    this._timer = clearTimer(this._timer);
    Signal.clearData(this);
  }

  private async _fetch(query: IAdviceQuery): Promise<void> {
    const outcome = await this._latest.run(() => api.getGoodputAdvice(query));
    if (outcome === null || this._disposed) {
      return;
    }
    this._advice = outcome.ok ? outcome.value : null;
    this._error = outcome.ok
      ? null
      : outcome.error instanceof HyperPodAPIError
        ? outcome.error
        : new HyperPodAPIError(outcome.error.message, 0, 'Error');
    this._changed.emit();
  }

  private _advice: IGoodputAdvice | null = null;
  private _error: HyperPodAPIError | null = null;
  private _timer: number | null = null;
  private _latest = new LatestRequest();
  private _disposed = false;
  private _changed = new Signal<this, void>(this);
}
