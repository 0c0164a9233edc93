// The page's only way to the cluster: the API's own list and watch calls, with the bearer token
// the user gave (kept for this tab only).

const TOKEN = 'shepherd-token';
const listeners = new Set();
let unauthorized = false;

/** The token this tab signed in with, if any. */
export const token = () => sessionStorage.getItem(TOKEN);

// A sign-in link (`/dashboard/#token=...`, as `shepherd standalone` prints it): the token is kept
// as a typed one is, and leaves the address bar and the history at once. A fragment is never sent
// to the server; a wrong token gets the sign-in form, as a typed one does.
const linked = new URLSearchParams(location.hash.slice(1)).get('token');
if (linked) {
  sessionStorage.setItem(TOKEN, linked);
  history.replaceState(null, '', location.pathname + location.search);
}

function headers(extra = {}, t = token()) {
  return t ? { ...extra, Authorization: `Bearer ${t}` } : extra;
}

/** Subscribes to connection news: {unauthorized, error}. */
export function onConnection(f) {
  listeners.add(f);
}

function notify(error = null) {
  for (const f of listeners) f({ unauthorized, error });
}

// Loops waiting out a back-off; a sign-in ends their wait, so the page fills at once.
const sleepers = new Set();

function sleep(ms) {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      sleepers.delete(done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    sleepers.add(done);
  });
}

/**
 * Tries `candidate` against the API and keeps it for this tab when the server knows it.
 * Resolves to null, or to the server's message refusing it. What the user may do with it is
 * authorization's business, answered call by call.
 */
export async function signIn(candidate) {
  let resp;
  try {
    resp = await fetch('/api', { headers: headers({}, candidate) });
  } catch (e) {
    return `cannot reach the server: ${e.message}`;
  }
  if (resp.status === 401) {
    let body = null;
    try { body = await resp.json(); } catch { /* not a Status */ }
    return body?.message || 'Unauthorized';
  }
  sessionStorage.setItem(TOKEN, candidate);
  unauthorized = false;
  notify();
  for (const wake of [...sleepers]) wake();
  return null;
}

/** Forgets the token; the page starts again with nothing of what it showed. */
export function signOut() {
  sessionStorage.removeItem(TOKEN);
  location.reload();
}

/** An API error with the server's own `Status` message. */
export class ApiError extends Error {
  constructor(status, body) {
    super(body?.message || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

/** Rejects an answer that is not a success; a 401 to the tab's current token signs it out. */
async function check(resp, used) {
  if (resp.status === 401 && used === token()) {
    unauthorized = true;
    notify();
  }
  if (!resp.ok) {
    let body = null;
    try { body = await resp.json(); } catch { /* not a Status */ }
    throw new ApiError(resp.status, body);
  }
  return resp;
}

/** One call; resolves to the decoded body, rejects with an ApiError carrying the server's message. */
export async function call(method, path, body, contentType = 'application/json') {
  const used = token();
  const init = { method, headers: headers(body === undefined ? {} : { 'Content-Type': contentType }, used) };
  if (body !== undefined) init.body = typeof body === 'string' ? body : JSON.stringify(body);
  const resp = await check(await fetch(path, init), used);
  return resp.status === 204 ? null : resp.json();
}

/** Yields each JSON line of a streaming response. */
export async function* jsonLines(resp) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buffered = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffered += decoder.decode(value, { stream: true });
    let nl;
    while ((nl = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, nl).trim();
      buffered = buffered.slice(nl + 1);
      if (line) yield JSON.parse(line);
    }
  }
  if (buffered.trim()) yield JSON.parse(buffered);
}

/** A watch that never opened: the server refused the upgrade (no status reaches a page). */
class WatchRefused extends Error {}

// How long the page may spend taking watch events in before it lets the browser draw a frame
// and run other tasks: a burst of thousands of events (a reconnect, a busy cluster) is parsed in
// slices, never in one long task.
const SLICE_MS = 8;

/** Lets the browser run its other tasks (a frame, input) before going on. */
const yieldToBrowser = () => new Promise((resolve) => setTimeout(resolve, 0));

/**
 * Yields the events of a watch carried over a WebSocket, as Kubernetes serves it, in batches:
 * each batch is what arrived since the last one, parsed in at most SLICE_MS, each event with the
 * time its message reached the page (`at`). One batch at a time lets the page redraw once for
 * many events instead of queueing a promise round per event. The page holds a watch per kind;
 * as HTTP/1.1 streams they would take all six connections a browser allows a host and leave none
 * for the user's actions. A browser cannot set headers on a WebSocket, so the token travels as
 * Kubernetes takes it there: in a subprotocol.
 */
async function* socketBatches(path) {
  const url = new URL(path, location.href);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  const protocols = ['binary.k8s.io'];
  const t = token();
  if (t) {
    const encoded = btoa(String.fromCharCode(...new TextEncoder().encode(t)))
      .replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
    protocols.push(`base64url.bearer.authorization.k8s.io.${encoded}`);
  }
  const ws = new WebSocket(url, protocols);
  ws.binaryType = 'arraybuffer';
  const decoder = new TextDecoder();
  // Raw messages and their arrival times, parsed only when taken: a message costs the socket's
  // handler a push.
  let queue = [];
  let head = 0;
  let opened = false;
  let closed = false;
  let wake = null;
  ws.onopen = () => { opened = true; notify(); };
  ws.onmessage = (m) => {
    queue.push(m.data, performance.now());
    if (wake) { wake(); wake = null; }
  };
  ws.onclose = () => { closed = true; if (wake) { wake(); wake = null; } };
  let start = performance.now();
  try {
    for (;;) {
      if (head < queue.length) {
        // The slice counts the caller's work on the batches too: it runs before this resumes.
        if (performance.now() - start > SLICE_MS) {
          await yieldToBrowser();
          start = performance.now();
        }
        const batch = [];
        do {
          const data = queue[head];
          const event = JSON.parse(typeof data === 'string' ? data : decoder.decode(data));
          event.at = queue[head + 1];
          batch.push(event);
          head += 2;
        } while (head < queue.length && performance.now() - start <= SLICE_MS);
        if (head === queue.length) {
          queue = [];
          head = 0;
        }
        yield batch;
      } else if (closed) {
        if (!opened) throw new WatchRefused(`cannot watch ${path.split('?')[0]}`);
        return;
      } else {
        await new Promise((r) => { wake = r; });
        start = performance.now();
      }
    }
  } finally {
    if (!closed) ws.close();
  }
}

/**
 * Keeps calling `once` (which streams until the server ends it), backing off after failures.
 * `refused(e)` sees a 403 (the user may not read this): the caller shows it, and the loop asks
 * again now and then, as roles change. A 401 waits for a sign-in.
 */
async function forever(once, refused = () => {}) {
  let delay = 250;
  for (;;) {
    const used = token();
    try {
      await once();
      delay = 250;
      notify();
    } catch (e) {
      if (e instanceof ApiError && e.status === 403) {
        refused(e);
        await sleep(30000);
      } else if (e instanceof ApiError && e.status === 401) {
        // Refused the token of before a sign-in: try the new one at once.
        if (token() === used) await sleep(60000);
      } else {
        notify(e);
        await sleep(delay);
        delay = Math.min(delay * 2, 8000);
      }
    }
  }
}

const LIST_PAGE = 500;

/**
 * A kind's objects, kept current as client-go's informers do: list, then watch from the list's
 * resourceVersion; a 410 (history gone) lists again, anything else retries with back-off.
 * `forbidden` holds the server's message while the user may not list the kind.
 */
export class Informer {
  /**
   * `compact(o)`: what the page keeps of each object (all of it by default): a page holding
   * 10,000 pods keeps the few fields it shows, not megabytes of specs for the collector to walk.
   */
  constructor(path, onChange, compact = (o) => o) {
    this.path = path;
    this.onChange = onChange;
    this.compact = compact;
    this.observers = [];
    this.items = new Map();
    this.resourceVersion = '';
    this.synced = false;
    this.forbidden = null;
    this.version = 0; // counts changes, for views that cache what they derive from the items
    this.at = 0; // when the event being applied reached the page (performance.now())
  }

  static key(o) {
    const m = o.metadata || {};
    return m.namespace ? `${m.namespace}/${m.name}` : m.name;
  }

  start() {
    forever(() => this.once(), (e) => {
      this.forbidden = e.message;
      this.items = new Map();
      this.resourceVersion = '';
      this.version++;
      this.changed(null);
      this.onChange();
    });
    return this;
  }

  list() {
    return [...this.items.values()];
  }

  /**
   * Calls `f(key, old, o)` for every change (`o` undefined: deleted) and `f(null)` when the items
   * were listed again, so a view keeps its indices current at the cost of each change rather than
   * going over every object at each redraw.
   */
  observe(f) {
    this.observers.push(f);
    return this;
  }

  changed(key, old, o) {
    for (const f of this.observers) f(key, old, o);
  }

  async once() {
    const sep = this.path.includes('?') ? '&' : '?';
    if (!this.resourceVersion) {
      // In pages, as client-go lists: each is parsed in a task short enough to leave the page
      // drawing frames, where one list of 10,000 pods would hold it for a good part of a second.
      const items = new Map();
      let next = '';
      let listedAt = '';
      do {
        const page = await call('GET', `${this.path}${sep}limit=${LIST_PAGE}${next ? `&continue=${encodeURIComponent(next)}` : ''}`);
        for (const o of page.items || []) items.set(Informer.key(o), this.compact(o));
        listedAt = page.metadata?.resourceVersion || '';
        next = page.metadata?.continue || '';
      } while (next);
      this.items = items;
      this.resourceVersion = listedAt;
      this.synced = true;
      this.forbidden = null;
      this.version++;
      this.changed(null);
      this.onChange();
    }
    const url = `${this.path}${sep}watch=true&allowWatchBookmarks=true&resourceVersion=${encodeURIComponent(this.resourceVersion)}`;
    try {
      for await (const batch of socketBatches(url)) {
        let changed = false;
        for (const event of batch) {
          const o = event.object;
          if (event.type === 'ERROR') {
            if (changed) this.onChange();
            if (o?.code === 410) {
              this.resourceVersion = '';
              return;
            }
            throw new ApiError(o?.code || 500, o);
          }
          if (o?.metadata?.resourceVersion) this.resourceVersion = o.metadata.resourceVersion;
          if (event.type === 'BOOKMARK') continue;
          if (window.dashboardPerf) window.dashboardPerf.watchEvents++;
          const key = Informer.key(o);
          const old = this.items.get(key);
          this.at = event.at;
          if (event.type === 'DELETED') {
            this.items.delete(key);
            this.changed(key, old, undefined);
          } else {
            const kept = this.compact(o);
            this.items.set(key, kept);
            this.changed(key, old, kept);
          }
          this.version++;
          changed = true;
        }
        if (changed) this.onChange();
      }
    } catch (e) {
      // A refused watch says nothing of why; listing again does (401, 403, or a server away).
      if (e instanceof WatchRefused) this.resourceVersion = '';
      throw e;
    }
  }
}

/**
 * Follows a stream of JSON snapshots (`/debug/controllers?watch=true`), reconnecting as needed;
 * `refused(e)` sees a 403.
 */
export function follow(path, onSnapshot, refused) {
  forever(async () => {
    const used = token();
    const resp = await check(await fetch(path, { headers: headers({}, used) }), used);
    notify();
    for await (const snapshot of jsonLines(resp)) onSnapshot(snapshot);
  }, refused);
}
