/**
 * Talking to the torchlens server extension. Every request goes through
 * ServerConnection, so it carries the server's token/XSRF cookie and the
 * base_url (JupyterHub's /user/<name>/) without this code knowing either.
 *
 * Live samples come over one WebSocket (`torchlens/monitor/ws`): the server
 * encodes each sample once for all tabs, where a long-poll answer costs it a
 * full request each. `fetchSamples` (long polling) is the fallback when no
 * socket gets through.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface IHostSample {
  t: number;
  cpu_percent: number | null;
  cpu_count: number | null;
  ram_used: number | null;
  ram_total: number | null;
  ram_percent: number | null;
  load1: number | null;
}

export interface IGpuProcess {
  pid: number;
  name: string | null;
  mem_used: number | null;
  /** id of this server's kernel that is this process or started it (set on the newest sample) */
  kernel?: string | null;
  /** true when the process is not the kernel itself but one it started (e.g. a DDP rank) */
  kernel_child?: boolean;
}

export interface IGpuSample {
  index: number;
  uuid: string;
  name: string;
  cuda: number | null;
  mig_parent: number | null;
  mig_slot: number | null;
  util_gpu: number | null;
  util_mem: number | null;
  mem_used: number | null;
  mem_total: number | null;
  temp_c: number | null;
  power_w: number | null;
  power_limit_w: number | null;
  pcie_tx_bps: number | null;
  pcie_rx_bps: number | null;
  /** bytes/s over all NVLinks since the previous sample; null on the first sample or without NVLink */
  nvlink_tx_bps?: number | null;
  nvlink_rx_bps?: number | null;
  /** seconds since PCIe was read: it is read every few seconds (each read blocks NVML 20 ms) */
  pcie_age_s?: number | null;
  /** memory the driver reserves for itself (NVML memory info v2), not counted in mem_used */
  mem_reserved?: number | null;
  /** metric -> why NVML could not read it (e.g. "NVMLError_NotSupported") */
  not_read?: Record<string, string>;
  /** why this GPU has no CUDA ordinal (mixed GPU models under FASTEST_FIRST, MIG on) */
  cuda_note?: string | null;
  processes: IGpuProcess[];
}

export interface ISample {
  t: number;
  host: IHostSample;
  gpu: {
    available: boolean;
    status: string;
    driver: string | null;
    gpus: IGpuSample[];
    /** host: NVML's pids are the host's (the server runs in a container), not this machine's view */
    pids?: 'host' | 'local';
    /** set by the server when pids is host: why no names or kernels are shown */
    pids_note?: string;
  };
}

/** Where a rank's memory figures come from (docs/RANK_PROFILE.md `mem.source`). */
export type MemorySource = 'cuda' | 'modelled' | 'rss';

export interface IRankSample {
  t: number;
  run: string;
  rank: number;
  device: number | null;
  allocated: number | null;
  reserved: number | null;
  /** `%ddp_check --profile` only (absent or null otherwise): bytes the allocator holds in split blocks nobody uses */
  inactive_split?: number | null;
  /** the largest free block in reserved memory, bytes (null: not known, e.g. CUDA without a snapshot) */
  largest_free?: number | null;
  /** cuda: the allocator's counters; modelled: a CPU run replayed through torchlens' allocator model; rss: resident memory */
  source?: MemorySource | null;
  /**
   * true on the samples a `%%gpumem` cell posts when it has finished: its
   * report's allocated bytes over the cell (the analysis's timeline), which
   * replace what was drawn while it ran
   */
  final?: boolean;
  /** with `final`: the report's peak allocated bytes */
  peak?: number | null;
}

export interface ISamplesReply {
  interval: number;
  samples: ISample[];
  ranks: IRankSample[];
}

/** What the socket sends: the history (or the gap since `?since=`) first, then each new sample. */
export interface IFeedMessage extends ISamplesReply {
  type: 'samples';
  history: boolean;
}

const settings = ServerConnection.makeSettings();

function endpoint(path: string): string {
  return URLExt.join(settings.baseUrl, 'torchlens', 'monitor', path);
}

async function request(path: string, init: RequestInit = {}): Promise<Response> {
  const response = await ServerConnection.makeRequest(endpoint(path), init, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response);
  }
  return response;
}

/** Samples newer than `since`; the server holds the request up to `wait` s until one exists. */
export async function fetchSamples(since: number, wait: number): Promise<ISamplesReply> {
  const response = await request(`samples?since=${since}&wait=${wait}`);
  return (await response.json()) as ISamplesReply;
}

/** Set the server's sampling interval (seconds); returns the value it applied. */
export async function setSamplingInterval(seconds: number): Promise<number> {
  const response = await request('config', {
    method: 'PUT',
    body: JSON.stringify({ interval: seconds })
  });
  return ((await response.json()) as { interval: number }).interval;
}

/** The server-side history as CSV text. */
export async function fetchCsv(): Promise<string> {
  return (await request('history.csv')).text();
}

/**
 * Open the monitor's WebSocket, authenticated the way @jupyterlab/services
 * opens kernel and terminal sockets: the browser sends the login cookie, and
 * `?token=` is added only when ServerConnection says so (`appendToken`, i.e.
 * the socket goes to another host than the page) and a token is set.
 */
export function openFeed(since: number): WebSocket {
  const query: Record<string, string> = { since: String(since) };
  if (settings.appendToken && settings.token !== '') {
    query.token = settings.token;
  }
  const url = URLExt.join(settings.wsUrl, 'torchlens', 'monitor', 'ws') + URLExt.objectToQueryString(query);
  return new settings.WebSocket(url);
}

/** One rank of a `torchlens run` job, as its live.json has it (server-checked types). */
export interface IRunRank {
  rank: number;
  node: number | null;
  host: string | null;
  /** waiting | running | finished | failed | ended by its agent | lost */
  state: string | null;
  restart: number | null;
  steps: number | null;
  step_ms: number | null;
  data_ms: number | null;
  allocated: number | null;
  reserved: number | null;
  rss: number | null;
  peak_allocated: number | null;
  peak_rss: number | null;
  source: MemorySource | string | null;
  error: string | null;
}

export interface IRunLive {
  t: number | null;
  /** seconds since torchlens run wrote it (the server's clock) */
  age_s: number | null;
  world_size: number | null;
  verdict: string;
  /** the verdict's kind (a Finding's code: waiting, no_steps, slow_rank, lost_node, ...) */
  verdict_code: string | null;
  /** the ranks the verdict names (a Finding's ranks: the slow rank, the failed one, ...) */
  verdict_ranks: number[];
  ended: boolean;
  restarts: number;
  dropped: number;
  ranks: IRunRank[];
}

/** A `torchlens run` job registered on the server's machine (`GET torchlens/runs`). */
export interface IRun {
  run_id: string;
  run_dir: string;
  collector: string | null;
  pid: number;
  command: string[];
  started: number | null;
  /** starting: no (readable) live.json yet; ended: a recently finished run */
  state: 'starting' | 'running' | 'ended';
  /** how the run ended (its manifest), once it has */
  stopped: string | null;
  /** when the run ended (epoch s, the server's clock), null while it runs */
  ended: number | null;
  live: IRunLive | null;
}

export interface IRunsReply {
  t: number;
  registry: string;
  runs: IRun[];
}

/** The `torchlens run` jobs of the server's machine and their ranks. */
export async function fetchRuns(): Promise<IRunsReply> {
  const url = URLExt.join(settings.baseUrl, 'torchlens', 'runs');
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response);
  }
  return (await response.json()) as IRunsReply;
}
