//! Scenario `validation-cost`: the time the API server's schema check takes per object, in
//! process, for a Lease renewal and a Pod as the store holds them: the in-place walk over the
//! decoded object against the typed round trip it replaced, and the whole validation of a write.

use std::hint::black_box;
use std::time::Instant;

use serde_json::{Value, json};
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_api::validation::{self, Schema};

use crate::procstat;
use crate::report::ScenarioResult;

/// Server-owned metadata as a Lease or Pod carries it after a few writes.
fn meta(name: &str, manager: &str) -> Value {
    json!({"name": name, "namespace": "default", "uid": "6f1c1c4e-8a2e-4b8e-9d7a-2f4d1e0c9b11",
        "resourceVersion": "4242", "creationTimestamp": "2026-11-30T10:00:00Z", "labels": {"app": "web"},
        "managedFields": [{"manager": manager, "operation": "Update", "apiVersion": "v1",
            "time": "2026-11-30T10:00:01Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}}}]})
}

/// A node's Lease as a renewal writes it.
fn lease() -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta("node-1", "shepherd-agent"),
        "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40,
            "renewTime": "2026-11-30T10:00:10.500000Z"}})
}

/// A Deployment's pod after scheduling and a status update.
fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta("web-7d9f8-abcde", "shepherd-agent"),
        "spec": {"containers": [{"name": "web", "image": "registry.example/web:1.0",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "MODE", "value": "fast"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
                "imagePullPolicy": "IfNotPresent", "terminationMessagePath": "/dev/termination-log"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "nodeName": "node-1", "schedulerName": "default-scheduler",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": 300}]},
        "status": {"phase": "Running", "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}],
            "startTime": "2026-11-30T10:00:02Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:00:03Z"}],
            "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0, "image": "registry.example/web:1.0",
                "imageID": "sha256:abc", "started": true, "state": {"running": {"startedAt": "2026-11-30T10:00:02Z"}}}]}})
}

/// The time per call of `f` over `n` calls, in microseconds.
fn per_call_us(n: usize, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn measure(res: &ResourceInfo, obj: &Value, batches: usize, n: usize) -> anyhow::Result<Value> {
    // The objects have no unknown fields, so the checks leave them as they are and can be repeated on one copy.
    let mut o = obj.clone();
    anyhow::ensure!(validation::prune_and_check(res, &mut o) == (vec![], Schema::AlreadyChecked), "{} fits", res.kind);
    anyhow::ensure!(validation::prune_and_check_typed(res, &mut o) == (vec![], Schema::AlreadyChecked), "{} fits", res.kind);
    anyhow::ensure!(&o == obj, "{} unchanged", res.kind);
    // The calls above warmed both (the schemas are compiled on first use); batches alternate so
    // that both see the same load. Reported: the median batch.
    let (mut walk, mut round_trip, mut whole) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..batches {
        walk.push(per_call_us(n, || {
            black_box(validation::prune_and_check(res, black_box(&mut o)));
        }));
        round_trip.push(per_call_us(n, || {
            black_box(validation::prune_and_check_typed(res, black_box(&mut o)));
        }));
        whole.push(per_call_us(n, || {
            let (_, schema) = validation::prune_and_check(res, black_box(&mut o));
            black_box(validation::validate_as(res, &o, schema).is_ok());
        }));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (walk, round_trip, whole) = (median(&mut walk), median(&mut round_trip), median(&mut whole));
    println!(
        "{:<5} schema check: in place {walk:.1} us, typed round trip {round_trip:.1} us ({:.1}x); whole validation {whole:.1} us",
        res.kind,
        round_trip / walk
    );
    Ok(json!({"schema_check_in_place_us": walk, "schema_check_round_trip_us": round_trip,
        "validation_us": whole, "bytes": serde_json::to_vec(obj)?.len()}))
}

pub fn run(batches: usize, per_batch: usize) -> anyhow::Result<ScenarioResult> {
    println!("scenario validation-cost: {batches} batches of {per_batch} calls each, median of the batches");
    let started = Instant::now();
    // The schemas of all kinds are compiled on the first check: a one-off cost of the first write.
    let first = Instant::now();
    black_box(validation::prune_and_check(&kinds::LEASE, &mut lease()));
    let first_ms = first.elapsed().as_secs_f64() * 1e3;
    println!("first schema check (compiles the schemas of all kinds): {first_ms:.1} ms");
    let lease = measure(&kinds::LEASE, &lease(), batches, per_batch)?;
    let pod = measure(&kinds::POD, &pod(), batches, per_batch)?;
    let load = procstat::load_average();
    println!("load average: {load:.2}; took {:.1} s", started.elapsed().as_secs_f64());
    Ok(ScenarioResult {
        name: "validation-cost",
        params: json!({"batches": batches, "calls_per_batch": per_batch}),
        values: json!({"first_check_ms": first_ms, "lease": lease, "pod": pod, "load_average": load}),
    })
}
