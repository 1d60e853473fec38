/**
 * The alerts the user's rules fired (`GET hyperpod/alerts`, `hyperpod_lab.server.alerts`,
 * docs/alerts.md), which the open Lab shows as notifications.
 */
import { requestAPI } from './network';

/** The rule kinds (`hyperpod_lab.server.alerts.RULE_KINDS`). */
export type AlertRuleKind = 'job_failed' | 'fault' | 'slow_recovery' | 'low_goodput' | 'straggler';

/** One fired alert (`Alerts.fired_after`). */
export interface IFiredAlert {
  /** Its number on this server (from 1; again from 1 after a restart). */
  seq: number;
  /** `rule|job id|occurrence`: the same alert has the same key, also after a restart. */
  key: string;
  /** The rule's name. */
  rule: string;
  /** The rule's kind. */
  on: AlertRuleKind;
  job_id: string;
  cluster: string;
  /** The webhook's message: job name, id, cluster and the rule's numbers. */
  text: string;
  /** When it occurred, seconds since the epoch. */
  at: number;
}

/** An answer of `GET hyperpod/alerts`. */
export interface IFiredAlerts {
  /** Whether the server has an alerts file with rules (read at its start). */
  enabled: boolean;
  /** The alerts after the asked number, oldest first. */
  alerts: IFiredAlert[];
  /** The number to ask after the next time. */
  next: number;
  /** When this server's numbering began (seconds since the epoch; 0 when disabled). */
  epoch: number;
}

/**
 * The alerts fired after number `after`.
 * @throws {HyperPodAPIError} on a network failure or a non-2xx answer
 */
export async function getFiredAlerts(after: number): Promise<IFiredAlerts> {
  return requestAPI<IFiredAlerts>(`alerts?after=${encodeURIComponent(String(after))}`);
}
