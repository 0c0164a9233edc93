// The cluster view: nodes, namespaces, Deployments as pictures of their replicas, pods by owner
// and node, Services with their endpoints, and the Events feed, all kept live by informers.

import { Informer, call } from './api.js';
import { h, fill, age, throttled, order, keyed, firstK, compare, editable, TopK } from './dom.js';

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
// A Deployment of more replicas than this is drawn as one bar of proportions, not a box each.
const BOXES_SHOWN = 60;

const visible = () => document.body.dataset.view === 'cluster';

export function startCluster() {
  // At most every 50 ms: a change reaches the screen well within the 100 ms a person calls live.
  const draw = throttled(() => visible() && render(inf), 50);
  const compact = { pods: compactPod };
  const inf = Object.fromEntries(Object.entries(PATHS).map(([k, p]) => [k, new Informer(p, draw, compact[k])]));
  inf.pods.observe((key, old, p) => {
    podIndex.apply(inf.pods, key, old, p);
    window.dashboardPerf?.note(key, p, inf.pods.at);
  });
  inf.events.observe((key, old, e) => {
    if (key === null) newestEvents.invalidate();
    else newestEvents.update(old, e, inf.events.items.size);
  });
  for (const informer of Object.values(inf)) informer.start();
  setInterval(draw, 5000); // ages move on even when nothing changes
  window.addEventListener('hashchange', draw);
}

/** "and 9,950 more" under a capped list. */
function more(hidden, what) {
  return hidden > 0 ? h('p', { class: 'muted more' }, `and ${hidden.toLocaleString('en')} more ${what}`) : null;
}

let shownLive = false;

function render(inf) {
  window.dashboardPerf?.render('cluster');
  renderDeployments(inf);
  renderNodes(inf);
  renderNamespaces(inf);
  renderPods(inf);
  renderServices(inf);
  renderEvents(inf);
  if (!shownLive && Object.values(inf).every((i) => i.synced || i.forbidden)) {
    shownLive = true;
    performance.mark('shepherd-live'); // every kind listed and drawn: what a benchmark times
    document.body.dataset.live = 'true';
  }
}

const byName = (a, b) => compare(Informer.key(a), Informer.key(b));
const live = (p) => p.phase !== 'Succeeded' && p.phase !== 'Failed';

/** The server's 403 for a kind this user may not list, shown in place of the list. */
function forbiddenText(informer) {
  return informer.forbidden || null;
}

// ---- Deployments -------------------------------------------------------------------------

const cards = new Map(); // key -> {card, parts}

function renderDeployments(inf) {
  const box = document.getElementById('deployments');
  const denied = forbiddenText(inf.deployments);
  if (denied) {
    for (const c of cards.values()) c.card.remove();
    cards.clear();
    fill(box, h('p', { class: 'forbidden' }, denied));
    return;
  }
  const all = inf.deployments.items;
  const deployments = firstK(all.values(), DEPLOYMENTS_SHOWN, byName);
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
  const tail = [];
  if (!deployments.length) tail.push(h('p', { class: 'empty' }, inf.deployments.synced ? 'No Deployments yet.' : 'Loading…'));
  const hidden = more(all.size - deployments.length, 'Deployments');
  if (hidden) tail.push(hidden);
  const els = [...shown, ...tail];
  order(box, els);
  while (box.childNodes.length > els.length) box.lastChild.remove();
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
  const scale = editable(scaleInput, () => { parts.scaleError.textContent = ''; });
  scaleForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    const ok = await act(parts.scaleError, () => call('PATCH', `/apis/apps/v1/namespaces/${ns}/deployments/${name}/scale`,
      { spec: { replicas: asNumber(scaleInput.value) } }, 'application/merge-patch+json'));
    if (ok) scale.accepted();
  });
  const card = h('article', { class: 'card', 'data-deployment': `${ns}/${name}` },
    h('h3', {}, name, ' ', h('span', { class: 'muted' }, ns)),
    parts.summary, parts.replicas, legend(), scaleForm, parts.images);
  return { card, parts, scale, imageForms: new Map(), ns, name, id, drawn: '' };
}

/** What the user typed, as JSON would carry it: a number when it is one, the text otherwise (for the server to judge). */
function asNumber(text) {
  const t = text.trim();
  return /^-?\d+$/.test(t) ? Number(t) : t;
}

/** Runs the call `f`; its error goes beside the field. True when the server accepted it. */
async function act(errorEl, f) {
  errorEl.textContent = '';
  try {
    await f();
    return true;
  } catch (e) {
    errorEl.textContent = e.body?.message || e.message;
    return false;
  }
}

function legend() {
  const item = (cls, text) => h('span', {}, h('span', { class: `replica ${cls}` }), text);
  return h('div', { class: 'legend', 'aria-hidden': 'true' },
    item('available', 'available'), item('ready', 'ready'), item('updated', 'updated'), item('old', 'old'), item('missing', 'missing'));
}

/**
 * How many replicas are in each state, as the boxes show them: available, then ready, updated,
 * old (current but not updated) and missing (wanted, not there yet).
 */
function replicaCounts(desired, current, updated, ready, available) {
  const order = [['available', available], ['ready', ready], ['updated', updated], ['old', current], ['missing', Math.max(desired, current)]];
  let below = 0;
  return order.map(([cls, upTo]) => {
    const n = Math.max(0, upTo - below);
    below = Math.max(below, upTo);
    return [cls, n];
  });
}

function updateCard(c, d) {
  const s = d.status || {};
  const desired = d.spec?.replicas ?? 1;
  const current = s.replicas || 0;
  const updated = s.updatedReplicas || 0;
  const ready = s.readyReplicas || 0;
  const available = s.availableReplicas || 0;
  const text = `${ready}/${desired} ready · ${updated} updated · ${available} available`;
  if (c.drawn !== text + current) {
    c.drawn = text + current;
    c.parts.summary.textContent = text;
    c.card.dataset.ready = ready;
    c.card.dataset.desired = desired;
    c.parts.replicas.setAttribute('aria-label', text);
    const counts = replicaCounts(desired, current, updated, ready, available);
    const total = Math.max(desired, current);
    if (total <= BOXES_SHOWN) {
      c.parts.replicas.className = 'replicas';
      fill(c.parts.replicas, counts.flatMap(([cls, n]) => Array.from({ length: n }, () => h('span', { class: `replica ${cls}` }))));
    } else {
      c.parts.replicas.className = 'bar';
      // Widths through the CSSOM: the page's Content-Security-Policy refuses style attributes.
      fill(c.parts.replicas, counts.filter(([, n]) => n > 0).map(([cls, n]) => {
        const part = h('span', { class: cls, 'data-count': n });
        part.style.width = `${(100 * n) / total}%`;
        return part;
      }));
    }
  }
  c.scale.show(desired);
  for (const container of d.spec?.template?.spec?.containers || []) {
    let f = c.imageForms.get(container.name);
    if (!f) {
      f = imageForm(c, container.name);
      c.imageForms.set(container.name, f);
      c.parts.images.append(f.form);
    }
    f.field.show(container.image || '');
  }
}

function imageForm(c, container) {
  const id = `image-${c.id}-${container}`.replace(/[^a-zA-Z0-9-]/g, '-');
  const error = h('p', { class: 'field-error', id: `${id}-error`, role: 'alert' });
  const input = h('input', { id, name: 'image', 'aria-describedby': `${id}-error`, 'data-container': container, spellcheck: 'false' });
  const form = h('form', { class: 'action', 'data-action': 'image' },
    h('label', { for: id }, `Image (${container})`),
    input, h('button', { type: 'submit' }, 'Set image'), error);
  const field = editable(input, () => { error.textContent = ''; });
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const patch = { spec: { template: { spec: { containers: [{ name: container, image: input.value }] } } } };
    const ok = await act(error, () => call('PATCH', `/apis/apps/v1/namespaces/${c.ns}/deployments/${c.name}`, patch,
      'application/strategic-merge-patch+json'));
    if (ok) field.accepted();
  });
  return { form, field, error };
}

// ---- Nodes and namespaces -------------------------------------------------------------------

const nodeRows = new Map();

function renderNodes(inf) {
  const tbody = document.querySelector('#nodes tbody');
  const denied = forbiddenText(inf.nodes);
  if (denied) {
    keyed(tbody, nodeRows, [], [emptyRow(5, denied, 'forbidden')]);
    return;
  }
  const { perNode } = podIndex;
  const leases = inf.leases.items;
  const nodes = firstK(inf.nodes.items.values(), NODES_SHOWN, byName);
  const items = nodes.map((n) => {
    const ready = (n.status?.conditions || []).find((c) => c.type === 'Ready');
    const isReady = ready?.status === 'True';
    const lease = leases.get(`kube-node-lease/${n.metadata.name}`);
    const count = perNode.get(n.metadata.name) || 0;
    const capacity = n.status?.allocatable?.pods || n.status?.capacity?.pods || '?';
    const taints = (n.spec?.taints || []).map((t) => `${t.key}${t.value ? `=${t.value}` : ''}:${t.effect}`).join(', ');
    const state = isReady ? 'Ready' : ready?.status === 'False' ? 'NotReady' : 'Unknown';
    const leaseAge = lease?.spec?.renewTime ? age(lease.spec.renewTime) : '–';
    return {
      key: n.metadata.name,
      sig: [state, leaseAge, count, capacity, taints].join('|'),
      make: () => h('tr', { 'data-node': n.metadata.name },
        h('td', {}, n.metadata.name),
        h('td', { class: isReady ? 'yes' : 'no' }, state),
        h('td', {}, leaseAge),
        h('td', {}, `${count}/${capacity}`),
        h('td', {}, taints || h('span', { class: 'muted' }, 'none'))),
    };
  });
  const tail = [];
  if (inf.nodes.items.size > items.length) tail.push(emptyRow(5, `and ${(inf.nodes.items.size - items.length).toLocaleString('en')} more nodes`));
  if (!items.length) tail.push(emptyRow(5, inf.nodes.synced ? 'No nodes have joined.' : 'Loading…'));
  keyed(tbody, nodeRows, items, tail);
}

let namespacesShown = null;

function renderNamespaces(inf) {
  const denied = forbiddenText(inf.namespaces);
  const names = denied ? [] : inf.namespaces.list().sort(byName).map((n) => n.metadata.name + (n.status?.phase === 'Terminating' ? ' (terminating)' : ''));
  const sig = denied || names.join('\n');
  if (sig === namespacesShown) return;
  namespacesShown = sig;
  fill(document.getElementById('namespaces'), denied ? h('li', { class: 'forbidden' }, denied) : names.map((n) => h('li', {}, n)));
}

function emptyRow(span, text, cls = 'empty') {
  return h('tr', {}, h('td', { colspan: span, class: cls }, text));
}

// ---- Pods ------------------------------------------------------------------------------------

/**
 * What the page keeps of a pod: the fields its row and its group show. A pod as the API serves
 * it is a few kilobytes; 10,000 of them kept whole make a heap the collector stops the page to
 * walk.
 */
function compactPod(p) {
  const m = p.metadata || {};
  const ref = (m.ownerReferences || []).find((r) => r.controller) || m.ownerReferences?.[0];
  const statuses = p.status?.containerStatuses || [];
  return {
    metadata: { namespace: m.namespace, name: m.name },
    key: m.namespace ? `${m.namespace}/${m.name}` : m.name,
    uid: m.uid,
    created: m.creationTimestamp,
    deleting: !!m.deletionTimestamp,
    owner: ref ? { kind: ref.kind, name: ref.name } : null,
    node: p.spec?.nodeName || '',
    containers: (p.spec?.containers || []).length,
    phase: p.status?.phase || 'Pending',
    ready: statuses.filter((s) => s.ready).length,
    restarts: statuses.reduce((n, s) => n + (s.restartCount || 0), 0),
    waiting: statuses.map((s) => s.state?.waiting?.reason).find(Boolean) || '',
  };
}

const byNodeThenName = (a, b) => compare(a.node, b.node) || compare(a.key, b.key);

/** A pod's direct owner, as its group is named before ReplicaSets are followed to their Deployment. */
const ownerRef = (p) => (p.owner ? `${p.owner.kind} ${p.metadata.namespace}/${p.owner.name}` : 'No owner');

/**
 * The pods by direct owner (each with its first rows kept in order) and the live pods per node,
 * kept as pods change: a redraw reads them at the cost of what it shows, where going over 10,000
 * pods at each redraw held the page tens of milliseconds.
 */
const podIndex = {
  perNode: new Map(),
  owners: new Map(), // direct owner -> {pods: Map key -> pod, top: TopK}

  apply(informer, key, old, p) {
    if (key === null) {
      this.perNode = new Map();
      this.owners = new Map();
      for (const [k, pod] of informer.items) this.apply(informer, k, undefined, pod);
      return;
    }
    if (old && live(old) && old.node) {
      const n = this.perNode.get(old.node) - 1;
      if (n > 0) this.perNode.set(old.node, n);
      else this.perNode.delete(old.node);
    }
    if (p && live(p) && p.node) this.perNode.set(p.node, (this.perNode.get(p.node) || 0) + 1);
    const was = old && ownerRef(old);
    const is = p && ownerRef(p);
    if (was && was !== is) {
      const o = this.owners.get(was);
      if (o) {
        o.pods.delete(key);
        o.top.update(old, undefined, o.pods.size);
        if (!o.pods.size) this.owners.delete(was);
      }
    }
    if (is) {
      let o = this.owners.get(is);
      if (!o) {
        o = { pods: new Map(), top: new TopK(PODS_SHOWN_PER_GROUP, byNodeThenName) };
        this.owners.set(is, o);
      }
      o.pods.set(key, p);
      o.top.update(was === is ? old : undefined, p, o.pods.size);
    }
  },
};

/** The group a direct owner's pods are shown in: a ReplicaSet's pods under its Deployment. */
function groupOf(ref, replicasets) {
  const [kind, id] = ref.split(' ');
  if (kind !== 'ReplicaSet') return ref;
  const dep = (replicasets.items.get(id)?.metadata?.ownerReferences || []).find((r) => r.kind === 'Deployment');
  return dep ? `Deployment ${id.split('/')[0]}/${dep.name}` : ref;
}

const groupSections = new Map(); // owner -> {section, count, tbody, more}
const podRows = new Map(); // namespace/name -> {tr, cells, button, error, sig}

function renderPods(inf) {
  const box = document.getElementById('pods');
  const denied = forbiddenText(inf.pods);
  document.getElementById('pods-error').textContent = denied || '';
  const groups = new Map(); // group -> direct owners
  for (const ref of podIndex.owners.keys()) {
    const group = groupOf(ref, inf.replicasets);
    const refs = groups.get(group);
    if (refs) refs.push(ref);
    else groups.set(group, [ref]);
  }
  const shownOwners = firstK(groups.keys(), GROUPS_SHOWN, compare);
  const shownPods = new Set();
  const sections = shownOwners.map((owner) => {
    const refs = groups.get(owner).map((ref) => podIndex.owners.get(ref));
    const count = refs.reduce((n, o) => n + o.pods.size, 0);
    const firsts = refs.flatMap((o) => o.top.get(() => o.pods.values()));
    const shown = refs.length === 1 ? firsts : firstK(firsts, PODS_SHOWN_PER_GROUP, byNodeThenName);
    let g = groupSections.get(owner);
    if (!g) {
      g = { count: h('span', { class: 'muted' }), tbody: h('tbody'), more: h('p', { class: 'muted more' }) };
      g.section = h('section', { class: 'group', 'data-owner': owner },
        h('h3', {}, owner, ' ', g.count),
        h('div', { class: 'scroll' }, h('table', {},
          h('thead', {}, h('tr', {}, ['Name', 'Node', 'Phase', 'Ready', 'Restarts', 'Age', ''].map((t) => h('th', { scope: 'col' }, t)))),
          g.tbody)),
        g.more);
      groupSections.set(owner, g);
    }
    g.count.textContent = `${count.toLocaleString('en')} pod${count === 1 ? '' : 's'}`;
    const rows = shown.map((p) => {
      shownPods.add(p.key);
      return podRow(p.key, p);
    });
    order(g.tbody, rows);
    while (g.tbody.childNodes.length > rows.length) g.tbody.lastChild.remove();
    const hidden = count - shown.length;
    g.more.hidden = hidden <= 0;
    g.more.textContent = hidden > 0 ? `and ${hidden.toLocaleString('en')} more pods` : '';
    return g.section;
  });
  for (const [owner, g] of groupSections) {
    if (!shownOwners.includes(owner)) {
      g.section.remove();
      groupSections.delete(owner);
    }
  }
  for (const [key, r] of podRows) {
    if (!shownPods.has(key)) {
      r.tr.remove();
      podRows.delete(key);
    }
  }
  const tail = [];
  const hidden = more(groups.size - sections.length, 'owners');
  if (hidden) tail.push(hidden);
  if (!sections.length && !denied) tail.push(h('p', { class: 'empty' }, inf.pods.synced ? 'No pods.' : 'Loading…'));
  const els = [...sections, ...tail];
  order(box, els);
  while (box.childNodes.length > els.length) box.lastChild.remove();
}

/**
 * A pod's row, kept from one redraw to the next and changed in place: a keyboard user's focus on
 * its Delete button, and the server's answer beside it, stay while the cluster moves.
 */
function podRow(key, p) {
  const ns = p.metadata.namespace;
  const name = p.metadata.name;
  const { ready, restarts, phase, deleting, waiting, node } = p;
  const created = age(p.created);
  const sig = [p.uid, node, phase, deleting, waiting, ready, p.containers, restarts, created].join('|');
  let r = podRows.get(key);
  if (!r) {
    const id = `pod-error-${key}`.replace(/[^a-zA-Z0-9-]/g, '-');
    const error = h('p', { class: 'field-error', id, role: 'alert' });
    const button = h('button', { class: 'danger', type: 'button', 'aria-label': `Delete pod ${name}`, 'aria-describedby': id }, 'Delete');
    button.addEventListener('click', () => act(error, () => call('DELETE', `/api/v1/namespaces/${ns}/pods/${name}`)));
    const cells = Array.from({ length: 6 }, () => h('td'));
    const tr = h('tr', { 'data-pod': key }, cells, h('td', { class: 'row-action' }, button, error));
    cells[0].textContent = name;
    r = { tr, cells, button, error, sig: '' };
    podRows.set(key, r);
  }
  if (r.sig !== sig) {
    r.sig = sig;
    const { tr, cells } = r;
    tr.dataset.phase = phase;
    tr.dataset.uid = p.uid;
    fill(cells[1], node || h('span', { class: 'muted' }, 'unscheduled'));
    fill(cells[2], deleting ? h('span', { class: 'terminating' }, 'Terminating') : h('span', { class: `phase ${phase}` }, waiting || phase));
    cells[3].textContent = `${ready}/${p.containers}`;
    cells[4].textContent = restarts;
    cells[5].textContent = created;
    r.button.disabled = deleting;
  }
  return r.tr;
}

// ---- Services and Events ---------------------------------------------------------------------

const serviceRows = new Map();

function renderServices(inf) {
  const tbody = document.querySelector('#services tbody');
  const denied = forbiddenText(inf.services);
  if (denied) {
    keyed(tbody, serviceRows, [], [emptyRow(5, denied, 'forbidden')]);
    return;
  }
  const services = firstK(inf.services.items.values(), SERVICES_SHOWN, byName);
  const items = services.map((s) => {
    const ep = inf.endpoints.items.get(Informer.key(s));
    const addresses = (ep?.subsets || []).flatMap((sub) =>
      (sub.addresses || []).flatMap((a) => (sub.ports || [{}]).map((port) => `${a.ip}${port.port ? `:${port.port}` : ''}`)));
    const ports = (s.spec?.ports || []).map((p) => `${p.port}${p.nodePort ? `:${p.nodePort}` : ''}/${p.protocol || 'TCP'}`).join(', ');
    const endpoints = inf.endpoints.forbidden ? inf.endpoints.forbidden : addresses.join(', ');
    return {
      key: Informer.key(s),
      sig: [s.spec?.type, s.spec?.clusterIP, ports, endpoints].join('|'),
      make: () => h('tr', { 'data-service': Informer.key(s) },
        h('td', {}, s.metadata.name, ' ', h('span', { class: 'muted' }, s.metadata.namespace)),
        h('td', {}, s.spec?.type || 'ClusterIP'),
        h('td', {}, s.spec?.clusterIP || '–'),
        h('td', {}, ports),
        h('td', {}, endpoints || h('span', { class: 'muted' }, 'none ready'))),
    };
  });
  const tail = [];
  const size = inf.services.items.size;
  if (size > items.length) tail.push(emptyRow(5, `and ${(size - items.length).toLocaleString('en')} more Services`));
  if (!items.length) tail.push(emptyRow(5, inf.services.synced ? 'No Services.' : 'Loading…'));
  keyed(tbody, serviceRows, items, tail);
}

function eventTime(e) {
  return e.lastTimestamp || e.eventTime || e.series?.lastObservedTime || e.firstTimestamp || e.metadata.creationTimestamp || '';
}

const eventItems = new Map();
// The newest Events, found again only when an Event changed: a cluster of 10,000 pods keeps tens
// of thousands of them, and most redraws come from pods.
const newestEvents = new TopK(EVENTS_SHOWN, (a, b) => compare(eventTime(b), eventTime(a)) || byName(a, b));

function renderEvents(inf) {
  const feed = document.getElementById('events');
  const denied = forbiddenText(inf.events);
  if (denied) {
    keyed(feed, eventItems, [], [h('li', { class: 'forbidden' }, denied)]);
    return;
  }
  const events = newestEvents.get(() => inf.events.items.values());
  const items = events.map((e) => {
    const o = e.involvedObject || e.regarding || {};
    const when = age(eventTime(e));
    return {
      key: Informer.key(e),
      sig: [e.metadata.resourceVersion, when].join('|'),
      make: () => h('li', { 'data-reason': e.reason, 'data-object': `${o.kind}/${o.name}` },
        h('span', { class: 'muted' }, when, ' '),
        h('span', { class: e.type === 'Warning' ? 'Warning' : 'reason' }, e.reason), ' ',
        h('span', {}, `${o.kind || ''} ${o.name || ''}: `), e.message || e.note || '',
        (e.count || 1) > 1 ? h('span', { class: 'muted' }, ` ×${e.count}`) : null),
    };
  });
  keyed(feed, eventItems, items, items.length ? [] : [h('li', { class: 'empty' }, inf.events.synced ? 'No Events.' : 'Loading…')]);
}
