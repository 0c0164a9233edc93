//! Add-ons by files: manifests in `<data-dir>/manifests/` are applied at start and when they
//! change, a broken file is reported (Event and log) while the others apply, and removing a file
//! deletes only the objects that ask for it. Real binaries; kubectl as the client.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Daemon, Kubectl};

fn write(dir: &Path, name: &str, text: &str) {
    // Written aside and renamed, as an editor or a configuration tool does: never seen half-written.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).expect("write manifest");
    std::fs::rename(&tmp, dir.join(name)).expect("rename manifest");
}

fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what} within 30 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn data_of(k: &Kubectl, name: &str) -> Option<String> {
    let (ok, out, _) = k.run(&["get", "configmap", name, "-o", "jsonpath={.data.greeting}"], None);
    ok.then_some(out)
}

#[test]
fn manifests_in_the_data_dir_are_applied_at_start_and_on_change_and_a_broken_one_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests).expect("mkdir");
    write(&manifests, "00-namespace.yaml", "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: tools\n");
    write(
        &manifests,
        "10-config.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hello\n  namespace: tools\ndata:\n  greeting: hi\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kept\ndata:\n  greeting: stays\n",
    );
    write(&manifests, "20-broken.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: [name: broken\n");
    write(&manifests, "30-unknown.json", r#"{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}"#);
    let daemon = Daemon::start("standalone", dir.path(), &["--runtime", "simulated"]);
    let k = Kubectl { bin: common::installed_kubectl(), url: daemon.url.clone() };

    // Applied at start, the namespace's file before the one that uses it.
    until("the ConfigMap in the file's namespace", || {
        let (ok, out, _) = k.run(&["get", "configmap", "hello", "-n", "tools", "-o", "jsonpath={.data.greeting}"], None);
        (ok && out == "hi").then_some(())
    });
    assert_eq!(data_of(&k, "kept").as_deref(), Some("stays"));
    let managers = k.ok(&["get", "configmap", "kept", "--show-managed-fields", "-o", "jsonpath={.metadata.managedFields[*].manager}"], None);
    assert_eq!(managers, "shepherd-manifests", "applied by server-side apply under its own field manager");

    // The broken and the unknown files are reported, each as a Warning Event `kubectl get events`
    // lists (about the kube-system Namespace, so in `default` as for any cluster-scoped object).
    let events = until("two ManifestFailed Events", || {
        let list = k.json(&["get", "events"]);
        let failed: Vec<String> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["reason"] == "ManifestFailed" && e["type"] == "Warning")
            .map(|e| e["message"].as_str().unwrap_or("").to_string())
            .collect();
        (failed.len() >= 2).then(|| failed.join("\n"))
    });
    assert!(events.contains("20-broken.yaml: malformed YAML"), "{events}");
    assert!(events.contains("30-unknown.json: example.com/v1 Widget: no such kind is served"), "{events}");

    // A change is applied again; the user's own fields stay.
    k.ok(&["label", "configmap", "kept", "owner=me"], None);
    write(
        &manifests,
        "10-config.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kept\ndata:\n  greeting: changed\n",
    );
    until("the changed file applied", || data_of(&k, "kept").filter(|d| d == "changed"));
    assert_eq!(k.ok(&["get", "configmap", "kept", "-o", "jsonpath={.metadata.labels.owner}"], None), "me");

    // The broken file, fixed, applies; its removal leaves its object unless the object asks.
    write(
        &manifests,
        "20-broken.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fixed\ndata:\n  greeting: ok\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: temporary\n  annotations:\n    manifests.shepherd.io/delete-with-file: \"true\"\ndata:\n  greeting: bye\n",
    );
    until("the fixed file applied", || data_of(&k, "temporary").filter(|d| d == "bye"));
    std::fs::remove_file(manifests.join("20-broken.yaml")).expect("remove");
    until("the annotated object deleted with its file", || data_of(&k, "temporary").is_none().then_some(()));
    assert_eq!(data_of(&k, "fixed").as_deref(), Some("ok"), "an object without the annotation stays");
}
