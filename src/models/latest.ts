/** Only the answer of the latest request counts: the helper behind every "newest wins" model. */

/** How a request that was still the latest when it settled ended. */
export type Outcome<T> = { ok: true; value: T } | { ok: false; error: Error };

/**
 * Numbers requests so that only the answer of the latest one is used: an answer that comes
 * after a newer request started, or after `cancel`, is dropped.
 */
export class LatestRequest {
  /** Whether the latest request has not settled yet (false after `cancel`). */
  get running(): boolean {
    return this._seq !== this._done;
  }

  /**
   * Run `request` as the latest one.
   *
   * @returns its outcome, or null when a newer request or `cancel` superseded it; never rejects
   */
  async run<T>(request: () => Promise<T>): Promise<Outcome<T> | null> {
    const seq = ++this._seq;
    let outcome: Outcome<T>;
    try {
      outcome = { ok: true, value: await request() };
    } catch (e) {
      outcome = { ok: false, error: e instanceof Error ? e : new Error(String(e)) };
    }
    if (seq !== this._seq) {
      return null;
    }
    this._done = seq;
    return outcome;
  }

  /** Drop the answer of the request running now, if any. */
  cancel(): void {
    this._done = ++this._seq;
  }

  private _seq = 0;
  private _done = 0;
}
