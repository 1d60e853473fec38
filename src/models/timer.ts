/**
 * The one-shot timers the models keep as `number | null` (a `window.setTimeout` handle, or null
 * when none is pending).
 */

/**
 * Cancel the pending `window.setTimeout` `timer` (nothing when it is null); returns null, the
 * value to store back: `this._timer = clearTimer(this._timer)`.
 */
export function clearTimer(timer: number | null): null {
  if (timer !== null) {
    window.clearTimeout(timer);
  }
  return null;
}
