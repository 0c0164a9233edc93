//! NodePort allocation: Services of type NodePort (and LoadBalancer) get a `nodePort` per port
//! from `--service-node-port-range`, unique across the cluster; and a Service's cluster IP is
//! checked to be its own.
//!
//! The stored Services are the record of what is allocated, so an allocation survives a restart
//! with nothing else to keep in step; Service writes hold one lock from reading the ports in use
//! until their store write is done, so two Services of one API server never get the same port.
//! Against other API servers on the same store, every newly taken port or address is first
//! reserved in the store (see `reservation`).

use std::collections::{BTreeSet, HashMap};

use serde_json::{Value, json};
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_api::{ApiError, Cause};
use shepherd_store::Store;
use tokio::sync::{Mutex, MutexGuard};

use crate::reservation::{self, CLUSTER_IPS, NODE_PORTS, Reserved};

/// A range of node ports, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodePortRange {
    first: u16,
    last: u16,
}

impl Default for NodePortRange {
    /// 30000-32767, as Kubernetes.
    fn default() -> Self {
        NodePortRange { first: 30000, last: 32767 }
    }
}

/// A `--service-node-port-range` value that cannot serve as one.
#[derive(Debug, thiserror::Error)]
#[error("invalid service node port range {0:?}: expected FIRST-LAST (ports 1-65535, FIRST <= LAST), as 30000-32767")]
pub struct InvalidNodePortRange(String);

impl std::str::FromStr for NodePortRange {
    type Err = InvalidNodePortRange;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidNodePortRange(s.to_string());
        let (first, last) = s.split_once('-').ok_or_else(bad)?;
        let (first, last): (u16, u16) = (first.trim().parse().map_err(|_| bad())?, last.trim().parse().map_err(|_| bad())?);
        if first == 0 || first > last {
            return Err(bad());
        }
        Ok(NodePortRange { first, last })
    }
}

impl std::fmt::Display for NodePortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl NodePortRange {
    fn contains(&self, port: i64) -> bool {
        (i64::from(self.first)..=i64::from(self.last)).contains(&port)
    }

    /// A free port, searched from a random point so that a released port is not at once reused.
    fn pick(&self, used: &BTreeSet<i64>) -> Option<i64> {
        let size = i64::from(self.last) - i64::from(self.first) + 1;
        let start = rand::random_range(0..size);
        (0..size).map(|i| i64::from(self.first) + (start + i) % size).find(|p| !used.contains(p))
    }
}

/// Whether a Service of this spec has node ports: NodePort, and LoadBalancer unless
/// `allocateLoadBalancerNodePorts` is false.
fn wants_node_ports(svc: &Value) -> bool {
    match svc.pointer("/spec/type").and_then(Value::as_str) {
        Some("NodePort") => true,
        Some("LoadBalancer") => svc.pointer("/spec/allocateLoadBalancerNodePorts") != Some(&json!(false)),
        _ => false,
    }
}

fn ports(svc: &Value) -> &[Value] {
    svc.pointer("/spec/ports").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn node_port(port: &Value) -> Option<i64> {
    port.get("nodePort").and_then(Value::as_i64).filter(|p| *p != 0)
}

/// The port of `old` that `port` continues: same port number and protocol.
fn same_port<'a>(old: &'a [Value], port: &Value) -> Option<&'a Value> {
    let proto = |p: &Value| p.get("protocol").and_then(Value::as_str).unwrap_or("TCP").to_string();
    old.iter().find(|o| o.get("port") == port.get("port") && proto(o) == proto(port))
}

/// What `assign` took for a Service write: the allocation lock, held until the write is stored,
/// and the reservations that the write confirms.
#[derive(Default)]
pub(crate) struct Assigned<'a> {
    _guard: Option<MutexGuard<'a, ()>>,
    reserved: Vec<Reserved>,
}

impl Assigned<'_> {
    /// The Service was stored: its reservations are held.
    pub(crate) async fn written(self, store: &dyn Store) {
        for r in &self.reserved {
            r.confirm(store).await;
        }
    }

    /// The Service was not stored: its new reservations go back.
    pub(crate) async fn not_written(self, store: &dyn Store) {
        for r in &self.reserved {
            r.release(store).await;
        }
    }
}

/// The allocator of one API server.
#[derive(Debug, Default)]
pub(crate) struct NodePorts {
    range: NodePortRange,
    /// Held from reading the ports in use until the write that takes one is stored.
    lock: Mutex<()>,
}

/// Attempts at a free port when other API servers keep taking the ones picked.
const PICK_ATTEMPTS: usize = 16;

impl NodePorts {
    pub(crate) fn new(range: NodePortRange) -> Self {
        NodePorts { range, lock: Mutex::new(()) }
    }

    /// Gives `new` (a Service being created, or replacing `old`) its node ports: an old
    /// Service's ports are kept, explicit ones checked against the range and the other
    /// Services, missing ones allocated. A Service that no longer has node ports drops the ones
    /// it had. A cluster IP the Service newly holds must not be another's. With `reserve`
    /// (every write but a dry run) the new ports and address are reserved in the store; the
    /// caller tells the result whether the write was stored.
    pub(crate) async fn assign(
        &self,
        store: &dyn Store,
        res: &ResourceInfo,
        old: Option<&Value>,
        new: &mut Value,
        reserve: bool,
    ) -> Result<Assigned<'_>, ApiError> {
        if res.kind != "Service" || !res.group.is_empty() {
            return Ok(Assigned::default());
        }
        let guard = self.lock.lock().await;
        let name = new.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
        let namespace = new.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default");
        let own_key = res.key(Some(namespace), &name);
        let mut reserved = Vec::new();
        let mut outcome = self.node_ports(store, res, &own_key, &name, old, new, reserve, &mut reserved).await;
        if outcome.is_ok() {
            outcome = own_cluster_ip(store, res, &own_key, &name, old, new, reserve, &mut reserved).await;
        }
        if let Err(e) = outcome {
            for r in &reserved {
                r.release(store).await;
            }
            return Err(e);
        }
        Ok(Assigned { _guard: Some(guard), reserved })
    }

    #[allow(clippy::too_many_arguments)]
    async fn node_ports(
        &self,
        store: &dyn Store,
        res: &ResourceInfo,
        own_key: &str,
        name: &str,
        old: Option<&Value>,
        new: &mut Value,
        reserve: bool,
        reserved: &mut Vec<Reserved>,
    ) -> Result<(), ApiError> {
        let old_ports: Vec<Value> = old.filter(|o| wants_node_ports(o)).map(|o| ports(o).to_vec()).unwrap_or_default();
        if !wants_node_ports(new) {
            // Kubernetes drops the node ports of a Service whose type no longer has them, unless
            // the update sets different ones (which validation then refuses).
            if let Some(list) = new.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
                for port in list {
                    let kept = same_port(&old_ports, port).and_then(node_port);
                    if node_port(port).is_some() && node_port(port) == kept
                        && let Some(p) = port.as_object_mut()
                    {
                        p.remove("nodePort");
                    }
                }
            }
            return Ok(());
        }
        let mut used = BTreeSet::new();
        let listed = store.list(&res.key_prefix(), None, None).await.map_err(|e| ApiError::Internal(e.to_string()))?;
        for kv in listed.items.iter().filter(|kv| kv.key != own_key) {
            let Ok(svc) = crate::codec::decode(kv) else { continue };
            used.extend(ports(&svc).iter().filter_map(node_port));
        }
        let mut causes = Vec::new();
        // Ports this Service takes, by number, with the protocols taking it: TCP and UDP of one
        // Service may share a number.
        let mut own: HashMap<i64, usize> = HashMap::new();
        let Some(list) = new.pointer_mut("/spec/ports").and_then(Value::as_array_mut) else { return Ok(()) };
        for (i, port) in list.iter_mut().enumerate() {
            let field = format!("spec.ports[{i}].nodePort");
            let kept = same_port(&old_ports, port).and_then(node_port);
            let requested = node_port(port).or(kept);
            let chosen = match requested {
                Some(p) if kept == Some(p) || own.contains_key(&p) => p,
                Some(p) if !self.range.contains(p) => {
                    causes.push(Cause::invalid(&field, format!(
                        "Invalid value: {p}: provided port is not in the valid range. The range of valid ports is {}",
                        self.range
                    )));
                    continue;
                }
                Some(p) if used.contains(&p) => {
                    causes.push(Cause::invalid(&field, format!("Invalid value: {p}: provided port is already allocated")));
                    continue;
                }
                Some(p) => {
                    if reserve && !reserve_port(store, own_key, p, reserved).await? {
                        causes.push(Cause::invalid(&field, format!("Invalid value: {p}: provided port is already allocated")));
                        continue;
                    }
                    p
                }
                None => {
                    let mut taken = used.clone();
                    taken.extend(own.keys());
                    let mut chosen = None;
                    for _ in 0..PICK_ATTEMPTS {
                        let Some(p) = self.range.pick(&taken) else { break };
                        if !reserve || reserve_port(store, own_key, p, reserved).await? {
                            chosen = Some(p);
                            break;
                        }
                        // Another API server's Service has it.
                        taken.insert(p);
                    }
                    match chosen {
                        Some(p) => p,
                        None => {
                            causes.push(Cause::invalid(&field, format!(
                                "Invalid value: 0: failed to allocate a nodePort: range {} is full",
                                self.range
                            )));
                            continue;
                        }
                    }
                }
            };
            *own.entry(chosen).or_default() += 1;
            if let Some(p) = port.as_object_mut() {
                p.insert("nodePort".into(), json!(chosen));
            }
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(kinds::SERVICE.kind, name, causes));
        }
        Ok(())
    }
}

/// Reserves node port `port` for the Service at `own_key`; false when another Service has it.
async fn reserve_port(store: &dyn Store, own_key: &str, port: i64, reserved: &mut Vec<Reserved>) -> Result<bool, ApiError> {
    let holds = move |svc: &Value| wants_node_ports(svc) && ports(svc).iter().filter_map(node_port).any(|p| p == port);
    match reservation::reserve(store, NODE_PORTS, &port.to_string(), own_key, &holds).await? {
        Some(r) => {
            reserved.push(r);
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Refuses a cluster IP that `new` newly holds and another Service has (stored, or reserved
/// through another API server), and reserves it otherwise.
#[allow(clippy::too_many_arguments)]
async fn own_cluster_ip(
    store: &dyn Store,
    res: &ResourceInfo,
    own_key: &str,
    name: &str,
    old: Option<&Value>,
    new: &Value,
    reserve: bool,
    reserved: &mut Vec<Reserved>,
) -> Result<(), ApiError> {
    let Some(ip) = reservation::cluster_ip(new) else { return Ok(()) };
    if old.and_then(reservation::cluster_ip) == Some(ip) {
        return Ok(());
    }
    let refuse = || {
        let cause = Cause::invalid(
            "spec.clusterIPs",
            format!("Invalid value: [\"{ip}\"]: failed to allocate IP {ip}: provided IP is already allocated"),
        );
        ApiError::invalid(kinds::SERVICE.kind, name, vec![cause])
    };
    // Services stored before reservations existed hold theirs without one.
    let listed = store.list(&res.key_prefix(), None, None).await.map_err(|e| ApiError::Internal(e.to_string()))?;
    let stored = listed.items.iter().filter(|kv| kv.key != own_key).filter_map(|kv| crate::codec::decode(kv).ok());
    if stored.into_iter().any(|svc| reservation::cluster_ip(&svc) == Some(ip)) {
        return Err(refuse());
    }
    if !reserve {
        return Ok(());
    }
    let owned = ip.to_string();
    let holds = move |svc: &Value| reservation::cluster_ip(svc) == Some(owned.as_str());
    match reservation::reserve(store, CLUSTER_IPS, ip, own_key, &holds).await? {
        Some(r) => {
            reserved.push(r);
            Ok(())
        }
        None => Err(refuse()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_parses_from_first_dash_last_and_refuses_anything_else() {
        assert_eq!("30000-32767".parse::<NodePortRange>().ok(), Some(NodePortRange::default()));
        for bad in ["30000", "0-10", "200-100", "1-70000", "a-b"] {
            assert!(bad.parse::<NodePortRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_full_range_has_nothing_to_pick_and_a_free_port_is_found_wherever_the_search_starts() {
        let r: NodePortRange = "30000-30003".parse().expect("range");
        let used: BTreeSet<i64> = [30000, 30001, 30003].into();
        for _ in 0..20 {
            assert_eq!(r.pick(&used), Some(30002));
        }
        assert_eq!(r.pick(&(30000..=30003).collect()), None);
    }
}
