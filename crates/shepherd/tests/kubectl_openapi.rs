//! kubectl's everyday verbs that read the server's OpenAPI documents, with default client-side
//! validation: apply (and re-apply with a field removed), a misspelled field refused, explain at any
//! depth, and edit; with kubectl 1.27 and the newest kubectl installed.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Daemon;

/// kubectl 1.27 and the newest installed kubectl.
fn kubectls() -> Vec<PathBuf> {
    common::kubectls_under_test().into_iter().map(|(_, bin)| bin).collect()
}

struct Kubectl<'a> {
    bin: &'a Path,
    url: &'a str,
    cache: &'a Path,
}

impl Kubectl<'_> {
    fn run(&self, args: &[&str], stdin: Option<&str>, editor: Option<&Path>) -> (bool, String, String) {
        let mut cmd = common::kubectl_command(self.bin, self.url);
        cmd.args(args).env("KUBECACHEDIR", self.cache);
        if let Some(editor) = editor {
            cmd.env("KUBE_EDITOR", editor).env("EDITOR", editor);
        }
        let (status, out, err) = common::run_with_stdin(&mut cmd, stdin);
        (status.success(), out, err)
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.run(args, stdin, None);
        assert!(ok, "{} {args:?} failed: {err}", self.bin.display());
        out
    }
}

fn deployment(namespace: &str, name: &str, extra_env: bool) -> String {
    let env = if extra_env { "        - {name: EXTRA, value: \"1\"}\n" } else { "" };
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  namespace: {namespace}
  labels: {{app: {name}{tier}}}
spec:
  replicas: 3
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers:
      - name: main
        image: minimal
        env:
        - {{name: KEPT, value: \"1\"}}
{env}",
        tier = if extra_env { ", tier: front" } else { "" },
    )
}

/// Polls `f` until it answers, for up to two minutes (the machine may be busy with other builds).
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn kubectl_applies_explains_and_edits_with_default_validation_from_the_servers_openapi() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", &dir.path().join("data"), &[]);
    for bin in kubectls() {
        let minor = bin.file_name().and_then(|n| n.to_str()).unwrap_or("kubectl").replace('.', "-");
        let cache = dir.path().join(format!("cache-{minor}"));
        let k = Kubectl { bin: &bin, url: &daemon.url, cache: &cache };
        let ns = format!("ns-{minor}");
        let what = bin.display().to_string();

        let namespace = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n");
        let out = k.ok(&["apply", "-f", "-"], Some(&namespace));
        assert!(out.contains(&format!("namespace/{ns} created")), "{what}: {out}");

        // Apply with default validation, and the Deployment runs.
        let out = k.ok(&["apply", "-f", "-"], Some(&deployment(&ns, "web", true)));
        assert_eq!(out.trim(), "deployment.apps/web created", "{what}");
        eventually(&format!("{what}: 3 running pods"), || {
            let phases =
                k.ok(&["get", "pods", "-n", &ns, "-l", "app=web", "-o", "jsonpath={.items[*].status.phase}"], None);
            (phases.split_whitespace().filter(|p| *p == "Running").count() == 3).then_some(())
        });

        // Re-apply without a label and an env entry: both are gone, the rest stays.
        let out = k.ok(&["apply", "-f", "-"], Some(&deployment(&ns, "web", false)));
        assert_eq!(out.trim(), "deployment.apps/web configured", "{what}");
        let labels = k.ok(&["get", "deploy", "web", "-n", &ns, "-o", "jsonpath={.metadata.labels}"], None);
        assert!(!labels.contains("tier") && labels.contains("\"app\":\"web\""), "{what}: {labels}");
        let env_names = "jsonpath={.spec.template.spec.containers[0].env[*].name}";
        let env = k.ok(&["get", "deploy", "web", "-n", &ns, "-o", env_names], None);
        assert_eq!(env.trim(), "KEPT", "{what}");

        // A misspelled field is refused, named, and nothing is created.
        let typo = deployment(&ns, "typo", false).replace("replicas: 3", "replicass: 3");
        let (ok, _, err) = k.run(&["apply", "-f", "-"], Some(&typo), None);
        assert!(!ok, "{what}: a misspelled field was accepted");
        assert!(err.contains("replicass"), "{what}: the error does not name the field: {err}");
        let (ok, _, err) = k.run(&["get", "deploy", "typo", "-n", &ns], None, None);
        assert!(!ok && err.contains("not found"), "{what}: {err}");

        // In a List, kubectl validates each item itself, against the protobuf /openapi/v2 document.
        let list = format!("apiVersion: v1\nkind: List\nitems:\n- {}", typo.replace('\n', "\n  "));
        let (ok, _, err) = k.run(&["apply", "-f", "-"], Some(&list), None);
        assert!(!ok, "{what}: a misspelled field in a List was accepted");
        assert!(
            err.contains("unknown field \"replicass\" in io.k8s.api.apps.v1.DeploymentSpec"),
            "{what}: not refused by client-side validation: {err}"
        );
        let ports = "deployment.spec.template.spec.containers.ports";
        let out = k.ok(&["explain", ports, "--output", "plaintext-openapiv2"], None);
        assert!(out.contains("containerPort\t<integer> -required-"), "{what}: {out}");

        // explain, at the top and deep down.
        let out = k.ok(&["explain", "pod"], None);
        assert!(out.contains("KIND:") && out.contains("Pod") && out.contains("spec\t<PodSpec>"), "{what}: {out}");
        let out = k.ok(&["explain", "deployment.spec.template.spec.containers.ports"], None);
        assert!(out.contains("containerPort\t<integer> -required-"), "{what}: {out}");
        assert!(out.contains("List of ports to expose from the container"), "{what}: {out}");
        // What Shepherd refuses is not offered.
        let out = k.ok(&["explain", "pod.spec"], None);
        assert!(out.contains("containers\t<[]Container> -required-"), "{what}: {out}");
        assert!(out.contains("volumes\t") && !out.contains("hostPID\t"), "{what}: {out}");
        let out = k.ok(&["explain", "pod.spec.volumes"], None);
        assert!(out.contains("configMap\t") && !out.contains("nfs\t"), "{what}: {out}");

        // edit, with an editor that changes the image.
        let editor = dir.path().join(format!("editor-{minor}.sh"));
        let script = "#!/bin/sh\nsed -i 's/image: minimal$/image: minimal:edited/' \"$1\"\n";
        std::fs::write(&editor, script).expect("editor");
        std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let (ok, out, err) = k.run(&["edit", "deployment", "web", "-n", &ns], None, Some(&editor));
        assert!(ok, "{what}: edit failed: {err}");
        assert!(out.contains("deployment.apps/web edited"), "{what}: {out}");
        let image_path = "jsonpath={.spec.template.spec.containers[0].image}";
        let image = k.ok(&["get", "deploy", "web", "-n", &ns, "-o", image_path], None);
        assert_eq!(image.trim(), "minimal:edited", "{what}");

        // The pods are real processes, which outlive a killed daemon: stop them first.
        k.ok(&["delete", "deployment", "web", "-n", &ns], None);
        eventually(&format!("{what}: no pods left"), || {
            k.ok(&["get", "pods", "-n", &ns, "-o", "name"], None).trim().is_empty().then_some(())
        });
    }
}
