/** The common part of the models that read a list from the server: change and error signals. */
import { ISignal, Signal } from '@lumino/signaling';

/**
 * A model of something read from the server: `changed` when it changed, `error` (with
 * `errorChanged`) when the last read failed.
 */
export abstract class ServerStateModel {
  /** Why the last read failed, or null. */
  get error(): string | null {
    return this._error;
  }
  /** What was read changed. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }
  /** `error` changed. */
  get errorChanged(): ISignal<this, void> {
    return this._errorChanged;
  }

  /** Disconnect the listeners. */
  dispose(): void {
    Signal.clearData(this);
  }

  /** Set `error` (null: the last read worked), emitting `errorChanged` when it changed. */
  protected _setError(error: string | null): void {
    if (error !== this._error) {
      this._error = error;
      this._errorChanged.emit();
    }
  }

  protected readonly _changed = new Signal<this, void>(this);
  private _error: string | null = null;
  private readonly _errorChanged = new Signal<this, void>(this);
}
