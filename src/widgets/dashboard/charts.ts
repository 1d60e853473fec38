/**
 * The dashboard's loss and throughput charts, drawn with uPlot (canvas; fast at any number of
 * points). The server sends the step series already downsampled by min/max buckets
 * (`IDashboardSeries`), so a million-step job draws a few thousand points. Colours come from
 * the JupyterLab theme's CSS variables, read again when the theme changes.
 */
import uPlot from 'uplot';

import { IDashboardSeries } from '../../api/rest';
import { h } from '../dom';

/** A CSS variable's value on the page (uPlot draws on a canvas: it needs the colour itself). */
function cssVar(name: string, fallback: string): string {
  const v = getComputedStyle(document.body).getPropertyValue(name).trim();
  return v || fallback;
}

interface IChartSpec {
  key: 'loss' | 'steps_per_s';
  title: string;
  unit: string;
  colorVar: string;
}

const CHARTS: IChartSpec[] = [
  { key: 'loss', title: 'Loss', unit: 'loss', colorVar: '--jp-brand-color1' },
  { key: 'steps_per_s', title: 'Throughput', unit: 'steps/s', colorVar: '--jp-success-color1' }
];

/** Loss and steps/s against the step, one uPlot each. */
export class StepCharts {
  constructor() {
    this.node = h('div', { class: 'jp-HyperPodDash-charts', 'data-testid': 'hp-dash-charts' });
    this._boxes = CHARTS.map(c => {
      const box = h('figure', {
        class: 'jp-HyperPodDash-chart',
        'data-testid': `hp-dash-chart-${c.key}`,
        'data-points': 0,
        role: 'img',
        'aria-label': `${c.title} (${c.unit}) by step`
      });
      box.appendChild(h('figcaption', { class: 'jp-HyperPod-subheading' }, `${c.title} (${c.unit})`));
      this.node.appendChild(box);
      return box;
    });
  }

  /** The element to add to a page. */
  readonly node: HTMLDivElement;

  /** Draw `series` (replacing what was drawn). */
  setData(series: IDashboardSeries): void {
    this._series = series;
    this._draw();
  }

  /** The theme changed: draw again with its colours. */
  themeChanged(): void {
    this._destroy();
    this._draw();
  }

  /** The container's width changed. */
  resize(): void {
    const w = this._width();
    for (const p of this._plots) {
      if (p && Math.abs(p.width - w) > 2) {
        p.setSize({ width: w, height: 160 });
      }
    }
  }

  dispose(): void {
    this._destroy();
  }

  private _width(): number {
    return Math.max(240, Math.floor((this.node.clientWidth || 640) / 2) - 24);
  }

  private _destroy(): void {
    for (const p of this._plots) {
      p?.destroy();
    }
    this._plots = [];
  }

  private _draw(): void {
    const s = this._series;
    if (!s) {
      return;
    }
    const x = s.step;
    CHARTS.forEach((c, i) => {
      const y = s[c.key];
      const data: uPlot.AlignedData = [x, y as (number | null)[]];
      const box = this._boxes[i];
      box.setAttribute('data-points', String(x.length));
      const plot = this._plots[i];
      if (plot) {
        plot.setData(data);
        return;
      }
      const fg = cssVar('--jp-ui-font-color1', '#333');
      const grid = cssVar('--jp-border-color2', '#ddd');
      const axis: uPlot.Axis = { stroke: fg, grid: { stroke: grid, width: 1 }, ticks: { stroke: grid, width: 1 } };
      const opts: uPlot.Options = {
        width: this._width(),
        height: 160,
        scales: { x: { time: false } },
        legend: { show: true },
        cursor: { drag: { x: true, y: false } },
        axes: [{ ...axis, label: 'step' }, { ...axis }],
        series: [
          { label: 'step' },
          { label: c.unit, stroke: cssVar(c.colorVar, '#1976d2'), width: 1.5, spanGaps: true, points: { show: false } }
        ]
      };
      this._plots[i] = new uPlot(opts, data, box);
      box.setAttribute('data-drawn', 'true');
    });
  }

  private _boxes: HTMLElement[];
  private _plots: (uPlot | undefined)[] = [];
  private _series: IDashboardSeries | null = null;
}
