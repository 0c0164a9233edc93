//! The EndpointSlice controller: for every Service with a selector, `discovery.k8s.io/v1`
//! EndpointSlices listing the matching pods (at most 100 endpoints each), beside the Endpoints
//! object the endpoints controller keeps. kubectl 1.32+ and proxies read these.
//!
//! Pods that resolve the service's ports to the same set share slices, as in Kubernetes;
//! terminating pods stay listed (`terminating: true`, not ready) until they are gone.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::kinds;
use shepherd_runtime::cache::resource_version;
use shepherd_runtime::controller::Error;
use shepherd_runtime::{Action, Cache, Client, Controller, DeleteParams, Manager};
use tokio::time::Instant;

use crate::config::ControllerConfig;
use crate::endpoints::{PortKey, is_ready, pod_ports, service_selector, services_selecting};
use shepherd_api::str_at;

/// The label naming the Service a slice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The label naming the controller that manages a slice; slices managed by others are left alone.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// Kubernetes' `--max-endpoints-per-slice` default.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// How long a reconcile waits for the cache to show the last one's writes. A slice written and
/// then deleted by someone else before the cache showed it would otherwise be waited for for ever.
const WRITES_VISIBLE_WITHIN: Duration = Duration::from_secs(10);

/// The EndpointSlice controller; pod changes enqueue the services selecting the pod.
pub fn endpoint_slice_controller(client: Arc<dyn Client>, manager: &Manager, config: ControllerConfig) -> Controller {
    let informers = manager.informers();
    let services = informers.cache(&kinds::SERVICE);
    let reconciler = Arc::new(EndpointSliceController {
        client,
        services: services.clone(),
        pods: informers.cache(&kinds::POD),
        slices: informers.cache(&kinds::ENDPOINTSLICE),
        written: Mutex::default(),
    });
    Controller::new("endpointslice", &kinds::SERVICE, move |key: String| {
        let r = reconciler.clone();
        async move { r.reconcile(&key).await }
    })
    .owns(&kinds::ENDPOINTSLICE)
    .watches(&kinds::POD, move |pod| services_selecting(&services, pod))
    .workers(config.workers)
    .mode(config.mode)
}

/// A slice write the cache has not shown yet: the slice's name and the revision written
/// (`None`: deleted).
type Written = (String, Option<u64>);

struct EndpointSliceController {
    client: Arc<dyn Client>,
    services: Arc<Cache>,
    pods: Arc<Cache>,
    slices: Arc<Cache>,
    /// Per service, the slice writes of its last reconcile and when they were made. Slices are
    /// created with generated names, so a reconcile working from a cache without them would
    /// create them a second time; it waits for the cache instead (at most [`WRITES_VISIBLE_WITHIN`]).
    written: Mutex<HashMap<String, (Instant, Vec<Written>)>>,
}

/// What one slice should hold.
#[derive(Debug, Clone, PartialEq)]
struct SliceContent {
    address_type: &'static str,
    ports: Value,
    endpoints: Vec<Value>,
}

impl EndpointSliceController {
    fn managed_slices(&self, ns: &str, service: &str) -> Vec<Arc<Value>> {
        self.slices
            .by_label(SERVICE_NAME_LABEL, service)
            .into_iter()
            .filter(|s| {
                str_at(s, "/metadata/namespace") == ns
                    && s.at("/metadata/labels").and_then(|l| l.get(MANAGED_BY_LABEL)).and_then(Value::as_str) == Some(MANAGED_BY)
            })
            .collect()
    }

    /// Whether the cache shows every write of this service's last reconcile.
    fn cache_caught_up(&self, key: &str, ns: &str) -> bool {
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let Some((at, writes)) = written.get(key) else { return true };
        let seen = at.elapsed() >= WRITES_VISIBLE_WITHIN || writes.iter().all(|(name, rv)| {
            let cached = self.slices.get(&format!("{ns}/{name}"));
            match rv {
                None => cached.is_none(),
                Some(rv) => cached.and_then(|c| resource_version(&c)).is_some_and(|c| c >= *rv),
            }
        });
        if seen {
            written.remove(key);
        }
        seen
    }

    async fn reconcile(&self, key: &str) -> Result<Action, Error> {
        let (ns, name) = key.split_once('/').ok_or_else(|| format!("service key {key:?} has no namespace"))?;
        if !self.cache_caught_up(key, ns) {
            // The slice events that complete the cache enqueue this service again; this is a backstop.
            return Ok(Action::RequeueAfter(Duration::from_secs(1)));
        }
        let existing = self.managed_slices(ns, name);
        let svc = self.services.get(key);
        let selector = svc.as_deref().and_then(service_selector);
        let (Some(svc), Some(selector)) = (svc, selector) else {
            // No service, or one whose endpoints are managed by hand: no managed slices.
            let mut writes = Vec::new();
            for slice in existing {
                writes.push(self.delete(ns, &slice).await?);
            }
            self.remember(key, writes);
            return Ok(Action::Done);
        };
        let pods: Vec<Arc<Value>> = self.pods.by_namespace_where(ns, |p| p.matches(&selector));
        let desired = desired_slices(&svc, &pods);
        let owner = json!([{"apiVersion": "v1", "kind": "Service", "name": name, "uid": svc.at("/metadata/uid"),
            "controller": true, "blockOwnerDeletion": true}]);
        let labels = slice_labels(&svc);

        // Keep slices that already hold what is wanted; rewrite others of the same address type;
        // create and delete for the difference.
        let mut spare: Vec<Arc<Value>> = Vec::new();
        let mut todo: Vec<SliceContent> = desired;
        for slice in existing {
            let have = content_of(&slice);
            match todo.iter().position(|want| Some(want) == have.as_ref()) {
                Some(i) if !needs_metadata(&slice, &labels, &owner) => {
                    todo.remove(i);
                }
                _ => spare.push(slice),
            }
        }
        let mut writes = Vec::new();
        for want in todo {
            let reuse = spare.iter().position(|s| str_at(s, "/addressType") == want.address_type).map(|i| spare.remove(i));
            let written = match reuse {
                Some(current) => {
                    let mut obj = (*current).clone();
                    obj["ports"] = want.ports;
                    obj["endpoints"] = Value::Array(want.endpoints);
                    obj["metadata"]["labels"] = labels.clone();
                    obj["metadata"]["ownerReferences"] = owner.clone();
                    self.client.update(&kinds::ENDPOINTSLICE, Some(ns), obj).await?
                }
                None => {
                    let obj = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                        "metadata": {"generateName": format!("{name}-"), "namespace": ns, "labels": labels,
                            "ownerReferences": owner},
                        "addressType": want.address_type, "ports": want.ports, "endpoints": want.endpoints});
                    self.client.create(&kinds::ENDPOINTSLICE, Some(ns), obj).await?
                }
            };
            writes.push((str_at(&written, "/metadata/name").to_string(), resource_version(&written)));
        }
        for slice in spare {
            writes.push(self.delete(ns, &slice).await?);
        }
        self.remember(key, writes);
        Ok(Action::Done)
    }

    async fn delete(&self, ns: &str, slice: &Value) -> Result<Written, Error> {
        let name = str_at(slice, "/metadata/name");
        match self.client.delete(&kinds::ENDPOINTSLICE, Some(ns), name, &DeleteParams::default()).await {
            Ok(_) => Ok((name.to_string(), None)),
            Err(e) if e.is_not_found() => Ok((name.to_string(), None)),
            Err(e) => Err(e.into()),
        }
    }

    fn remember(&self, key: &str, writes: Vec<Written>) {
        if !writes.is_empty() {
            self.written.lock().unwrap_or_else(|e| e.into_inner()).insert(key.to_string(), (Instant::now(), writes));
        }
    }
}

/// The service's labels, then the two that tie a slice to it.
fn slice_labels(svc: &Value) -> Value {
    let mut labels = svc.at("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default();
    labels.insert(SERVICE_NAME_LABEL.into(), json!(str_at(svc, "/metadata/name")));
    labels.insert(MANAGED_BY_LABEL.into(), json!(MANAGED_BY));
    if str_at(svc, "/spec/clusterIP") == "None" {
        labels.insert("service.kubernetes.io/headless".into(), json!(""));
    }
    Value::Object(labels)
}

fn needs_metadata(slice: &Value, labels: &Value, owner: &Value) -> bool {
    slice.at("/metadata/labels") != Some(labels) || slice.at("/metadata/ownerReferences") != Some(owner)
}

fn content_of(slice: &Value) -> Option<SliceContent> {
    let address_type = match str_at(slice, "/addressType") {
        "IPv4" => "IPv4",
        "IPv6" => "IPv6",
        _ => return None,
    };
    let ports = slice.get("ports").filter(|p| !p.is_null()).cloned().unwrap_or(json!([]));
    let endpoints = slice.get("endpoints").and_then(Value::as_array).cloned().unwrap_or_default();
    Some(SliceContent { address_type, ports, endpoints })
}

fn ports_value(ports: &[PortKey]) -> Value {
    ports.iter().map(|(name, port, protocol)| json!({"name": name, "port": port, "protocol": protocol})).collect()
}

/// The slices a service should have: its pods grouped by address family and resolved ports,
/// sorted by address, cut into slices of at most [`MAX_ENDPOINTS_PER_SLICE`]. A service with no
/// endpoints keeps one empty slice, as Kubernetes does.
fn desired_slices(svc: &Value, pods: &[Arc<Value>]) -> Vec<SliceContent> {
    let ns = str_at(svc, "/metadata/namespace");
    let publish_not_ready = svc.at("/spec/publishNotReadyAddresses").and_then(Value::as_bool).unwrap_or(false);
    let service_ports: Vec<&Value> = svc.at("/spec/ports").and_then(Value::as_array).map(|p| p.iter().collect()).unwrap_or_default();
    // Per (address family, resolved ports): (address, pod name, endpoint), to sort and cut.
    type Group = Vec<(IpAddr, String, Value)>;
    let mut groups: BTreeMap<(&'static str, Vec<PortKey>), Group> = BTreeMap::new();
    for pod in pods {
        let Ok(ip) = str_at(pod, "/status/podIP").parse::<IpAddr>() else { continue };
        if matches!(str_at(pod, "/status/phase"), "Succeeded" | "Failed") {
            continue;
        }
        let Some(ports) = pod_ports(&service_ports, pod) else { continue };
        let serving = is_ready(pod);
        let terminating = pod.at("/metadata/deletionTimestamp").is_some_and(|t| !t.is_null());
        let ready = publish_not_ready || (serving && !terminating);
        let pod_name = str_at(pod, "/metadata/name");
        let mut endpoint = json!({"addresses": [ip.to_string()],
            "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
            "targetRef": {"kind": "Pod", "namespace": ns, "name": pod_name, "uid": pod.at("/metadata/uid")}});
        let node = str_at(pod, "/spec/nodeName");
        if !node.is_empty() {
            endpoint["nodeName"] = json!(node);
        }
        let family = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
        groups.entry((family, ports)).or_default().push((ip, pod_name.to_string(), endpoint));
    }
    let mut slices = Vec::new();
    for ((address_type, ports), mut endpoints) in groups {
        endpoints.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let ports = ports_value(&ports);
        for chunk in endpoints.chunks(MAX_ENDPOINTS_PER_SLICE) {
            let endpoints = chunk.iter().map(|(_, _, e)| e.clone()).collect();
            slices.push(SliceContent { address_type, ports: ports.clone(), endpoints });
        }
    }
    if slices.is_empty() {
        slices.push(SliceContent { address_type: "IPv4", ports: json!([]), endpoints: Vec::new() });
    }
    slices
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, ip: &str, ready: bool) -> Arc<Value> {
        Arc::new(json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}))
    }

    fn service() -> Value {
        json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http", "protocol": "TCP"}]}})
    }

    #[test]
    fn a_service_with_250_pods_gets_three_slices_of_at_most_100_sorted_by_address() {
        let pods: Vec<Arc<Value>> = (0..250).map(|n| pod(&format!("p{n}"), &format!("10.0.{}.{}", n / 200, n % 200 + 1), true)).collect();
        let slices = desired_slices(&service(), &pods);
        assert_eq!(slices.iter().map(|s| s.endpoints.len()).collect::<Vec<_>>(), vec![100, 100, 50]);
        assert_eq!(slices[0].endpoints[0]["addresses"][0], "10.0.0.1");
        assert_eq!(slices[0].endpoints[1]["addresses"][0], "10.0.0.2");
        assert_eq!(slices[0].ports, json!([{"name": "", "port": 8080, "protocol": "TCP"}]));
    }

    #[test]
    fn not_ready_and_terminating_pods_are_listed_with_their_conditions() {
        let mut terminating = (*pod("b", "10.0.0.2", true)).clone();
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let pods = vec![pod("a", "10.0.0.1", false), Arc::new(terminating), pod("c", "", true)];
        let slices = desired_slices(&service(), &pods);
        assert_eq!(slices.len(), 1);
        let conditions: Vec<&Value> = slices[0].endpoints.iter().map(|e| &e["conditions"]).collect();
        assert_eq!(conditions, vec![
            &json!({"ready": false, "serving": false, "terminating": false}),
            &json!({"ready": false, "serving": true, "terminating": true}),
        ]);
        assert_eq!(slices[0].endpoints[0]["targetRef"]["name"], "a");
        assert_eq!(slices[0].endpoints[0]["nodeName"], "n1");
    }

    #[test]
    fn a_service_without_endpoints_keeps_one_empty_slice() {
        let slices = desired_slices(&service(), &[]);
        assert_eq!(slices, vec![SliceContent { address_type: "IPv4", ports: json!([]), endpoints: vec![] }]);
    }
}
