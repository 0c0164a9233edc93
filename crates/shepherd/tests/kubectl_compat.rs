//! kubectl 1.27 and the newest preinstalled kubectl, unmodified, through every everyday verb
//! against one `shepherd standalone`; prints a verb x version table and requires every row to pass.
//!
//! Adding a verb is adding one line to `ROWS`. Rows run in order inside one namespace per
//! kubectl version, so a row may rely on what the rows before it created.

mod common;
#[path = "compat/crd.rs"]
mod crd;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use common::Daemon;
use serde_json::Value;

/// One kubectl binary under test, with the namespace its rows work in.
struct Kubectl {
    label: String,
    bin: PathBuf,
    url: String,
    namespace: String,
    /// kubectl's HOME: its discovery cache starts empty and is not shared with other runs.
    home: PathBuf,
    manifests: PathBuf,
}

type Outcome = Result<(), String>;

/// A row of the table: the verb as shown, and the check that runs it.
type Row = (&'static str, fn(&Kubectl) -> Outcome);

impl Kubectl {
    /// Runs `kubectl --server URL -n NS ARGS`, returning stdout, or stdout and stderr on failure.
    fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(&self.bin)
            .args(["--server", &self.url, "--namespace", &self.namespace, "--request-timeout", "60s"])
            .args(args)
            .env("KUBECONFIG", "/dev/null")
            .env("HOME", &self.home)
            .current_dir(&self.manifests)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {}: {e}", self.bin.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(stdout)
        } else {
            Err(format!("kubectl {} exited {}:\n{stdout}{}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// Succeeds and prints every one of `wanted`.
    fn expect(&self, args: &[&str], wanted: &[&str]) -> Outcome {
        let out = self.run(args)?;
        match wanted.iter().find(|w| !out.contains(*w)) {
            Some(missing) => Err(format!("kubectl {}: {missing:?} missing from\n{out}", args.join(" "))),
            None => Ok(()),
        }
    }

    /// Fails, and says every one of `wanted` (in stdout or stderr).
    fn expect_failure(&self, args: &[&str], wanted: &[&str]) -> Outcome {
        match self.run(args) {
            Ok(out) => Err(format!("kubectl {} succeeded, but should have failed:\n{out}", args.join(" "))),
            Err(err) => match wanted.iter().find(|w| !err.contains(*w)) {
                Some(missing) => Err(format!("{missing:?} missing from\n{err}")),
                None => Ok(()),
            },
        }
    }

    /// After `apply --server-side` over a client-side apply: kubectl's apply manager owns what the
    /// client-side one did, and the client-side manager is gone from the Deployment.
    fn migrated_to_server_side(&self) -> Outcome {
        let d = self.json(&["get", "deployment", "web", "-o", "json", "--show-managed-fields"])?;
        let entries = d["metadata"]["managedFields"].as_array().cloned().unwrap_or_default();
        let names: Vec<String> =
            entries.iter().map(|e| format!("{} {}", e["manager"].as_str().unwrap_or(""), e["operation"].as_str().unwrap_or(""))).collect();
        if names.iter().any(|n| n.starts_with("kubectl-client-side-apply ")) || !names.contains(&"kubectl Apply".to_string()) {
            return Err(format!("managers after the migration: {names:?}"));
        }
        if d["spec"]["replicas"] != 2 {
            return Err(format!("--force-conflicts did not take spec.replicas: {}", d["spec"]));
        }
        Ok(())
    }

    /// Succeeds and prints exactly `wanted` (surrounding whitespace aside).
    fn expect_exactly(&self, args: &[&str], wanted: &str) -> Outcome {
        let out = self.run(args)?;
        if out.trim() == wanted { Ok(()) } else { Err(format!("kubectl {}: wanted {wanted:?}, got {out:?}", args.join(" "))) }
    }

    /// `-o json` output, parsed.
    fn json(&self, args: &[&str]) -> Result<Value, String> {
        let out = self.run(args)?;
        serde_json::from_str(&out).map_err(|e| format!("kubectl {}: not JSON ({e}):\n{out}", args.join(" ")))
    }

    fn rolled_out(&self) -> Outcome {
        self.expect(&["rollout", "status", "deployment/web", "--timeout=120s"], &["successfully rolled out"])
    }

    /// A plain HTTP GET, as the Python client sends it, which must answer 200 with `field` in the body.
    fn http_get(&self, path: &str, field: &str) -> Outcome {
        let url = format!("{}{path}", self.url);
        let body = get_json(&url)?;
        if body.get(field).is_some() { Ok(()) } else { Err(format!("GET {path}: no {field:?} in {body}")) }
    }
}

/// A blocking GET on top of the async client the tests already use.
fn get_json(url: &str) -> Result<Value, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let resp = reqwest::get(url).await.map_err(|e| format!("GET {url}: {e}"))?;
        let code = resp.status();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if !code.is_success() {
            return Err(format!("GET {url}: {code}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("GET {url}: not JSON ({e}): {text}"))
    })
}

const APP: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: minimal
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
  - port: 80
";

/// The Deployment of [`APP`] without its `app` label: applied server-side, the label goes.
const APP_WITHOUT_LABEL: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: minimal
";

/// The verbs, in the order they run: (row name, check). One line each.
#[rustfmt::skip]
const ROWS: &[Row] = &[
    ("python client: GET /version/", |k| k.http_get("/version/", "gitVersion")),
    ("python client: GET /apis/", |k| k.http_get("/apis/", "groups")),
    ("api-resources", |k| k.expect(&["api-resources"], &["deployments", "deploy", "apps/v1", "Deployment", "leases"])),
    ("api-resources --categories=all", |k| k.expect(&["api-resources", "--categories=all", "-o", "name"], &["pods", "services", "deployments.apps", "replicasets.apps"])),
    ("apply --validate=false", |k| k.expect(&["apply", "--validate=false", "-f", "app.yaml"], &["deployment.apps/web created", "service/web created"])),
    ("rollout status", |k| k.rolled_out()),
    ("wait --for=condition=Available", |k| k.expect(&["wait", "--for=condition=Available", "deployment/web", "--timeout=120s"], &["condition met"])),
    ("get", |k| k.expect(&["get", "deployments"], &["NAME", "web", "2/2"])),
    ("get -o yaml", |k| k.expect(&["get", "deployment", "web", "-o", "yaml"], &["kind: Deployment", "replicas: 2", "image: minimal"])),
    ("get -o json", |k| k.json(&["get", "svc", "web", "-o", "json"]).and_then(|v| {
        if v["status"]["loadBalancer"].is_object() { Ok(()) } else { Err(format!("no status.loadBalancer in {v}")) }
    })),
    ("get -o wide", |k| k.expect(&["get", "pods", "-o", "wide"], &["NODE", "web-"])),
    ("get -o name", |k| k.expect_exactly(&["get", "deploy", "-o", "name"], "deployment.apps/web")),
    ("get -o jsonpath", |k| k.expect_exactly(&["get", "deploy", "web", "-o", "jsonpath={.spec.replicas}"], "2")),
    ("get deploy,rs,svc (comma kinds)", |k| k.expect(&["get", "deploy,rs,svc"], &["deployment.apps/web", "replicaset.apps/web-", "service/web"])),
    ("get all", |k| k.expect(&["get", "all"], &["pod/web-", "service/web", "deployment.apps/web", "replicaset.apps/web-"])),
    ("autoscale", |k| k.expect(&["autoscale", "deployment", "web", "--cpu-percent=50", "--min=1", "--max=5"], &["horizontalpodautoscaler.autoscaling/web autoscaled"])),
    ("get hpa", |k| k.expect(&["get", "hpa", "web"], &["REFERENCE", "TARGETS", "Deployment/web", "/50%"])),
    ("delete hpa", |k| k.expect(&["delete", "hpa", "web"], &["deleted"])),
    ("get by short name (po)", |k| k.expect(&["get", "po"], &["web-"])),
    ("describe deployment", |k| k.expect(&["describe", "deployment", "web"], &["Name:", "web", "Replicas:"])),
    ("describe service", |k| k.expect(&["describe", "service", "web"], &["Name:", "web", "Selector:"])),
    ("logs", |k| k.run(&["logs", "deployment/web"]).map(drop)),
    ("scale", |k| k.expect(&["scale", "deployment/web", "--replicas=3"], &["deployment.apps/web scaled"])),
    ("rollout status after scale", |k| k.rolled_out()),
    ("label", |k| k.expect(&["label", "deployment", "web", "tier=fe"], &["deployment.apps/web labeled"])),
    ("annotate", |k| k.expect(&["annotate", "deployment", "web", "note=compat"], &["deployment.apps/web annotate"])), // 1.27 prints "annotate"
    ("patch --type=merge", |k| k.expect(&["patch", "deployment", "web", "--type=merge", "-p", r#"{"metadata":{"labels":{"m":"1"}}}"#], &["patched"])),
    ("patch --type=json", |k| k.expect(&["patch", "deployment", "web", "--type=json", "-p", r#"[{"op":"add","path":"/metadata/labels/j","value":"1"}]"#], &["patched"])),
    ("patch (strategic)", |k| k.expect(&["patch", "deployment", "web", "-p", r#"{"spec":{"template":{"metadata":{"annotations":{"rev":"2"}}}}}"#], &["patched"])),
    ("rollout status after patch", |k| k.rolled_out()),
    ("rollout history", |k| k.expect(&["rollout", "history", "deployment/web"], &["REVISION", "1", "2"])),
    ("rollout restart", |k| k.expect(&["rollout", "restart", "deployment/web"], &["restarted"])),
    ("rollout status after restart", |k| k.rolled_out()),
    ("rollout undo", |k| k.expect(&["rollout", "undo", "deployment/web"], &["rolled back"])),
    ("rollout status after undo", |k| k.rolled_out()),
    ("apply --server-side: 409 names the manager", |k| k.expect_failure(&["apply", "--server-side", "-f", "app.yaml"], &["Apply failed with 1 conflict", "with subresource \"scale\"", ".spec.replicas", "--force-conflicts"])),
    ("apply --server-side --force-conflicts", |k| k.expect(&["apply", "--server-side", "--force-conflicts", "-f", "app.yaml"], &["deployment.apps/web serverside-applied", "service/web serverside-applied"])),
    ("client-side to server-side migration", |k| k.migrated_to_server_side()),
    ("apply --server-side, a field removed", |k| k.run(&["apply", "--server-side", "-f", "app-without-label.yaml"])
        .and_then(|_| k.expect_exactly(&["get", "deploy", "web", "-o", "jsonpath={.metadata.labels.app}|{.metadata.labels.tier}"], "|fe"))),
    ("create configmap", |k| k.expect(&["create", "configmap", "app", "--from-literal=a=1", "--from-literal=b=two"], &["configmap/app created"])),
    ("get configmap (cm)", |k| k.expect(&["get", "cm", "app"], &["NAME", "DATA", "app    2"])),
    ("describe configmap", |k| k.expect(&["describe", "configmap", "app"], &["Data", "a:", "two"])),
    ("create secret generic", |k| k.expect(&["create", "secret", "generic", "creds", "--from-literal=password=s3cret!"], &["secret/creds created"])),
    ("get secret -o yaml (base64)", |k| k.expect(&["get", "secret", "creds", "-o", "yaml"], &["password: czNjcmV0IQ==", "type: Opaque"])),
    ("describe secret (sizes, no values)", |k| {
        let out = k.run(&["describe", "secret", "creds"])?;
        if out.contains("password:") && out.contains("7 bytes") && !out.contains("s3cret") { Ok(()) } else { Err(format!("describe secret:\n{out}")) }
    }),
    ("create secret tls without a key: refused", |k| match k.run(&["create", "secret", "generic", "bad", "--type=kubernetes.io/tls", "--from-literal=tls.crt=x"]) {
        Err(e) if e.contains("data[tls.key]: Required value") => Ok(()),
        other => Err(format!("wanted 422 naming data[tls.key], got {other:?}")),
    }),
    ("create serviceaccount", |k| k.expect(&["create", "serviceaccount", "bot"], &["serviceaccount/bot created"])),
    ("get sa (default made by the controller)", |k| k.expect(&["get", "sa"], &["default", "bot"])),
    ("delete", |k| k.expect(&["delete", "deployment", "web", "--wait=false"], &["deployment.apps \"web\" deleted"])),
    ("delete service", |k| k.expect(&["delete", "service", "web", "--wait=false"], &["service \"web\" deleted"])),
    ("crd: apply definition, served within 1 s", crd::create_and_serve),
    ("crd: apply object (default validation)", crd::apply_object),
    ("crd: get -o wide (printer columns)", crd::wide_columns),
    ("crd: re-apply, label, get by short name", crd::reapply_and_label),
    ("crd: explain", crd::explain),
    ("crd: describe", crd::describe),
    ("crd: defaulting and pruning", crd::defaulted_and_pruned),
    ("crd: invalid object names the field", crd::invalid_object),
    ("crd: scale subresource", crd::scale),
    ("crd: status subresource ignores spec", crd::status_ignores_spec),
    ("crd: non-structural schema refused", crd::non_structural_refused),
    ("crd: pod owned by a custom object collected", crd::owned_pod_collected),
    ("crd: custom object owned by a pod collected", crd::custom_dependent_collected),
    ("crd: foreground deletion of a custom owner", crd::foreground_deletion),
    ("crd: delete definition removes its objects", crd::delete_definition),
];

fn create_namespace(url: &str, name: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let code = rt.block_on(async {
        let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        reqwest::Client::new().post(format!("{url}/api/v1/namespaces")).json(&body).send().await.map(|r| r.status())
    });
    assert!(code.as_ref().is_ok_and(|c| c.is_success()), "creating namespace {name}: {code:?}");
}

#[test]
fn kubectl_1_27_and_the_newest_kubectl_pass_every_everyday_verb() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", &dir.path().join("data"), &[]);
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    std::fs::write(manifests.join("app.yaml"), APP).expect("write manifest");
    std::fs::write(manifests.join("app-without-label.yaml"), APP_WITHOUT_LABEL).expect("write manifest");

    let started = Instant::now();
    let mut results: Vec<(String, Vec<Outcome>)> = ROWS.iter().map(|(name, _)| (name.to_string(), Vec::new())).collect();
    let binaries = common::kubectls_under_test();
    for (label, bin) in &binaries {
        let namespace = format!("compat-{}", label.replace('.', "-"));
        create_namespace(&daemon.url, &namespace);
        let home = dir.path().join(format!("home-{label}"));
        std::fs::create_dir_all(&home).expect("home");
        let k = Kubectl { label: label.clone(), bin: bin.clone(), url: daemon.url.clone(), namespace, home, manifests: manifests.clone() };
        for (i, (_, check)) in ROWS.iter().enumerate() {
            results[i].1.push(check(&k));
        }
        eprintln!("kubectl {} done after {:?}", k.label, started.elapsed());
    }

    let width = ROWS.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut table = format!("{:width$}", "verb");
    for (label, _) in &binaries {
        table.push_str(&format!("  {label:>7}"));
    }
    table.push('\n');
    let mut failures = Vec::new();
    for (name, outcomes) in &results {
        table.push_str(&format!("{name:width$}"));
        for ((label, _), outcome) in binaries.iter().zip(outcomes) {
            table.push_str(&format!("  {:>7}", if outcome.is_ok() { "pass" } else { "FAIL" }));
            if let Err(e) = outcome {
                failures.push(format!("[{label}] {name}: {e}"));
            }
        }
        table.push('\n');
    }
    println!("{table}");
    assert!(failures.is_empty(), "{table}\n{}", failures.join("\n\n"));
}
