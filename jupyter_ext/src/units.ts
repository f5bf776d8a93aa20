/**
 * Human units for the sidebar: counts, bytes, durations, shares and missing
 * figures written exactly as torchlens' Python views write them
 * (torchlens/model/units.py), so a figure the sidebar repeats from a report or
 * from the terminal reads the same in both. tests/test_units_ts.py runs this
 * module under node beside model/units.py and compares every string.
 *
 * The rules, as in model/units.py:
 * - counts: thousands separators, `1,234`;
 * - bytes: binary units, whole bytes below 1 KiB, else one decimal, no
 *   thousands separator: `16 B`, `1000.0 MiB`, `1.5 GiB`;
 * - durations: one decimal in µs, ms or s; `formatDuration` picks the unit,
 *   `formatUs`, `formatMs` and `formatSeconds` keep one;
 * - shares: whole percent, no space: `12%`;
 * - a missing figure (null, undefined or NaN) is `n/a`, unless the caller
 *   names another word (`missing`).
 *
 * Decimals round as Python's format() does: the exact binary value, and a
 * tie to the even digit (1.25 ms is `1.2 ms`, where toFixed writes `1.3`).
 *
 * Figures model/units.py has no rule for (the GPU card's W, °C and MB/s,
 * written as frontends/monitor/gpumonitor.py writes them; chart ticks; times of day)
 * are written here too, so no other file of the sidebar formats a number.
 */

/** What a missing figure reads as. */
export const MISSING = 'n/a';

/** A figure, or what the server sends for one it did not read. */
export type Figure = number | null | undefined;

export interface IUnitOptions {
  /** write the sign of every figure, `+` included (a change: `+4.0 MiB`) */
  signed?: boolean;
  /** the text for a missing figure */
  missing?: string;
}

/** null, undefined or NaN: the figures every function writes as `missing`. */
export function isMissing(v: Figure): v is null | undefined {
  return v === null || v === undefined || Number.isNaN(v);
}

/** Thousands separators in a string of digits: `1234567` -> `1,234,567`. */
function grouped(digits: string): string {
  return digits.replace(/\B(?=(\d{3})+$)/g, ',');
}

/**
 * |v| with `decimals` decimals, rounded as Python rounds: the exact binary
 * value to the nearest, an exact tie to the even digit.
 */
function absFixed(a: number, decimals: number): string {
  if (a >= 1e21) {
    // toFixed switches to exponent form here; such a double is a whole number
    return BigInt(a).toString() + (decimals ? '.' + '0'.repeat(decimals) : '');
  }
  // 20 more digits show whether the value is exactly half way: a double near a
  // tie but not on it differs from it by more than 1e-20 of the last digit
  const EXTRA = 20;
  const long = a.toFixed(decimals + EXTRA);
  if (long.endsWith('5' + '0'.repeat(EXTRA - 1))) {
    const truncated = long.slice(0, long.length - EXTRA).replace(/\.$/, '');
    const last = Number(truncated[truncated.length - 1]);
    if (last % 2 === 0) {
      return truncated; // toFixed would round the tie up, Python keeps the even digit
    }
  }
  return a.toFixed(decimals);
}

/**
 * `v` with `decimals` decimals, as Python's `f"{v:{+}{,}.{decimals}f}"`:
 * thousands separators unless not `grouping`, and `signed` writes `+` too.
 */
export function fixed(v: number, decimals: number, signed = false, grouping = true): string {
  const negative = v < 0 || Object.is(v, -0);
  const sign = negative ? '-' : signed ? '+' : '';
  const a = Math.abs(v);
  if (!Number.isFinite(a)) {
    return `${sign}inf`;
  }
  const text = absFixed(a, decimals);
  if (!grouping) {
    return sign + text;
  }
  const [whole, fraction] = text.split('.');
  return sign + grouped(whole) + (fraction === undefined ? '' : '.' + fraction);
}

/** A count with thousands separators: `1,234` (a fraction is cut off, as Python's int() does). */
export function formatCount(n: Figure, missing = MISSING): string {
  if (isMissing(n)) {
    return missing;
  }
  return fixed(Math.trunc(n) + 0, 0); // + 0: -0.5 is the count 0, not -0
}

/** The byte units `formatBytes` writes, each with its decimals. */
const BYTE_UNITS: [string, number][] = [
  ['B', 0],
  ['KiB', 1],
  ['MiB', 1],
  ['GiB', 1]
];

/**
 * The unit `formatBytes` writes `n` bytes in, as [name, bytes in one, decimals]:
 * the first whose figure stays below 1024 once rounded (never `1024.0 KiB`);
 * GiB above that, however large.
 */
export function byteUnit(n: number): [string, number, number] {
  let size = 1;
  for (const [unit, decimals] of BYTE_UNITS) {
    // dividing by a power of two is exact: the same figure as dividing by 1024 step by step
    if (unit === 'GiB' || Math.abs(n / size) < 1024 - 0.5 * 10 ** -decimals) {
      return [unit, size, decimals];
    }
    size *= 1024;
  }
  return ['GiB', size / 1024, 1];
}

/** Bytes in binary units: `16 B`, `4.0 MiB`, `1.5 GiB` (`signed`: a change, `+4.0 MiB`). */
export function formatBytes(n: Figure, options: IUnitOptions = {}): string {
  if (isMissing(n)) {
    return options.missing ?? MISSING;
  }
  const [unit, size, decimals] = byteUnit(n);
  return `${fixed(n / size, decimals, options.signed, false)} ${unit}`;
}

/** Microseconds, in µs: `12.3 µs`. */
export function formatUs(us: Figure, options: IUnitOptions = {}): string {
  return isMissing(us) ? (options.missing ?? MISSING) : `${fixed(us, 1, options.signed)} µs`;
}

export interface IMsOptions extends IUnitOptions {
  /** false: the figure alone (`12.3`), in a column whose header names the unit */
  unit?: boolean;
  /** false: no thousands separator (`1362.6`), for a column too narrow for `1,362.6` */
  grouping?: boolean;
}

/** Milliseconds, in ms: `12.3 ms`. */
export function formatMs(ms: Figure, options: IMsOptions = {}): string {
  if (isMissing(ms)) {
    return options.missing ?? MISSING;
  }
  return fixed(ms, 1, options.signed, options.grouping ?? true) + (options.unit === false ? '' : ' ms');
}

/** Microseconds written in ms: `12.3 ms` for 12,300 µs. */
export function formatUsAsMs(us: Figure, options: IUnitOptions = {}): string {
  return isMissing(us) ? (options.missing ?? MISSING) : formatMs(us / 1e3, { signed: options.signed });
}

/** Seconds, in s: `3.2 s`. */
export function formatSeconds(s: Figure, options: IUnitOptions = {}): string {
  return isMissing(s) ? (options.missing ?? MISSING) : `${fixed(s, 1, options.signed)} s`;
}

/**
 * Microseconds in the unit that suits them: `950.0 µs`, `12.3 ms`, `1.3 s`
 * (the unit chosen after rounding, so never `1,000.0 µs`).
 */
export function formatDuration(us: Figure, options: IUnitOptions = {}): string {
  if (isMissing(us)) {
    return options.missing ?? MISSING;
  }
  const signed = { signed: options.signed };
  if (Math.abs(us) < 999.95) {
    return formatUs(us, signed);
  }
  if (Math.abs(us) < 999_950) {
    return formatMs(us / 1e3, signed);
  }
  return formatSeconds(us / 1e6, signed);
}

/** A share given in percent (0-100) as a whole percent: `12%`. */
export function formatPercent(pct: Figure, options: IUnitOptions = {}): string {
  return isMissing(pct) ? (options.missing ?? MISSING) : `${fixed(pct, 0, options.signed)}%`;
}

/** How long ago, in whole seconds below 90 s, else whole minutes: `12 s ago`, `4 min ago`. */
export function formatAgo(seconds: number): string {
  return seconds < 90 ? `${fixed(seconds, 0)} s ago` : `${fixed(seconds / 60, 0)} min ago`;
}

/** Watts, whole: `250 W` (frontends/monitor/gpumonitor.py writes the GPU's power alike). */
export function formatWatts(w: Figure, missing = MISSING): string {
  return isMissing(w) ? missing : `${fixed(w, 0, false, false)} W`;
}

/** A temperature as the sampler reads it (whole degrees): `65 °C`. */
export function formatCelsius(c: Figure, missing = MISSING): string {
  return isMissing(c) ? missing : `${c} °C`;
}

/** Bytes per second as whole MB/s (decimal, as link rates are quoted): `123 MB/s`. */
export function formatMBps(bps: Figure, missing = MISSING): string {
  return isMissing(bps) ? missing : `${fixed(bps / 1e6, 0, false, false)} MB/s`;
}

/**
 * A time of day as the sidebar writes it everywhere (axes and text): 24-hour,
 * hh:mm:ss, with `decimals` fractions of a second.
 */
export function clockTime(t: number, decimals = 0): string {
  const whole = new Date(t * 1000).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
  return decimals ? `${whole}.${fixed(t % 1, decimals).slice(2)}` : whole;
}

/** Time tick labels, with the fractions of a second a short span needs to tell them apart. */
export function timeTicks(splits: number[]): string[] {
  const step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 1;
  const decimals = step >= 1 || step <= 0 ? 0 : Math.min(3, Math.ceil(-Math.log10(step) - 1e-9));
  return splits.map(t => clockTime(t, decimals));
}

/** Tick labels of a percent axis: whole percent. */
export function percentTicks(splits: number[]): string[] {
  return splits.map(v => formatPercent(v));
}

/** Byte tick steps in a unit, before the next smaller unit is taken. */
const MIN_TICK_STEP = 1 / 64;

/**
 * Tick labels of a byte axis, in one unit for the whole axis, each one different.
 *
 * The unit is the one `formatBytes` writes the axis's top value in (155.5 MiB:
 * MiB, so ticks read "64 MiB", "128 MiB", not "0.063 GiB"), unless the ticks
 * are too close for it: 424.406 MiB of resident memory moving by a few KiB
 * has ticks 1 KiB apart, which in MiB would all read "424.406 MiB". Then the
 * largest unit in which the tick step is at least 1/64 is taken. As many
 * decimals as the step needs (at most three), so consecutive labels differ.
 */
export function byteTicks(splits: number[]): string[] {
  const top = Math.max(...splits.map(Math.abs), 0);
  const step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : top;
  let [name, size] = byteUnit(top);
  if (step > 0 && step / size < MIN_TICK_STEP) {
    while (size > 1 && step / size < MIN_TICK_STEP) {
      size /= 1024;
    }
    name = BYTE_UNITS[Math.round(Math.log2(size) / 10)][0];
  }
  // as many decimals as the step has (0.25 -> 2), at most 3: 1/64 reads 0.016
  const inUnit = step / size;
  let decimals = 0;
  while (decimals < 3 && Math.abs(inUnit * 10 ** decimals - Math.round(inUnit * 10 ** decimals)) > 1e-6) {
    decimals++;
  }
  return splits.map(v => `${fixed(v / size, decimals, false, false)} ${name}`);
}
