//! Metrics and autoscaling end to end with the real kubectl against `shepherd standalone` on the
//! process runtime: `kubectl top` reads a busy container's CPU from its cgroup, and a
//! HorizontalPodAutoscaler scales a busy Deployment up and an idle one down.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, Kubectl, kubectls_under_test};
use serde_json::Value;

impl Kubectl {
    /// Polls `f` until it returns `Some`; panics with `what` and the last output after `limit`.
    fn wait_for<T>(&self, what: &str, limit: Duration, mut f: impl FnMut(&Kubectl) -> Result<T, String>) -> T {
        let started = Instant::now();
        loop {
            match f(self) {
                Ok(t) => return t,
                Err(last) if started.elapsed() > limit => panic!("timed out after {limit:?} waiting for {what}; last: {last}"),
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Uid:").map(|u| u.split_whitespace().next() == Some("0"))))
        .unwrap_or(false)
}

fn deployment(name: &str, replicas: u32, command: &str, cpu_request: &str, cpu_limit: Option<&str>) -> String {
    let limit = cpu_limit.map(|l| format!(", limits: {{cpu: {l}}}")).unwrap_or_default();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  \
         selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec:\n      \
         terminationGracePeriodSeconds: 0\n      containers:\n      - name: main\n        image: minimal\n        \
         command: [\"sh\", \"-c\", \"{command}\"]\n        resources: {{requests: {{cpu: {cpu_request}}}{limit}}}\n"
    )
}

/// Millicores of a `kubectl top` CPU column (`1234m`, `1`).
fn millicores(cell: &str) -> Option<u64> {
    match cell.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => cell.parse::<u64>().ok().map(|c| c * 1000),
    }
}

/// The tests load the CPU on purpose; one at a time, so neither starves the other's pods.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn standalone(dir: &Path) -> Daemon {
    Daemon::start("standalone", &dir.join("data"), &["--hpa-sync-seconds", "2"])
}

#[test]
fn kubectl_top_shows_a_busy_container_near_its_real_use() {
    assert!(is_root(), "this test measures containers through their cgroups, which the agent makes only as root");
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = standalone(dir.path());
    let (_, first) = &kubectls_under_test()[0];
    let k = Kubectl { bin: first.clone(), url: daemon.url.clone() };
    // Six busy loops: on two cores shared with other work they still get well over half a core.
    let spin = "for i in 1 2 3 4 5; do (while :; do :; done) & done; while :; do :; done";
    k.ok(&["apply", "-f", "-"], Some(&deployment("spin", 1, spin, "100m", None)));
    k.ok(&["create", "deployment", "quiet", "--image=minimal", "--", "sleep", "3600"], None);

    for (label, bin) in kubectls_under_test() {
        let k = Kubectl { bin, url: daemon.url.clone() };
        let busy = k.wait_for(&format!("kubectl {label} top to show the busy pod above 500m"), Duration::from_secs(120), |k| {
            let (ok, out, err) = k.run(&["top", "pods", "-l", "app=spin", "--no-headers"], None);
            let cpu = out.split_whitespace().nth(1).and_then(millicores);
            match cpu {
                Some(m) if ok && m > 500 => Ok(m),
                _ => Err(format!("{out}{err}")),
            }
        });
        eprintln!("kubectl {label} top pods: the busy container at {busy}m");
        let all = k.ok(&["top", "pods", "-A", "--containers"], None);
        assert!(all.contains("spin-") && all.contains("main") && all.contains("quiet-"), "kubectl {label} top pods -A --containers:\n{all}");
        let quiet = k.ok(&["top", "pods", "-l", "app=quiet", "--no-headers"], None);
        let quiet_cpu = quiet.split_whitespace().nth(1).and_then(millicores).expect("quiet pod's CPU");
        assert!(quiet_cpu < 50, "a sleeping container uses next to nothing: {quiet}");
        let nodes = k.ok(&["top", "nodes", "--no-headers"], None);
        let node_cpu = nodes.split_whitespace().nth(1).and_then(millicores).expect("node CPU");
        assert!(node_cpu >= busy / 2, "the node's usage includes its busy pod: {nodes}");
    }
    let raw: Value = serde_json::from_str(&k.ok(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods"], None))
        .expect("PodMetricsList");
    assert_eq!(raw["kind"], "PodMetricsList");
    let (ok, _, err) = k.run(&["get", "--raw", "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/nonexistent"], None);
    assert!(!ok && err.contains("NotFound"), "{err}");
}

#[test]
fn an_autoscaler_scales_a_busy_deployment_up_and_an_idle_one_down_after_its_stabilization_window() {
    assert!(is_root(), "this test measures containers through their cgroups, which the agent makes only as root");
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = standalone(dir.path());
    let (label, bin) = kubectls_under_test().remove(0);
    let k = Kubectl { bin, url: daemon.url.clone() };

    // Each busy pod is held to 200m by its limit: 200% of its 100m request, four times the 50% target.
    k.ok(&["apply", "-f", "-"], Some(&deployment("busy", 1, "while :; do :; done", "100m", Some("200m"))));
    k.ok(&["autoscale", "deployment", "busy", "--cpu-percent=50", "--min=1", "--max=3"], None);
    // Busy for its first 30 s, then idle: the autoscaler sees it fall from 200% to nothing.
    let settling = "timeout 30 sh -c 'while :; do :; done'; exec sleep 3600";
    k.ok(&["apply", "-f", "-"], Some(&deployment("idle", 3, settling, "100m", Some("200m"))));
    let window = 6;
    let idle_hpa = format!(
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {{name: idle}}\nspec:\n  \
         scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: idle}}\n  minReplicas: 1\n  maxReplicas: 3\n  \
         metrics: [{{type: Resource, resource: {{name: cpu, target: {{type: Utilization, averageUtilization: 50}}}}}}]\n  \
         behavior: {{scaleDown: {{stabilizationWindowSeconds: {window}}}}}\n"
    );
    k.ok(&["apply", "-f", "-"], Some(&idle_hpa));

    // Both at once: the idle Deployment's busy phase ends while the busy one is still scaling.
    // Once idle, its recommendation drops to 1 but the higher ones of the last `window` seconds
    // hold it at 3 (AbleToScale: ScaleDownStabilized) until they age out.
    let started = Instant::now();
    let (mut busy_at, mut held_since, mut idle_down): (Option<Duration>, Option<Instant>, Option<Duration>) = (None, None, None);
    let (busy_at, held_for) = k.wait_for("busy at 3 ready replicas and idle held, then down to 1", Duration::from_secs(240), |k| {
        if busy_at.is_none() {
            let d = k.json(&["get", "deployment", "busy"]);
            if (d["spec"]["replicas"].as_i64(), d["status"]["readyReplicas"].as_i64()) == (Some(3), Some(3)) {
                busy_at = Some(started.elapsed());
            }
        }
        if idle_down.is_none() {
            let replicas = k.json(&["get", "deployment", "idle"])["spec"]["replicas"].as_i64();
            let hpa = k.json(&["get", "hpa", "idle"]);
            let able = hpa["status"]["conditions"].as_array().and_then(|cs| cs.iter().find(|c| c["type"] == "AbleToScale").cloned());
            if replicas == Some(3) && able.as_ref().is_some_and(|c| c["reason"] == "ScaleDownStabilized") {
                held_since.get_or_insert_with(Instant::now);
            }
            if replicas == Some(1) {
                let held = held_since.expect("the idle Deployment was scaled down without being held by its window");
                idle_down = Some(held.elapsed());
            }
        }
        match (busy_at, idle_down) {
            (Some(b), Some(i)) => Ok((b, i)),
            other => Err(format!("{other:?}")),
        }
    });
    eprintln!("busy Deployment at 3 ready replicas {busy_at:?} after its autoscaler was created");
    let row = k.ok(&["get", "hpa", "busy", "--no-headers"], None);
    assert!(row.contains("Deployment/busy") && row.contains("%/50%") && row.contains("cpu: "), "kubectl {label} get hpa: {row}");
    let hpa = k.json(&["get", "hpa", "busy"]);
    let conds = hpa["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let cond = |t: &str| conds.iter().find(|c| c["type"] == t).cloned().unwrap_or(Value::Null);
    assert_eq!(cond("ScalingActive")["reason"], "ValidMetricFound", "{conds:?}");
    assert_eq!(cond("AbleToScale")["status"], "True", "{conds:?}");
    assert_eq!(hpa["status"]["currentMetrics"][0]["resource"]["name"], "cpu");
    assert!(hpa["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"].as_i64().is_some_and(|u| u > 55));
    let events = k.ok(&["get", "events", "--field-selector", "involvedObject.name=busy"], None);
    assert!(events.contains("SuccessfulRescale") && events.contains("New size: "), "{events}");
    eprintln!("idle Deployment held by its {window} s window, scaled down {held_for:?} after the hold was first seen");
    let idle = k.json(&["get", "hpa", "idle"]);
    assert_eq!(idle["status"]["desiredReplicas"], 1);
    assert!(idle["status"]["lastScaleTime"].is_string());

    // Bad input is refused naming the field, and nothing is written.
    let bad = idle_hpa.replace("name: idle}\nspec", "name: bad}\nspec").replace("minReplicas: 1", "minReplicas: 0");
    let (ok, _, err) = k.run(&["apply", "-f", "-"], Some(&bad));
    assert!(!ok && err.contains("spec.minReplicas"), "{err}");
    let (ok, _, err) = k.run(&["get", "hpa", "bad"], None);
    assert!(!ok && err.contains("NotFound"), "{err}");
}

/// A one-node simulated agent for `server`: its pods report the CPU their annotation names.
fn simulated_agent(server: &str, dir: &Path) -> common::KillOnDrop {
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["agent", "--server", server, "--runtime", "simulated", "--simulated-ready-ms", "50", "--node-name", "sim-0"])
        .arg("--data-dir")
        .arg(dir.join("agent"))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start agent");
    common::KillOnDrop(child)
}

/// A workload of `kind` with one container requesting 100m, whose simulated pods use `cpu`.
fn scalable(kind: &str, name: &str, replicas: u32, cpu: &str) -> String {
    let (api_version, selector) = match kind {
        "ReplicationController" => ("v1", format!("{{app: {name}}}")),
        _ => ("apps/v1", format!("{{matchLabels: {{app: {name}}}}}")),
    };
    let service = if kind == "StatefulSet" { format!("  serviceName: {name}\n") } else { String::new() };
    format!(
        "apiVersion: {api_version}\nkind: {kind}\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n{service}  \
         selector: {selector}\n  template:\n    metadata:\n      labels: {{app: {name}}}\n      \
         annotations: {{shepherd.io/simulated-cpu: {cpu}}}\n    spec:\n      terminationGracePeriodSeconds: 0\n      \
         containers:\n      - name: main\n        image: minimal\n        resources: {{requests: {{cpu: 100m}}}}\n"
    )
}

fn autoscaler_of(kind: &str, api_version: &str, name: &str, min: u32, max: u32) -> String {
    format!(
        "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {{name: {name}}}\nspec:\n  \
         scaleTargetRef: {{apiVersion: {api_version}, kind: {kind}, name: {name}}}\n  minReplicas: {min}\n  maxReplicas: {max}\n  \
         metrics: [{{type: Resource, resource: {{name: cpu, target: {{type: Utilization, averageUtilization: 50}}}}}}]\n"
    )
}

/// Whether some manager wrote the object through its `scale` subresource.
fn written_through_scale(obj: &Value) -> bool {
    obj["metadata"]["managedFields"].as_array().is_some_and(|fs| fs.iter().any(|f| f["subresource"] == "scale"))
}

fn condition(hpa: &Value, type_: &str) -> Value {
    let conds = hpa["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conds.into_iter().find(|c| c["type"] == type_).unwrap_or(Value::Null)
}

#[test]
fn an_autoscaler_scales_a_statefulset_and_a_replication_controller_through_their_scale_subresource() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Not every second: until a pod has been Ready for a whole metrics window (15 s on simulated
    // nodes) each sync records a failure, and a faster sync would spend the autoscaler's Event
    // budget (25, as client-go's spam filter) before it gets to rescale.
    let server = Daemon::start("server", &dir.path().join("data"), &["--in-memory", "--hpa-sync-seconds", "3"]);
    let _agent = simulated_agent(&server.url, dir.path());
    let (label, bin) = common::newest_kubectl();
    let k = Kubectl { bin, url: server.url.clone() };

    // Each pod uses 200m of its 100m request: four times the 50% target, so 1 replica asks for 4, held to 3.
    k.ok(&["apply", "-f", "-"], Some(&scalable("StatefulSet", "web", 1, "200m")));
    k.ok(&["apply", "-f", "-"], Some(&autoscaler_of("StatefulSet", "apps/v1", "web", 1, 3)));
    // An idle ReplicationController below its autoscaler's minimum is raised to it without metrics.
    k.ok(&["apply", "-f", "-"], Some(&scalable("ReplicationController", "rc", 1, "1m")));
    k.ok(&["apply", "-f", "-"], Some(&autoscaler_of("ReplicationController", "v1", "rc", 2, 4)));
    // A DaemonSet serves no scale subresource: its autoscaler says so instead of scaling.
    let ds = scalable("DaemonSet", "ds", 1, "1m").replace("  replicas: 1\n", "");
    k.ok(&["apply", "-f", "-"], Some(&ds));
    k.ok(&["apply", "-f", "-"], Some(&autoscaler_of("DaemonSet", "apps/v1", "ds", 1, 3)));

    let sts = k.wait_for("the StatefulSet at 3 ready replicas", Duration::from_secs(120), |k| {
        let sts = k.json(&["get", "statefulset", "web", "--show-managed-fields"]);
        match (sts["spec"]["replicas"].as_i64(), sts["status"]["readyReplicas"].as_i64()) {
            (Some(3), Some(3)) => Ok(sts),
            other => Err(format!("{other:?}")),
        }
    });
    assert!(written_through_scale(&sts), "the autoscaler writes through statefulsets/scale: {}", sts["metadata"]["managedFields"]);
    let hpa = k.wait_for("the autoscaler to see its 3 replicas", Duration::from_secs(30), |k| {
        let hpa = k.json(&["get", "hpa", "web"]);
        if hpa["status"]["currentReplicas"] == 3 { Ok(hpa) } else { Err(hpa["status"].to_string()) }
    });
    assert_eq!(condition(&hpa, "ScalingActive")["reason"], "ValidMetricFound", "{}", hpa["status"]);
    let row = k.ok(&["get", "hpa", "web", "--no-headers"], None);
    assert!(row.contains("StatefulSet/web") && row.contains("%/50%"), "kubectl {label} get hpa: {row}");
    let events = k.ok(&["get", "events", "--field-selector", "involvedObject.name=web,involvedObject.kind=HorizontalPodAutoscaler"], None);
    assert!(events.contains("SuccessfulRescale") && events.contains("New size: 3"), "{events}");

    let rc = k.wait_for("the ReplicationController raised to its minimum", Duration::from_secs(60), |k| {
        let rc = k.json(&["get", "rc", "rc", "--show-managed-fields"]);
        if rc["spec"]["replicas"] == 2 { Ok(rc) } else { Err(rc["spec"].to_string()) }
    });
    assert!(written_through_scale(&rc), "{}", rc["metadata"]["managedFields"]);

    let hpa = k.wait_for("the DaemonSet's autoscaler to report FailedGetScale", Duration::from_secs(60), |k| {
        let hpa = k.json(&["get", "hpa", "ds"]);
        let able = condition(&hpa, "AbleToScale");
        if able["status"] == "False" { Ok(hpa) } else { Err(hpa["status"].to_string()) }
    });
    let able = condition(&hpa, "AbleToScale");
    assert_eq!(able["reason"], "FailedGetScale", "{able}");
    assert!(able["message"].as_str().is_some_and(|m| m.contains("unable to get the target's current scale")), "{able}");
    let events = k.ok(&["get", "events", "--field-selector", "involvedObject.name=ds,involvedObject.kind=HorizontalPodAutoscaler"], None);
    assert!(events.contains("FailedGetScale"), "{events}");
    assert!(k.json(&["get", "daemonset", "ds"])["spec"].get("replicas").is_none(), "nothing was written to the DaemonSet");
}

#[test]
fn kubectl_scale_writes_every_scalable_kind_through_its_scale_subresource() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Daemon::start("server", &dir.path().join("data"), &["--in-memory"]);
    let kinds = [
        ("Deployment", "deployment", "/apis/apps/v1/namespaces/default/deployments"),
        ("ReplicaSet", "replicaset", "/apis/apps/v1/namespaces/default/replicasets"),
        ("StatefulSet", "statefulset", "/apis/apps/v1/namespaces/default/statefulsets"),
        ("ReplicationController", "replicationcontroller", "/api/v1/namespaces/default/replicationcontrollers"),
    ];
    for (label, bin) in kubectls_under_test() {
        let k = Kubectl { bin, url: server.url.clone() };
        for (i, (kind, resource, path)) in kinds.iter().enumerate() {
            let name = format!("{resource}-{}", label.replace('.', "-"));
            k.ok(&["apply", "-f", "-"], Some(&scalable(kind, &name, 1, "1m")));
            let out = k.ok(&["scale", &format!("{resource}/{name}"), &format!("--replicas={}", i + 2)], None);
            assert!(out.contains(&format!("{name} scaled")), "kubectl {label} scale {resource}: {out}");
            let scale: Value = serde_json::from_str(&k.ok(&["get", "--raw", &format!("{path}/{name}/scale")], None)).expect("Scale");
            assert_eq!((scale["kind"].as_str(), scale["apiVersion"].as_str()), (Some("Scale"), Some("autoscaling/v1")));
            assert_eq!(scale["spec"]["replicas"], i + 2, "kubectl {label} scale {resource}: {scale}");
            assert_eq!(scale["status"]["selector"], format!("app={name}"), "{scale}");
            let obj = k.json(&["get", resource, &name, "--show-managed-fields"]);
            assert_eq!(obj["spec"]["replicas"], i + 2);
            assert!(written_through_scale(&obj), "kubectl {label} scale {resource}: {}", obj["metadata"]["managedFields"]);
            // --current-replicas is checked against the Scale kubectl reads first.
            let (ok, _, err) = k.run(&["scale", &format!("{resource}/{name}"), "--current-replicas=9", "--replicas=1"], None);
            assert!(!ok && err.contains("9"), "kubectl {label}: {err}");
        }
        let ds = scalable("DaemonSet", "ds", 1, "1m").replace("  replicas: 1\n", "");
        k.ok(&["apply", "-f", "-"], Some(&ds));
        let (ok, _, err) = k.run(&["scale", "daemonset/ds", "--replicas=2"], None);
        assert!(!ok, "a DaemonSet has no scale subresource; kubectl {label}: {err}");
        let (ok, _, err) = k.run(&["get", "--raw", "/apis/apps/v1/namespaces/default/daemonsets/ds/scale"], None);
        assert!(!ok && err.contains("NotFound"), "kubectl {label}: {err}");
    }
}
