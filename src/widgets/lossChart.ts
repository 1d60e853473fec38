/** The loss chart of a job: plain SVG, loss against step. */
import { fmt } from './dom';

const SVG_NS = 'http://www.w3.org/2000/svg';
const W = 280;
const H = 120;
const PAD_L = 36;
const PAD_B = 18;
const PAD_T = 6;
const PAD_R = 6;

/** Most points the loss line is drawn with; longer series are downsampled to this. */
export const MAX_CHART_POINTS = 2000;

/** The smallest and the largest of `values` (a loop: spreading 100k+ values overflows the stack). */
function extent(values: Iterable<number>): [number, number] {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (v < lo) {
      lo = v;
    }
    if (v > hi) {
      hi = v;
    }
  }
  return [lo, hi];
}

/**
 * At most `max` of `points` (a `max` below 4 counts as 4), in order: the series cut into
 * `max / 2` buckets, each kept by its lowest and highest loss (so spikes survive); the first
 * and last points are always kept.
 */
export function downsample(
  points: [number, number][],
  max: number = MAX_CHART_POINTS
): [number, number][] {
  if (points.length <= max) {
    return points;
  }
  const buckets = Math.max(1, Math.floor((Math.max(max, 4) - 2) / 2));
  const size = (points.length - 2) / buckets;
  const out: [number, number][] = [points[0]];
  for (let b = 0; b < buckets; b++) {
    const start = 1 + Math.floor(b * size);
    const end = Math.min(points.length - 1, 1 + Math.floor((b + 1) * size));
    let lo = start;
    let hi = start;
    for (let i = start; i < end; i++) {
      if (points[i][1] < points[lo][1]) {
        lo = i;
      }
      if (points[i][1] > points[hi][1]) {
        hi = i;
      }
    }
    if (start < end) {
      out.push(points[Math.min(lo, hi)]);
      if (lo !== hi) {
        out.push(points[Math.max(lo, hi)]);
      }
    }
  }
  out.push(points[points.length - 1]);
  return out;
}

function svg<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: { [name: string]: string | number }
): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    el.setAttribute(k, String(v));
  }
  return el;
}

/**
 * Render `points` (step, loss) into an SVG with axes, the loss line and vertical markers
 * at fault steps (red) and recovery steps (green). The line is drawn with at most
 * `MAX_CHART_POINTS` points (`downsample`); the axes span all of `points`, and `data-points`
 * counts all of them.
 *
 * @param points - `[step, loss]` pairs in arrival order (steps may repeat after a restore)
 * @param faults - steps at which faults were detected
 * @param recoveries - steps training resumed from
 */
export function renderLossChart(
  points: [number, number][],
  faults: number[] = [],
  recoveries: number[] = []
): SVGSVGElement {
  const root = svg('svg', {
    viewBox: `0 0 ${W} ${H}`,
    width: '100%',
    class: 'jp-HyperPod-lossChart',
    role: 'img',
    'data-testid': 'hp-loss-chart',
    'data-points': points.length
  });
  const title = svg('title', {});
  const last = points.length ? points[points.length - 1] : null;
  title.textContent = last
    ? `Loss ${fmt(last[1])} at step ${last[0]} (${points.length} points)`
    : 'Loss: no steps yet';
  root.appendChild(title);
  const x0 = PAD_L;
  const x1 = W - PAD_R;
  const y0 = H - PAD_B;
  const y1 = PAD_T;
  root.appendChild(
    svg('path', {
      d: `M${x0},${y1} L${x0},${y0} L${x1},${y0}`,
      class: 'jp-HyperPod-lossChart-axis',
      fill: 'none'
    })
  );
  if (points.length === 0) {
    const t = svg('text', { x: (x0 + x1) / 2, y: (y0 + y1) / 2, 'text-anchor': 'middle' });
    t.textContent = 'no steps yet';
    root.appendChild(t);
    return root;
  }
  const [sMin, sLast] = extent(points.map(p => p[0]));
  const sMax = Math.max(sMin + 1, sLast);
  let [lMin, lMax] = extent(points.map(p => p[1]));
  if (lMax - lMin < 1e-9) {
    lMin -= 0.5;
    lMax += 0.5;
  }
  const X = (s: number) => x0 + ((s - sMin) / (sMax - sMin)) * (x1 - x0);
  const Y = (l: number) => y0 - ((l - lMin) / (lMax - lMin)) * (y0 - y1);
  for (const [steps_, cls] of [
    [faults, 'jp-HyperPod-lossChart-fault'],
    [recoveries, 'jp-HyperPod-lossChart-recovery']
  ] as [number[], string][]) {
    for (const s of steps_) {
      if (s >= sMin && s <= sMax) {
        root.appendChild(
          svg('line', { x1: X(s), x2: X(s), y1: y1, y2: y0, class: cls })
        );
      }
    }
  }
  const d = downsample(points)
    .map(([s, l], i) => `${i === 0 ? 'M' : 'L'}${X(s).toFixed(1)},${Y(l).toFixed(1)}`)
    .join(' ');
  root.appendChild(
    svg('path', { d, class: 'jp-HyperPod-lossChart-line', fill: 'none' })
  );
  const labels: [number, number, string, string][] = [
    [x0 - 3, y1 + 8, fmt(lMax), 'end'],
    [x0 - 3, y0, fmt(lMin), 'end'],
    [x0, y0 + 13, String(sMin), 'start'],
    [x1, y0 + 13, String(sMax), 'end']
  ];
  for (const [x, y, text, anchor] of labels) {
    const t = svg('text', { x, y, 'text-anchor': anchor, class: 'jp-HyperPod-lossChart-label' });
    t.textContent = text;
    root.appendChild(t);
  }
  return root;
}
