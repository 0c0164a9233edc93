// The dashboard's entry: routing between views, the connection line, and the token form.

import { onConnection, signIn, signOut, token } from './api.js';
import { startCluster } from './cluster.js';
import { startLoop } from './loop.js';
import { showBenchmarks } from './benchmarks.js';

// Errors a test (or a curious person) can read: every uncaught error is kept, not only logged.
window.dashboardErrors = [];
window.addEventListener('error', (e) => window.dashboardErrors.push(String(e.message)));
window.addEventListener('unhandledrejection', (e) => window.dashboardErrors.push(String(e.reason?.message || e.reason)));

// What a benchmark reads: frames (the longest gap between two since the last reset, and how many
// gaps passed 100 ms), the browser's long tasks and long animation frames (where the time of
// those over 100 ms went: the page's scripts, the browser's style, layout and paint, or neither),
// and the page's own redraws (how many, how long, and how many times each view was drawn).
const fresh = () => ({
  maxFrameGapMs: 0, framesOver100: 0, frames: 0, longTasks: [], watchEvents: 0, draws: 0, drawMs: 0, maxDrawMs: 0, rendered: {},
  longFrames: { count: 0, ms: 0, scriptMs: 0, renderMs: 0, styleLayoutMs: 0, forcedStyleLayoutMs: 0, scripts: {} },
});
const perf = fresh();
perf.reset = () => Object.assign(perf, fresh());
perf.drew = (ms) => {
  perf.draws++;
  perf.drawMs += ms;
  perf.maxDrawMs = Math.max(perf.maxDrawMs, ms);
};
perf.render = (view) => {
  perf.rendered[view] = (perf.rendered[view] || 0) + 1;
};
// When the watch events of the objects whose key starts with `prefix` reached the page: a
// benchmark tells the server's part of a change's way to the screen from the page's.
perf.follow = (prefix) => {
  perf.following = prefix;
  perf.followed = {};
};
perf.note = (key, o, at) => {
  if (!perf.following || key === null || !key.startsWith(perf.following)) return;
  const f = perf.followed[key] ||= {};
  const wall = performance.timeOrigin + at;
  f.added ??= wall;
  if (!o || o.deleting) f.deleting ??= wall;
};
window.dashboardPerf = perf;
let lastFrame = performance.now();
requestAnimationFrame(function frame(t) {
  const gap = t - lastFrame;
  lastFrame = t;
  perf.frames++;
  perf.maxFrameGapMs = Math.max(perf.maxFrameGapMs, gap);
  if (gap > 100) perf.framesOver100++;
  requestAnimationFrame(frame);
});
if (PerformanceObserver.supportedEntryTypes?.includes('longtask')) {
  new PerformanceObserver((list) => { for (const e of list.getEntries()) perf.longTasks.push(e.duration); })
    .observe({ type: 'longtask', buffered: true });
}
if (PerformanceObserver.supportedEntryTypes?.includes('long-animation-frame')) {
  new PerformanceObserver((list) => {
    for (const e of list.getEntries()) {
      if (e.duration <= 100) continue;
      const f = perf.longFrames;
      const end = e.startTime + e.duration;
      f.count++;
      f.ms += e.duration;
      f.renderMs += e.renderStart ? end - e.renderStart : 0;
      f.styleLayoutMs += e.styleAndLayoutStart ? end - e.styleAndLayoutStart : 0;
      for (const s of e.scripts) {
        f.scriptMs += s.duration;
        f.forcedStyleLayoutMs += s.forcedStyleAndLayoutDuration || 0;
        const what = `${s.invokerType} ${s.invoker} ${s.sourceFunctionName || ''}`.trim();
        f.scripts[what] = (f.scripts[what] || 0) + s.duration;
      }
    }
  }).observe({ type: 'long-animation-frame', buffered: true });
}

const VIEWS = ['cluster', 'loop', 'benchmarks'];

function route() {
  const view = VIEWS.find((v) => location.hash === `#/${v}`) || 'cluster';
  for (const section of document.querySelectorAll('main > section')) section.hidden = section.dataset.view !== view;
  for (const a of document.querySelectorAll('nav a')) {
    if (a.dataset.view === view) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  document.body.dataset.view = view;
  if (view === 'benchmarks') showBenchmarks();
}

function connection() {
  const line = document.getElementById('connection');
  const login = document.getElementById('login');
  const field = document.getElementById('token');
  const error = document.getElementById('token-error');
  const out = document.getElementById('sign-out');
  out.hidden = !token();
  out.addEventListener('click', signOut);
  onConnection(({ unauthorized, error: down }) => {
    const asking = login.hidden && unauthorized;
    login.hidden = !unauthorized;
    document.body.dataset.auth = unauthorized ? 'needed' : 'ok';
    line.classList.toggle('down', !!down || unauthorized);
    line.textContent = unauthorized ? 'signed out' : down ? `reconnecting: ${down.message}` : 'live';
    // The form takes the focus when it appears, so a keyboard user can type the token at once.
    if (asking && !document.activeElement?.closest('input, select, textarea')) field.focus();
  });
  login.addEventListener('submit', async (e) => {
    e.preventDefault();
    error.textContent = '';
    const button = login.querySelector('button');
    button.disabled = true;
    const refused = await signIn(field.value.trim());
    button.disabled = false;
    if (refused) {
      error.textContent = refused;
      field.setAttribute('aria-invalid', 'true');
      field.select();
      return;
    }
    field.removeAttribute('aria-invalid');
    field.value = '';
    out.hidden = false;
    document.getElementById('main').focus();
  });
}

window.addEventListener('hashchange', route);
route();
connection();
startCluster();
startLoop();
