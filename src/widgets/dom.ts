/** A tiny element builder for the views (no framework). */

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

/** Format a number with at most `digits` significant digits, or an em dash. */
export function fmt(value: number | null | undefined, digits = 3): string {
  if (value === null || value === undefined || !Number.isFinite(value)) {
    return '—';
  }
  return Number(value.toPrecision(digits)).toString();
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
