// The dashboard's entry: routing between views, the connection line, and the token form.

import { onConnection, setToken } from './api.js';
import { startCluster } from './cluster.js';
import { startLoop } from './loop.js';
import { showBenchmarks } from './benchmarks.js';

// Errors a test (or a curious person) can read: every uncaught error is kept, not only logged.
window.dashboardErrors = [];
window.addEventListener('error', (e) => window.dashboardErrors.push(String(e.message)));
window.addEventListener('unhandledrejection', (e) => window.dashboardErrors.push(String(e.reason?.message || e.reason)));

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
  onConnection(({ unauthorized, error }) => {
    login.hidden = !unauthorized;
    line.classList.toggle('down', !!error || unauthorized);
    line.textContent = unauthorized ? 'needs a token' : error ? `reconnecting: ${error.message}` : 'live';
  });
  login.addEventListener('submit', (e) => {
    e.preventDefault();
    setToken(document.getElementById('token').value);
  });
}

window.addEventListener('hashchange', route);
route();
connection();
startCluster();
startLoop();
