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
