//! Endpoints, EndpointSlices and ClusterIPs against the real in-process API server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd_api::kinds;
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_controllers::ControllerConfig;
use shepherd_controllers::endpoints::{ClusterIpConfig, cluster_ip_allocator, endpoints_controller};
use shepherd_controllers::endpointslice::endpoint_slice_controller;
use shepherd_runtime::ListParams;
use shepherd_runtime::{Client, DeleteParams, Manager, Patch, RunningManager};
use shepherd_store::{HistoryLimits, LocalStore};

struct Cluster {
    client: Arc<dyn Client>,
    running: RunningManager,
}

impl Cluster {
    async fn start(range: Option<&str>) -> Cluster {
        let store = Arc::new(LocalStore::in_memory(HistoryLimits::default()));
        let server = ApiServer::new(store, HttpConfig::default()).await.expect("api server starts");
        let client: Arc<dyn Client> = Arc::new(server.client());
        let manager = Manager::new(client.clone());
        manager.add(endpoints_controller(client.clone(), &manager, ControllerConfig::default()));
        manager.add(endpoint_slice_controller(client.clone(), &manager, ControllerConfig::default()));
        let mut ip = ClusterIpConfig::default();
        if let Some(r) = range {
            ip.range = r.parse().expect("valid range");
        }
        manager.add(cluster_ip_allocator(client.clone(), &manager, ip));
        Cluster { client, running: manager.spawn() }
    }

    async fn shut_down(self) {
        self.running.stop().await;
    }

    async fn service(&self, name: &str, spec: Value) {
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"}, "spec": spec});
        self.client.create(&kinds::SERVICE, Some("default"), svc).await.expect("service created");
    }

    /// A running pod on node-1 with `ip`, ready or not, with `ports` as its container ports.
    async fn pod(&self, name: &str, app: &str, ip: &str, ready: bool, ports: Value) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": {"app": app}},
            "spec": {"containers": [{"name": "app", "image": "web:1", "ports": ports}]}});
        self.client.create(&kinds::POD, Some("default"), pod).await.expect("pod created");
        self.client.bind_pod("default", name, "node-1").await.expect("pod bound");
        self.set_ready(name, ready, Some(ip)).await;
    }

    async fn set_ready(&self, name: &str, ready: bool, ip: Option<&str>) {
        let current = self.client.get(&kinds::POD, Some("default"), name).await.expect("pod exists");
        let mut conditions: Vec<Value> = current["status"]["conditions"].as_array().cloned().unwrap_or_default();
        conditions.retain(|c| c["type"] != "Ready");
        conditions.push(json!({"type": "Ready", "status": if ready { "True" } else { "False" }}));
        let mut status = json!({"phase": "Running", "conditions": conditions});
        if let Some(ip) = ip {
            status["podIP"] = json!(ip);
        }
        self.client
            .patch_status(&kinds::POD, Some("default"), name, Patch::Merge(json!({"status": status})))
            .await
            .expect("pod status patched");
    }

    async fn endpoints(&self, name: &str) -> Option<Value> {
        self.client.get(&kinds::ENDPOINTS, Some("default"), name).await.ok()
    }

    /// Waits until the endpoints' subsets, reduced to (ready IPs, not-ready IPs, ports), equal `want`.
    async fn wait_for_subsets(&self, name: &str, want: Value) -> Duration {
        let started = Instant::now();
        let mut last = Value::Null;
        while started.elapsed() < Duration::from_secs(5) {
            if let Some(ep) = self.endpoints(name).await {
                last = summarize(&ep);
                if last == want {
                    return started.elapsed();
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("endpoints {name} never became {want}; last seen {last}");
    }

    async fn cluster_ip(&self, name: &str) -> Option<String> {
        let svc = self.client.get(&kinds::SERVICE, Some("default"), name).await.ok()?;
        svc.pointer("/spec/clusterIP").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string)
    }

    async fn wait_for_cluster_ip(&self, name: &str) -> String {
        for _ in 0..500 {
            if let Some(ip) = self.cluster_ip(name).await {
                return ip;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("service {name} never got a cluster IP");
    }
}

impl Cluster {
    /// The service's slices, each reduced to (address type, ports, [(address, ready, serving,
    /// terminating, pod)]), sorted, as kubectl would find them: by the service-name label.
    async fn slices(&self, service: &str) -> Value {
        let params = ListParams::namespace("default").labels(format!("kubernetes.io/service-name={service}"));
        let list = self.client.list(&kinds::ENDPOINTSLICE, &params).await.expect("slices listed");
        let mut out: Vec<Value> = list
            .items
            .iter()
            .map(|s| {
                let endpoints: Vec<Value> = s["endpoints"].as_array().into_iter().flatten().map(|e| {
                    let c = &e["conditions"];
                    json!([e["addresses"][0], c["ready"], c["serving"], c["terminating"], e["targetRef"]["name"]])
                }).collect();
                json!({"type": s["addressType"], "ports": s["ports"], "endpoints": endpoints})
            })
            .collect();
        out.sort_by_key(|v| v.to_string());
        Value::Array(out)
    }

    async fn wait_for_slices(&self, service: &str, want: Value) {
        let started = Instant::now();
        let mut last = Value::Null;
        while started.elapsed() < Duration::from_secs(10) {
            last = self.slices(service).await;
            if last == want {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("slices of {service} never became {want}; last seen {last}");
    }
}

fn ips(list: &Value) -> Vec<String> {
    list.as_array().into_iter().flatten().filter_map(|a| a["ip"].as_str().map(str::to_string)).collect()
}

fn summarize(ep: &Value) -> Value {
    let subsets = ep["subsets"].as_array().cloned().unwrap_or_default();
    Value::Array(
        subsets
            .iter()
            .map(|s| {
                let ports: Vec<Value> = s["ports"].as_array().cloned().unwrap_or_default();
                json!({"ready": ips(&s["addresses"]), "notReady": ips(&s["notReadyAddresses"]), "ports": ports})
            })
            .collect(),
    )
}

#[tokio::test]
async fn endpoints_follow_pod_readiness() {
    let c = Cluster::start(None).await;
    c.service("web", json!({"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]})).await;
    c.pod("web-0", "web", "10.1.0.10", true, json!([])).await;
    c.pod("web-1", "web", "10.1.0.11", false, json!([])).await;
    c.pod("db-0", "db", "10.1.0.20", true, json!([])).await;
    let port = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    c.wait_for_subsets("web", json!([{"ready": ["10.1.0.10"], "notReady": ["10.1.0.11"], "ports": port}])).await;

    let ep = c.endpoints("web").await.expect("endpoints exist");
    let svc = c.client.get(&kinds::SERVICE, Some("default"), "web").await.expect("service exists");
    assert_eq!(ep["metadata"]["ownerReferences"][0]["kind"], "Service");
    assert_eq!(ep["metadata"]["ownerReferences"][0]["uid"], svc["metadata"]["uid"]);
    let address = &ep["subsets"][0]["addresses"][0];
    assert_eq!(address["targetRef"]["name"], "web-0");
    assert_eq!(address["nodeName"], "node-1");

    c.set_ready("web-1", true, None).await;
    let took = c.wait_for_subsets("web", json!([{"ready": ["10.1.0.10", "10.1.0.11"], "notReady": [], "ports": port}])).await;
    assert!(took < Duration::from_millis(500), "readiness took {took:?} to reach the endpoints");
    c.set_ready("web-0", false, None).await;
    c.wait_for_subsets("web", json!([{"ready": ["10.1.0.11"], "notReady": ["10.1.0.10"], "ports": port}])).await;

    // A pod that is deleted leaves; the last one leaving empties the endpoints.
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    c.client.delete(&kinds::POD, Some("default"), "web-0", &now).await.expect("deleted");
    c.wait_for_subsets("web", json!([{"ready": ["10.1.0.11"], "notReady": [], "ports": port}])).await;
    c.client.delete(&kinds::POD, Some("default"), "web-1", &now).await.expect("deleted");
    c.wait_for_subsets("web", json!([])).await;

    // Deleting the service deletes its endpoints.
    c.client.delete(&kinds::SERVICE, Some("default"), "web", &DeleteParams::default()).await.expect("deleted");
    for _ in 0..500 {
        if c.endpoints("web").await.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(c.endpoints("web").await.is_none(), "endpoints outlived their service");
    c.shut_down().await;
}

#[tokio::test]
async fn endpoint_slices_follow_pods_through_ready_not_ready_terminating_and_deleted() {
    let c = Cluster::start(None).await;
    c.service("web", json!({"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]})).await;
    // No pods yet: one empty slice, as Kubernetes keeps.
    c.wait_for_slices("web", json!([{"type": "IPv4", "ports": [], "endpoints": []}])).await;
    c.pod("web-0", "web", "10.1.0.10", true, json!([])).await;
    c.pod("web-1", "web", "10.1.0.11", false, json!([])).await;
    c.pod("db-0", "db", "10.1.0.20", true, json!([])).await;
    let ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    c.wait_for_slices("web", json!([{"type": "IPv4", "ports": ports, "endpoints": [
        ["10.1.0.10", true, true, false, "web-0"], ["10.1.0.11", false, false, false, "web-1"]]}])).await;

    let params = ListParams::namespace("default").labels("kubernetes.io/service-name=web");
    let slice = c.client.list(&kinds::ENDPOINTSLICE, &params).await.expect("listed").items.remove(0);
    let svc = c.client.get(&kinds::SERVICE, Some("default"), "web").await.expect("service exists");
    assert_eq!(slice["metadata"]["ownerReferences"][0]["uid"], svc["metadata"]["uid"]);
    assert_eq!(slice["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"], "endpointslice-controller.k8s.io");
    assert_eq!(slice["endpoints"][0]["nodeName"], "node-1");
    assert_eq!(slice["endpoints"][0]["targetRef"]["kind"], "Pod");

    c.set_ready("web-1", true, None).await;
    c.set_ready("web-0", false, None).await;
    c.wait_for_slices("web", json!([{"type": "IPv4", "ports": ports, "endpoints": [
        ["10.1.0.10", false, false, false, "web-0"], ["10.1.0.11", true, true, false, "web-1"]]}])).await;

    // A pod on a node is deleted gracefully: it stays listed as terminating until it is gone.
    c.client.delete(&kinds::POD, Some("default"), "web-1", &DeleteParams::default()).await.expect("deleting");
    c.wait_for_slices("web", json!([{"type": "IPv4", "ports": ports, "endpoints": [
        ["10.1.0.10", false, false, false, "web-0"], ["10.1.0.11", false, true, true, "web-1"]]}])).await;
    let now = DeleteParams { grace_period_seconds: Some(0), ..Default::default() };
    for pod in ["web-0", "web-1"] {
        c.client.delete(&kinds::POD, Some("default"), pod, &now).await.expect("deleted");
    }
    c.wait_for_slices("web", json!([{"type": "IPv4", "ports": [], "endpoints": []}])).await;

    c.client.delete(&kinds::SERVICE, Some("default"), "web", &DeleteParams::default()).await.expect("deleted");
    c.wait_for_slices("web", json!([])).await;
    c.shut_down().await;
}

#[tokio::test]
async fn named_target_ports_resolve_per_pod() {
    let c = Cluster::start(None).await;
    c.service("api", json!({"selector": {"app": "api"}, "ports": [{"name": "web", "port": 80, "targetPort": "http"}]})).await;
    c.pod("api-old", "api", "10.1.0.1", true, json!([{"name": "http", "containerPort": 8080}])).await;
    c.pod("api-new", "api", "10.1.0.2", true, json!([{"name": "http", "containerPort": 9090}])).await;
    c.pod("api-portless", "api", "10.1.0.3", true, json!([{"name": "metrics", "containerPort": 9100}])).await;
    c.wait_for_subsets(
        "api",
        json!([
            {"ready": ["10.1.0.1"], "notReady": [], "ports": [{"name": "web", "port": 8080, "protocol": "TCP"}]},
            {"ready": ["10.1.0.2"], "notReady": [], "ports": [{"name": "web", "port": 9090, "protocol": "TCP"}]},
        ]),
    )
    .await;
    c.shut_down().await;
}

#[tokio::test]
async fn services_get_unique_cluster_ips_and_headless_ones_stay_headless() {
    let c = Cluster::start(None).await;
    for name in ["a", "b", "c"] {
        c.service(name, json!({"selector": {"app": name}, "ports": [{"port": 80}]})).await;
    }
    c.service("headless", json!({"clusterIP": "None", "selector": {"app": "x"}, "ports": [{"port": 80}]})).await;
    c.service("fixed", json!({"clusterIP": "10.96.0.2", "ports": [{"port": 80}]})).await;
    let mut got = Vec::new();
    for name in ["a", "b", "c"] {
        got.push(c.wait_for_cluster_ip(name).await);
    }
    for ip in &got {
        assert!(ip.starts_with("10.96."), "{ip} is outside the default range");
        assert!(!["10.96.0.0", "10.96.0.1", "10.96.0.2"].contains(&ip.as_str()), "{ip} is reserved or taken");
    }
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 3, "cluster IPs are not unique: {got:?}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(c.cluster_ip("headless").await.as_deref(), Some("None"));
    assert_eq!(c.cluster_ip("fixed").await.as_deref(), Some("10.96.0.2"));
    c.shut_down().await;
}

#[tokio::test]
async fn a_deleted_service_releases_its_cluster_ip() {
    // 10.0.0.0/29 offers five addresses: .2 to .6.
    let c = Cluster::start(Some("10.0.0.0/29")).await;
    let mut taken = Vec::new();
    for i in 0..5 {
        c.service(&format!("s{i}"), json!({"ports": [{"port": 80}]})).await;
        taken.push(c.wait_for_cluster_ip(&format!("s{i}")).await);
    }
    taken.sort();
    assert_eq!(taken, ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"]);
    c.service("waiting", json!({"ports": [{"port": 80}]})).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(c.cluster_ip("waiting").await, None, "the range is full");

    let released = c.cluster_ip("s3").await.expect("s3 has an address");
    c.client.delete(&kinds::SERVICE, Some("default"), "s3", &DeleteParams::default()).await.expect("deleted");
    // The deletion wakes the waiting service, which gets the released address.
    let mut got = None;
    for _ in 0..300 {
        got = c.cluster_ip("waiting").await;
        if got.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(got, Some(released));
    c.shut_down().await;
}
