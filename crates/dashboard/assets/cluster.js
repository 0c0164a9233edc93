// The cluster view: nodes, namespaces, Deployments as pictures of their replicas, pods by owner
// and node, Services with their endpoints, and the Events feed, all kept live by informers.

import { Informer, call } from './api.js';
import { h, fill, age, throttled, order } from './dom.js';

const PATHS = {
  nodes: '/api/v1/nodes',
  namespaces: '/api/v1/namespaces',
  pods: '/api/v1/pods',
  services: '/api/v1/services',
  endpoints: '/api/v1/endpoints',
  events: '/api/v1/events',
  deployments: '/apis/apps/v1/deployments',
  replicasets: '/apis/apps/v1/replicasets',
  leases: '/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases',
};

// The page keeps every object, and draws at most this many of each (a cluster of 10,000 pods
// stays responsive): the data is capped by nothing, the rendering by these.
const EVENTS_SHOWN = 60;
const DEPLOYMENTS_SHOWN = 60;
const NODES_SHOWN = 100;
const GROUPS_SHOWN = 40;
const PODS_SHOWN_PER_GROUP = 50;
const SERVICES_SHOWN = 100;

const visible = () => document.body.dataset.view === 'cluster';

export function startCluster() {
  const draw = throttled(() => visible() && render(inf), 150);
  const inf = Object.fromEntries(Object.entries(PATHS).map(([k, p]) => [k, new Informer(p, draw).start()]));
  setInterval(draw, 5000); // ages move on even when nothing changes
  window.addEventListener('hashchange', draw);
}

/** "and 9,950 more" under a capped list. */
function more(hidden, what) {
  return hidden > 0 ? h('p', { class: 'muted more' }, `and ${hidden.toLocaleString('en')} more ${what}`) : null;
}

let shownLive = false;

function render(inf) {
  renderDeployments(inf);
  renderNodes(inf);
  renderNamespaces(inf);
  renderPods(inf);
  renderServices(inf);
  renderEvents(inf);
  if (!shownLive && Object.values(inf).every((i) => i.synced)) {
    shownLive = true;
    performance.mark('shepherd-live'); // every kind listed and drawn: what a benchmark times
    document.body.dataset.live = 'true';
  }
}

const byName = (a, b) => Informer.key(a).localeCompare(Informer.key(b));
const live = (p) => !['Succeeded', 'Failed'].includes(p.status?.phase);

// ---- Deployments -------------------------------------------------------------------------

const cards = new Map(); // key -> {card, parts}

function renderDeployments(inf) {
  const box = document.getElementById('deployments');
  const all = inf.deployments.list().sort(byName);
  const deployments = all.slice(0, DEPLOYMENTS_SHOWN);
  const keys = new Set(deployments.map(Informer.key));
  for (const [key, c] of cards) {
    if (!keys.has(key)) {
      c.card.remove();
      cards.delete(key);
    }
  }
  const shown = deployments.map((d) => {
    const key = Informer.key(d);
    let c = cards.get(key);
    if (!c) {
      c = deploymentCard(d);
      cards.set(key, c);
    }
    updateCard(c, d);
    return c.card;
  });
  order(box, shown);
  box.querySelector('.more')?.remove();
  if (!deployments.length && inf.deployments.synced) fill(box, h('p', { class: 'empty' }, 'No Deployments yet.'));
  else box.querySelector('.empty')?.remove();
  const hidden = more(all.length - deployments.length, 'Deployments');
  if (hidden) box.append(hidden);
}

function deploymentCard(d) {
  const ns = d.metadata.namespace;
  const name = d.metadata.name;
  const id = `${ns}-${name}`.replace(/[^a-zA-Z0-9-]/g, '-');
  const parts = {
    summary: h('p', { class: 'muted' }),
    replicas: h('div', { class: 'replicas', role: 'img' }),
    images: h('div'),
    scaleError: h('p', { class: 'field-error', id: `scale-error-${id}`, role: 'alert' }),
  };
  const scaleInput = h('input', {
    id: `scale-${id}`, class: 'replicas-input', inputmode: 'numeric', 'aria-describedby': `scale-error-${id}`,
    'data-deployment': `${ns}/${name}`, name: 'replicas',
  });
  const scaleForm = h('form', { class: 'action', 'data-action': 'scale' },
    h('label', { for: `scale-${id}` }, 'Replicas'), scaleInput, h('button', { type: 'submit' }, 'Scale'), parts.scaleError);
  scaleForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    await act(parts.scaleError, () => call('PATCH', `/apis/apps/v1/namespaces/${ns}/deployments/${name}/scale`,
      { spec: { replicas: asNumber(scaleInput.value) } }, 'application/merge-patch+json'));
  });
  const card = h('article', { class: 'card', 'data-deployment': `${ns}/${name}` },
    h('h3', {}, name, ' ', h('span', { class: 'muted' }, ns)),
    parts.summary, parts.replicas, legend(), scaleForm, parts.images);
  return { card, parts, scaleInput, imageForms: new Map(), ns, name, id };
}

/** What the user typed, as JSON would carry it: a number when it is one, the text otherwise (for the server to judge). */
function asNumber(text) {
  const t = text.trim();
  return /^-?\d+$/.test(t) ? Number(t) : t;
}

async function act(errorEl, f) {
  errorEl.textContent = '';
  try {
    await f();
  } catch (e) {
    errorEl.textContent = e.body?.message || e.message;
  }
}

function legend() {
  const item = (cls, text) => h('span', {}, h('span', { class: `replica ${cls}` }), text);
  return h('div', { class: 'legend', 'aria-hidden': 'true' },
    item('available', 'available'), item('ready', 'ready'), item('updated', 'updated'), item('old', 'old'), item('missing', 'missing'));
}

function updateCard(c, d) {
  const s = d.status || {};
  const desired = d.spec?.replicas ?? 1;
  const current = s.replicas || 0;
  const updated = s.updatedReplicas || 0;
  const ready = s.readyReplicas || 0;
  const available = s.availableReplicas || 0;
  const text = `${ready}/${desired} ready · ${updated} updated · ${available} available`;
  c.parts.summary.textContent = text;
  c.card.dataset.ready = ready;
  c.card.dataset.desired = desired;
  c.parts.replicas.setAttribute('aria-label', text);
  const boxes = [];
  for (let i = 0; i < Math.max(desired, current); i++) {
    const cls = i < available ? 'available' : i < ready ? 'ready' : i < updated ? 'updated' : i < current ? 'old' : 'missing';
    boxes.push(h('span', { class: `replica ${cls}` }));
  }
  fill(c.parts.replicas, boxes);
  if (document.activeElement !== c.scaleInput && !c.parts.scaleError.textContent) c.scaleInput.value = desired;
  for (const container of d.spec?.template?.spec?.containers || []) {
    let f = c.imageForms.get(container.name);
    if (!f) {
      f = imageForm(c, container.name);
      c.imageForms.set(container.name, f);
      c.parts.images.append(f.form);
    }
    if (document.activeElement !== f.input && !f.error.textContent) f.input.value = container.image || '';
  }
}

function imageForm(c, container) {
  const id = `image-${c.id}-${container}`.replace(/[^a-zA-Z0-9-]/g, '-');
  const error = h('p', { class: 'field-error', id: `${id}-error`, role: 'alert' });
  const input = h('input', { id, name: 'image', 'aria-describedby': `${id}-error`, 'data-container': container, spellcheck: 'false' });
  const form = h('form', { class: 'action', 'data-action': 'image' },
    h('label', { for: id }, `Image (${container})`),
    input, h('button', { type: 'submit' }, 'Set image'), error);
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const patch = { spec: { template: { spec: { containers: [{ name: container, image: input.value }] } } } };
    await act(error, () => call('PATCH', `/apis/apps/v1/namespaces/${c.ns}/deployments/${c.name}`, patch,
      'application/strategic-merge-patch+json'));
  });
  return { form, input, error };
}

// ---- Nodes and namespaces -------------------------------------------------------------------

function renderNodes(inf) {
  const perNode = new Map();
  for (const p of inf.pods.items.values()) {
    if (live(p) && p.spec?.nodeName) perNode.set(p.spec.nodeName, (perNode.get(p.spec.nodeName) || 0) + 1);
  }
  const leases = inf.leases.items;
  const nodes = inf.nodes.list().sort(byName);
  const rows = nodes.slice(0, NODES_SHOWN).map((n) => {
    const ready = (n.status?.conditions || []).find((c) => c.type === 'Ready');
    const isReady = ready?.status === 'True';
    const lease = leases.get(`kube-node-lease/${n.metadata.name}`);
    const count = perNode.get(n.metadata.name) || 0;
    const capacity = n.status?.allocatable?.pods || n.status?.capacity?.pods || '?';
    const taints = (n.spec?.taints || []).map((t) => `${t.key}${t.value ? `=${t.value}` : ''}:${t.effect}`).join(', ');
    return h('tr', { 'data-node': n.metadata.name },
      h('td', {}, n.metadata.name),
      h('td', { class: isReady ? 'yes' : 'no' }, isReady ? 'Ready' : ready?.status === 'False' ? 'NotReady' : 'Unknown'),
      h('td', {}, lease?.spec?.renewTime ? age(lease.spec.renewTime) : '–'),
      h('td', {}, `${count}/${capacity}`),
      h('td', {}, taints || h('span', { class: 'muted' }, 'none')));
  });
  if (nodes.length > rows.length) rows.push(emptyRow(5, `and ${(nodes.length - rows.length).toLocaleString('en')} more nodes`));
  fill(document.querySelector('#nodes tbody'), rows.length ? rows : emptyRow(5, 'No nodes have joined.'));
}

function renderNamespaces(inf) {
  fill(document.getElementById('namespaces'),
    inf.namespaces.list().sort(byName).map((n) => h('li', {}, n.metadata.name, n.status?.phase === 'Terminating' ? ' (terminating)' : '')));
}

function emptyRow(span, text) {
  return h('tr', {}, h('td', { colspan: span, class: 'empty' }, text));
}

// ---- Pods ------------------------------------------------------------------------------------

function ownerOf(pod, replicasets) {
  const ref = (pod.metadata.ownerReferences || []).find((r) => r.controller) || pod.metadata.ownerReferences?.[0];
  if (!ref) return 'No owner';
  if (ref.kind === 'ReplicaSet') {
    const rs = replicasets.get(`${pod.metadata.namespace}/${ref.name}`);
    const dep = (rs?.metadata?.ownerReferences || []).find((r) => r.kind === 'Deployment');
    if (dep) return `Deployment ${pod.metadata.namespace}/${dep.name}`;
  }
  return `${ref.kind} ${pod.metadata.namespace}/${ref.name}`;
}

function renderPods(inf) {
  const box = document.getElementById('pods');
  const groups = new Map();
  for (const p of inf.pods.items.values()) {
    const owner = ownerOf(p, inf.replicasets.items);
    if (!groups.has(owner)) groups.set(owner, []);
    groups.get(owner).push(p);
  }
  const sorted = [...groups.entries()].sort(([a], [b]) => a.localeCompare(b));
  const sections = sorted.slice(0, GROUPS_SHOWN).map(([owner, pods]) => {
    pods.sort((a, b) => (a.spec?.nodeName || '').localeCompare(b.spec?.nodeName || '') || byName(a, b));
    const shown = pods.slice(0, PODS_SHOWN_PER_GROUP);
    return h('section', { class: 'group' },
      h('h3', {}, owner, ' ', h('span', { class: 'muted' }, `${pods.length} pod${pods.length === 1 ? '' : 's'}`)),
      h('div', { class: 'scroll' }, h('table', {},
        h('thead', {}, h('tr', {}, ['Name', 'Node', 'Phase', 'Ready', 'Restarts', 'Age', ''].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, shown.map(podRow)))),
      more(pods.length - shown.length, 'pods'));
  });
  const hidden = more(sorted.length - sections.length, 'owners');
  if (hidden) sections.push(hidden);
  if (!sections.length) fill(box, h('p', { class: 'empty' }, inf.pods.synced ? 'No pods.' : 'Loading…'));
  else fill(box, sections);
}

function podRow(p) {
  const ns = p.metadata.namespace;
  const name = p.metadata.name;
  const statuses = p.status?.containerStatuses || [];
  const ready = statuses.filter((s) => s.ready).length;
  const restarts = statuses.reduce((n, s) => n + (s.restartCount || 0), 0);
  const phase = p.status?.phase || 'Pending';
  const deleting = !!p.metadata.deletionTimestamp;
  const waiting = statuses.map((s) => s.state?.waiting?.reason).find(Boolean);
  return h('tr', { 'data-pod': `${ns}/${name}`, 'data-phase': phase, 'data-uid': p.metadata.uid },
    h('td', {}, name),
    h('td', {}, p.spec?.nodeName || h('span', { class: 'muted' }, 'unscheduled')),
    h('td', {}, deleting ? h('span', { class: 'terminating' }, 'Terminating') : h('span', { class: `phase ${phase}` }, waiting || phase)),
    h('td', {}, `${ready}/${(p.spec?.containers || []).length}`),
    h('td', {}, restarts),
    h('td', {}, age(p.metadata.creationTimestamp)),
    h('td', {}, h('button', {
      class: 'danger', type: 'button', 'aria-label': `Delete pod ${name}`, disabled: deleting,
      onclick: () => act(document.getElementById('pods-error'), () => call('DELETE', `/api/v1/namespaces/${ns}/pods/${name}`)),
    }, 'Delete')));
}

// ---- Services and Events ---------------------------------------------------------------------

function renderServices(inf) {
  const services = inf.services.list().sort(byName);
  const rows = services.slice(0, SERVICES_SHOWN).map((s) => {
    const ep = inf.endpoints.items.get(Informer.key(s));
    const addresses = (ep?.subsets || []).flatMap((sub) =>
      (sub.addresses || []).flatMap((a) => (sub.ports || [{}]).map((port) => `${a.ip}${port.port ? `:${port.port}` : ''}`)));
    const ports = (s.spec?.ports || []).map((p) => `${p.port}${p.nodePort ? `:${p.nodePort}` : ''}/${p.protocol || 'TCP'}`).join(', ');
    return h('tr', { 'data-service': Informer.key(s) },
      h('td', {}, s.metadata.name, ' ', h('span', { class: 'muted' }, s.metadata.namespace)),
      h('td', {}, s.spec?.type || 'ClusterIP'),
      h('td', {}, s.spec?.clusterIP || '–'),
      h('td', {}, ports),
      h('td', {}, addresses.length ? addresses.join(', ') : h('span', { class: 'muted' }, 'none ready')));
  });
  if (services.length > rows.length) rows.push(emptyRow(5, `and ${(services.length - rows.length).toLocaleString('en')} more Services`));
  fill(document.querySelector('#services tbody'), rows.length ? rows : emptyRow(5, 'No Services.'));
}

function eventTime(e) {
  return e.lastTimestamp || e.eventTime || e.series?.lastObservedTime || e.firstTimestamp || e.metadata.creationTimestamp || '';
}

function renderEvents(inf) {
  const events = inf.events.list().sort((a, b) => eventTime(b).localeCompare(eventTime(a))).slice(0, EVENTS_SHOWN);
  const items = events.map((e) => {
    const o = e.involvedObject || e.regarding || {};
    return h('li', { 'data-reason': e.reason, 'data-object': `${o.kind}/${o.name}` },
      h('span', { class: 'muted' }, age(eventTime(e)), ' '),
      h('span', { class: e.type === 'Warning' ? 'Warning' : 'reason' }, e.reason), ' ',
      h('span', {}, `${o.kind || ''} ${o.name || ''}: `), e.message || e.note || '',
      (e.count || 1) > 1 ? h('span', { class: 'muted' }, ` ×${e.count}`) : null);
  });
  fill(document.getElementById('events'), items.length ? items : h('li', { class: 'empty' }, 'No Events.'));
}
