// The page's only way to the cluster: the API's own list and watch calls, with the bearer token
// the user gave (kept for this tab only).

const TOKEN = 'shepherd-token';
const listeners = new Set();
let unauthorized = false;

export function setToken(token) {
  sessionStorage.setItem(TOKEN, token);
  unauthorized = false;
  notify();
}

function headers(extra = {}) {
  const token = sessionStorage.getItem(TOKEN);
  return token ? { ...extra, Authorization: `Bearer ${token}` } : extra;
}

/** Subscribes to connection news: {unauthorized, error}. */
export function onConnection(f) {
  listeners.add(f);
}

function notify(error = null) {
  for (const f of listeners) f({ unauthorized, error });
}

/** An API error with the server's own `Status` message. */
export class ApiError extends Error {
  constructor(status, body) {
    super(body?.message || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

async function check(resp) {
  if (resp.status === 401) {
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
  const init = { method, headers: headers(body === undefined ? {} : { 'Content-Type': contentType }) };
  if (body !== undefined) init.body = typeof body === 'string' ? body : JSON.stringify(body);
  const resp = await check(await fetch(path, init));
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

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Yields the events of a watch carried over a WebSocket, as Kubernetes serves it. The page holds a
 * watch per kind; as HTTP/1.1 streams they would take all six connections a browser allows a host
 * and leave none for the user's actions.
 */
async function* socketEvents(path) {
  const url = new URL(path, location.href);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  const protocols = ['binary.k8s.io'];
  const token = sessionStorage.getItem(TOKEN);
  if (token) {
    const encoded = btoa(String.fromCharCode(...new TextEncoder().encode(token)))
      .replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
    protocols.push(`base64url.bearer.authorization.k8s.io.${encoded}`);
  }
  const ws = new WebSocket(url, protocols);
  ws.binaryType = 'arraybuffer';
  const decoder = new TextDecoder();
  const queue = [];
  let opened = false;
  let closed = false;
  let wake = null;
  const poke = () => { if (wake) { wake(); wake = null; } };
  ws.onopen = () => { opened = true; notify(); };
  ws.onmessage = (m) => {
    queue.push(JSON.parse(typeof m.data === 'string' ? m.data : decoder.decode(m.data)));
    poke();
  };
  ws.onclose = () => { closed = true; poke(); };
  try {
    for (;;) {
      if (queue.length) {
        yield queue.shift();
      } else if (closed) {
        if (!opened) throw new Error(`cannot watch ${path.split('?')[0]}`);
        return;
      } else {
        await new Promise((r) => { wake = r; });
      }
    }
  } finally {
    if (!closed) ws.close();
  }
}

/** Keeps calling `once` (which streams until the server ends it), backing off after failures. */
async function forever(once) {
  let delay = 250;
  for (;;) {
    try {
      await once();
      delay = 250;
      notify();
    } catch (e) {
      notify(e);
      await sleep(delay);
      delay = Math.min(delay * 2, 8000);
    }
  }
}

/**
 * A kind's objects, kept current as client-go's informers do: list, then watch from the list's
 * resourceVersion; a 410 (history gone) lists again, anything else retries with back-off.
 */
export class Informer {
  constructor(path, onChange) {
    this.path = path;
    this.onChange = onChange;
    this.items = new Map();
    this.resourceVersion = '';
    this.synced = false;
  }

  static key(o) {
    const m = o.metadata || {};
    return m.namespace ? `${m.namespace}/${m.name}` : m.name;
  }

  start() {
    forever(() => this.once());
    return this;
  }

  list() {
    return [...this.items.values()];
  }

  async once() {
    if (!this.resourceVersion) {
      const list = await call('GET', this.path);
      this.items = new Map((list.items || []).map((o) => [Informer.key(o), o]));
      this.resourceVersion = list.metadata?.resourceVersion || '';
      this.synced = true;
      this.onChange();
    }
    const sep = this.path.includes('?') ? '&' : '?';
    const url = `${this.path}${sep}watch=true&allowWatchBookmarks=true&resourceVersion=${encodeURIComponent(this.resourceVersion)}`;
    for await (const event of socketEvents(url)) {
      const o = event.object;
      if (event.type === 'ERROR') {
        if (o?.code === 410) {
          this.resourceVersion = '';
          return;
        }
        throw new ApiError(o?.code || 500, o);
      }
      if (o?.metadata?.resourceVersion) this.resourceVersion = o.metadata.resourceVersion;
      if (event.type === 'BOOKMARK') continue;
      if (window.dashboardPerf) window.dashboardPerf.watchEvents++;
      if (event.type === 'DELETED') this.items.delete(Informer.key(o));
      else this.items.set(Informer.key(o), o);
      this.onChange();
    }
  }
}

/** Follows a stream of JSON snapshots (`/debug/controllers?watch=true`), reconnecting as needed. */
export function follow(path, onSnapshot) {
  forever(async () => {
    const resp = await check(await fetch(path, { headers: headers() }));
    notify();
    for await (const snapshot of jsonLines(resp)) onSnapshot(snapshot);
  });
}
