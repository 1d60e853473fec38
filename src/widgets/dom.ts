/** A tiny element builder for the views (no framework). */
import { fmt } from '../format';

export { fmt };

/** Attributes of `h`: `class`, `data-*`, `aria-*`, properties such as `type` or `value`. */
export type Attrs = { [name: string]: string | number | boolean | null | undefined };

/**
 * Create an element with attributes and children (strings become text nodes).
 * `null`/`false`/`undefined` attribute values are left out.
 */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Attrs = {},
  ...children: (Node | string | null | undefined)[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) {
      continue;
    }
    if (name === 'class') {
      el.className = String(value);
    } else if (value === true) {
      el.setAttribute(name, '');
    } else {
      el.setAttribute(name, String(value));
    }
  }
  for (const child of children) {
    if (child === null || child === undefined) {
      continue;
    }
    el.appendChild(
      typeof child === 'string' ? document.createTextNode(child) : child
    );
  }
  return el;
}

/**
 * A `jp-HyperPod-button` with a test id; `attrs` adds to (or overrides) type `button` and the
 * class, e.g. `{ type: 'submit' }` or `{ class: 'jp-HyperPod-button jp-mod-warn' }`.
 */
export function button(testid: string, label: string, attrs: Attrs = {}): HTMLButtonElement {
  return h('button', { type: 'button', class: 'jp-HyperPod-button', 'data-testid': testid, ...attrs }, label);
}

/** A one-line text input for a name (no autocomplete, no spell check). */
export function textInput(id: string, placeholder: string, testid: string): HTMLInputElement {
  return h('input', { id, type: 'text', placeholder, autocomplete: 'off', spellcheck: 'false', 'data-testid': testid });
}

/** An alert for an error message (`jp-HyperPod-error`), hidden until there is one. */
export function errorBox(testid: string): HTMLDivElement {
  return h('div', { class: 'jp-HyperPod-error', role: 'alert', 'data-testid': testid, hidden: true });
}

/** A `div` whose changes screen readers announce (`aria-live="polite"`). */
export function liveBox(cls: string, testid: string, attrs: Attrs = {}): HTMLDivElement {
  return h('div', { class: cls, 'data-testid': testid, 'aria-live': 'polite', ...attrs });
}

/** A list named for screen readers by `label`. */
export function labelledList<K extends 'ul' | 'ol'>(
  tag: K,
  cls: string,
  testid: string,
  label: string,
  attrs: Attrs = {}
): HTMLElementTagNameMap[K] {
  return h(tag, { class: cls, 'data-testid': testid, 'aria-label': label, ...attrs });
}

/** A captioned table with one header row (`scope="col"`) above `body`. */
export function captionedTable(
  testid: string,
  caption: string,
  headers: string[],
  body: HTMLTableSectionElement
): HTMLTableElement {
  return h(
    'table',
    { class: 'jp-HyperPod-table', 'data-testid': testid },
    h('caption', { class: 'jp-HyperPod-dim' }, caption),
    h('thead', {}, h('tr', {}, ...headers.map(text => h('th', { scope: 'col' }, text)))),
    body
  );
}

/** A unique element id for label/control pairs. */
let counter = 0;
export function uid(prefix: string): string {
  counter += 1;
  return `${prefix}-${counter}`;
}

/** A clock time (local) of an epoch timestamp in seconds. */
export function clock(time: number): string {
  return new Date(time * 1000).toLocaleTimeString([], { hour12: false });
}

/** A goodput fraction (0..1) as a percentage with two decimals: `99.83 %`. */
export function percent(fraction: number | null | undefined): string {
  if (fraction === null || fraction === undefined || !Number.isFinite(fraction)) {
    return '—';
  }
  return `${(fraction * 100).toFixed(2)} %`;
}

/** A duration in seconds in the unit that reads best: `45 s`, `12 min`, `1.9 h`, `3.2 d`. */
export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) {
    return '—';
  }
  if (seconds < 120) {
    return `${fmt(seconds)} s`;
  }
  if (seconds < 7200) {
    return `${fmt(seconds / 60)} min`;
  }
  if (seconds < 172800) {
    return `${fmt(seconds / 3600)} h`;
  }
  return `${fmt(seconds / 86400)} d`;
}
