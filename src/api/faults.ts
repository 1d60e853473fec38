/**
 * The fault-injection request (`POST hyperpod/jobs/{id}/faults`, `hyperpod_lab.schedulers.base`
 * on the server): the kinds of fault, the slowdown of a `slow` one and its limits, what the
 * request carries and what it answers.
 */

/**
 * What a fault injection does (the server's `FAULT_KINDS`): `kill` SIGKILLs the rank's
 * process, `node` fails the rank's node as the scheduler sees it (Slurm: set DOWN, needs an
 * operator; EKS: its pod deleted), `exception` has the rank raise `InjectedFault` in its next step,
 * `hang` stops the rank (SIGSTOP) until the launch agent's hang watchdog catches and restarts it,
 * `slow` makes the rank's steps take `factor` times longer (straggler detection flags it).
 */
export type FaultKind = 'kill' | 'node' | 'exception' | 'hang' | 'slow';

/** Every {@link FaultKind}, the default (`kill`) first. */
export const FAULT_KINDS: readonly FaultKind[] = ['kill', 'node', 'exception', 'hang', 'slow'];

/** The default slowdown of a `slow` injection (the server's `DEFAULT_SLOW_FACTOR`). */
export const DEFAULT_SLOW_FACTOR = 2;

/** The smallest slowdown the server accepts (`slow_factor`): 1, back to normal speed. */
export const MIN_SLOW_FACTOR = 1;

/** The largest slowdown the server accepts (`MAX_SLOW_FACTOR`); 1 ends a slowdown. */
export const MAX_SLOW_FACTOR = 100;

/** The body of `POST jobs/{id}/faults`: `factor` only for `slow` (the server's default when absent). */
export interface IFaultRequest {
  rank: number;
  kind: FaultKind;
  factor?: number;
}

/** What `POST jobs/{id}/faults` answers: the rank that was SIGKILLed. */
export interface IFaultInfo {
  rank: number;
  node?: string;
  pid?: number;
  [key: string]: unknown;
}
