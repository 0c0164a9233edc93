// The loop view: each controller's trigger mode, workers, queue depth over the last minutes,
// reconciles per second, latency percentiles and the keys waiting out a back-off, live from
// `/debug/controllers?watch=true`.

import { call, follow } from './api.js';
import { h, fill, age, duration, throttled, order } from './dom.js';

const WINDOW_MS = 5 * 60 * 1000;
const RATE_MS = 3000;
const history = new Map(); // controller name -> [{t, depth, inFlight, adds, done}]
let latest = null;
let denied = null; // the server's 403 while this user may not read the controllers

export function startLoop() {
  const draw = throttled(() => document.body.dataset.view === 'loop' && render(), 250);
  window.addEventListener('hashchange', draw);
  follow('/debug/controllers?watch=true', (snapshot) => {
    latest = snapshot;
    denied = null;
    const now = Date.now();
    for (const c of snapshot.controllers || []) {
      const r = c.reconciles || {};
      const points = history.get(c.name) || [];
      points.push({ t: now, depth: c.queueDepth, inFlight: c.inFlight, adds: c.queueAdds || 0,
        done: (r.success || 0) + (r.error || 0) + (r.requeue || 0) + (r.panic || 0) });
      while (points.length && points[0].t < now - WINDOW_MS) points.shift();
      history.set(c.name, points);
    }
    draw();
  }, (e) => {
    denied = e.message;
    latest = null;
    draw();
  });
  setInterval(draw, 1000);
}

/** Per second over the last few seconds, from a counter's samples. */
function rate(points, field, now = Date.now()) {
  if (points.length < 2) return 0;
  const last = points[points.length - 1];
  const first = points.find((p) => p.t >= now - RATE_MS) || points[0];
  const base = first === last ? points[points.length - 2] : first;
  const dt = (last.t - base.t) / 1000;
  return dt > 0 ? (last[field] - base[field]) / dt : 0;
}

const cards = new Map(); // controller name -> {card, body, demo}

function render() {
  window.dashboardPerf?.render('loop');
  const box = document.getElementById('controllers');
  if (denied) {
    cards.clear();
    fill(box, h('p', { class: 'forbidden', role: 'alert' }, denied));
    return;
  }
  if (!latest) return;
  document.getElementById('demo-banner').hidden = !latest.demo;
  // The controllers at work first (the ones the cluster's objects have made reconcile), then the
  // idle ones, each group by name: the seed's Deployment is not below four idle cards.
  const worked = (c) => Object.values(c.reconciles || {}).some((n) => n > 0);
  const controllers = (latest.controllers || []).slice()
    .sort((a, b) => (worked(b) - worked(a)) || a.name.localeCompare(b.name));
  if (!controllers.length) {
    fill(box, h('p', { class: 'empty' }, 'No controllers run in this process.'));
    return;
  }
  for (const stale of box.querySelectorAll(':scope > .empty, :scope > .forbidden')) stale.remove();
  order(box, controllers.map((c) => {
    let entry = cards.get(c.name);
    if (!entry) {
      entry = { card: h('article', { class: 'card', 'data-controller': c.name }), body: h('div'), demo: null };
      entry.card.append(entry.body);
      cards.set(c.name, entry);
    }
    entry.card.dataset.mode = c.mode;
    entry.card.dataset.worked = worked(c);
    entry.card.dataset.eventLoss = c.eventLoss || 0;
    fill(entry.body, cardBody(c));
    if (latest.demo && !entry.demo) {
      entry.demo = demoForm(c);
      entry.card.append(entry.demo.form);
    }
    entry.demo?.update(c);
    return entry.card;
  }));
}

function cardBody(c) {
  const points = history.get(c.name) || [];
  const r = c.reconciles || {};
  const perSecond = rate(points, 'done');
  const loss = c.eventLoss ? ` · loses ${Math.round(c.eventLoss * 100)}% of events` : '';
  return [
    h('h3', {}, c.name, h('span', { class: 'mode' }, c.mode + (c.periodSeconds ? ` · ${duration(c.periodSeconds)}` : ''))),
    h('p', { class: c.eventLoss ? 'loss' : 'muted' }, `${c.kind} · ${c.workers} worker${c.workers === 1 ? '' : 's'}${loss}`),
    h('div', { class: 'stats' },
      stat(c.queueDepth, 'queued', 'depth'), stat(c.inFlight, 'in flight', 'in-flight'),
      stat(perSecond.toFixed(perSecond < 10 ? 1 : 0), 'reconciles/s', 'rate'),
      stat(duration(c.latency?.p50Seconds), 'p50', 'p50'), stat(duration(c.latency?.p99Seconds), 'p99', 'p99'),
      stat(c.backoff?.length || 0, 'backing off', 'backoff')),
    chart(c.name, points),
    h('p', { class: 'muted' },
      `${r.success || 0} ok · ${r.error || 0} failed · ${r.requeue || 0} requeued · ${r.panic || 0} panicked`),
    h('p', { class: 'muted', 'data-resync': c.lastResync || '' },
      `last resync ${c.lastResync ? `${age(c.lastResync)} ago` : 'never'} · last list ${c.lastList ? `${age(c.lastList)} ago` : 'never'}`,
      c.lastCheck ? ` · last check ${age(c.lastCheck)} ago` : '', c.lastRepair ? ` · last repair ${age(c.lastRepair)} ago` : ''),
    backoff(c.backoff || []),
  ];
}

/** Demo mode: switch the trigger mode and make the controller lose events, live. */
function demoForm(c) {
  const id = `demo-${c.name}`.replace(/[^a-zA-Z0-9-]/g, '-');
  const mode = h('select', { id: `${id}-mode`, name: 'mode' },
    ['level', 'edge', 'hybrid'].map((m) => h('option', { value: m }, m)));
  const period = h('input', { id: `${id}-period`, name: 'periodSeconds', inputmode: 'decimal', class: 'replicas-input' });
  const loss = h('input', { id: `${id}-loss`, name: 'eventLoss', inputmode: 'numeric', class: 'replicas-input' });
  const error = h('p', { class: 'field-error', id: `${id}-error`, role: 'alert' });
  const form = h('form', { class: 'action demo', 'data-action': 'tune', 'aria-describedby': `${id}-error` },
    h('label', { for: `${id}-mode` }, 'Mode'), mode,
    h('label', { for: `${id}-period` }, 'every (s)'), period,
    h('label', { for: `${id}-loss` }, 'lose (%)'), loss,
    h('button', { type: 'submit' }, 'Apply'), error);
  let touched = false;
  form.addEventListener('input', () => { touched = true; });
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    error.textContent = '';
    const body = { mode: mode.value, eventLoss: Number(loss.value) / 100 };
    if (mode.value !== 'edge' && period.value.trim()) body.periodSeconds = Number(period.value);
    try {
      await call('POST', `/debug/controllers/${encodeURIComponent(c.name)}`, body);
      touched = false;
    } catch (err) {
      error.textContent = err.body?.message || err.message;
    }
  });
  // What a person changed stays until it is applied or they press Escape, which shows the
  // controller's settings again.
  let shown = null;
  const showSettings = (now) => {
    mode.value = ['level', 'edge', 'hybrid'].includes(now.mode) ? now.mode : 'hybrid';
    period.value = now.periodSeconds ?? '';
    loss.value = Math.round((now.eventLoss || 0) * 100);
  };
  form.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape' || !touched) return;
    touched = false;
    error.textContent = '';
    if (shown) showSettings(shown);
  });
  const update = (now) => {
    shown = now;
    if (touched || form.contains(document.activeElement)) return;
    showSettings(now);
  };
  return { form, update };
}

function stat(value, label, key) {
  return h('div', { class: 'stat', 'data-stat': key }, h('b', {}, value), h('span', {}, label));
}

/** Queue depth (line) and keys added per sample (bars) over the window. */
function chart(name, points) {
  const w = 300;
  const ht = 60;
  const now = Date.now();
  const x = (t) => ((t - (now - WINDOW_MS)) / WINDOW_MS) * w;
  const maxDepth = Math.max(1, ...points.map((p) => p.depth + p.inFlight));
  const adds = points.map((p, i) => (i ? Math.max(0, p.adds - points[i - 1].adds) : 0));
  const maxAdds = Math.max(1, ...adds);
  const bars = points.map((p, i) => adds[i]
    ? h('svg:rect', { class: 'adds', x: x(p.t) - 1, width: 2, y: ht - (adds[i] / maxAdds) * ht, height: (adds[i] / maxAdds) * ht })
    : null);
  const line = points.map((p) => `${x(p.t).toFixed(1)},${(ht - ((p.depth + p.inFlight) / maxDepth) * ht).toFixed(1)}`).join(' ');
  const added = adds.reduce((a, b) => a + b, 0);
  const peak = Math.max(0, ...points.map((p) => p.depth + p.inFlight));
  return h('svg:svg', {
    class: 'chart', viewBox: `0 0 ${w} ${ht}`, preserveAspectRatio: 'none', role: 'img',
    'aria-label': `${name}: ${added} keys added and a peak of ${peak} queued or in flight over the last 5 minutes`,
    'data-added': added, 'data-peak': peak,
  }, bars, points.length > 1 ? h('svg:polyline', { class: 'depth', points: line }) : null);
}

function backoff(entries) {
  if (!entries.length) return h('p', { class: 'empty' }, 'No keys in back-off.');
  return h('div', { class: 'scroll' }, h('table', { class: 'backoff' },
    h('thead', {}, h('tr', {}, ['Key', 'Retries', 'Next try', 'Last error'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, entries.map((e) => h('tr', { 'data-key': e.key },
      h('td', {}, e.key), h('td', {}, e.retries), h('td', {}, `in ${duration(e.nextAttemptInSeconds)}`),
      h('td', {}, e.lastError || '–'))))));
}
