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

export interface ISeriesSpec {
  label: string;
  stroke: string;
}

export class RollingChart {
  constructor(
    parent: HTMLElement,
    title: string,
    series: ISeriesSpec[],
    yRange: [number, number] | null,
    windowSeconds: number
  ) {
    this.windowSeconds = windowSeconds;
    this.series = series;
    this.data = [[], ...series.map(() => [])];
    this.host = document.createElement('div');
    this.host.className = 'tl-chart';
    parent.appendChild(this.host);
    const width = Math.max(200, parent.clientWidth - 8);
    this.plot = new uPlot(
      {
        title,
        width,
        height: 120,
        legend: { show: true, live: false },
        cursor: { show: false },
        scales: {
          x: { time: true },
          y: yRange ? { range: yRange } : { auto: true }
        },
        axes: [
          { size: 24, stroke: 'var(--jp-ui-font-color2)', grid: { stroke: 'var(--jp-border-color2)' } },
          { size: 36, stroke: 'var(--jp-ui-font-color2)', grid: { stroke: 'var(--jp-border-color2)' } }
        ],
        series: [{}, ...series.map(s => ({ label: s.label, stroke: s.stroke, width: 1.5, spanGaps: false }))]
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

  /** Redraw if something was appended since the last redraw. */
  redraw(): void {
    if (this.dirty) {
      this.plot.setData(this.data as uPlot.AlignedData);
      this.dirty = false;
    }
  }

  resize(width: number): void {
    this.plot.setSize({ width: Math.max(200, width - 8), height: 120 });
  }

  get length(): number {
    return this.data[0].length;
  }

  dispose(): void {
    this.plot.destroy();
    this.host.remove();
  }

  readonly series: ISeriesSpec[];
  private windowSeconds: number;
  private data: (number | null)[][];
  private host: HTMLDivElement;
  private plot: uPlot;
  private dirty = false;
}
