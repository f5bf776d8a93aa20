/**
 * DOM helpers shared by the sidebar's sections. Text goes in through
 * `textContent` only: nothing the server passes on (a kernel's samples, a
 * run's live.json) is ever parsed as markup.
 */

export function el<K extends keyof HTMLElementTagNameMap>(tag: K, cls: string, text = ''): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = cls;
  node.textContent = text;
  return node;
}

/** Bytes in the unit that suits them: a rank's allocator may hold KiB or tens of GiB. */
export function bytesText(v: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v.toFixed(0)} B` : `${v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0)} ${units[i]}`;
}

/**
 * Bytes exactly as torchlens' reports write them (model/units.py `format_bytes`:
 * B, then KiB/MiB/GiB with one decimal): a figure the sidebar repeats from a
 * report reads the same in both.
 */
export function reportBytesText(v: number): string {
  const units: [string, number][] = [
    ['B', 0],
    ['KiB', 1],
    ['MiB', 1]
  ];
  for (const [unit, decimals] of units) {
    if (Math.abs(v) < 1024 - 0.5 * 10 ** -decimals) {
      return `${v.toFixed(decimals)} ${unit}`;
    }
    v /= 1024;
  }
  return `${v.toFixed(1)} GiB`;
}
