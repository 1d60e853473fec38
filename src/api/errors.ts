/** The error every call of the hyperpod API throws. */

/**
 * An error answer of the hyperpod API (any non-2xx status).
 *
 * `type` is the server's error class (`SpecError`, `UnknownJob`, ...), `field` the JobSpec
 * field at fault for a SpecError, `status` the HTTP status (0 when the server was not reached).
 */
export class HyperPodAPIError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly type: string,
    readonly field: string | null = null
  ) {
    super(message);
    this.name = 'HyperPodAPIError';
  }
}
