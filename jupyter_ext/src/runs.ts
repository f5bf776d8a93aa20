/**
 * The sidebar's "torchrun jobs" section: the `torchlens run` jobs of the
 * server's machine and a row per rank (`GET torchlens/runs`).
 *
 * `torchlens run` rewrites its run's live.json about once a second, so the
 * section polls every POLL_MS while the panel is shown and the browser tab
 * is visible, and not at all otherwise. Every value comes from files on the
 * server (the registry, live.json): all of it goes in as text.
 */
import { fetchRuns, IRun, IRunLive, IRunRank, IRunsReply } from './api';
import { el } from './dom';
import { formatAgo, formatBytes, formatMs, MISSING } from './units';

const POLL_MS = 2000;
/** live.json older than this while the run is not over: said next to the run */
const STALE_S = 10;

/**
 * Verdicts that are about particular ranks (their codes, model/findings.py) ->
 * the word marking those ranks' rows. Which rows: the verdict's own ranks
 * (`verdict_ranks`), never a rank number read from its words.
 */
const RANK_MARK: Record<string, string> = {
  slow_rank: 'slow',
  memory_creep: 'creep'
};

/** Rank states (analysis/ranks/verdict.py) -> the class that colours them. */
const STATE_CLASS: Record<string, string> = {
  running: 'tl-state-ok',
  finished: 'tl-state-done',
  waiting: 'tl-state-wait',
  'ended by its agent': 'tl-state-warn',
  'ended: peer failed': 'tl-state-warn',
  interrupted: 'tl-state-warn',
  failed: 'tl-state-bad',
  lost: 'tl-state-bad'
};

/** States with a figure in them (torchrun's exit code for the rank) by their start. */
const STATE_PREFIX_CLASS: [string, string][] = [
  ['killed by ', 'tl-state-bad'],
  ['exit code ', 'tl-state-bad'],
  ['stopped when ', 'tl-state-warn']
];

function stateClass(state: string): string {
  return (
    STATE_CLASS[state] ??
    STATE_PREFIX_CLASS.find(([start]) => state.startsWith(start))?.[1] ??
    ''
  );
}

const MEMORY_NOTE: Record<string, string> = {
  cuda: 'allocated: the CUDA caching allocator\u2019s counters',
  modelled:
    'modelled (~), nothing measured: the allocations made inside the profiled steps (not the weights), ' +
    'replayed through the CUDA caching-allocator model',
  rss: 'resident memory of the rank\u2019s process (measured; a CPU run\u2019s modelled allocator figure is not its memory)'
};

/**
 * A time in a column whose header says ms: `12.3`; no thousands separator, so
 * a row of four-digit times fits the sidebar's default width.
 */
const ms = (v: number | null) => formatMs(v, { unit: false, grouping: false });

/** The command as a shell would show it: words with spaces or quotes quoted. */
function shellJoin(words: string[]): string {
  return words.map(w => (/^[\w@%+=:,./-]+$/.test(w) ? w : `'${w.replace(/'/g, `'"'"'`)}'`)).join(' ');
}

/**
 * The memory column follows `torchlens run`'s terminal (render/ranks/terminal.py
 * `memory_cell`), one figure per row from the same live.json row: the CUDA
 * allocator's allocated bytes when measured, else the process's RSS, and the
 * modelled figure (`~`, a CPU step's in-step allocations, no weights) only
 * when nothing was measured. Bytes as the terminal writes them (`format_bytes`).
 */
type MemoryFigure = 'cuda' | 'rss' | 'modelled' | null;

function memoryFigure(r: IRunRank): MemoryFigure {
  if (r.allocated !== null && r.source !== 'modelled') {
    return 'cuda';
  }
  if (r.rss !== null) {
    return 'rss';
  }
  return r.allocated !== null && r.source === 'modelled' ? 'modelled' : null;
}

/** What the memory column holds: allocator figures (`~` when modelled), RSS, or both kinds. */
type MemoryKind = 'alloc' | 'rss' | 'mixed';

function memoryKind(ranks: IRunRank[]): MemoryKind {
  const kinds = new Set(ranks.map(r => memoryFigure(r)).map(f => (f === 'rss' ? 'rss' : f === null ? null : 'alloc')));
  kinds.delete(null);
  return kinds.size === 1 ? (kinds.has('rss') ? 'rss' : 'alloc') : 'mixed';
}

function memoryCell(r: IRunRank, kind: MemoryKind): HTMLTableCellElement {
  const td = el('td', 'tl-num tl-run-mem');
  const figure = memoryFigure(r);
  if (figure === 'rss') {
    // the header says "rss" when every rank's figure is one; else the cell does,
    // free to go under the number in a narrow sidebar
    // the number and its unit may go on two lines: "356.0 MiB" on one line
    // overflows the sidebar's default width and cuts the column
    td.append(formatBytes(r.rss), kind === 'rss' ? '' : ' rss');
    td.title = MEMORY_NOTE.rss;
  } else if (figure !== null) {
    td.textContent = `${figure === 'modelled' ? '~' : ''}${formatBytes(r.allocated)}`;
    td.title = MEMORY_NOTE[figure];
  } else {
    td.textContent = MISSING;
  }
  return td;
}

/** The verdict's marker for a rank's row ("slow" with the verdict as its title), or null. */
function rankMark(r: IRunRank, live: IRunLive): HTMLElement | null {
  const word = RANK_MARK[live.verdict_code ?? ''];
  if (word === undefined || !(live.verdict_ranks ?? []).includes(r.rank)) {
    return null;
  }
  const mark = el('span', 'tl-run-mark', word);
  mark.dataset.code = live.verdict_code ?? '';
  mark.title = live.verdict;
  return mark;
}

function rankRow(r: IRunRank, kind: MemoryKind, live: IRunLive): HTMLTableRowElement {
  const tr = el('tr', 'tl-run-rank');
  tr.dataset.rank = String(r.rank);
  const mark = rankMark(r, live);
  const state = r.state ?? '?';
  const stateCell = el('td', `tl-run-state ${stateClass(state)}`, state);
  stateCell.title = r.error ? `${state}: ${r.error}` : state;
  if (r.restart) {
    stateCell.append(el('span', 'tl-dim', ` (restart ${r.restart})`));
  }
  const rankCell = el('td', 'tl-num', String(r.rank));
  if (mark !== null) {
    // the rank number keeps its column; the marker goes under it, the row is tinted
    tr.classList.add('tl-run-marked');
    tr.dataset.mark = live.verdict_code ?? '';
    rankCell.title = `rank ${r.rank}: ${live.verdict}`;
    rankCell.append(mark);
  }
  tr.append(
    rankCell,
    stateCell,
    // steps as the terminal's table writes them: no separator in a narrow column
    el('td', 'tl-num', r.steps === null ? MISSING : String(r.steps)),
    el('td', 'tl-num', ms(r.step_ms)),
    el('td', 'tl-num', ms(r.data_ms)),
    memoryCell(r, kind)
  );
  return tr;
}

const MEMORY_HEADER: Record<MemoryKind, [string, string]> = {
  alloc: ['alloc', 'latest allocated memory (~: modelled, a CPU run that measured nothing)'],
  rss: ['rss', MEMORY_NOTE.rss],
  mixed: ['memory', 'latest CUDA allocated memory, else resident memory (rss); ~: modelled, nothing measured']
};

function columns(kind: MemoryKind): [string, string][] {
  return [
    ['rank', ''],
    ['state', ''],
    ['steps', 'steps done'],
    ['step\nms', 'median step time, ms'],
    ['data\nms', 'median data-loading time per step, ms'],
    MEMORY_HEADER[kind]
  ];
}

/**
 * The ranks grouped by node (torchrun places ranks by node, and a node is
 * what gets lost): a line "node N · host" above each group's rows. Six
 * narrow columns, so the table fits the sidebar's default width; the memory
 * column's header names the figure when every rank has the same kind.
 */
function rankTable(live: IRunLive): HTMLElement {
  const ranks = live.ranks;
  const table = el('table', 'tl-run-ranks');
  const head = el('tr', '');
  const kind = memoryKind(ranks);
  const cols = columns(kind);
  for (const [label, title] of cols) {
    const th = el('th', label === 'state' ? '' : 'tl-num', label);
    th.title = title;
    head.appendChild(th);
  }
  table.appendChild(el('thead', '')).appendChild(head);
  const nodes = new Map<string, IRunRank[]>();
  const sorted = [...ranks].sort((a, b) => (a.node ?? Infinity) - (b.node ?? Infinity) || a.rank - b.rank);
  for (const r of sorted) {
    const key = `${r.node ?? '?'} \u00b7 ${r.host ?? 'host unknown'}`;
    nodes.set(key, [...(nodes.get(key) ?? []), r]);
  }
  for (const [key, rows] of nodes) {
    const body = el('tbody', 'tl-run-node');
    const label = el('td', '', `node ${key}`);
    label.colSpan = cols.length;
    label.title = label.textContent ?? '';
    body.appendChild(el('tr', 'tl-run-node-head')).appendChild(label);
    body.append(...rows.map(r => rankRow(r, kind, live)));
    table.appendChild(body);
  }
  // wider than the sidebar (a long state, huge numbers): it scrolls, never clips
  const box = el('div', 'tl-run-table');
  box.appendChild(table);
  return box;
}

function runCard(run: IRun, now: number): HTMLElement {
  const card = el('div', `tl-run tl-run-${run.state}`);
  card.dataset.runId = run.run_id;
  card.dataset.state = run.state;
  const head = el('div', 'tl-run-head');
  head.append(el('span', 'tl-run-id', `run ${run.run_id}`), el('span', 'tl-run-badge', run.state));
  const command = el('div', 'tl-run-command', shellJoin(run.command));
  command.title = command.textContent ?? '';
  const folder = el('div', 'tl-run-dir', run.run_dir);
  folder.title = `run folder: ${run.run_dir}`;
  card.append(head, command, folder);
  const live = run.live;
  if (live === null && run.state === 'starting') {
    card.appendChild(el('div', 'tl-run-verdict tl-dim', 'starting: waiting for its first live status'));
  }
  if (live !== null) {
    card.append(el('div', 'tl-run-verdict', live.verdict), liveFacts(run, live));
    if (live.ranks.length) {
      card.appendChild(rankTable(live));
    }
  }
  if (run.state === 'ended') {
    // how it stopped (the manifest's line, once written) and when: "ended 2 min ago"
    const stopped = el('div', 'tl-run-stopped', run.stopped ?? 'ended');
    if (run.ended !== null) {
      const ago = formatAgo(Math.max(0, now - run.ended));
      stopped.appendChild(el('span', 'tl-dim', run.stopped ? ` \u00b7 ended ${ago}` : ` ${ago}`));
    }
    card.appendChild(stopped);
    card.appendChild(el('div', 'tl-run-hint tl-dim', `torchlens report ${shellJoin([run.run_dir])}`));
  }
  return card;
}

/** The ranks that have reported (a waiting rank has not). */
function attachedRanks(live: IRunLive): IRunRank[] {
  return live.ranks.filter(r => r.state !== null && r.state !== 'waiting');
}

/** Verdicts (their codes, analysis/ranks/verdict.py) that say how many ranks attached. */
const SAYS_ATTACHED = new Set(['waiting', 'no_steps']);

/**
 * "2 of 4 ranks attached" in the verdict's own words (analysis/ranks/verdict.py):
 * a rank is attached once it has reported; a world size of 0 or null is not
 * known yet and shows as "?". While waiting (and when no step was recorded)
 * the verdict already says it, so the count is not repeated.
 */
function rankCountText(live: IRunLive): string {
  const attached = attachedRanks(live);
  const known = live.world_size !== null && live.world_size > 0 ? live.world_size : '?';
  const count = `${attached.length} of ${known} ranks attached`;
  return SAYS_ATTACHED.has(live.verdict_code ?? '') ? '' : count;
}

const plural = (n: number, word: string) => `${n} ${word}${n === 1 ? '' : 's'}`;

/** "2 of 4 ranks attached · 2 nodes · updated 1 s ago", and restarts and dropped messages when any. */
function liveFacts(run: IRun, live: IRunLive): HTMLElement {
  const nodes = new Set(attachedRanks(live).map(r => r.node)).size;
  const facts = [rankCountText(live), nodes ? plural(nodes, 'node') : ''].filter(f => f);
  if (live.restarts) {
    facts.push(`${live.restarts} restart(s)`);
  }
  if (live.dropped) {
    facts.push(`${live.dropped} dropped message(s)`);
  }
  const meta = el('div', 'tl-run-meta tl-dim', facts.join(' \u00b7 '));
  if (live.age_s !== null && run.state === 'running') {
    const stale = live.age_s > STALE_S;
    const sep = facts.length ? ' \u00b7 ' : '';
    const age = el('span', stale ? 'tl-run-stale' : '', `${sep}updated ${formatAgo(live.age_s)}`);
    if (stale) {
      age.title = 'torchlens run has not rewritten live.json for a while';
    }
    meta.appendChild(age);
  }
  return meta;
}

export class RunsSection {
  readonly node: HTMLDivElement;

  constructor() {
    this.node = el('div', 'tl-runs');
    this.body = el('div', 'tl-runs-body', 'looking for torchlens run jobs\u2026');
    this.node.append(el('div', 'tl-runs-title', 'torchrun jobs'), this.body);
  }

  /** Poll while shown; `stop` ends the loop after its current wait. */
  start(): void {
    this.active = true;
    if (!this.looping) {
      void this.loop();
    }
  }

  stop(): void {
    this.active = false;
  }

  private async loop(): Promise<void> {
    this.looping = true;
    try {
      while (this.active) {
        if (!document.hidden) {
          await this.refresh();
        }
        await new Promise(resolve => setTimeout(resolve, POLL_MS));
      }
    } finally {
      this.looping = false;
    }
  }

  private async refresh(): Promise<void> {
    let reply: IRunsReply;
    try {
      reply = await fetchRuns();
    } catch (err) {
      this.body.replaceChildren(el('div', 'tl-error', `job list unreachable: ${err}`));
      return;
    }
    if (!reply.runs.length) {
      const none = el('div', 'tl-runs-none', 'no torchlens run job on this machine');
      const hint = el('div', 'tl-dim', 'torchlens run -- torchrun ... train.py lists its ranks here');
      this.body.replaceChildren(none, hint);
    } else {
      this.body.replaceChildren(...reply.runs.map(run => runCard(run, reply.t)));
    }
    this.node.dataset.runs = String(reply.runs.length);
    this.polls++;
    this.node.dataset.polls = String(this.polls);
  }

  private body: HTMLDivElement;
  private active = false;
  private looping = false;
  private polls = 0;
}
