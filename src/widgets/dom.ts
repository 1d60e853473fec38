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
