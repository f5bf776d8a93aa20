/**
 * Talking to the torchlens server extension. Every request goes through
 * ServerConnection, so it carries the server's token/XSRF cookie and the
 * base_url (JupyterHub's /user/<name>/) without this code knowing either.
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
  kernel?: string | null;
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
  processes: IGpuProcess[];
}

export interface ISample {
  t: number;
  host: IHostSample;
  gpu: { available: boolean; status: string; driver: string | null; gpus: IGpuSample[] };
}

export interface IRankSample {
  t: number;
  run: string;
  rank: number;
  device: number | null;
  allocated: number | null;
  reserved: number | null;
}

export interface ISamplesReply {
  interval: number;
  samples: ISample[];
  ranks: IRankSample[];
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
export async function setInterval(seconds: number): Promise<number> {
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
