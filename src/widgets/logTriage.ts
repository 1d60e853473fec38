/**
 * Per-rank log triage (issue 18, item 3): every rank's log in one view, identical lines of
 * several ranks collapsed with a rank badge, the first failing rank and its traceback, a
 * bounded search, a rank filter and a follow mode. Everything comes from
 * `GET hyperpod/jobs/{id}/logs/triage` (docs/logs.md), which reads by byte range.
 */
import { Widget } from '@lumino/widgets';

import { requestAPI } from '../api/network';
import { IJobEvent } from '../api/events';
import { ILogTriage, ITriageFailure, ITriageLine, ITriageMatch } from '../api/rest';
import { h } from './dom';

/** The API call the panel makes: `requestAPI` of src/api/network.ts (tests may pass another). */
export type TriageRequest = <T>(path: string, init?: RequestInit) => Promise<T>;

/** Most lines kept on screen; follow mode drops the oldest beyond it. */
export const MAX_TRIAGE_LINES = 5000;

/** Milliseconds between follow-mode polls. */
export const FOLLOW_INTERVAL_MS = 2000;

/** `[0, 1, 2, 3, 5]` -> `0-3,5`. */
export function rankSetLabel(ranks: number[]): string {
  const rs = [...new Set(ranks)].sort((a, b) => a - b);
  const parts: string[] = [];
  for (let i = 0; i < rs.length; ) {
    let j = i;
    while (j + 1 < rs.length && rs[j + 1] === rs[j] + 1) {
      j++;
    }
    parts.push(i === j ? `${rs[i]}` : `${rs[i]}-${rs[j]}`);
    i = j + 1;
  }
  return parts.join(',');
}

/** `rank 1` or `ranks 0-3`: the badge of a collapsed line. */
export function rankBadge(ranks: number[]): string {
  return ranks.length === 1 ? `rank ${ranks[0]}` : `ranks ${rankSetLabel(ranks)}`;
}

/**
 * The log triage panel of one job.
 *
 * Keyboard: the search box searches on Enter; the line list is one tab stop whose lines scroll
 * with the arrow keys, Page Up/Down, Home and End; every control is a native button or input.
 */
export class LogTriagePanel extends Widget {
  /**
   * @param requests - what src/api/network.ts exports for API calls: `requestAPI` (or an object
   *   holding it, such as the module itself)
   * @param jobId - the hyperpod-lab job id
   */
  constructor(requests: TriageRequest | { requestAPI: TriageRequest }, jobId: string) {
    super();
    this._request =
      typeof requests === 'function' ? requests : (requests?.requestAPI ?? (requestAPI as TriageRequest));
    this.jobId = jobId;
    this.addClass('jp-HyperPod-triage');
    this.node.dataset.testid = 'log-triage';
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', `Logs of every rank of job ${jobId}`);

    this._search = h('input', {
      type: 'search',
      class: 'jp-HyperPod-triage-search',
      placeholder: 'Search all ranks (Enter)',
      'aria-label': "Search the ranks' logs",
      autocomplete: 'off',
      spellcheck: 'false',
      'data-testid': 'triage-search'
    });
    this._regex = h('input', { type: 'checkbox', 'data-testid': 'triage-regex' });
    this._ranks = h('input', {
      type: 'text',
      class: 'jp-HyperPod-triage-ranks',
      placeholder: 'all ranks',
      'aria-label': 'Ranks to show, e.g. 0,2-3 (empty: all)',
      autocomplete: 'off',
      spellcheck: 'false',
      size: 8,
      'data-testid': 'triage-ranks'
    });
    this._follow = h(
      'button',
      { type: 'button', class: 'jp-HyperPod-button', 'aria-pressed': 'false', 'data-testid': 'triage-follow' },
      'Follow'
    );
    const searchBtn = h(
      'button',
      { type: 'button', class: 'jp-HyperPod-button', 'data-testid': 'triage-search-go' },
      'Search'
    );
    const showBtn = h(
      'button',
      { type: 'button', class: 'jp-HyperPod-button', 'data-testid': 'triage-show' },
      'Show'
    );
    this._failureBox = h('div', { class: 'jp-HyperPod-triage-failure', 'data-testid': 'triage-failure', hidden: true });
    this._status = h('div', { class: 'jp-HyperPod-triage-status', 'aria-live': 'polite', 'data-testid': 'triage-status' });
    this._list = h('div', {
      class: 'jp-HyperPod-triage-lines',
      role: 'log',
      tabindex: 0,
      'aria-label': 'Collapsed log lines',
      'data-testid': 'triage-lines'
    });
    this._more = h(
      'button',
      { type: 'button', class: 'jp-HyperPod-button', hidden: true, 'data-testid': 'triage-more' },
      'More'
    );

    const bar = h(
      'div',
      { class: 'jp-HyperPod-triage-bar' },
      this._search,
      h('label', { class: 'jp-HyperPod-triage-check' }, this._regex, ' regex'),
      searchBtn,
      h('label', { class: 'jp-HyperPod-triage-check' }, 'Ranks ', this._ranks),
      showBtn,
      this._follow
    );
    this.node.append(bar, this._failureBox, this._status, this._list, this._more);

    this._search.addEventListener('keydown', ev => {
      if (ev.key === 'Enter') {
        ev.preventDefault();
        void this.search(this._search.value);
      } else if (ev.key === 'Escape' && this._search.value) {
        this._search.value = '';
        void this.refresh();
      }
    });
    searchBtn.addEventListener('click', () => void this.search(this._search.value));
    this._ranks.addEventListener('keydown', ev => {
      if (ev.key === 'Enter') {
        ev.preventDefault();
        this._applyRanks();
      }
    });
    showBtn.addEventListener('click', () => this._applyRanks());
    this._follow.addEventListener('click', () => this.setFollow(!this._following));
    this._more.addEventListener('click', () => void this._continue());
    this._list.addEventListener('keydown', ev => this._scrollKey(ev));
  }

  /** The job whose logs this panel shows. */
  readonly jobId: string;

  /** The first failure the last answer named (null before any, or when none). */
  get failure(): ITriageFailure | null {
    return this._failure;
  }

  /** Whether follow mode is on. */
  get following(): boolean {
    return this._following;
  }

  /** Show only `rank`'s log (tail), as if typed into the rank filter. */
  showRank(rank: number): void {
    this._ranks.value = String(rank);
    this._selected = String(rank);
    void this.refresh();
  }

  /**
   * Open the log of a `fault.detected` event's rank at its traceback: the lines around it,
   * the traceback highlighted, scrolled into view and focused.
   * @param ev - a `fault.detected` event (its `data.rank` and `time` pick the traceback)
   */
  openAtFault(ev: IJobEvent): Promise<void> {
    const rank = typeof ev?.data?.rank === 'number' ? (ev.data.rank as number) : null;
    const params: { [k: string]: string } = { around: 'traceback', length: '65536' };
    if (rank !== null) {
      params.ranks = String(rank);
      this._ranks.value = String(rank);
      this._selected = String(rank);
    }
    if (typeof ev?.time === 'number' && isFinite(ev.time)) {
      params.time = String(ev.time);
    }
    this.setFollow(false);
    return this._load(params, 'around');
  }

  /** Reload the view: the tail of each log file of the selected ranks, and the first failure. */
  refresh(): Promise<void> {
    return this._load({ tail: '1', ...this._rankParam() }, 'view');
  }

  /** Search the selected ranks' logs (bounded per request; "More" continues). */
  search(q: string): Promise<void> {
    if (!q) {
      return this.refresh();
    }
    this._search.value = q;
    return this._load({ q, regex: this._regex.checked ? '1' : '0', limit: '200', ...this._rankParam() }, 'search');
  }

  /** Turn follow mode on (poll for new lines every {@link FOLLOW_INTERVAL_MS}) or off. */
  setFollow(on: boolean): void {
    if (on === this._following) {
      return;
    }
    this._following = on;
    this._follow.setAttribute('aria-pressed', on ? 'true' : 'false');
    this._follow.classList.toggle('jp-mod-active', on);
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
    if (on) {
      const start = this._mode === 'view' && this._cursor ? Promise.resolve() : this.refresh();
      void start.then(() => {
        if (this._following && !this.isDisposed) {
          this._timer = window.setInterval(() => void this._poll(), FOLLOW_INTERVAL_MS);
        }
      });
      this._say('following: new lines appear as they are written');
    } else {
      this._say('follow off');
    }
  }

  override dispose(): void {
    if (this._timer !== null) {
      window.clearInterval(this._timer);
      this._timer = null;
    }
    super.dispose();
  }

  protected override onAfterAttach(): void {
    if (!this._loaded) {
      this._loaded = true;
      void this.refresh();
    }
  }

  // ---- requests ------------------------------------------------------------------
  private _rankParam(): { [k: string]: string } {
    return this._selected ? { ranks: this._selected } : {};
  }

  private _applyRanks(): void {
    this._selected = this._ranks.value.trim();
    void (this._search.value ? this.search(this._search.value) : this.refresh());
  }

  private _url(params: { [k: string]: string }): string {
    const q = Object.entries(params)
      .map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v)}`)
      .join('&');
    return `jobs/${encodeURIComponent(this.jobId)}/logs/triage${q ? `?${q}` : ''}`;
  }

  private async _load(params: { [k: string]: string }, mode: 'view' | 'search' | 'around'): Promise<void> {
    this._loaded = true;
    const seq = ++this._seq;
    this._say('loading…');
    let reply: ILogTriage;
    try {
      reply = await this._request<ILogTriage>(this._url(params));
    } catch (error) {
      if (seq === this._seq) {
        this._say(`could not read the logs: ${(error as Error).message}`, true);
      }
      return;
    }
    if (seq !== this._seq || this.isDisposed) {
      return; // a newer request superseded this one
    }
    this._mode = mode;
    this._params = params;
    this._cursor = reply.cursor;
    this._list.textContent = '';
    this._lastHead = '';
    this._count = 0;
    this._setFailure(reply.first_failure);
    if (mode === 'search') {
      this._appendMatches(reply.matches ?? []);
      this._more.hidden = !!reply.done;
      this._say(
        `${reply.matches?.length ?? 0} match(es) in ${reply.scanned ?? 0} bytes` +
          (reply.done ? '' : '; more to search ("More")')
      );
      return;
    }
    this._appendLines(reply.lines ?? []);
    this._more.hidden = !(mode === 'view' && reply.more);
    this._list.dataset.mode = mode;
    if (mode === 'around') {
      this._highlightFailure(reply.first_failure);
    } else {
      this._list.scrollTop = this._list.scrollHeight;
      this._say(
        `${this._count} line(s) of ranks ${rankSetLabel(reply.ranks)}; ${reply.bytes_read} bytes read` +
          (reply.truncated && reply.budget
            ? `; cut at this request's budget (${reply.budget.bytes} bytes, ${reply.budget.lines} lines): "More" reads on, or narrow the ranks`
            : '')
      );
    }
  }

  private async _continue(): Promise<void> {
    if (!this._cursor || this._mode === 'around') {
      return;
    }
    const params: { [k: string]: string } = { ...this._params, cursor: this._cursor, failure: '0' };
    delete params.tail;
    const seq = ++this._seq;
    let reply: ILogTriage;
    try {
      reply = await this._request<ILogTriage>(this._url(params));
    } catch (error) {
      this._say(`could not read the logs: ${(error as Error).message}`, true);
      return;
    }
    if (seq !== this._seq || this.isDisposed) {
      return;
    }
    this._cursor = reply.cursor;
    if (this._mode === 'search') {
      this._appendMatches(reply.matches ?? []);
      this._more.hidden = !!reply.done;
      this._say(`${reply.matches?.length ?? 0} more match(es)` + (reply.done ? '; searched to the end' : ''));
    } else {
      this._appendLines(reply.lines ?? []);
      this._more.hidden = !reply.more;
    }
  }

  private async _poll(): Promise<void> {
    if (!this._following || this._polling || this.isDisposed || this._mode !== 'view' || !this._cursor) {
      return;
    }
    this._polling = true;
    const seq = this._seq;
    try {
      const params = { ...this._rankParam(), cursor: this._cursor, failure: '0' };
      const reply = await this._request<ILogTriage>(this._url(params));
      if (seq !== this._seq || this.isDisposed || this._mode !== 'view') {
        return;
      }
      this._cursor = reply.cursor;
      const lines = reply.lines ?? [];
      if (lines.length) {
        const atEnd = this._list.scrollTop + this._list.clientHeight >= this._list.scrollHeight - 4;
        this._appendLines(lines);
        if (atEnd) {
          this._list.scrollTop = this._list.scrollHeight;
        }
        this._say(`${lines.length} new line(s)`);
      }
    } catch (error) {
      this._say(`follow: ${(error as Error).message}`, true);
    } finally {
      this._polling = false;
    }
  }

  // ---- rendering -----------------------------------------------------------------
  private _appendLines(lines: ITriageLine[]): void {
    const frag = document.createDocumentFragment();
    for (const ln of lines) {
      const head = `${ln.attempt ?? ''}|${ln.stream ?? ''}`;
      if (head !== this._lastHead) {
        this._lastHead = head;
        frag.appendChild(
          h(
            'div',
            { class: 'jp-HyperPod-triage-head', role: 'separator' },
            ln.attempt === null || ln.attempt === undefined
              ? `${ln.stream ?? 'log'}`
              : `attempt ${ln.attempt} · ${ln.stream ?? ''}`
          )
        );
      }
      const row = h(
        'div',
        {
          class: 'jp-HyperPod-triage-line' + (ln.ranks.length > 1 ? ' jp-mod-collapsed' : ''),
          'data-ranks': ln.ranks.join(','),
          'data-offsets': JSON.stringify(ln.offsets)
        },
        h('span', { class: 'jp-HyperPod-triage-badge', title: `printed by ${rankBadge(ln.ranks)}` }, rankBadge(ln.ranks)),
        h('span', { class: 'jp-HyperPod-triage-text' }, ln.text)
      );
      frag.appendChild(row);
      this._count++;
    }
    this._list.appendChild(frag);
    while (this._count > MAX_TRIAGE_LINES && this._list.firstChild) {
      const first = this._list.firstChild as HTMLElement;
      if (first.classList.contains('jp-HyperPod-triage-line')) {
        this._count--;
      }
      first.remove();
    }
  }

  private _appendMatches(matches: ITriageMatch[]): void {
    const frag = document.createDocumentFragment();
    for (const m of matches) {
      const row = h(
        'div',
        { class: 'jp-HyperPod-triage-line jp-mod-match', 'data-ranks': String(m.rank), 'data-offset': m.offset },
        h('span', { class: 'jp-HyperPod-triage-badge' }, `rank ${m.rank}`),
        h('span', { class: 'jp-HyperPod-triage-text' }, m.text),
        h(
          'span',
          { class: 'jp-HyperPod-triage-where', title: m.source },
          `${m.attempt !== null ? `attempt ${m.attempt} ${m.stream}` : m.stream} @${m.offset}`
        )
      );
      frag.appendChild(row);
      this._count++;
    }
    this._list.appendChild(frag);
  }

  private _setFailure(f: ITriageFailure | null): void {
    this._failure = f;
    this._failureBox.textContent = '';
    if (!f) {
      this._failureBox.hidden = true;
      return;
    }
    const go = h(
      'button',
      { type: 'button', class: 'jp-HyperPod-button', 'data-testid': 'triage-goto-failure' },
      'Show traceback'
    );
    go.addEventListener('click', () =>
      void this._load({ around: 'traceback', ranks: String(f.rank), length: '65536' }, 'around')
    );
    this._failureBox.append(
      h('strong', {}, `First failure: rank ${f.rank}${f.node ? ` on ${f.node}` : ''}`),
      ' ',
      h('span', { class: 'jp-HyperPod-triage-exc' }, f.exception ?? '(no traceback found in its log)'),
      ' ',
      f.source ? go : ''
    );
    this._failureBox.hidden = false;
  }

  private _highlightFailure(f: ITriageFailure | null): void {
    if (!f || f.offset === null || f.offset === undefined) {
      // no traceback (SIGKILL, a lost node): the server sent the rank's last lines
      this._list.scrollTop = this._list.scrollHeight;
      this._say(
        f
          ? `rank ${f.rank}${f.node ? ` on ${f.node}` : ''} failed (${f.exception ?? 'no reason given'}); ` +
              'no traceback in its log: its last lines'
          : 'no failure found',
        !f
      );
      return;
    }
    const key = String(f.rank);
    const end = f.end ?? f.offset;
    let first: HTMLElement | null = null;
    for (const row of Array.from(this._list.querySelectorAll<HTMLElement>('.jp-HyperPod-triage-line'))) {
      const offs = JSON.parse(row.dataset.offsets ?? '{}') as { [k: string]: number };
      const at = offs[key];
      const text = row.querySelector('.jp-HyperPod-triage-text')?.textContent ?? '';
      // the line holding the traceback's first byte, through the exception line
      if (typeof at === 'number' && at + new TextEncoder().encode(text).length >= f.offset && at < end) {
        row.classList.add('jp-mod-fault');
        if (!first) {
          first = row;
          row.dataset.testid = 'triage-traceback';
          row.tabIndex = -1;
        }
      }
    }
    if (first) {
      first.scrollIntoView({ block: 'center' });
      first.focus({ preventScroll: true });
    }
    this._say(
      `traceback of rank ${f.rank}${f.node ? ` on ${f.node}` : ''}` +
        (f.attempt !== null ? ` (attempt ${f.attempt})` : '') +
        ` at byte ${f.offset} of ${f.source ?? 'its log'}`
    );
  }

  private _scrollKey(ev: KeyboardEvent): void {
    const list = this._list;
    const line = 18;
    const moves: { [k: string]: number } = {
      ArrowDown: line,
      ArrowUp: -line,
      PageDown: list.clientHeight - line,
      PageUp: -(list.clientHeight - line)
    };
    if (ev.key in moves) {
      list.scrollTop += moves[ev.key];
    } else if (ev.key === 'Home') {
      list.scrollTop = 0;
    } else if (ev.key === 'End') {
      list.scrollTop = list.scrollHeight;
    } else {
      return;
    }
    ev.preventDefault();
  }

  private _say(text: string, error = false): void {
    this._status.textContent = text;
    this._status.classList.toggle('jp-mod-error', error);
  }

  private _request: TriageRequest;
  private _search: HTMLInputElement;
  private _regex: HTMLInputElement;
  private _ranks: HTMLInputElement;
  private _follow: HTMLButtonElement;
  private _failureBox: HTMLDivElement;
  private _status: HTMLDivElement;
  private _list: HTMLDivElement;
  private _more: HTMLButtonElement;
  private _selected = '';
  private _cursor = '';
  private _params: { [k: string]: string } = {};
  private _mode: 'view' | 'search' | 'around' = 'view';
  private _failure: ITriageFailure | null = null;
  private _following = false;
  private _polling = false;
  private _timer: number | null = null;
  private _loaded = false;
  private _seq = 0;
  private _count = 0;
  private _lastHead = '';
}
