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
