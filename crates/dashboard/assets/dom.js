// Small DOM helpers: build elements without HTML strings (nothing from the cluster is ever
// parsed as markup), and say ages the way kubectl does.

const SVG = 'http://www.w3.org/2000/svg';

/** An element: h('td', {class: 'x', 'data-pod': name}, 'text', child, ...). */
export function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith('svg:') ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/**
 * Makes `els` the first children of `box`, in order, moving only the ones out of place: moving a
 * node takes the focus from a field inside it, so a live re-render must not move what a person
 * is typing in.
 */
export function order(box, els) {
  let at = box.firstChild;
  for (const el of els) {
    if (el === at) at = at.nextSibling;
    else box.insertBefore(el, at);
  }
}

/**
 * Keeps one child of `box` per item, in order, then `tail`: a child is built again only when its
 * item's `sig` (what it shows) changed, so a redraw of thousands of objects touches the few that
 * moved. Items: {key, sig, make}.
 */
export function keyed(box, cache, items, tail = []) {
  const seen = new Set();
  const els = items.map(({ key, sig, make }) => {
    seen.add(key);
    let c = cache.get(key);
    if (!c || c.sig !== sig) {
      const el = make();
      if (c) c.el.replaceWith(el);
      c = { el, sig };
      cache.set(key, c);
    }
    return c.el;
  });
  for (const [key, c] of cache) {
    if (!seen.has(key)) {
      c.el.remove();
      cache.delete(key);
    }
  }
  const all = [...els, ...tail];
  order(box, all);
  while (box.childNodes.length > all.length) box.lastChild.remove();
}

/** Replaces an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

/** kubectl's age: 45s, 12m, 3h4m, 2d3h. */
export function age(timestamp, now = Date.now()) {
  const t = Date.parse(timestamp);
  if (Number.isNaN(t)) return '';
  let s = Math.max(0, Math.floor((now - t) / 1000));
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m`;
  const hours = Math.floor(m / 60);
  if (hours < 24) return m % 60 ? `${hours}h${m % 60}m` : `${hours}h`;
  const d = Math.floor(hours / 24);
  return hours % 24 ? `${d}d${hours % 24}h` : `${d}d`;
}

/** Milliseconds or seconds, whichever reads better. */
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return '–';
  if (seconds < 0.001) return `${(seconds * 1e6).toFixed(0)} µs`;
  if (seconds < 1) return `${(seconds * 1000).toFixed(seconds < 0.01 ? 2 : 1)} ms`;
  if (seconds < 120) return `${Number(seconds.toFixed(1))} s`;
  return `${Number((seconds / 60).toFixed(1))} min`;
}

/**
 * Calls `draw` at most once per animation frame and at most every `minMs`, and leaves the page
 * idle at least twice as long as the last draw took: data arrives as fast as the cluster changes, the
 * page redraws at a pace a person can read and a browser can keep.
 */
export function throttled(draw, minMs = 100) {
  let pending = false;
  let last = 0;
  let cost = 0;
  return () => {
    if (pending) return;
    pending = true;
    const wait = Math.max(0, last + Math.max(minMs, 2 * cost) - performance.now());
    setTimeout(() => requestAnimationFrame(() => {
      pending = false;
      const start = performance.now();
      draw();
      last = performance.now();
      cost = last - start;
      window.dashboardPerf?.drew(cost);
    }), wait);
  };
}

/**
 * A form field that the page keeps showing the cluster's value in, until a person changes it:
 * from their first keystroke what they typed stays, through redraws and when the field loses the
 * focus, until the form is accepted (`accepted()`) or they press Escape, which puts the cluster's
 * value back (and calls `onRevert`). `show(value)` is what a redraw calls.
 */
export function editable(input, onRevert = () => {}) {
  let edited = false;
  let latest = '';
  input.addEventListener('input', () => { edited = true; });
  input.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape' || !edited) return;
    edited = false;
    input.value = latest;
    onRevert();
  });
  return {
    input,
    show(value) {
      latest = String(value);
      if (!edited && document.activeElement !== input) input.value = latest;
    },
    accepted() { edited = false; },
    get edited() { return edited; },
  };
}

/**
 * The first `k` of `items` in `cmp` order, without sorting them all: what a capped list shows
 * of thousands, at a cost that grows with the items, not with their sort.
 */
export function firstK(items, k, cmp) {
  const top = [];
  for (const item of items) {
    if (top.length === k && cmp(item, top[k - 1]) >= 0) continue;
    let lo = 0;
    let hi = top.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (cmp(item, top[mid]) < 0) hi = mid;
      else lo = mid + 1;
    }
    top.splice(lo, 0, item);
    if (top.length > k) top.pop();
  }
  return top;
}

/** Orders strings as `<` does: much cheaper than localeCompare over thousands of names. */
export function compare(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

/** Puts `item` into the sorted `items` where `cmp` says. */
function insertSorted(items, item, cmp) {
  let lo = 0;
  let hi = items.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (cmp(item, items[mid]) < 0) hi = mid;
    else lo = mid + 1;
  }
  items.splice(lo, 0, item);
}

/**
 * The first `k` of a changing collection in `cmp` order, kept as its objects change: most changes
 * touch an object that is not among the first, or change one in place, and cost a comparison or
 * two; the few others (one of the first goes, or moves) leave it to be found again over all
 * objects at the next redraw. It holds the collection's own objects (compared by identity).
 */
export class TopK {
  constructor(k, cmp) {
    this.k = k;
    this.cmp = cmp;
    this.items = [];
    this.stale = true;
  }

  invalidate() {
    this.stale = true;
  }

  /** `old` became `o` (either may be absent); `size`: how many objects the collection holds now. */
  update(old, o, size) {
    if (this.stale) return;
    const { items, k, cmp } = this;
    const at = old ? items.indexOf(old) : -1;
    if (at >= 0) {
      if (o && cmp(o, old) === 0) {
        items[at] = o;
        return;
      }
      items.splice(at, 1);
      // Moved forward, it stays among the first; moved back or gone, the one that takes its
      // place is known only when every other object is among the first.
      if (o && cmp(o, old) < 0) {
        insertSorted(items, o, cmp);
        return;
      }
      if (items.length < size - (o ? 1 : 0)) {
        this.stale = true;
        return;
      }
      if (o) insertSorted(items, o, cmp);
      return;
    }
    if (!o) return;
    if (items.length < k) insertSorted(items, o, cmp);
    else if (cmp(o, items[k - 1]) < 0) {
      insertSorted(items, o, cmp);
      items.pop();
    }
  }

  /** The first k; `all()` gives every object when they must be found again. */
  get(all) {
    if (this.stale) {
      this.items = firstK(all(), this.k, this.cmp);
      this.stale = false;
    }
    return this.items;
  }
}
