//! The endpoints controller: for every Service with a selector, an Endpoints object of the same
//! name listing the matching pods' IPs (ready ones in `addresses`, the others in
//! `notReadyAddresses`) with the service's target ports resolved per pod; and the ClusterIP
//! allocator, which gives Services without a `spec.clusterIP` a unique one from a range.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use shepherd_api::{JsonPath, str_at};
use shepherd_api::{LabelSelector, kinds};
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager};

use crate::config::ControllerConfig;


/// The service's selector, or `None` when it has none (its Endpoints are managed by hand).
pub(crate) fn service_selector(svc: &Value) -> Option<LabelSelector> {
    let sel = svc.at("/spec/selector")?.as_object().filter(|m| !m.is_empty())?;
    LabelSelector::from_k8s(&json!({ "matchLabels": sel })).ok()
}

/// The Endpoints controller. Pod changes enqueue the services that select the pod (before and
/// after the change, so a pod that stops matching leaves its old service's endpoints at once).
pub fn endpoints_controller(client: Arc<dyn Client>, manager: &Manager, config: ControllerConfig) -> Controller {
    let informers = manager.informers();
    let services = informers.cache(&kinds::SERVICE);
    let reconciler = Arc::new(EndpointsController {
        client,
        services: services.clone(),
        pods: informers.cache(&kinds::POD),
        endpoints: informers.cache(&kinds::ENDPOINTS),
    });
    Controller::new("endpoints", &kinds::SERVICE, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    .owns(&kinds::ENDPOINTS)
    .watches(&kinds::POD, move |pod| services_selecting(&services, pod))
    .workers(config.workers)
    .mode(config.mode)
}

pub(crate) fn services_selecting(services: &Cache, pod: &Value) -> Vec<String> {
    let ns = str_at(pod, "/metadata/namespace");
    services
        .by_namespace(ns)
        .iter()
        .filter(|svc| service_selector(svc).is_some_and(|s| s.matches_object(pod)))
        .filter_map(|svc| shepherd_runtime::cache::object_key(svc))
        .collect()
}

struct EndpointsController {
    client: Arc<dyn Client>,
    services: Arc<Cache>,
    pods: Arc<Cache>,
    endpoints: Arc<Cache>,
}

/// One endpoint port: (name, port, protocol).
pub(crate) type PortKey = (String, i64, String);

impl EndpointsController {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let (ns, name) = key.split_once('/').ok_or_else(|| format!("service key {key:?} has no namespace"))?;
        let existing = self.endpoints.get(key);
        let Some(svc) = self.services.get(key) else {
            // The service is gone: its endpoints go with it (the garbage collector would too,
            // through the owner reference; doing it here makes it immediate).
            if existing.is_some() {
                match self.client.delete(&kinds::ENDPOINTS, Some(ns), name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(e) if e.is_not_found() => {}
                    Err(e) => return Err(e.into()),
                }
            }
            return Ok(Action::Done);
        };
        let Some(selector) = service_selector(&svc) else { return Ok(Action::Done) };
        let pods: Vec<Arc<Value>> = self.pods.by_namespace_where(ns, |p| p.matches(&selector));
        let subsets = desired_subsets(&svc, &pods);
        let owner = json!([{"apiVersion": "v1", "kind": "Service", "name": name, "uid": svc.at("/metadata/uid"),
            "controller": true, "blockOwnerDeletion": true}]);
        let labels = svc.at("/metadata/labels").cloned().unwrap_or(json!({}));

        match existing {
            None => {
                let obj = json!({"apiVersion": "v1", "kind": "Endpoints",
                    "metadata": {"name": name, "namespace": ns, "labels": labels, "ownerReferences": owner},
                    "subsets": subsets});
                // AlreadyExists (created meanwhile, not yet cached) retries with backoff.
                self.client.create(&kinds::ENDPOINTS, Some(ns), obj).await?;
                Ok(Action::Done)
            }
            Some(current) => {
                let have_subsets = current.get("subsets").filter(|s| !s.is_null()).cloned().unwrap_or(json!([]));
                let have_labels = current.at("/metadata/labels").cloned().unwrap_or(json!({}));
                let have_owner = current.at("/metadata/ownerReferences").cloned().unwrap_or(json!([]));
                if have_subsets == subsets && have_labels == labels && have_owner == owner {
                    return Ok(Action::Done);
                }
                let mut obj = (*current).clone();
                obj["subsets"] = subsets;
                obj["metadata"]["labels"] = labels;
                obj["metadata"]["ownerReferences"] = owner;
                match self.client.update(&kinds::ENDPOINTS, Some(ns), obj).await {
                    Ok(_) => Ok(Action::Done),
                    Err(e) if e.is_not_found() => Err(format!("endpoints {key} vanished during update; retrying").into()),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

pub(crate) fn is_ready(pod: &Value) -> bool {
    pod.at("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c.get("type").and_then(Value::as_str) == Some("Ready") && str_at(c, "/status") == "True"))
}

/// The port a service port reaches on this pod: a number as is, a name through the pod's
/// container ports (same protocol); `None` when the pod has no port by that name.
pub(crate) fn resolve_target(service_port: &Value, protocol: &str, pod: &Value) -> Option<i64> {
    match service_port.get("targetPort") {
        None | Some(Value::Null) => service_port.get("port").and_then(Value::as_i64),
        Some(Value::Number(n)) => n.as_i64(),
        Some(Value::String(s)) => {
            if let Ok(n) = s.parse::<i64>() {
                return Some(n);
            }
            pod.at("/spec/containers")?.as_array()?.iter().find_map(|c| {
                c.get("ports")?.as_array()?.iter().find_map(|p| {
                    let proto = p.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
                    (p.get("name").and_then(Value::as_str) == Some(s.as_str()) && proto == protocol)
                        .then(|| p.get("containerPort").and_then(Value::as_i64))
                        .flatten()
                })
            })
        }
        Some(_) => None,
    }
}

/// The service's ports as they resolve on this pod; `None` when the service has ports and none
/// of them resolves (the pod cannot serve it).
pub(crate) fn pod_ports(service_ports: &[&Value], pod: &Value) -> Option<Vec<PortKey>> {
    let ports: Vec<PortKey> = service_ports
        .iter()
        .filter_map(|sp| {
            let protocol = sp.get("protocol").and_then(Value::as_str).unwrap_or("TCP");
            let port = resolve_target(sp, protocol, pod)?;
            Some((str_at(sp, "/name").to_string(), port, protocol.to_string()))
        })
        .collect();
    (!ports.is_empty() || service_ports.is_empty()).then_some(ports)
}

/// Subsets as Kubernetes groups them: pods that resolve the service's ports to the same set
/// share a subset. Addresses are sorted by IP so the result is stable.
fn desired_subsets(svc: &Value, pods: &[Arc<Value>]) -> Value {
    let ns = str_at(svc, "/metadata/namespace");
    let publish_not_ready = svc.at("/spec/publishNotReadyAddresses").and_then(Value::as_bool).unwrap_or(false);
    let service_ports: Vec<&Value> = svc.at("/spec/ports").and_then(Value::as_array).map(|p| p.iter().collect()).unwrap_or_default();
    let mut groups: BTreeMap<Vec<PortKey>, (Vec<Value>, Vec<Value>)> = BTreeMap::new();
    for pod in pods {
        let ip = str_at(pod, "/status/podIP");
        if ip.is_empty()
            || pod.at("/metadata/deletionTimestamp").is_some()
            || matches!(str_at(pod, "/status/phase"), "Succeeded" | "Failed")
        {
            continue;
        }
        let Some(ports) = pod_ports(&service_ports, pod) else { continue };
        let mut address = json!({"ip": ip, "targetRef": {"kind": "Pod", "namespace": ns,
            "name": pod.at("/metadata/name"), "uid": pod.at("/metadata/uid")}});
        let node = str_at(pod, "/spec/nodeName");
        if !node.is_empty() {
            address["nodeName"] = json!(node);
        }
        let (ready, not_ready) = groups.entry(ports).or_default();
        if publish_not_ready || is_ready(pod) { ready.push(address) } else { not_ready.push(address) }
    }
    let by_ip = |a: &Value, b: &Value| {
        let ip = |v: &Value| str_at(v, "/ip").parse::<Ipv4Addr>().ok();
        ip(a).cmp(&ip(b)).then_with(|| str_at(a, "/ip").cmp(str_at(b, "/ip"))).then_with(|| str_at(a, "/targetRef/name").cmp(str_at(b, "/targetRef/name")))
    };
    let subsets: Vec<Value> = groups
        .into_iter()
        .map(|(ports, (mut ready, mut not_ready))| {
            ready.sort_by(by_ip);
            not_ready.sort_by(by_ip);
            let mut subset = Map::new();
            if !ready.is_empty() {
                subset.insert("addresses".into(), Value::Array(ready));
            }
            if !not_ready.is_empty() {
                subset.insert("notReadyAddresses".into(), Value::Array(not_ready));
            }
            if !ports.is_empty() {
                let ports = ports
                    .into_iter()
                    .map(|(name, port, protocol)| {
                        let mut p = json!({"port": port, "protocol": protocol});
                        if !name.is_empty() {
                            p["name"] = json!(name);
                        }
                        p
                    })
                    .collect();
                subset.insert("ports".into(), Value::Array(ports));
            }
            Value::Object(subset)
        })
        .collect();
    Value::Array(subsets)
}

/// A `--service-cluster-ip-range` value that cannot serve as one.
#[derive(Debug, thiserror::Error)]
#[error("invalid service cluster IP range {range:?}: {why}")]
pub struct InvalidRange {
    range: String,
    why: &'static str,
}

/// An IPv4 CIDR block; allocation skips its network address, the address after it (reserved,
/// by Kubernetes convention, for the `kubernetes` service) and its broadcast address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceIpRange {
    base: u32,
    size: u32,
}

impl std::str::FromStr for ServiceIpRange {
    type Err = InvalidRange;

    fn from_str(s: &str) -> Result<Self, InvalidRange> {
        let bad = |why| InvalidRange { range: s.to_string(), why };
        let (ip, len) = s.split_once('/').ok_or_else(|| bad("expected an IPv4 CIDR such as 10.96.0.0/16"))?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad("the address is not an IPv4 address"))?;
        let len: u32 = len.parse().map_err(|_| bad("the prefix length is not a number"))?;
        if !(8..=29).contains(&len) {
            return Err(bad("the prefix length must be between 8 and 29"));
        }
        let size = 1u32 << (32 - len);
        Ok(ServiceIpRange { base: u32::from(ip) & !(size - 1), size })
    }
}

impl Default for ServiceIpRange {
    /// 10.96.0.0/16, Kubernetes' default service range.
    fn default() -> Self {
        ServiceIpRange { base: u32::from(Ipv4Addr::new(10, 96, 0, 0)), size: 1 << 16 }
    }
}

impl ServiceIpRange {
    /// The first free address at or after offset `from` (wrapping), skipping `used`.
    fn next_free(&self, from: u32, used: &HashSet<u32>) -> Option<u32> {
        let (first, last) = (2, self.size - 2);
        let count = last - first + 1;
        let start = from.clamp(first, last) - first;
        (0..count).map(|i| self.base + first + (start + i) % count).find(|ip| !used.contains(ip))
    }

    fn offset(&self, ip: u32) -> u32 {
        ip.wrapping_sub(self.base)
    }
}

/// How the ClusterIP allocator runs and where it allocates.
#[derive(Debug, Clone, Default)]
pub struct ClusterIpConfig {
    /// The trigger mode applies; the allocator always runs one worker, since allocations are
    /// serialized anyway.
    pub run: ControllerConfig,
    pub range: ServiceIpRange,
}

/// The ClusterIP allocator: a Service without `spec.clusterIP` gets the next free address of the
/// range. Headless services (`None`) and ExternalName services are left alone. The addresses in
/// use are those of the Services that exist, so a deleted Service's address is free again.
/// When the range is full, services wait until a service is deleted.
pub fn cluster_ip_allocator(client: Arc<dyn Client>, manager: &Manager, config: ClusterIpConfig) -> Controller {
    let services = manager.informers().cache(&kinds::SERVICE);
    let waiting: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let reconciler = Arc::new(ClusterIpAllocator {
        client,
        services: services.clone(),
        range: config.range,
        allocation: tokio::sync::Mutex::default(),
        waiting: waiting.clone(),
    });
    Controller::new("clusterip-allocator", &kinds::SERVICE, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    // A service no longer in the cache was deleted: its address is free for those waiting.
    .watches(&kinds::SERVICE, move |svc| match shepherd_runtime::cache::object_key(svc) {
        Some(key) if services.get(&key).is_none() => {
            std::mem::take(&mut *waiting.lock().unwrap_or_else(|e| e.into_inner())).into_iter().collect()
        }
        _ => Vec::new(),
    })
    .workers(1)
    .mode(config.run.mode)
}

#[derive(Default)]
struct Allocation {
    /// Where the next search starts, so addresses are not reused at once after a release.
    cursor: u32,
    /// Addresses written but perhaps not yet in the service cache, by service key.
    in_flight: HashMap<String, u32>,
}

struct ClusterIpAllocator {
    client: Arc<dyn Client>,
    services: Arc<Cache>,
    range: ServiceIpRange,
    /// Held across choosing an address and writing it, so two services never get the same one.
    allocation: tokio::sync::Mutex<Allocation>,
    /// Services that found the range full.
    waiting: Arc<Mutex<BTreeSet<String>>>,
}

fn cluster_ip(svc: &Value) -> &str {
    str_at(svc, "/spec/clusterIP")
}

impl ClusterIpAllocator {
    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let Some(svc) = self.services.get(key) else { return Ok(Action::Done) };
        if !cluster_ip(&svc).is_empty() || str_at(&svc, "/spec/type") == "ExternalName" {
            return Ok(Action::Done);
        }
        let ns = str_at(&svc, "/metadata/namespace").to_string();
        let mut alloc = self.allocation.lock().await;
        // Forget in-flight addresses the cache now shows (or whose service is gone).
        let services = &self.services;
        alloc.in_flight.retain(|k, _| services.get(k).is_some_and(|s| cluster_ip(&s).is_empty()));
        let mut used: HashSet<u32> =
            self.services.list().iter().filter_map(|s| cluster_ip(s).parse::<Ipv4Addr>().ok()).map(u32::from).collect();
        used.extend(alloc.in_flight.values().copied());
        let Some(ip) = self.range.next_free(alloc.cursor, &used) else {
            tracing::warn!(service = key, "no free cluster IP left: every address in the range is in use; waiting for a service to be deleted");
            self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string());
            // A deletion between the count above and joining the waiting set woke nobody.
            let mut now_used: HashSet<u32> =
                self.services.list().iter().filter_map(|s| cluster_ip(s).parse::<Ipv4Addr>().ok()).map(u32::from).collect();
            now_used.extend(alloc.in_flight.values().copied());
            if self.range.next_free(alloc.cursor, &now_used).is_some() {
                return Err(format!("a cluster IP was released while service {key} was queued; retrying").into());
            }
            return Ok(Action::Done);
        };
        let address = Ipv4Addr::from(ip).to_string();
        let mut obj = (*svc).clone();
        obj["spec"]["clusterIP"] = json!(address);
        obj["spec"]["clusterIPs"] = json!([address]);
        match self.client.update(&kinds::SERVICE, Some(&ns), obj).await {
            Ok(_) => {
                alloc.in_flight.insert(key.to_string(), ip);
                alloc.cursor = self.range.offset(ip) + 1;
                Ok(Action::Done)
            }
            Err(e) if e.is_not_found() => Ok(Action::Done),
            Err(e) => {
                // The API refuses an address another Service holds, perhaps one this cache does not
                // show yet (allocated through another API server): the retry starts after it.
                alloc.cursor = self.range.offset(ip) + 1;
                Err(format!("assigning cluster IP {address} to service {key}: {e}").into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_range_skips_the_network_and_first_addresses() {
        let r = ServiceIpRange::default();
        let ip = r.next_free(0, &HashSet::new()).map(Ipv4Addr::from);
        assert_eq!(ip, Some(Ipv4Addr::new(10, 96, 0, 2)));
    }

    #[test]
    fn a_full_range_has_nothing_free_and_wraps_before_giving_up() {
        let r: ServiceIpRange = "10.0.0.0/29".parse().expect("valid range");
        let used: HashSet<u32> = (2..=6).map(|i| u32::from(Ipv4Addr::new(10, 0, 0, i))).collect();
        assert_eq!(r.next_free(5, &used), None);
        let mut some = used.clone();
        some.remove(&u32::from(Ipv4Addr::new(10, 0, 0, 3)));
        assert_eq!(r.next_free(5, &some).map(Ipv4Addr::from), Some(Ipv4Addr::new(10, 0, 0, 3)));
    }

    #[test]
    fn ranges_that_are_not_cidrs_are_rejected_with_the_reason() {
        let e = "10.96.0.0".parse::<ServiceIpRange>().expect_err("no prefix");
        assert!(e.to_string().contains("10.96.0.0/16"), "{e}");
        assert!("10.96.0.0/31".parse::<ServiceIpRange>().is_err());
        assert!("fd00::/108".parse::<ServiceIpRange>().is_err());
    }
}
