//! ConfigMaps and Secrets as pods use them, driven by real kubectl (1.27 and the newest) against a
//! real `shepherd standalone`: environment from `envFrom`, configMap and secret volumes whose
//! files follow edits without a restart, a pod waiting in `CreateContainerConfigError` until its
//! ConfigMap exists, an emptyDir shared by two containers, and bad input refused naming the field.
//!
//! The process runtime binds volumes in each container's mount namespace, so this needs root.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, kubectl_command, kubectls_under_test, run_with_stdin};

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(uid, 0, "volume tests need root: the process runtime mounts volumes in a mount namespace (run as root, as CI does)");
}

struct Kubectl<'a> {
    bin: &'a Path,
    url: &'a str,
    ns: String,
}

impl Kubectl<'_> {
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = kubectl_command(self.bin, self.url);
        cmd.args(["-n", &self.ns]).args(args);
        cmd
    }

    /// Runs kubectl; (success, stdout, stderr).
    fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let (status, out, err) = run_with_stdin(&mut self.command(args), stdin);
        (status.success(), out, err)
    }

    fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.run(args, stdin);
        assert!(ok, "kubectl {args:?} failed: {err}{out}");
        out
    }

    /// Polls `kubectl args` until its stdout contains `want`; returns how long that took.
    fn wait_for(&self, args: &[&str], want: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let (_, out, err) = self.run(args, None);
            if out.contains(want) {
                return start.elapsed();
            }
            assert!(start.elapsed() < limit, "kubectl {args:?} did not show {want:?} within {limit:?}; last: {out}{err}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn mounted_under(dir: &Path) -> bool {
    let dir = dir.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mounts").unwrap_or_default().lines().any(|l| l.contains(&dir))
}

/// Waits until nothing is mounted under `dir` (a deleted pod's tmpfs volumes are unmounted).
fn wait_unmounted(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while mounted_under(dir) {
        assert!(Instant::now() < deadline, "a deleted pod's tmpfs is still mounted under {}", dir.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn daemon() -> (tempfile::TempDir, Daemon) {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", &dir.path().join("data"), &[]);
    (dir, daemon)
}

/// Each kubectl under test gets a namespace of its own on one daemon.
fn each_kubectl(url: &str, prefix: &str, mut f: impl FnMut(&Kubectl)) {
    for (label, bin) in kubectls_under_test() {
        let ns = format!("{prefix}-{}", label.replace('.', "-"));
        let k = Kubectl { bin: &bin, url, ns: ns.clone() };
        k.ok(&["create", "namespace", &ns], None);
        eprintln!("kubectl {label}: namespace {ns}");
        f(&k);
    }
}

const APP_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata: {name: app}
spec:
  containers:
  - name: c
    image: minimal
    command: ["sh", "-c", "while :; do echo \"file a=$(cat /srv/a) env a=$a sub a=$(cat /etc/hostname)\"; sleep 0.2; done"]
    envFrom: [{configMapRef: {name: app}}]
    # A subPath mount binds the file as it is at the start: it does not follow edits (as in Kubernetes).
    volumeMounts: [{name: conf, mountPath: /srv}, {name: conf, mountPath: /etc/hostname, subPath: a}]
  volumes: [{name: conf, configMap: {name: app}}]
"#;

#[test]
fn a_config_map_reaches_a_pod_as_environment_and_files_and_the_files_follow_edits() {
    let (_dir, daemon) = daemon();
    each_kubectl(&daemon.url, "cm", |k| {
        k.ok(&["create", "configmap", "app", "--from-literal=a=1", "--from-literal=1bad=x"], None);
        k.ok(&["apply", "-f", "-"], Some(APP_POD));
        k.wait_for(&["logs", "app"], "file a=1 env a=1 sub a=1", Duration::from_secs(60));
        // A key that is no variable name is skipped, and an Event says so.
        let skipped = format!("Keys [1bad] from the EnvFrom configmap {}/app were skipped", k.ns);
        k.wait_for(&["get", "events", "--field-selector", "reason=InvalidEnvironmentVariableNames"], &skipped, Duration::from_secs(10));

        k.ok(&["patch", "configmap", "app", "-p", r#"{"data":{"a":"2"}}"#], None);
        k.wait_for(&["logs", "app"], "file a=2 env a=1 sub a=1", Duration::from_secs(10));

        let applied = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\ndata: {a: \"3\"}\n";
        k.ok(&["apply", "-f", "-"], Some(applied));
        k.wait_for(&["logs", "app"], "file a=3 env a=1 sub a=1", Duration::from_secs(10));

        let mut edit = k.command(&["edit", "configmap", "app"]);
        edit.env("KUBE_EDITOR", r#"sed -i -e 's/^  a: .*/  a: "4"/'"#);
        let (status, out, err) = run_with_stdin(&mut edit, None);
        assert!(status.success(), "kubectl edit: {err}{out}");
        k.wait_for(&["logs", "app"], "file a=4 env a=1 sub a=1", Duration::from_secs(10));

        let restarts = k.ok(&["get", "pod", "app", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"], None);
        assert_eq!(restarts, "0", "the files changed without a restart");
        k.ok(&["delete", "pod", "app", "--wait=false"], None);
    });
}

#[test]
fn a_secret_from_a_file_is_mounted_with_its_mode_and_never_printed_by_describe() {
    let (dir, daemon) = daemon();
    let token = dir.path().join("token");
    std::fs::write(&token, "hunter2-very-secret").expect("write token");
    each_kubectl(&daemon.url, "secret", |k| {
        k.ok(&["create", "secret", "generic", "creds", &format!("--from-file=token={}", token.display())], None);
        let pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  containers:
  - name: c
    image: minimal
    command: ["sh", "-c", "echo \"mode=$(stat -L -c %a /srv/token) token=$(cat /srv/token) fs=$(stat -f -c %T /srv)\"; \
      echo env=$TOKEN; touch /srv/x 2>/dev/null || echo read-only; sleep 1000"]
    env: [{name: TOKEN, valueFrom: {secretKeyRef: {name: creds, key: token}}}]
    volumeMounts: [{name: creds, mountPath: /srv}]
  volumes: [{name: creds, secret: {secretName: creds, defaultMode: 0400}}]
"#;
        k.ok(&["apply", "-f", "-"], Some(pod));
        k.wait_for(&["logs", "reader"], "mode=400 token=hunter2-very-secret fs=tmpfs", Duration::from_secs(60));
        k.wait_for(&["logs", "reader"], "env=hunter2-very-secret", Duration::from_secs(10));
        k.wait_for(&["logs", "reader"], "read-only", Duration::from_secs(10));

        let described = k.ok(&["describe", "secret", "creds"], None);
        assert!(!described.contains("hunter2"), "describe printed the value: {described}");
        assert!(described.contains("token:") && described.contains("19 bytes"), "{described}");
        let yaml = k.ok(&["get", "secret", "creds", "-o", "yaml"], None);
        assert!(yaml.contains("token: aHVudGVyMi12ZXJ5LXNlY3JldA=="), "base64 in -o yaml: {yaml}");
        k.ok(&["delete", "pod", "reader", "--grace-period=1", "--timeout=60s"], None);
        wait_unmounted(dir.path());
    });
}

#[test]
fn a_pod_waits_for_its_missing_config_map_and_starts_once_it_exists() {
    let (_dir, daemon) = daemon();
    each_kubectl(&daemon.url, "wait", |k| {
        let pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: patient}
spec:
  containers:
  - name: c
    image: minimal
    command: ["sh", "-c", "echo \"greeting=$GREETING\"; sleep 1000"]
    env: [{name: GREETING, valueFrom: {configMapKeyRef: {name: later, key: greeting}}}]
"#;
        k.ok(&["apply", "-f", "-"], Some(pod));
        k.wait_for(&["get", "pod", "patient"], "CreateContainerConfigError", Duration::from_secs(30));
        let message = k.ok(&["get", "pod", "patient", "-o", "jsonpath={.status.containerStatuses[0].state.waiting.message}"], None);
        assert_eq!(message, "configmap \"later\" not found");
        k.wait_for(&["get", "events", "--field-selector", "involvedObject.name=patient"], "configmap \"later\" not found", Duration::from_secs(10));

        k.ok(&["create", "configmap", "later", "--from-literal=greeting=hello"], None);
        k.wait_for(&["logs", "patient"], "greeting=hello", Duration::from_secs(30));
        k.wait_for(&["get", "pod", "patient"], "Running", Duration::from_secs(10));
        k.ok(&["delete", "pod", "patient", "--wait=false"], None);
    });
}

#[test]
fn two_containers_of_a_pod_share_an_empty_dir() {
    let (_dir, daemon) = daemon();
    each_kubectl(&daemon.url, "empty", |k| {
        let pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: pair}
spec:
  containers:
  - name: writer
    image: minimal
    command: ["sh", "-c", "echo from-the-writer > /srv/msg; sleep 1000"]
    volumeMounts: [{name: shared, mountPath: /srv}]
  - name: reader
    image: minimal
    command: ["sh", "-c", "until [ -s /mnt/msg ]; do sleep 0.2; done; cat /mnt/msg; sleep 1000"]
    volumeMounts: [{name: shared, mountPath: /mnt}]
  volumes: [{name: shared, emptyDir: {}}]
"#;
        k.ok(&["apply", "-f", "-"], Some(pod));
        k.wait_for(&["logs", "pair", "-c", "reader"], "from-the-writer", Duration::from_secs(60));
        assert!(!Path::new("/srv/msg").exists(), "the host's /srv is untouched");
        k.ok(&["delete", "pod", "pair", "--wait=false"], None);
    });
}

#[test]
fn a_downward_api_volume_follows_labels_and_a_host_path_is_shared_with_the_host() {
    let (dir, daemon) = daemon();
    each_kubectl(&daemon.url, "info", |k| {
        let host = dir.path().join(format!("host-{}", k.ns));
        let pod = format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: info, labels: {{app: demo}}}}
spec:
  containers:
  - name: c
    image: minimal
    command: ["sh", "-c", "echo written-in-the-pod > /mnt/out; while :; do echo \"labels: $(cat /srv/labels | tr '\\n' ' ')\"; sleep 0.2; done"]
    volumeMounts: [{{name: info, mountPath: /srv}}, {{name: host, mountPath: /mnt}}]
  volumes:
  - {{name: info, downwardAPI: {{items: [{{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}]}}}}
  - {{name: host, hostPath: {{path: {}, type: DirectoryOrCreate}}}}
"#,
            host.display()
        );
        k.ok(&["apply", "-f", "-"], Some(&pod));
        k.wait_for(&["logs", "info"], "labels: app=\"demo\"", Duration::from_secs(60));
        k.ok(&["label", "pod", "info", "tier=web"], None);
        k.wait_for(&["logs", "info"], "labels: app=\"demo\" tier=\"web\"", Duration::from_secs(10));
        let written = std::fs::read_to_string(host.join("out")).unwrap_or_default();
        assert_eq!(written, "written-in-the-pod\n", "the host path holds what the pod wrote");
        k.ok(&["delete", "pod", "info", "--wait=false"], None);
    });
}

#[test]
fn a_memory_empty_dir_is_a_tmpfs_of_its_size_limit_and_goes_away_with_its_pod() {
    let (dir, daemon) = daemon();
    each_kubectl(&daemon.url, "ram", |k| {
        let pod = r#"
apiVersion: v1
kind: Pod
metadata: {name: ram}
spec:
  containers:
  - name: c
    image: minimal
    command: ["sh", "-c", "echo \"fs=$(stat -f -c %T /srv) blocks=$(df -k /srv | tail -1 | awk '{print $2}')\"; sleep 1000"]
    volumeMounts: [{name: fast, mountPath: /srv}]
  volumes: [{name: fast, emptyDir: {medium: Memory, sizeLimit: 8Mi}}]
"#;
        k.ok(&["apply", "-f", "-"], Some(pod));
        k.wait_for(&["logs", "ram"], "fs=tmpfs blocks=8192", Duration::from_secs(60));
        assert!(mounted_under(dir.path()), "the tmpfs is mounted under the data dir");
        k.ok(&["delete", "pod", "ram", "--grace-period=1", "--timeout=60s"], None);
        wait_unmounted(dir.path());
        let left = std::fs::read_dir(dir.path().join("data/pods")).map(|d| d.count()).unwrap_or(0);
        assert_eq!(left, 0, "the pod's volume directories are removed");
    });
}

#[test]
fn a_mount_over_a_path_the_host_lacks_is_made_in_the_container_only() {
    let (dir, daemon) = daemon();
    // Next to the data directory, so the overlaid directory holds the volume's own source too.
    std::fs::write(dir.path().join("host-file"), "seen-through\n").expect("write");
    each_kubectl(&daemon.url, "nopath", |k| {
        let missing = dir.path().join(format!("missing-{}/deep", k.ns));
        let pod = format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: made}}
spec:
  containers:
  - name: writer
    image: minimal
    command: ["sh", "-c", "echo from-the-writer > {m}/msg; echo \"host=$(cat {h}) mine=$(cat {m}/msg)\"; sleep 1000"]
    volumeMounts: [{{name: scratch, mountPath: {m}}}]
  - name: reader
    image: minimal
    command: ["sh", "-c", "until [ -s /mnt/msg ]; do sleep 0.2; done; cat /mnt/msg; sleep 1000"]
    volumeMounts: [{{name: scratch, mountPath: /mnt}}]
  volumes: [{{name: scratch, emptyDir: {{}}}}]
"#,
            m = missing.display(),
            h = dir.path().join("host-file").display()
        );
        k.ok(&["apply", "-f", "-"], Some(&pod));
        k.wait_for(&["logs", "made", "-c", "writer"], "host=seen-through mine=from-the-writer", Duration::from_secs(60));
        // The reader sees the writer's file through the volume, not a copy in the overlay.
        k.wait_for(&["logs", "made", "-c", "reader"], "from-the-writer", Duration::from_secs(30));
        assert!(!missing.parent().is_some_and(Path::exists), "nothing was created on the host at {}", missing.display());
        k.ok(&["delete", "pod", "made", "--wait=false"], None);

        // A top-level directory the host lacks: the container gets a root of its own.
        let top = format!("/shepherd-test-{}-{}", std::process::id(), k.ns);
        let pod = format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: rooted}}
spec:
  containers:
  - name: c
    image: minimal
    command: ["sh", "-c", "echo kept > {top}/data/msg; echo \"host=$(cat {h}) mine=$(cat {top}/data/msg)\"; sleep 1000"]
    volumeMounts: [{{name: scratch, mountPath: {top}/data}}]
  volumes: [{{name: scratch, emptyDir: {{}}}}]
"#,
            h = dir.path().join("host-file").display()
        );
        k.ok(&["apply", "-f", "-"], Some(&pod));
        k.wait_for(&["logs", "rooted"], "host=seen-through mine=kept", Duration::from_secs(60));
        let read = k.ok(&["exec", "rooted", "--", "cat", &format!("{top}/data/msg")], None);
        assert_eq!(read, "kept\n", "kubectl exec enters the container's own root");
        assert!(!Path::new(&top).exists(), "nothing was created on the host at {top}");
        k.ok(&["delete", "pod", "rooted", "--wait=false"], None);
    });
}

/// Whether a process whose command line contains `needle` runs.
fn process_running(needle: &str) -> bool {
    std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(needle)
    })
}

#[test]
fn a_pod_filling_its_empty_dir_past_the_size_limit_is_evicted_with_the_reason() {
    let (_dir, daemon) = daemon();
    each_kubectl(&daemon.url, "hog", |k| {
        let marker = format!("{}{}", 8_000_000 + std::process::id() % 100_000, k.ns.len());
        let pod = format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: hog}}
spec:
  restartPolicy: Never
  containers:
  - name: c
    image: minimal
    command: ["sh", "-c", "dd if=/dev/zero of=/srv/fill bs=1M count=4; sleep {marker}"]
    volumeMounts: [{{name: scratch, mountPath: /srv}}]
  volumes: [{{name: scratch, emptyDir: {{sizeLimit: 1Mi}}}}]
"#
        );
        k.ok(&["apply", "-f", "-"], Some(&pod));
        k.wait_for(&["get", "pod", "hog", "-o", "jsonpath={.status.phase}/{.status.reason}"], "Failed/Evicted", Duration::from_secs(60));
        let message = k.ok(&["get", "pod", "hog", "-o", "jsonpath={.status.message}"], None);
        assert_eq!(message, "Usage of EmptyDir volume \"scratch\" exceeds the limit \"1Mi\". ");
        k.wait_for(&["get", "pod", "hog"], "Evicted", Duration::from_secs(10));
        k.wait_for(&["get", "events", "--field-selector", "reason=Evicted"], "exceeds the limit", Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(60);
        while process_running(&format!("sleep {marker}")) {
            assert!(Instant::now() < deadline, "the evicted pod's container still runs");
            std::thread::sleep(Duration::from_millis(100));
        }
        k.ok(&["delete", "pod", "hog", "--wait=false"], None);
    });
}

#[test]
fn bad_volumes_and_oversized_secrets_are_refused_naming_the_field() {
    let (dir, daemon) = daemon();
    let big = dir.path().join("big");
    std::fs::write(&big, vec![b'x'; 1024 * 1024 + 1]).expect("write big file");
    each_kubectl(&daemon.url, "bad", |k| {
        let unknown = r#"
apiVersion: v1
kind: Pod
metadata: {name: bad}
spec:
  containers:
  - {name: c, image: minimal, volumeMounts: [{name: nope, mountPath: /srv}]}
  volumes: [{name: data, emptyDir: {}}]
"#;
        let (ok, _, err) = k.run(&["apply", "-f", "-"], Some(unknown));
        assert!(!ok && err.contains("spec.containers[0].volumeMounts[0].name: Not found: \"nope\""), "{err}");

        let escape = unknown.replace("name: nope, mountPath: /srv", "name: data, mountPath: /srv, subPath: ../../etc");
        let (ok, _, err) = k.run(&["apply", "-f", "-"], Some(&escape));
        assert!(!ok && err.contains("spec.containers[0].volumeMounts[0].subPath: Invalid value: \"../../etc\": must not contain '..'"), "{err}");

        let (ok, _, err) = k.run(&["create", "secret", "generic", "big", &format!("--from-file=big={}", big.display())], None);
        assert!(!ok && err.contains("Too long: must have at most 1048576 bytes"), "{err}");
        let (_, out, _) = k.run(&["get", "pods,secrets", "-o", "name"], None);
        assert!(!out.contains("pod/bad") && !out.contains("secret/big"), "nothing was written: {out}");

        // A pod naming a ServiceAccount that does not exist is refused, as Kubernetes' admission does.
        let robot = r#"
apiVersion: v1
kind: Pod
metadata: {name: robot}
spec:
  serviceAccountName: bot
  containers:
  - name: c
    image: minimal
    command: ["sh", "-c", "echo account=$SA; sleep 1000"]
    env: [{name: SA, valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}}]
"#;
        let (ok, _, err) = k.run(&["apply", "-f", "-"], Some(robot));
        assert!(!ok && err.contains("error looking up service account") && err.contains("serviceaccount \"bot\" not found"), "{err}");
        k.ok(&["create", "serviceaccount", "bot"], None);
        k.ok(&["apply", "-f", "-"], Some(robot));
        k.wait_for(&["logs", "robot"], "account=bot", Duration::from_secs(60));
        k.ok(&["delete", "pod", "robot", "--wait=false"], None);
    });
}
