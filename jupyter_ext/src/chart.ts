/**
 * A rolling time-series chart on uPlot.
 *
 * Why uPlot and not BokehJS here: the sidebar draws a few small line charts
 * that get one point per second. uPlot (MIT, maintained, ~50 KB) is built for
 * exactly that (canvas, fast appends, no layout engine), keeps the
 * labextension around 100 KB instead of ~3 MB and node_modules ~100 MB
 * smaller, and needs no server round trip to build a figure. BokehJS stays
 * the right tool for the notebook-side reports, where figures come from Python.
 */
import uPlot from 'uplot';

import { byteTicks, percentTicks, timeTicks } from './units';

export interface ISeriesSpec {
  label: string;
  stroke: string;
}

export interface IChartOptions {
  /** fixed y range (percentages); null: fit the data */
  yRange: [number, number] | null;
  /** y tick labels: bytes (in the unit picked from the range) or percent */
  yUnit: 'bytes' | '%';
  height?: number;
  /** draw each value until the next one (a step function, as memory over a cell is) */
  stepped?: boolean;
}

const FONT_PX = 11;
const FONT = `${FONT_PX}px system-ui, -apple-system, "Segoe UI", sans-serif`;
const TICK = 4;
const GAP = 4;
/** y tick labels at least this far apart, and at most this many on a tall chart */
const Y_TICK_PX = 24;
const MAX_Y_TICKS = 7;

/**
 * A CSS custom property's value: canvas colours cannot be `var(--...)` (the
 * context silently keeps its previous colour, which drew faint labels).
 */
function themeColor(name: string, fallback: string): string {
  const value = getComputedStyle(document.body).getPropertyValue(name).trim();
  return value || fallback;
}

let measureCtx: CanvasRenderingContext2D | null = null;
function textWidth(text: string): number {
  measureCtx = measureCtx ?? document.createElement('canvas').getContext('2d');
  if (!measureCtx) {
    return text.length * FONT_PX * 0.6;
  }
  measureCtx.font = FONT;
  return measureCtx.measureText(text).width;
}

/** Byte tick steps: powers of two, so a step in any binary unit is written exactly (0.25, 64). */
const BYTE_INCRS = [...Array(51).keys()].map(k => 2 ** k);

export class RollingChart {
  constructor(parent: HTMLElement, title: string, series: ISeriesSpec[], options: IChartOptions, windowSeconds: number) {
    this.windowSeconds = windowSeconds;
    this.series = series;
    this.height = options.height ?? 130;
    this.data = [[], ...series.map(() => [])];
    this.host = document.createElement('div');
    this.host.className = 'tl-chart';
    parent.appendChild(this.host);
    const width = Math.max(200, parent.clientWidth);
    const text = themeColor('--jp-ui-font-color1', '#222');
    const grid = themeColor('--jp-border-color2', '#e0e0e0');
    const yUnit = options.yUnit;
    // what both axes share: readable labels in the theme's colours
    const axis = {
      font: FONT,
      stroke: text,
      grid: { stroke: grid, width: 1 },
      ticks: { stroke: grid, width: 1, size: TICK },
      gap: GAP
    };
    this.plot = new uPlot(
      {
        title,
        width,
        height: this.height,
        legend: { show: true, live: false },
        cursor: { show: false },
        scales: {
          x: { time: true },
          y: options.yRange ? { range: options.yRange } : { auto: true }
        },
        axes: [
          {
            ...axis,
            space: 64,
            size: FONT_PX + TICK + GAP + 6,
            values: (_u, splits) => {
              const labels = timeTicks(splits);
              this.host.dataset.xTicks = labels.join('|'); // what a test reads, as for y
              return labels;
            }
          },
          {
            ...axis,
            // a tall chart spaces its labels out: no more than MAX_Y_TICKS to read
            space: (_u, _axis, _min, _max, plotPx) => Math.max(Y_TICK_PX, plotPx / MAX_Y_TICKS),
            ...(yUnit === 'bytes' ? { incrs: BYTE_INCRS } : {}),
            values: (_u, splits) => {
              const labels = yUnit === 'bytes' ? byteTicks(splits) : percentTicks(splits);
              this.host.dataset.yTicks = labels.join('|');
              return labels;
            },
            // as wide as the widest tick label: labels are never cut at the left edge
            size: (_u, values) => {
              const widest = Math.max(0, ...(values ?? []).map(v => textWidth(String(v))));
              return Math.ceil(widest + TICK + GAP + 4);
            }
          }
        ],
        series: [
          {},
          ...series.map(s => ({
            label: s.label,
            stroke: s.stroke,
            width: 1.5,
            spanGaps: false,
            ...(options.stepped ? { paths: uPlot.paths.stepped!({ align: 1 }) } : {})
          }))
        ],
        hooks: { draw: [u => this.noteRange(u)] }
      },
      this.data as uPlot.AlignedData,
      this.host
    );
  }

  /** Append one point per series (null = not measured: a gap in the line). */
  append(t: number, values: (number | null)[]): void {
    this.data[0].push(t);
    values.forEach((v, i) => this.data[i + 1].push(v));
    const horizon = t - this.windowSeconds;
    let drop = 0;
    while (drop < this.data[0].length && (this.data[0][drop] as number) < horizon) {
      drop++;
    }
    if (drop > 0) {
      this.data.forEach(column => column.splice(0, drop));
    }
    this.dirty = true;
  }

  /**
   * The y axis's range and the data's, as drawn (`data-y-min`, `data-y-max`,
   * `data-data-min`, `data-data-max`): what a test compares to say the axis
   * covers what the chart plots.
   */
  private noteRange(u: uPlot): void {
    const values = this.data.slice(1).flat().filter((v): v is number => v !== null && v !== undefined);
    const y = u.scales.y;
    Object.assign(this.host.dataset, {
      yMin: String(y.min ?? ''),
      yMax: String(y.max ?? ''),
      dataMin: values.length ? String(Math.min(...values)) : '',
      dataMax: values.length ? String(Math.max(...values)) : ''
    });
  }

  /** A new title over the plot (the quantity drawn changed, or the run ended). */
  setTitle(title: string): void {
    const node = this.host.querySelector('.u-title');
    if (node) {
      node.textContent = title;
    }
  }

  /** Redraw if something was appended since the last redraw. */
  redraw(): void {
    if (this.dirty) {
      this.plot.setData(this.data as uPlot.AlignedData);
      this.dirty = false;
    }
  }

  /** New size in CSS pixels; the height stays unless given. */
  resize(width: number, height?: number): void {
    this.height = height ?? this.height;
    this.plot.setSize({ width: Math.max(200, width), height: this.height });
  }

  get length(): number {
    return this.data[0].length;
  }

  /** The whole chart's height (title, plot, legend) as laid out. */
  get outerHeight(): number {
    return this.host.offsetHeight;
  }

  get plotHeight(): number {
    return this.height;
  }

  dispose(): void {
    this.plot.destroy();
    this.host.remove();
  }

  readonly series: ISeriesSpec[];
  private windowSeconds: number;
  private height: number;
  private data: (number | null)[][];
  private host: HTMLDivElement;
  private plot: uPlot;
  private dirty = false;
}
