/**
 * The dashboard's events table: pages through the job's events (`GET jobs/{id}/events`, a
 * cursor per page, never the whole history at once) with filters by kind, rank and text. Rows
 * are focusable; Enter (or a click) on a row calls `onActivate` (the dashboard opens a fault's
 * log from it).
 */
import { describeEvent } from '../../format';
import { requestAPI } from '../../api/network';
import { EVENT_KINDS, IJobEvent } from '../../api/events';
import { button, clock, h, uid } from '../dom';

/** Events per page. */
export const EVENTS_PAGE = 500;
/** Most events kept loaded (older pages are not dropped: loading stops there). */
export const MAX_LOADED = 50_000;
/** Most pages loaded at once while a filter matches too few loaded rows. */
const FILTER_PAGES = 10;

/** A rank an event is about: `data.rank` (a number), else the writer's `rank-N`, else null. */
export function eventRank(ev: IJobEvent): number | null {
  const r = ev.data.rank;
  if (typeof r === 'number') {
    return r;
  }
  const m = /^rank-(\d+)$/.exec(ev.writer);
  return m ? Number(m[1]) : null;
}

/** The events table of one job. */
export class EventsTable {
  constructor(jobId: string, onActivate: (ev: IJobEvent) => void) {
    this._jobId = jobId;
    this._onActivate = onActivate;
    const kindId = uid('hp-dash-kind');
    const rankId = uid('hp-dash-rank');
    const textId = uid('hp-dash-text');
    this._kind = h('select', { id: kindId, 'data-testid': 'hp-dash-filter-kind' }, h('option', { value: '' }, 'all kinds'),
      ...EVENT_KINDS.map(k => h('option', { value: k }, k)));
    this._rank = h('input', { id: rankId, type: 'number', min: 0, step: 1, placeholder: 'any', 'data-testid': 'hp-dash-filter-rank', class: 'jp-HyperPodDash-rankInput' });
    this._text = h('input', { id: textId, type: 'search', placeholder: 'text', autocomplete: 'off', spellcheck: 'false', 'data-testid': 'hp-dash-filter-text' });
    this._more = button('hp-dash-events-more', 'Load more');
    this._status = h('span', { class: 'jp-HyperPod-dim', 'data-testid': 'hp-dash-events-status', 'aria-live': 'polite' });
    this._body = h('tbody');
    this._scroller = h(
      'div',
      { class: 'jp-HyperPodDash-eventsScroll', 'data-testid': 'hp-dash-events-scroll' },
      h('table', { class: 'jp-HyperPod-table jp-HyperPodDash-events', 'data-testid': 'hp-dash-events' },
        h('caption', { class: 'jp-HyperPod-dim' }, 'Events (Enter on a fault opens its log)'),
        h('thead', {}, h('tr', {}, ...['Time', 'Kind', 'Rank', 'Writer', 'Details'].map(t => h('th', { scope: 'col' }, t)))),
        this._body)
    );
    this.node = h(
      'div',
      { class: 'jp-HyperPodDash-eventsPanel' },
      h('div', { class: 'jp-HyperPodDash-filters', role: 'search', 'aria-label': 'Filter events' },
        h('label', { for: kindId }, 'Kind '), this._kind,
        h('label', { for: rankId }, ' Rank '), this._rank,
        h('label', { for: textId }, ' Text '), this._text,
        ' ', this._more, ' ', this._status),
      this._scroller
    );
    const changed = () => void this._filterChanged();
    this._kind.addEventListener('change', changed);
    this._rank.addEventListener('input', changed);
    this._text.addEventListener('input', changed);
    this._more.addEventListener('click', () => void this.loadMore());
    this._scroller.addEventListener('scroll', () => {
      const s = this._scroller;
      if (s.scrollTop + s.clientHeight > s.scrollHeight - 200 && this._hasMore && !this._loading) {
        void this.loadMore();
      }
    }, { passive: true });
    this._body.addEventListener('keydown', e => this._onKey(e));
    this._body.addEventListener('click', e => {
      const row = (e.target as HTMLElement).closest('tr[data-index]');
      if (row) {
        this._activate(row as HTMLElement);
      }
    });
  }

  /** The element to add to a page. */
  readonly node: HTMLDivElement;

  /** Events loaded so far. */
  get loaded(): number {
    return this._events.length;
  }

  /** Load the next page of events (after the cursor). Resolves to the number of new events. */
  async loadMore(): Promise<number> {
    if (this._loading || this._events.length >= MAX_LOADED) {
      return 0;
    }
    this._loading = true;
    this._more.disabled = true;
    try {
      const q = [`limit=${EVENTS_PAGE}`];
      if (this._cursor) {
        q.push(`cursor=${encodeURIComponent(this._cursor)}`);
      }
      const page = await requestAPI<{ events: IJobEvent[]; cursor: string; more: boolean }>(
        `jobs/${encodeURIComponent(this._jobId)}/events?${q.join('&')}`
      );
      this._cursor = page.cursor;
      this._hasMore = page.more;
      const start = this._events.length;
      this._events.push(...page.events);
      this._appendRows(start);
      return page.events.length;
    } catch (e) {
      this._status.textContent = `Events not loaded: ${(e as Error).message}`;
      return 0;
    } finally {
      this._loading = false;
      this._more.disabled = false;
      this._updateStatus();
    }
  }

  /** New events may have arrived (the job runs): load what follows the cursor. */
  async refresh(): Promise<void> {
    if (!this._hasMore) {
      this._hasMore = true;
      await this.loadMore();
    }
  }

  private _matches(ev: IJobEvent): boolean {
    const kind = this._kind.value;
    if (kind && ev.kind !== kind) {
      return false;
    }
    const rank = this._rank.value.trim();
    if (rank !== '' && eventRank(ev) !== Number(rank)) {
      return false;
    }
    const text = this._text.value.trim().toLowerCase();
    if (text && !`${ev.kind} ${ev.writer} ${describeEvent(ev)} ${JSON.stringify(ev.data)}`.toLowerCase().includes(text)) {
      return false;
    }
    return true;
  }

  private async _filterChanged(): Promise<void> {
    this._body.textContent = '';
    this._shown = 0;
    this._appendRows(0);
    // a filter that matches few loaded rows: read on a few pages
    let pages = 0;
    while (this._shown < 50 && this._hasMore && pages < FILTER_PAGES && !this._loading) {
      pages += 1;
      if ((await this.loadMore()) === 0) {
        break;
      }
    }
    this._updateStatus();
  }

  private _appendRows(start: number): void {
    const rows: HTMLElement[] = [];
    const t0 = this._events.length ? this._events[0].time : 0;
    for (let i = start; i < this._events.length; i++) {
      const ev = this._events[i];
      if (!this._matches(ev)) {
        continue;
      }
      const rank = eventRank(ev);
      const fault = ev.kind === 'fault.detected';
      rows.push(
        h(
          'tr',
          {
            tabindex: 0,
            'data-index': i,
            'data-kind': ev.kind,
            'data-rank': rank ?? '',
            class: fault ? 'jp-HyperPodDash-eventRow jp-mod-fault' : 'jp-HyperPodDash-eventRow',
            title: fault ? 'Enter or click: open this rank\'s log at its traceback' : null
          },
          h('td', { class: 'jp-mod-number', title: `${(ev.time - t0).toFixed(3)} s after the first event` }, clock(ev.time)),
          h('td', {}, ev.kind),
          h('td', { class: 'jp-mod-number' }, rank === null ? '' : String(rank)),
          h('td', {}, ev.writer),
          h('td', {}, describeEvent(ev))
        )
      );
    }
    this._shown += rows.length;
    this._body.append(...rows);
  }

  private _updateStatus(): void {
    const filtered = this._kind.value || this._rank.value || this._text.value;
    this._status.textContent =
      `${filtered ? `${this._shown} of ` : ''}${this._events.length} events loaded` +
      (this._hasMore ? (this._events.length >= MAX_LOADED ? ' (the most kept)' : ', more to load') : '');
    this._status.setAttribute('data-shown', String(this._shown));
    this._more.hidden = !this._hasMore || this._events.length >= MAX_LOADED;
  }

  private _activate(row: HTMLElement): void {
    const ev = this._events[Number(row.getAttribute('data-index'))];
    if (ev) {
      this._onActivate(ev);
    }
  }

  private _onKey(e: KeyboardEvent): void {
    const row = (e.target as HTMLElement).closest('tr[data-index]') as HTMLElement | null;
    if (!row) {
      return;
    }
    if (e.key === 'Enter') {
      e.preventDefault();
      this._activate(row);
    } else if (e.key === 'ArrowDown' || e.key === 'ArrowUp') {
      e.preventDefault();
      const next = (e.key === 'ArrowDown' ? row.nextElementSibling : row.previousElementSibling) as HTMLElement | null;
      next?.focus();
    }
  }

  private _jobId: string;
  private _onActivate: (ev: IJobEvent) => void;
  private _events: IJobEvent[] = [];
  private _cursor: string | null = null;
  private _hasMore = true;
  private _loading = false;
  private _shown = 0;
  private _kind: HTMLSelectElement;
  private _rank: HTMLInputElement;
  private _text: HTMLInputElement;
  private _more: HTMLButtonElement;
  private _status: HTMLSpanElement;
  private _body: HTMLTableSectionElement;
  private _scroller: HTMLDivElement;
}
