// The Benchmarks view: the seeds' trigger-mode experiment as shepherd-bench last measured it
// (bench/results/trigger-modes*.json and their plots), when the server has them.

import { call } from './api.js';
import { h, fill } from './dom.js';

let loaded = false;

export async function showBenchmarks() {
  if (loaded) return;
  loaded = true;
  const box = document.getElementById('benchmarks');
  try {
    const files = await call('GET', '/dashboard/results/');
    const runs = files.filter((f) => f.endsWith('.json')).sort((a, b) => a.length - b.length || a.localeCompare(b));
    if (!runs.length) {
      fill(box, h('p', { class: 'empty' },
        'No results here. Run `shepherd-bench trigger-modes` (see BENCHMARKS.md) and start the server where bench/results is, or pass --bench-results DIR.'));
      return;
    }
    const sections = [];
    for (const name of runs) {
      const run = await call('GET', `/dashboard/results/${name}`);
      const plot = name.replace(/\.json$/, '.svg');
      sections.push(experiment(name, run, files.includes(plot) ? plot : null));
    }
    fill(box, sections);
  } catch (e) {
    loaded = false;
    fill(box, h('p', { class: 'field-error', role: 'alert' }, `Cannot read the results: ${e.message}`));
  }
}

const ms = (v) => (v === undefined || v === null ? '–' : v >= 1000 ? `${(v / 1000).toFixed(1)} s` : `${v.toFixed(0)} ms`);
const num = (v) => (v === undefined || v === null ? '–' : Math.round(v).toLocaleString('en'));

function experiment(name, run, plot) {
  const cells = run.results?.cells || [];
  const m = run.machine || {};
  const when = run.unix_time ? new Date(run.unix_time * 1000).toISOString().slice(0, 16).replace('T', ' ') : '';
  return h('section', { class: 'panel wide', 'data-result': name },
    h('h2', {}, name.replace(/\.json$/, '')),
    h('p', { class: 'muted' }, `${when} UTC · ${m.cores ?? '?'} cores, ${m.memory_gib ? m.memory_gib.toFixed(0) : '?'} GiB, ${m.cpu || ''}`),
    h('p', { class: 'lead' }, 'Each cell changes Deployments while a share of watch events is lost, and times each change until it converged.'),
    plot ? h('img', { src: `/dashboard/results/${plot}`, alt: `Convergence time by trigger mode and event loss (${plot})`, class: 'plot' }) : null,
    h('div', { class: 'scroll' }, h('table', {},
      h('thead', {}, h('tr', {}, ['Mode', 'Events lost', 'p50', 'p99', 'Never converged', 'Reconciles/min', 'Objects listed/min', 'CPU s']
        .map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, cells.map((c) => h('tr', {},
        h('td', {}, c.mode), h('td', {}, `${((c.loss || 0) * 100).toFixed(0)}%`),
        h('td', {}, ms(c.latency?.p50_ms)), h('td', {}, ms(c.latency?.p99_ms)),
        h('td', { class: c.never_converged ? 'no' : '' }, c.never_converged ?? '–'),
        h('td', {}, num(c.reconciles_per_min)), h('td', {}, num(c.listed_objects_per_min)),
        h('td', {}, c.cpu_seconds === undefined ? '–' : c.cpu_seconds.toFixed(1))))))));
}
