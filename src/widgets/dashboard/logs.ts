/**
 * The dashboard's Logs area until the log triage panel (src/widgets/logTriage.ts) is there: one
 * rank's log around its traceback (`GET jobs/{id}/logs/triage?ranks=R&around=traceback`, one
 * bounded read; else the tail of `GET jobs/{id}/logs?rank=R`), scrolled to the traceback's
 * first line, which is marked (`hp-dash-log-traceback`).
 */
import { requestAPI } from '../../request';
import { IDashboardMark, IJobEvent } from '../../tokens';
import { h } from '../dom';

/** One rank's log, opened at its traceback. */
export class RankLog {
  constructor(jobId: string) {
    this._jobId = jobId;
    this._head = h('div', { class: 'jp-HyperPod-dim', 'data-testid': 'hp-dash-log-head', 'aria-live': 'polite' },
      'Open a fault (a red mark, a fault in the timeline or the events table) to show its rank\'s log here.');
    this._pre = h('pre', { class: 'jp-HyperPodDash-log', 'data-testid': 'hp-dash-log', tabindex: 0, 'aria-label': 'Log' });
    this.node = h('div', { class: 'jp-HyperPodDash-logs', 'data-testid': 'hp-dash-logs' }, this._head, this._pre);
  }

  /** The element to add to a page. */
  readonly node: HTMLDivElement;

  /** Show `rank`'s log, scrolled to its first traceback (the fault's, when `ev` is given). */
  async showRank(rank: number, ev: IJobEvent | IDashboardMark | null = null): Promise<void> {
    this.node.setAttribute('data-rank', String(rank));
    this._head.textContent = `Rank ${rank}: loading its log…`;
    let text = '';
    try {
      // the triage route (log triage, issue 18 item 3): the window around the rank's traceback,
      // every torchrun attempt's log of it (a restarted rank's new log has no traceback)
      const t = ev === null ? null : 'time' in ev ? ev.time : ev.t;
      const q = `ranks=${rank}&around=traceback&length=16384${t !== null ? `&time=${t}` : ''}`;
      const win = await requestAPI<{ lines: { text: string }[] }>(`jobs/${encodeURIComponent(this._jobId)}/logs/triage?${q}`);
      text = win.lines.map(l => l.text).join('\n');
    } catch {
      try {
        text = (await requestAPI<{ text: string }>(`jobs/${encodeURIComponent(this._jobId)}/logs?rank=${rank}`)).text;
      } catch (e) {
        this._head.textContent = `Rank ${rank}: log not read: ${(e as Error).message}`;
        return;
      }
    }
    this._pre.textContent = '';
    const lines = text.split('\n');
    let first: HTMLElement | null = null;
    for (const line of lines) {
      const tb: boolean = first === null && /Traceback \(most recent call last\)/.test(line);
      const el: HTMLSpanElement = h('span', { class: tb ? 'jp-HyperPodDash-logLine jp-mod-traceback' : 'jp-HyperPodDash-logLine', 'data-testid': tb ? 'hp-dash-log-traceback' : null }, line + '\n');
      if (tb) {
        first = el;
      }
      this._pre.appendChild(el);
    }
    const why = ev ? ` (${'label' in ev ? ev.label : ev.kind})` : '';
    this._head.textContent = `Rank ${rank}'s log${why}: ${first ? 'at its first traceback' : 'no traceback in its tail'}`;
    if (first) {
      this._pre.scrollTop = Math.max(0, first.offsetTop - this._pre.offsetTop - 8);
      first.scrollIntoView({ block: 'start' });
    }
  }

  private _jobId: string;
  private _head: HTMLDivElement;
  private _pre: HTMLPreElement;
}
