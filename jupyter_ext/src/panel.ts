/**
 * The "GPU Monitor" sidebar panel.
 *
 * It holds no history of its own beyond what it draws: on start (and after a
 * page reload) it opens the server's WebSocket, which sends the history first
 * and then pushes each new sample. If the socket closes or cannot be opened
 * (a proxy without WebSocket support), the panel long-polls the REST endpoint
 * meanwhile and retries the socket with exponential backoff; a reconnect asks
 * only for what it has not drawn (`?since=`). Pausing tells the server to stop
 * sending (or stops polling), so with no other watcher it drops to its idle
 * rate; resuming fetches the gap from the server's history.
 *
 * Below the monitor, the "torchrun jobs" section (runs.ts) lists the
 * `torchlens run` jobs of the server's machine; it polls only while the
 * panel is shown.
 */
import { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';

import {
  fetchCsv,
  fetchSamples,
  IFeedMessage,
  IGpuSample,
  IRankSample,
  ISample,
  MemorySource,
  openFeed,
  setSamplingInterval
} from './api';
import { RollingChart } from './chart';
import { el } from './dom';
import { RunsSection } from './runs';
import { clockTime, formatAgo, formatBytes, formatCelsius, formatMBps, formatPercent, formatWatts, MISSING } from './units';

const WINDOW_SECONDS = 600;
const LONG_POLL_SECONDS = 10;
const BACKOFF_MIN_SECONDS = 1;
const BACKOFF_MAX_SECONDS = 30;
const INTERVALS = [0.5, 1, 2, 5, 10];
const COLORS = ['#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2', '#17becf'];

/** a run whose chart got no memory sample for this long (while the host's did) is marked stale */
const RANK_STALE_S = 10;
const RANK_CHART_MIN = 160;
const RANK_CHART_MAX = 900;

/** '' for a value the sampler did not send: an addition to a line that stands without it. */
function opt(value: number | null | undefined, fmt: (v: number) => string): string {
  return value === null || value === undefined ? '' : fmt(value);
}

/** The sampler's metric keys, in the words the card uses for them. */
const METRIC_NAMES: Record<string, string> = {
  util_gpu: 'util',
  mem_used: 'memory',
  mem_reserved: 'driver-reserved memory',
  temp_c: 'temp',
  power_w: 'power',
  power_limit_w: 'power limit',
  pcie_tx_bps: 'PCIe tx',
  pcie_rx_bps: 'PCIe rx',
  nvlink_tx_bps: 'NVLink tx',
  nvlink_rx_bps: 'NVLink rx'
};

/** What shows when NVML's pids are the host's and the server sent no note of its own. */
const HOST_PIDS_NOTE = 'process ids are the host\u2019s (the server runs in a container); names not shown';

/**
 * "not read: NVLink tx, NVLink rx (field 138: NVML_ERROR_NOT_SUPPORTED; ...)":
 * the metrics NVML would not give, grouped by why, or '' when it gave all.
 */
export function notReadText(notRead: Record<string, string> | undefined): string {
  const byWhy = new Map<string, string[]>();
  for (const [key, why] of Object.entries(notRead ?? {})) {
    byWhy.set(why, [...(byWhy.get(why) ?? []), METRIC_NAMES[key] ?? key]);
  }
  const parts = [...byWhy].map(([why, names]) => `${names.join(', ')} (${why})`);
  return parts.length ? `not read: ${parts.join('; ')}` : '';
}

/**
 * How each memory source is named in the rank section: a short tag per rank,
 * and one plain sentence under the section's title for each source shown.
 */
const SOURCE_TEXT: Record<MemorySource, { tag: string; note: string }> = {
  cuda: {
    tag: 'CUDA',
    note: 'CUDA: measured, the caching allocator\u2019s own counters (largest free needs a snapshot).'
  },
  modelled: {
    tag: 'modelled (CPU)',
    note:
      'Modelled, not measured: a CPU run has no CUDA allocator, so torchlens replayed each step\u2019s ' +
      'allocations through its model of one. These are what it would hold.'
  },
  rss: { tag: 'RSS (CPU)', note: 'RSS: the process\u2019s resident memory; no allocator figures.' }
};

// one clock for the axes and the text: the axes' 24-hour time (a 12-hour
// text under a 24-hour axis read as two different times)
const clock = (t: number) => clockTime(t);

/**
 * Whether a sample's figure is the process's resident memory: said so
 * (`source: 'rss'`), or a heartbeat of a rank with no CUDA device, which
 * carries no source and sends its RSS as `allocated` (frontends/shared/live_publish.py).
 */
function isRss(r: IRankSample): boolean {
  return r.source === 'rss' || (!r.source && r.device === null && (r.reserved === null || r.reserved === undefined));
}

/** What the rank chart's line is, in its title: the quantity the samples carry, in the report's words. */
function rankChartTitle(r: IRankSample): string {
  if (r.final) {
    return `${r.run}: allocated memory, as in its report`;
  }
  const what = isRss(r) ? 'resident memory (RSS)' : 'memory allocated';
  return `Run ${r.run}: ${what} per rank`;
}

/** A sample that carries allocator figures (`%ddp_check --profile`), not just a memory total. */
function hasAllocatorFigures(r: IRankSample): boolean {
  return (
    (r.inactive_split !== null && r.inactive_split !== undefined) ||
    (r.largest_free !== null && r.largest_free !== undefined) ||
    r.source === 'cuda' ||
    r.source === 'modelled'
  );
}

export class GpuMonitorPanel extends Widget {
  constructor() {
    super();
    this.addClass('tl-monitor');
    this.status = el('div', 'tl-status', 'connecting…');
    const controls = el('div', 'tl-controls');
    this.intervalSelect = el('select', 'tl-interval');
    this.intervalSelect.title = 'Sampling interval (server-wide)';
    for (const s of INTERVALS) {
      const option = el('option', '', `${s} s`);
      option.value = String(s);
      this.intervalSelect.appendChild(option);
    }
    this.intervalSelect.onchange = () => void this.changeInterval();
    this.pauseButton = el('button', 'tl-pause jp-mod-styled', 'Pause');
    this.pauseButton.onclick = () => this.togglePause();
    const exportButton = el('button', 'tl-export jp-mod-styled', 'Export CSV');
    exportButton.onclick = () => void this.exportCsv();
    controls.append(this.intervalSelect, this.pauseButton, exportButton);
    this.hostText = el('div', 'tl-host');
    this.hostCharts = el('div', 'tl-host-charts');
    this.gpuBox = el('div', 'tl-gpus');
    this.rankBox = el('div', 'tl-ranks');
    this.rankState = el('div', 'tl-rank-state tl-dim');
    this.rankMemBox = el('div', 'tl-rank-mem');
    this.footer = el('div', 'tl-footer');
    this.node.append(
      this.status,
      controls,
      this.hostText,
      this.hostCharts,
      this.gpuBox,
      this.rankBox,
      this.rankState,
      this.rankMemBox,
      this.runs.node,
      this.footer
    );
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    if (!this.started) {
      this.started = true;
      this.connect();
    }
    this.runs.start();
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this.runs.stop(); // the job list is polled only while someone can see it
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    const width = this.chartWidth;
    [this.hostChart, ...this.gpuCharts.values(), this.rankChart].forEach(c => c?.resize(width));
    this.fitRankChart();
  }

  /** The panel's inner width (its padding is 6 px a side). */
  private get chartWidth(): number {
    return this.node.clientWidth - 12;
  }

  /**
   * The rank chart takes the panel's spare height (what the host and GPU
   * blocks leave), so a DDP run's memory is drawn large, not in a strip
   * above an empty panel.
   */
  private fitRankChart(): void {
    const chart = this.rankChart;
    if (!chart || !this.node.clientHeight) {
      return;
    }
    const used = this.footer.getBoundingClientRect().bottom - this.node.getBoundingClientRect().top + this.node.scrollTop + 6;
    const spare = this.node.clientHeight - used;
    const height = Math.round(Math.min(RANK_CHART_MAX, Math.max(RANK_CHART_MIN, chart.plotHeight + spare)));
    if (Math.abs(height - chart.plotHeight) > 4) {
      chart.resize(this.chartWidth, height);
    }
  }

  dispose(): void {
    this.stopped = true;
    this.runs.stop();
    window.clearTimeout(this.reconnectTimer);
    this.socket?.close();
    super.dispose();
  }

  /** Open the push socket; on failure poll meanwhile and retry with backoff. */
  private connect(): void {
    if (this.stopped) {
      return;
    }
    let opened = false;
    let ws: WebSocket;
    try {
      ws = openFeed(this.since);
    } catch (err) {
      this.socketClosed(false);
      return;
    }
    this.socket = ws;
    ws.onopen = () => {
      opened = true;
      this.backoff = BACKOFF_MIN_SECONDS;
      this.node.dataset.transport = 'websocket';
      if (this.paused) {
        ws.send(JSON.stringify({ pause: true }));
      }
    };
    ws.onmessage = event => {
      if (this.paused || this.stopped) {
        return; // `since` stays put: resuming asks the server for the gap
      }
      const message = JSON.parse(event.data as string) as IFeedMessage;
      this.intervalSelect.value = String(message.interval);
      this.ingest(message.samples, message.ranks);
    };
    // an error is always followed by close
    ws.onclose = () => {
      if (this.socket === ws) {
        this.socket = null;
        this.socketClosed(opened);
      }
    };
  }

  private socketClosed(wasOpen: boolean): void {
    if (this.stopped) {
      return;
    }
    this.node.dataset.transport = 'polling';
    if (!this.polling) {
      void this.pollLoop();
    }
    // a socket that worked is retried soon (server restart); one that never opened, ever later
    const delay = wasOpen ? BACKOFF_MIN_SECONDS : this.backoff;
    this.backoff = Math.min(BACKOFF_MAX_SECONDS, this.backoff * 2);
    this.reconnectTimer = window.setTimeout(() => this.connect(), delay * 1000 * (0.8 + 0.4 * Math.random()));
  }

  private get socketOpen(): boolean {
    return this.socket !== null && this.socket.readyState === WebSocket.OPEN;
  }

  /** Long polling: the fallback while the socket is down; stops once it is up. */
  private async pollLoop(): Promise<void> {
    this.polling = true;
    try {
      await this.poll();
    } finally {
      this.polling = false;
    }
  }

  private async poll(): Promise<void> {
    while (!this.stopped && !this.socketOpen) {
      if (this.paused) {
        await new Promise(resolve => setTimeout(resolve, 250));
        continue;
      }
      try {
        const reply = await fetchSamples(this.since, this.since === 0 ? 0 : LONG_POLL_SECONDS);
        if (this.paused || this.stopped || this.socketOpen) {
          continue;
        }
        this.intervalSelect.value = String(reply.interval);
        this.ingest(reply.samples, reply.ranks);
      } catch (err) {
        this.status.textContent = `monitor unreachable: ${err}`;
        this.status.classList.add('tl-error');
        await new Promise(resolve => setTimeout(resolve, 2000));
      }
    }
  }

  private ingest(samples: ISample[], ranks: IRankSample[]): void {
    let last: ISample | undefined;
    for (const s of samples) {
      if (s.t <= this.lastSampleT) {
        continue; // already drawn: a poll answer overlapping the socket's first message
      }
      this.lastSampleT = s.t;
      last = s;
      this.ensureHostChart();
      const h = s.host;
      this.hostChart!.append(s.t, [h.cpu_percent, h.ram_percent]);
      for (const g of s.gpu.gpus) {
        this.gpuChart(g).append(s.t, [g.util_gpu, g.mem_used !== null && g.mem_total ? (100 * g.mem_used) / g.mem_total : null]);
      }
      this.received++;
      this.since = Math.max(this.since, s.t);
    }
    // a kernel posts all ranks of one step together: one chart point per distinct time
    let memChanged = false;
    let toDraw = false;
    ranks.forEach((r, i) => {
      if (r.run === this.rankFinished && !r.final) {
        return; // a live sample behind the finished cell's report figures
      }
      this.rankSeries(r);
      if (hasAllocatorFigures(r)) {
        this.rankMemory.set(r.rank, r);
        memChanged = true;
      }
      // the line is the memory the rank holds; a modelled figure (a CPU run
      // replayed through the allocator model) is another quantity: text only
      if (r.source !== 'modelled') {
        this.rankLatest.set(r.rank, r);
        toDraw = true;
        this.setRankTitle(rankChartTitle(r));
      }
      if (r.final) {
        this.rankEnd = Math.max(this.rankEnd, r.t);
        this.rankPeak = r.peak ?? this.rankPeak;
      }
      this.since = Math.max(this.since, r.t);
      const endOfGroup = i === ranks.length - 1 || ranks[i + 1].t !== r.t || ranks[i + 1].run !== r.run;
      if (endOfGroup) {
        // a step record ends before the heartbeat posted with it: x must only grow
        if (toDraw && r.t > this.rankChartT) {
          this.rankChartT = r.t;
          this.rankChart?.append(r.t, this.rankValues());
        }
        toDraw = false;
      }
    });
    if (memChanged) {
      this.renderRankMemory();
    }
    if (last) {
      this.renderText(last);
    }
    this.renderRankState(last);
    [this.hostChart, ...this.gpuCharts.values(), this.rankChart].forEach(c => c?.redraw());
    this.fitRankChart();
    if (last) {
      requestAnimationFrame(() => {
        const latencyMs = Date.now() - last.t * 1000;
        this.node.dataset.latencyMs = String(Math.round(latencyMs));
      });
    }
  }

  private renderText(s: ISample): void {
    this.status.classList.remove('tl-error');
    this.status.classList.toggle('tl-nogpu', !s.gpu.gpus.length);
    this.status.textContent = s.gpu.status;
    const h = s.host;
    this.hostText.replaceChildren(
      el('span', 'tl-host-cpu', `CPU ${formatPercent(h.cpu_percent)} of ${h.cpu_count ?? MISSING} cores`),
      el('span', 'tl-host-ram', `RAM ${formatBytes(h.ram_used)} / ${formatBytes(h.ram_total)}`)
    );
    const pidsNote = s.gpu.pids === 'host' ? s.gpu.pids_note ?? HOST_PIDS_NOTE : '';
    this.gpuBox.replaceChildren(...s.gpu.gpus.map(g => this.gpuCard(g, pidsNote)));
    const when = clock(s.t);
    this.footer.textContent = `${this.received} samples · last ${when}`;
    this.footer.dataset.samples = String(this.received);
  }

  private gpuCard(g: IGpuSample, pidsNote: string): HTMLElement {
    const card = el('div', 'tl-gpu');
    const label = g.mig_parent !== null ? `GPU ${g.index} MIG ${g.mig_slot}` : `GPU ${g.index}`;
    const cuda = g.cuda !== null ? ` (cuda:${g.cuda})` : '';
    card.appendChild(el('div', 'tl-gpu-title', `${label}${cuda}: ${g.name}`));
    if (g.cuda === null && g.cuda_note) {
      // which cuda:k this GPU is cannot be told here: say why, not a guess
      card.appendChild(el('div', 'tl-cuda-note tl-dim', `no CUDA ordinal: ${g.cuda_note}`));
    }
    const power = `${formatWatts(g.power_w)} / ${formatWatts(g.power_limit_w)}`;
    const reserved = opt(g.mem_reserved, v => ` (+ ${formatBytes(v)} reserved by the driver)`);
    const pcieAge = opt(g.pcie_age_s, v => ` (read ${formatAgo(v)})`);
    const rows: [string, string][] = [
      ['util', `${formatPercent(g.util_gpu)} (mem ${formatPercent(g.util_mem)})`],
      ['memory', `${formatBytes(g.mem_used)} / ${formatBytes(g.mem_total)}${reserved}`],
      ['temp', formatCelsius(g.temp_c)],
      ['power', power],
      ['PCIe', `tx ${formatMBps(g.pcie_tx_bps)} · rx ${formatMBps(g.pcie_rx_bps)}${pcieAge}`],
      ['NVLink', `tx ${formatMBps(g.nvlink_tx_bps)} · rx ${formatMBps(g.nvlink_rx_bps)}`]
    ];
    const table = el('table', 'tl-metrics');
    for (const [k, v] of rows) {
      const tr = el('tr', '');
      tr.append(el('td', '', k), el('td', '', v));
      table.appendChild(tr);
    }
    card.appendChild(table);
    const notRead = notReadText(g.not_read);
    if (notRead) {
      // plain text, not an error: consumer cards, MIG slices and containers lack some metrics
      card.appendChild(el('div', 'tl-not-read tl-dim', notRead));
    }
    const procs = el('ul', 'tl-procs');
    if (pidsNote) {
      procs.appendChild(el('li', 'tl-pids-note tl-dim', pidsNote));
    }
    for (const p of g.processes) {
      const item = el('li', '', `${p.pid} ${p.name ?? '?'}: ${formatBytes(p.mem_used)}`);
      if (p.kernel) {
        // a kernel's own process, or one it started (DDP rank): say which kernel
        const who = `kernel ${p.kernel.slice(0, 8)}${p.kernel_child ? ' (child)' : ''}`;
        const tag = el('span', 'tl-kernel', ` [${who}]`);
        tag.title = `this server\u2019s kernel ${p.kernel}`;
        item.appendChild(tag);
        item.dataset.kernel = p.kernel;
      }
      procs.appendChild(item);
    }
    if (!g.processes.length) {
      procs.appendChild(el('li', 'tl-dim', 'no processes'));
    }
    card.appendChild(procs);
    return card;
  }

  private ensureHostChart(): void {
    if (!this.hostChart) {
      const series = [
        { label: 'CPU %', stroke: COLORS[0] },
        { label: 'RAM %', stroke: COLORS[1] }
      ];
      this.hostChart = new RollingChart(this.hostCharts, 'Host', series, { yRange: [0, 100], yUnit: '%' }, WINDOW_SECONDS);
    }
  }

  private gpuChart(g: IGpuSample): RollingChart {
    let chart = this.gpuCharts.get(g.uuid);
    if (!chart) {
      const series = [
        { label: 'util %', stroke: COLORS[2] },
        { label: 'mem %', stroke: COLORS[3] }
      ];
      chart = new RollingChart(this.hostCharts, `GPU ${g.index}`, series, { yRange: [0, 100], yUnit: '%' }, WINDOW_SECONDS);
      this.gpuCharts.set(g.uuid, chart);
    }
    return chart;
  }

  /**
   * One chart for the latest run that published per-rank memory; new run ->
   * new chart. A finished `%%gpumem` cell's first report sample (`final`)
   * starts the chart again: the line becomes the report's figure, not what
   * was sampled while the cell ran.
   */
  private rankSeries(r: IRankSample): void {
    const { run, rank } = r;
    const finishing = r.final === true && this.rankFinished !== run;
    if (run !== this.rankRun || finishing) {
      this.rankChart?.dispose();
      this.rankChart = null;
      this.rankChartT = 0;
      this.rankLatest.clear();
      this.rankTitle = '';
      this.rankEnd = 0;
      this.rankPeak = null;
      if (run !== this.rankRun) {
        this.rankMemory.clear();
        this.rankMemBox.replaceChildren();
      }
      this.rankRun = run;
      this.rankFinished = r.final ? run : '';
    }
    if (!this.rankChart || !this.rankChart.series.some(s => s.label === `rank ${rank}`)) {
      const drawn = (this.rankChart?.series ?? []).map(s => Number(s.label.split(' ')[1]));
      const ranks = new Set([...drawn, rank]);
      const series = [...ranks].sort((a, b) => a - b).map(k => ({ label: `rank ${k}`, stroke: COLORS[k % COLORS.length] }));
      this.rankChart?.dispose();
      this.rankTitle = this.rankTitle || rankChartTitle(r);
      this.rankChart = new RollingChart(
        this.rankBox,
        this.rankTitle,
        series,
        { yRange: null, yUnit: 'bytes', height: RANK_CHART_MIN, stepped: this.rankFinished === run },
        WINDOW_SECONDS
      );
    }
  }

  private setRankTitle(title: string): void {
    if (title !== this.rankTitle) {
      this.rankTitle = title;
      this.rankChart?.setTitle(title);
    }
  }

  /**
   * The line under the rank chart: a finished cell says so (and its report's
   * peak); a run whose samples stopped while the host's go on is marked
   * stale, so an old line is not read as the present.
   */
  private renderRankState(last: ISample | undefined): void {
    const box = this.rankState;
    let state = '';
    let text = '';
    if (this.rankChart && this.rankFinished === this.rankRun) {
      state = 'finished';
      const peak = this.rankPeak !== null ? `; peak ${formatBytes(this.rankPeak)} allocated` : '';
      text = `finished at ${clock(this.rankEnd)}: the line is the report\u2019s allocated memory${peak}`;
    } else if (this.rankChart && last && this.rankChartT > 0 && last.t - this.rankChartT > RANK_STALE_S) {
      state = 'stale';
      text = `no memory sample since ${clock(this.rankChartT)}: the run has ended or stopped sending`;
    } else if (last === undefined) {
      return; // no host sample in this batch: nothing new to judge by
    }
    box.textContent = text;
    box.dataset.state = state;
    this.rankBox.classList.toggle('tl-rank-stale', state === 'stale');
    this.placeRankSection(state === '');
  }

  /**
   * A live run's rank chart sits under the GPUs; an ended or stale one goes
   * below the "torchrun jobs" section, so a finished `%ddp_check` from minutes
   * ago does not push a running job below the fold.
   */
  private placeRankSection(live: boolean): void {
    const section = [this.rankBox, this.rankState, this.rankMemBox];
    const anchor = live ? this.gpuBox : this.runs.node;
    // below the jobs, a rule like the jobs section's own sets it apart from their rank rows
    this.rankBox.classList.toggle('tl-ranks-below', !live);
    if (anchor.nextElementSibling !== this.rankBox) {
      anchor.after(...section);
    }
  }

  /**
   * Under the chart, each rank's latest allocator figures (`%ddp_check
   * --profile`): allocated and reserved, fragmentation (inactive split bytes as
   * a share of reserved) and the largest free block, a bar of reserved memory,
   * and where the numbers come from. Built with textContent only: nothing a
   * kernel posted is ever parsed as markup. Empty (and hidden) without such
   * figures, so a run without --profile looks as before.
   */
  private renderRankMemory(): void {
    const rows = [...this.rankMemory.values()].sort((a, b) => a.rank - b.rank);
    // named for its run: moved below "torchrun jobs" once ended, an unnamed
    // block read as the running job's figures
    const run = rows.length ? ` of ${rows[0].run}` : '';
    const title = el('div', 'tl-rank-mem-title', `Allocator memory per rank (latest step)${run}`);
    const sources = (Object.keys(SOURCE_TEXT) as MemorySource[]).filter(k => rows.some(r => r.source === k));
    const notes = sources.map(k => {
      const note = el('div', `tl-rank-mem-note tl-source-${k}`, SOURCE_TEXT[k].note);
      note.dataset.source = k;
      return note;
    });
    // the key to the bars, only when a bar is drawn (a rank with reserved memory)
    const legend: HTMLElement[] = [];
    if (rows.some(r => r.reserved !== null && r.reserved > 0)) {
      const key = el('div', 'tl-rank-mem-legend');
      key.append(
        el('span', 'tl-key tl-key-alloc', 'allocated'),
        el('span', 'tl-key tl-key-split', 'inactive split'),
        el('span', 'tl-key tl-key-free', 'free')
      );
      key.title = 'Each bar is the rank\u2019s reserved memory.';
      legend.push(key);
    }
    this.rankMemBox.replaceChildren(title, ...notes, ...legend, ...rows.map(r => this.rankMemoryRow(r)));
  }

  private rankMemoryRow(r: IRankSample): HTMLElement {
    const row = el('div', 'tl-rank-mem-row');
    row.dataset.rank = String(r.rank);
    const head = el('div', 'tl-rank-mem-head');
    const name = el('span', 'tl-rank-name', `rank ${r.rank}`);
    name.style.borderLeftColor = COLORS[r.rank % COLORS.length];
    head.appendChild(name);
    const known = r.source ? SOURCE_TEXT[r.source] : undefined; // the server passes these three only
    if (r.source && known) {
      const source = el('span', `tl-rank-source tl-source-${r.source}`, known.tag);
      source.title = known.note;
      head.appendChild(source);
      row.dataset.source = r.source;
    }
    row.appendChild(head);
    const reserved = r.reserved ?? null;
    const split = r.inactive_split ?? null;
    if (reserved !== null && reserved > 0) {
      const bar = el('div', 'tl-rank-bar');
      // a bar's width in CSS, not a figure to read
      const share = (v: number | null) => `${Math.max(0, Math.min(100, (100 * (v ?? 0)) / reserved))}%`;
      const alloc = el('span', 'tl-bar-alloc');
      alloc.style.width = share(r.allocated);
      const splitBar = el('span', 'tl-bar-split');
      splitBar.style.width = share(split);
      bar.append(alloc, splitBar);
      bar.title = 'reserved memory: allocated, inactive split, free';
      row.appendChild(bar);
    }
    // a number and its unit never part at a line break
    const size = (v: number) => el('span', 'tl-nowrap', formatBytes(v));
    const allocated = el('td', '');
    allocated.append(r.allocated === null ? MISSING : size(r.allocated));
    if (reserved !== null) {
      allocated.append(' of ', size(reserved), ' reserved');
    }
    const fragmentation = el('td', '');
    if (split === null) {
      fragmentation.append(MISSING);
    } else {
      if (reserved !== null && reserved > 0) {
        fragmentation.append(el('span', 'tl-nowrap', formatPercent((100 * split) / reserved)), ' · ');
      }
      fragmentation.append(size(split), ' inactive split');
    }
    const largest = el('td', '');
    largest.append(r.largest_free === null || r.largest_free === undefined ? MISSING : size(r.largest_free));
    const table = el('table', 'tl-metrics tl-rank-metrics');
    for (const [key, label, cell] of [
      ['allocated', 'allocated', allocated],
      ['fragmentation', 'fragmentation', fragmentation],
      ['largest_free', 'largest free', largest]
    ] as [string, string, HTMLElement][]) {
      const tr = el('tr', '');
      tr.dataset.metric = key;
      tr.append(el('td', '', label), cell);
      table.appendChild(tr);
    }
    row.appendChild(table);
    return row;
  }

  private rankValues(): (number | null)[] {
    return this.rankChart!.series.map(s => {
      const rank = Number(s.label.split(' ')[1]);
      const allocated = this.rankLatest.get(rank)?.allocated;
      return allocated === null || allocated === undefined ? null : allocated;
    });
  }

  private togglePause(): void {
    this.paused = !this.paused;
    this.pauseButton.textContent = this.paused ? 'Resume' : 'Pause';
    this.node.classList.toggle('tl-paused', this.paused);
    if (this.socketOpen) {
      this.socket!.send(JSON.stringify(this.paused ? { pause: true } : { pause: false, since: this.since }));
    }
  }

  private async changeInterval(): Promise<void> {
    if (this.socketOpen) {
      this.socket!.send(JSON.stringify({ interval: Number(this.intervalSelect.value) }));
      return;
    }
    try {
      await setSamplingInterval(Number(this.intervalSelect.value));
    } catch (err) {
      this.status.textContent = `could not set interval: ${err}`;
    }
  }

  private async exportCsv(): Promise<void> {
    const csv = await fetchCsv();
    const url = URL.createObjectURL(new Blob([csv], { type: 'text/csv' }));
    const a = document.createElement('a');
    a.href = url;
    a.download = 'torchlens-gpu-monitor.csv';
    a.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }

  private status: HTMLDivElement;
  private intervalSelect: HTMLSelectElement;
  private pauseButton: HTMLButtonElement;
  private hostText: HTMLDivElement;
  private hostCharts: HTMLDivElement;
  private gpuBox: HTMLDivElement;
  private rankBox: HTMLDivElement;
  private rankState: HTMLDivElement;
  private rankMemBox: HTMLDivElement;
  private footer: HTMLDivElement;
  private runs = new RunsSection();
  private hostChart: RollingChart | null = null;
  private gpuCharts = new Map<string, RollingChart>();
  private rankChart: RollingChart | null = null;
  private rankRun = '';
  /** the run whose chart draws its finished cell's report figures ('' while live) */
  private rankFinished = '';
  private rankTitle = '';
  /** the finished cell's last report sample (s) and its report's peak (bytes) */
  private rankEnd = 0;
  private rankPeak: number | null = null;
  /** the latest sample per rank that the chart draws (measured memory) */
  private rankLatest = new Map<number, IRankSample>();
  /** the latest sample per rank with allocator figures (--profile) */
  private rankMemory = new Map<number, IRankSample>();
  private rankChartT = 0;
  private since = 0;
  private lastSampleT = 0;
  private received = 0;
  private socket: WebSocket | null = null;
  private backoff = BACKOFF_MIN_SECONDS;
  private reconnectTimer = 0;
  private polling = false;
  private started = false;
  private stopped = false;
  private paused = false;
}
