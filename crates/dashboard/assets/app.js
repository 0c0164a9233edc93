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
// gaps passed 100 ms), the browser's long tasks, and the page's own redraws (how many, how long).
const fresh = () => ({ maxFrameGapMs: 0, framesOver100: 0, frames: 0, longTasks: [], watchEvents: 0, draws: 0, drawMs: 0, maxDrawMs: 0 });
const perf = fresh();
perf.reset = () => Object.assign(perf, fresh());
perf.drew = (ms) => {
  perf.draws++;
  perf.drawMs += ms;
  perf.maxDrawMs = Math.max(perf.maxDrawMs, ms);
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
