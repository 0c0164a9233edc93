//! The commands that change or follow objects: watch, scale, label, annotate, delete, rollout,
//! events, info, version and completion, against a real `shepherd server`.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{LineReader, Shepherd};
use serde_json::json;

fn pod(s: &Shepherd, name: &str) {
    s.ok("POST", "/api/v1/namespaces/default/pods", Some(json!({"metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "web", "image": "minimal"}]}})));
}

fn deployment(s: &Shepherd) {
    s.sheepctl_stdin(&["apply", "-f", "-"], r#"{"kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":3,"selector":{"app":"web"},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"minimal"}]}}}}"#).ok();
}

#[test]
fn watch_prints_a_row_when_a_pod_changes() {
    let s = Shepherd::server();
    pod(&s, "web-0");
    let mut child = common::command(Some(&s.url), &["get", "pods", "-w"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("start watch");
    let lines = LineReader::new(child.stdout.take().expect("stdout"));
    let first = lines.until("web-0", Duration::from_secs(10));
    assert!(first[0].starts_with("NAME"), "{first:?}");
    s.ok("PATCH", "/api/v1/namespaces/default/pods/web-0/status", Some(json!({"status": {"phase": "Running"}})));
    let changed = lines.until("Running", Duration::from_secs(10));
    assert!(changed.last().is_some_and(|l| l.starts_with("web-0")), "{changed:?}");
    s.ok("PATCH", "/api/v1/namespaces/default/pods/web-0", Some(json!({"metadata": {"labels": {"tier": "front"}}})));
    assert!(lines.next(Duration::from_secs(10)).is_some_and(|l| l.starts_with("web-0")), "a label change prints a row");
    pod(&s, "web-1");
    lines.until("web-1", Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn watch_without_objects_prints_the_header_with_the_first_row() {
    let s = Shepherd::server();
    let mut child = common::command(Some(&s.url), &["get", "pods", "-w", "-A"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("start watch");
    let lines = LineReader::new(child.stdout.take().expect("stdout"));
    std::thread::sleep(Duration::from_millis(300));
    pod(&s, "late");
    let seen = lines.until("late", Duration::from_secs(10));
    assert!(seen[0].starts_with("NAMESPACE   NAME"), "{seen:?}");
    assert!(seen[1].starts_with("default     late"), "{seen:?}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn scale_sets_replicas_through_the_scale_subresource() {
    let s = Shepherd::server();
    deployment(&s);
    assert_eq!(s.sheepctl(&["scale", "deployment/web", "--replicas=5"]).ok(), "deployment.apps/web scaled\n");
    assert_eq!(s.ok("GET", "/apis/apps/v1/namespaces/default/deployments/web", None)["spec"]["replicas"], 5);
    assert_eq!(s.sheepctl(&["scale", "deploy", "web", "--replicas", "0"]).ok(), "deployment.apps/web scaled\n");
    assert_eq!(s.ok("GET", "/apis/apps/v1/namespaces/default/deployments/web", None)["spec"]["replicas"], 0);
    let pods = s.sheepctl(&["scale", "pod", "x", "--replicas=1"]);
    assert_eq!(pods.code, 1);
    assert_eq!(pods.stderr, "Error: pods cannot be scaled: only deployments and replicasets have a scale subresource\n");
}

#[test]
fn label_and_annotate_set_and_remove_keys() {
    let s = Shepherd::server();
    pod(&s, "web-0");
    assert_eq!(s.sheepctl(&["label", "pod", "web-0", "tier=front", "env=prod"]).ok(), "pod/web-0 labeled\n");
    assert_eq!(s.sheepctl(&["get", "pods", "-l", "tier=front,env=prod", "-o", "name"]).ok(), "pod/web-0\n");
    let refused = s.sheepctl(&["label", "pod/web-0", "tier=back"]);
    assert_eq!(refused.stderr, "Error: 'tier' already has a value (front), and --overwrite is false\n");
    s.sheepctl(&["label", "pod/web-0", "tier=back", "--overwrite", "env-"]).ok();
    let labels = s.ok("GET", "/api/v1/namespaces/default/pods/web-0", None)["metadata"]["labels"].clone();
    assert_eq!(labels, json!({"app": "web", "tier": "back"}));
    assert_eq!(s.sheepctl(&["annotate", "po", "web-0", "note=hello world"]).ok(), "pod/web-0 annotated\n");
    assert_eq!(s.ok("GET", "/api/v1/namespaces/default/pods/web-0", None)["metadata"]["annotations"]["note"], "hello world");
    s.sheepctl(&["annotate", "po", "web-0", "note-"]).ok();
    assert!(s.ok("GET", "/api/v1/namespaces/default/pods/web-0", None)["metadata"]["annotations"].get("note").is_none());
}

#[test]
fn delete_by_name_and_by_file_with_cascade_and_wait() {
    let s = Shepherd::server();
    pod(&s, "a");
    pod(&s, "b");
    assert_eq!(s.sheepctl(&["delete", "pod", "a", "b", "--wait"]).ok(), "pod \"a\" deleted\npod \"b\" deleted\n");
    assert_eq!(s.api("GET", "/api/v1/namespaces/default/pods/a", None).0, 404);
    deployment(&s);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("d.json");
    std::fs::write(&file, r#"{"kind":"Deployment","metadata":{"name":"web"},"spec":{"selector":{"app":"web"},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"minimal"}]}}}}"#).expect("write");
    // Orphaning is the garbage collector's job (it removes the `orphan` finalizer); without one
    // the object stays, marked for deletion.
    let out = s.sheepctl(&["delete", "-f", file.to_str().expect("path"), "--cascade=orphan"]);
    assert_eq!(out.ok(), "deployment.apps \"web\" deleted\n");
    let d = s.ok("GET", "/apis/apps/v1/namespaces/default/deployments/web", None);
    assert!(d["metadata"]["deletionTimestamp"].is_string(), "{d}");
    assert_eq!(d["metadata"]["finalizers"], json!(["orphan"]));
    assert_eq!(s.sheepctl(&["delete", "pod", "gone", "--ignore-not-found"]).code, 0);
}

#[test]
fn foreground_delete_with_wait_times_out_naming_the_finalizer_while_dependents_remain() {
    // Without a garbage collector running, the foreground finalizer stays and --wait must say so.
    let s = Shepherd::server();
    deployment(&s);
    let out = s.sheepctl(&["delete", "deploy", "web", "--cascade=foreground", "--wait", "--timeout=1"]);
    assert_eq!(out.code, 1);
    assert_eq!(out.stdout, "deployment.apps \"web\" deleted\n");
    assert_eq!(out.stderr, "Error: timed out waiting for deployment.apps \"web\" to be deleted (finalizers: foregroundDeletion)\n");
}

fn set_status(s: &Shepherd, status: serde_json::Value) {
    s.ok("PATCH", "/apis/apps/v1/namespaces/default/deployments/web/status", Some(json!({"status": status})));
}

#[test]
fn rollout_status_follows_progress_and_exits_zero_when_done() {
    let s = Shepherd::server();
    deployment(&s);
    set_status(&s, json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 1}));
    let mut child = common::command(Some(&s.url), &["rollout", "status", "deployment/web"]).stdout(Stdio::piped()).spawn().expect("start");
    let lines = LineReader::new(child.stdout.take().expect("stdout"));
    assert_eq!(lines.next(Duration::from_secs(10)).as_deref(),
        Some("Waiting for deployment \"web\" rollout to finish: 1 of 3 updated replicas are available..."));
    set_status(&s, json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 2}));
    assert_eq!(lines.next(Duration::from_secs(10)).as_deref(),
        Some("Waiting for deployment \"web\" rollout to finish: 2 of 3 updated replicas are available..."));
    set_status(&s, json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3}));
    assert_eq!(lines.next(Duration::from_secs(10)).as_deref(), Some("deployment \"web\" successfully rolled out"));
    let status = child.wait().expect("exit");
    assert!(status.success());
}

#[test]
fn rollout_status_fails_on_progress_deadline_exceeded() {
    let s = Shepherd::server();
    deployment(&s);
    set_status(&s, json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 0,
        "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}));
    let out = s.sheepctl(&["rollout", "status", "deploy", "web"]);
    assert_eq!(out.code, 1);
    assert_eq!(out.stderr, "Error: deployment \"web\" exceeded its progress deadline\n");
}

#[test]
fn rollout_restart_stamps_the_template() {
    let s = Shepherd::server();
    deployment(&s);
    assert_eq!(s.sheepctl(&["rollout", "restart", "deployment/web"]).ok(), "deployment.apps/web restarted\n");
    let d = s.ok("GET", "/apis/apps/v1/namespaces/default/deployments/web", None);
    assert!(d["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"].is_string(), "{d}");
    assert_eq!(d["metadata"]["generation"], 2);
}

#[test]
fn info_version_and_completion() {
    let s = Shepherd::server();
    deployment(&s);
    let info = common::redact(s.sheepctl(&["info"]).ok());
    insta::assert_snapshot!(info);
    let version = s.sheepctl(&["version"]);
    assert!(version.ok().starts_with(&format!("Client Version: sheepctl {}\nServer Version: v", env!("CARGO_PKG_VERSION"))), "{version:?}");
    for shell in ["bash", "zsh", "fish"] {
        let out = common::sheepctl(None, &["completion", shell], None);
        assert!(out.ok().contains("rollout"), "{shell} completion mentions subcommands");
    }
}

#[test]
fn create_makes_config_maps_secrets_and_service_accounts_from_kubectl_flags() {
    let s = Shepherd::server();
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("app.conf");
    std::fs::write(&conf, "port=8080\n").expect("write");
    let conf = conf.display().to_string();

    let out = s.sheepctl(&["create", "configmap", "app", "--from-literal=a=1", &format!("--from-file={conf}")]);
    assert_eq!(out.ok(), "configmap/app created\n");
    let cm = s.ok("GET", "/api/v1/namespaces/default/configmaps/app", None);
    assert_eq!(cm["data"], json!({"a": "1", "app.conf": "port=8080\n"}));

    assert_eq!(s.sheepctl(&["create", "secret", "generic", "db", "--from-literal=password=s3cret!"]).ok(), "secret/db created\n");
    let secret = s.ok("GET", "/api/v1/namespaces/default/secrets/db", None);
    assert_eq!((secret["type"].as_str(), secret["data"]["password"].as_str()), (Some("Opaque"), Some("czNjcmV0IQ==")));
    let described = s.sheepctl(&["describe", "secret", "db"]);
    assert!(described.ok().contains("password:  7 bytes") && !described.ok().contains("s3cret"), "{}", described.ok());

    let out = s.sheepctl(&["create", "secret", "docker-registry", "pull", "--docker-server=r.local:5000",
        "--docker-username=u", "--docker-password=p"]);
    assert_eq!(out.ok(), "secret/pull created\n");
    let pull = s.ok("GET", "/api/v1/namespaces/default/secrets/pull", None);
    assert_eq!(pull["type"], "kubernetes.io/dockerconfigjson");

    // The server's validation speaks for a bad Secret; nothing is created.
    let refused = s.sheepctl(&["create", "secret", "generic", "half", "--type=kubernetes.io/tls", "--from-literal=tls.crt=x"]);
    assert!(refused.code != 0 && refused.stderr.contains("data[tls.key]: Required value"), "{}", refused.stderr);
    assert_eq!(s.api("GET", "/api/v1/namespaces/default/secrets/half", None).0, 404);

    assert_eq!(s.sheepctl(&["create", "sa", "bot"]).ok(), "serviceaccount/bot created\n");
    let yaml = s.sheepctl(&["create", "configmap", "preview", "--from-literal=k=v", "--dry-run=client", "-o", "yaml"]);
    assert!(yaml.ok().contains("kind: ConfigMap") && yaml.ok().contains("k: v"), "{}", yaml.ok());
    assert_eq!(s.api("GET", "/api/v1/namespaces/default/configmaps/preview", None).0, 404, "a client dry run sends nothing");
}

#[test]
fn create_makes_jobs_and_cronjobs_and_a_job_from_a_cronjob() {
    let s = Shepherd::server();
    assert_eq!(s.sheepctl(&["create", "job", "pi", "--image=busybox", "--", "sh", "-c", "echo 3.14"]).ok(), "job.batch/pi created\n");
    let job = s.ok("GET", "/apis/batch/v1/namespaces/default/jobs/pi", None);
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["command"], json!(["sh", "-c", "echo 3.14"]));
    assert_eq!(job["spec"]["completions"], 1, "the server defaulted it");

    let out = s.sheepctl(&["create", "cronjob", "tick", "--image=busybox", "--schedule=*/5 * * * *", "--", "date"]);
    assert_eq!(out.ok(), "cronjob.batch/tick created\n");
    assert_eq!(s.sheepctl(&["create", "job", "tick-now", "--from=cronjob/tick"]).ok(), "job.batch/tick-now created\n");
    let manual = s.ok("GET", "/apis/batch/v1/namespaces/default/jobs/tick-now", None);
    assert_eq!(manual["metadata"]["ownerReferences"][0]["name"], "tick");
    assert_eq!(manual["spec"]["template"]["spec"]["containers"][0]["command"], json!(["date"]));

    let refused = s.sheepctl(&["create", "cronjob", "bad", "--image=busybox", "--schedule=61 * * * *"]);
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("spec.schedule"), "{}", refused.stderr);
}
