//! The `oci` runtime end to end: real `shepherd standalone --runtime oci`, real runc, the built-in
//! registry serving the busybox test image, kubectl as the client. Needs root, runc
//! (`/usr/sbin/runc`) and busybox-static (`/bin/busybox`); each test fails naming what is missing.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, free_port, mounts_under, processes_with};
use serde_json::{Value, json};
use shepherd_registry::testimage::ImageBuilder;

const RUNC: &str = "/usr/sbin/runc";

fn require_root_and_runc() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the oci runtime tests need root (runc creates namespaces and cgroups)");
    let runc = Command::new(RUNC).arg("--version").output();
    assert!(runc.is_ok_and(|o| o.status.success()), "the oci runtime tests need runc at {RUNC} (Debian package runc)");
}

/// A standalone daemon on the oci runtime with a registry beside it. Dropping it kills the
/// daemon, removes every container runc still runs for it and unmounts what the agent mounted,
/// before the data directory goes.
struct Cluster {
    daemon: Option<Daemon>,
    registry: String,
    flags: Vec<String>,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start(extra: &[&str]) -> Cluster {
        let mut flags = vec!["--runtime", "oci"];
        flags.extend_from_slice(extra);
        Cluster::start_with(&flags)
    }

    /// With `flags` and no `--runtime` among them: standalone picks its runtime itself.
    fn start_with(extra: &[&str]) -> Cluster {
        require_root_and_runc();
        let dir = tempfile::tempdir().expect("tempdir");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
        let registry = format!("127.0.0.1:{port}");
        let mut flags: Vec<String> = ["--restart-backoff-seconds", "0.5", "--restart-backoff-max-seconds", "4", "--lease-seconds", "1"]
            .into_iter()
            .map(String::from)
            .collect();
        flags.extend(["--registry-listen".to_string(), registry.clone()]);
        flags.extend(extra.iter().map(|s| s.to_string()));
        let daemon = Self::launch(dir.path(), &flags);
        Cluster { daemon: Some(daemon), registry, flags, dir }
    }

    /// `Daemon::start` would add `--runtime process` to a standalone naming none; this does not.
    fn launch(dir: &Path, flags: &[String]) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .arg("standalone")
            .arg("--data-dir")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0", "--insecure-loopback"])
            .args(common::host_network_unless_named("standalone", &flags.iter().map(String::as_str).collect::<Vec<_>>()))
            .args(flags)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start shepherd");
        Daemon::from_child(child)
    }

    fn url(&self) -> String {
        self.daemon.as_ref().expect("daemon").url.clone()
    }

    fn data(&self) -> &Path {
        self.dir.path()
    }

    fn agent(&self) -> PathBuf {
        self.data().join("agent")
    }

    fn kill9_and_restart(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.kill9();
            // The daemon's Drop kills processes carrying its command line; oci containers do not.
            std::mem::forget(d);
        }
        self.daemon = Some(Self::launch(self.dir.path(), &self.flags));
    }

    async fn push(&self, image: &ImageBuilder, repository: &str, tag: &str) -> shepherd_registry::testimage::Image {
        let built = image.build().expect("build the test image (needs busybox-static at /bin/busybox)");
        let base = format!("http://{}", self.registry);
        wait_for("the registry", 30, async || reqwest::get(format!("{base}/v2/")).await.ok().filter(|r| r.status() == 200))
            .await;
        built.push(&base, repository, tag).await.expect("push");
        built
    }

    /// Copies `image` into the registry as `repository:tag` with skopeo, from an OCI layout.
    async fn skopeo_push(&self, image: &shepherd_registry::testimage::Image, repository: &str, tag: &str) {
        let base = format!("http://{}", self.registry);
        wait_for("the registry", 30, async || reqwest::get(format!("{base}/v2/")).await.ok().filter(|r| r.status() == 200))
            .await;
        let work = tempfile::tempdir().expect("tempdir");
        let layout = work.path().join("layout");
        image.write_oci_layout(&layout, tag).expect("layout");
        let out = skopeo(
            work.path(),
            &["copy", "--dest-tls-verify=false", &format!("oci:{}:{tag}", layout.display()), &format!("docker://{}/{repository}:{tag}", self.registry)],
        );
        assert!(out.status.success(), "skopeo copy: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut cmd = common::kubectl_command(&common::installed_kubectl(), &self.url());
        cmd.args(args);
        let (status, out, err) = common::run_with_stdin(&mut cmd, stdin);
        assert!(status.success(), "kubectl {args:?}: {err}");
        out
    }

    fn pods(&self) -> Vec<Value> {
        let out = self.kubectl(&["get", "pods", "-o", "json"], None);
        serde_json::from_str::<Value>(&out).expect("json")["items"].as_array().cloned().unwrap_or_default()
    }

    fn events(&self) -> Vec<Value> {
        let out = self.kubectl(&["get", "events", "-o", "json"], None);
        serde_json::from_str::<Value>(&out).expect("json")["items"].as_array().cloned().unwrap_or_default()
    }

    fn runc_list(&self) -> BTreeMap<String, (i64, String)> {
        runc_containers(&self.agent().join("oci/runc"))
    }
}

/// skopeo with its blob-location cache in a private home (Debian package skopeo).
fn skopeo(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new("skopeo")
        .arg("--insecure-policy")
        .args(args)
        .env("HOME", home)
        .output()
        .expect("run skopeo (Debian package skopeo)")
}

fn runc_containers(root: &Path) -> BTreeMap<String, (i64, String)> {
    let out = Command::new(RUNC).arg("--root").arg(root).args(["list", "--format", "json"]).output().expect("runc list");
    let list: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((c["id"].as_str()?.to_string(), (c["pid"].as_i64().unwrap_or(0), c["status"].as_str()?.to_string())))
        })
        .collect()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.kill9();
        }
        let root = self.agent().join("oci/runc");
        for id in runc_containers(&root).keys() {
            let _ = Command::new(RUNC).arg("--root").arg(&root).args(["delete", "--force", id]).status();
        }
        for m in mounts_under(self.dir.path()) {
            let _ = Command::new("umount").args(["-l", &m]).status();
        }
    }
}

async fn wait_for<T>(what: &str, seconds: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {seconds} s waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn ready(p: &Value) -> bool {
    p["status"]["phase"] == "Running"
        && p["metadata"]["deletionTimestamp"].is_null()
        && p["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn deployment(name: &str, replicas: u32, container: Value) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": {"replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}}}})
    .to_string()
}

fn parent(pid: i64) -> i64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    after.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0)
}

fn cmdline(pid: i64) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline")).map(|c| String::from_utf8_lossy(&c).replace('\0', " ")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busybox_deployment_runs_in_the_image_root_with_its_own_pid_1_and_the_pod_name_as_hostname() {
    let cluster = Cluster::start(&[]);
    cluster.push(&ImageBuilder::busybox().expect("busybox-static"), "busybox", "1").await;
    let image = format!("{}/busybox:1", cluster.registry);
    // The exec probe runs inside the container: it sees the image's marker file, the pod's name
    // as hostname and httpd as PID 1. Pods share the node's network (until pods get their own),
    // so each httpd takes a port of its own; `exec` makes httpd the container's first process.
    let check = r#"cat /etc/shepherd-test-image && test "$(hostname)" = "$POD_NAME" && grep -q httpd /proc/1/cmdline"#;
    // Below the kernel's ephemeral range (32768 and up), which other tests' connections use.
    let serve = "exec httpd -f -p 127.0.0.1:$((10000 + RANDOM % 20000))";
    let container = json!({"name": "web", "image": image, "command": ["sh", "-c", serve],
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "readinessProbe": {"exec": {"command": ["sh", "-c", check]}, "periodSeconds": 1}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&deployment("web", 3, container)));
    let pods = wait_for("3 busybox pods Running and Ready", 90, async || {
        let ps = cluster.pods();
        (ps.len() == 3 && ps.iter().all(ready)).then_some(ps)
    })
    .await;
    for p in &pods {
        let cs = &p["status"]["containerStatuses"][0];
        if cs["restartCount"] != 0 {
            let name = p["metadata"]["name"].as_str().unwrap_or_default();
            let previous = cluster.kubectl(&["logs", name, "--previous"], None);
            panic!("{name} restarted: {cs}\nits previous output: {previous}");
        }
    }
    // On the host, each container's init is httpd itself (not a shell, not the agent).
    let running = cluster.runc_list();
    assert_eq!(running.len(), 3, "{running:?}");
    for (id, (pid, status)) in &running {
        assert_eq!(status, "running", "{id}");
        let line = cmdline(*pid);
        assert!(line.starts_with("httpd -f -p 127.0.0.1:"), "container {id} shows {line:?}");
        // Its parent, the shim that records its exit, is the shim program, not a second daemon.
        let shim = cmdline(parent(*pid));
        assert!(shim.split_whitespace().next().is_some_and(|p| p.ends_with("/shepherd-shim")), "the parent of container {id}: {shim:?}");
    }
    let events = cluster.events();
    assert!(
        events.iter().any(|e| e["reason"] == "Pulled" && e["message"].as_str().is_some_and(|m| m.contains("Successfully pulled image"))),
        "a Pulled event: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_pods_of_one_new_image_pull_it_once() {
    let cluster = Cluster::start(&[]);
    let built = cluster.push(&ImageBuilder::busybox().expect("busybox-static").file("/ten", "10", 0o644), "ten", "1").await;
    let container = json!({"name": "c", "image": format!("{}/ten:1", cluster.registry), "command": ["sleep", "3600"]});
    cluster.kubectl(&["apply", "-f", "-"], Some(&deployment("ten", 10, container)));
    wait_for("10 pods Running", 120, async || {
        let ps = cluster.pods();
        (ps.len() == 10 && ps.iter().all(ready)).then_some(())
    })
    .await;
    let metrics = reqwest::get(format!("http://{}/metrics", cluster.registry)).await.expect("metrics").text().await.expect("text");
    let line = format!("registry_blob_pulls_total{{repository=\"ten\",digest=\"{}\"}} ", built.layer_digest);
    let count = metrics.lines().find_map(|l| l.strip_prefix(&line)).unwrap_or_else(|| panic!("no {line} in\n{metrics}"));
    assert_eq!(count, "1", "one pull of the layer for ten pods");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_backs_off_with_an_event_and_starts_once_pushed() {
    let cluster = Cluster::start(&[]);
    let image = format!("{}/late:1", cluster.registry);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "late"},
        "spec": {"containers": [{"name": "c", "image": image, "command": ["sleep", "3600"]}]}});
    // The registry is up before the pod asks it for the image.
    wait_for("the registry", 30, async || {
        reqwest::get(format!("http://{}/v2/", cluster.registry)).await.ok().filter(|r| r.status() == 200)
    })
    .await;
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    let waiting = |reason: &str| {
        let w = cluster.pods().first()?["status"]["containerStatuses"][0]["state"]["waiting"].clone();
        (w["reason"] == reason).then_some(w)
    };
    let err = wait_for("ErrImagePull", 60, async || waiting("ErrImagePull")).await;
    assert!(err["message"].as_str().is_some_and(|m| m.contains("late:1")), "{err}");
    wait_for("ImagePullBackOff", 60, async || waiting("ImagePullBackOff")).await;
    let events = cluster.events();
    let failed = events.iter().find(|e| e["reason"] == "Failed" && e["type"] == "Warning").unwrap_or_else(|| panic!("{events:?}"));
    assert!(failed["message"].as_str().is_some_and(|m| m.contains("Failed to pull image") && m.contains("not found")), "{failed}");
    assert_eq!(failed["involvedObject"]["name"], "late");

    cluster.push(&ImageBuilder::busybox().expect("busybox-static"), "late", "1").await;
    wait_for("the pod Running once the image exists", 60, async || cluster.pods().first().filter(|p| ready(p)).cloned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_over_its_memory_limit_is_oom_killed_and_restarted() {
    let cluster = Cluster::start(&[]);
    cluster.push(&ImageBuilder::busybox().expect("busybox-static"), "busybox", "1").await;
    // tail keeps the whole line it has not finished: one endless line grows without bound.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog"},
        "spec": {"containers": [{"name": "c", "image": format!("{}/busybox:1", cluster.registry),
            "command": ["sh", "-c", "head -c 500000000 /dev/zero | tail"],
            "resources": {"limits": {"memory": "32Mi"}}}]}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    let cs = wait_for("an OOMKilled restart", 90, async || {
        let cs = cluster.pods().first()?["status"]["containerStatuses"][0].clone();
        (cs["lastState"]["terminated"]["reason"] == "OOMKilled" && cs["restartCount"].as_i64() >= Some(1)).then_some(cs)
    })
    .await;
    assert_eq!(cs["lastState"]["terminated"]["exitCode"], 137, "{cs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_adopts_the_same_containers_and_a_deleted_pod_leaves_nothing_behind() {
    let mut cluster = Cluster::start(&[]);
    cluster.push(&ImageBuilder::busybox().expect("busybox-static"), "busybox", "1").await;
    let bb = json!({"name": "c", "image": format!("{}/busybox:1", cluster.registry), "command": ["sleep", "3600"]});
    cluster.kubectl(&["apply", "-f", "-"], Some(&deployment("bb", 2, bb)));
    cluster.kubectl(&["apply", "-f", "-"], Some(&deployment("web", 1, json!({"name": "web", "image": "minimal"}))));
    wait_for("3 pods Running", 90, async || {
        let ps = cluster.pods();
        (ps.len() == 3 && ps.iter().all(ready)).then_some(())
    })
    .await;
    let before = cluster.runc_list();
    assert_eq!(before.len(), 3, "{before:?}");

    cluster.kill9_and_restart();
    assert_eq!(cluster.runc_list(), before, "containers outlive the agent");
    wait_for("the restarted agent reporting all pods Ready", 60, async || {
        let ps = cluster.pods();
        (ps.len() == 3 && ps.iter().all(ready)).then_some(())
    })
    .await;
    // A reconcile or two later, nothing was restarted or duplicated.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(cluster.runc_list(), before, "the same containers and pids, adopted, none added");
    assert!(cluster.pods().iter().all(|p| p["status"]["containerStatuses"][0]["restartCount"] == 0));

    cluster.kubectl(&["delete", "deployment", "bb", "web", "--wait=false"], None);
    wait_for("every pod gone", 90, async || cluster.pods().is_empty().then_some(())).await;
    wait_for("no container, mount, overlay or cgroup left", 30, async || {
        let overlays: Vec<_> =
            std::fs::read_dir(cluster.agent().join("images/containers")).into_iter().flatten().flatten().collect();
        let cgroups: Vec<_> =
            std::fs::read_dir("/sys/fs/cgroup/memory/shepherd-oci").into_iter().flatten().flatten().map(|e| e.file_name()).collect();
        let mine: Vec<_> = cgroups.iter().filter(|c| before.contains_key(&*c.to_string_lossy())).collect();
        let left = (cluster.runc_list(), mounts_under(cluster.data()), overlays.len(), mine.len());
        (left.0.is_empty() && left.1.is_empty() && left.2 == 0 && left.3 == 0).then_some(())
    })
    .await;
    let sandboxes = std::fs::read_dir(cluster.agent().join("oci/sandboxes")).into_iter().flatten().count();
    assert_eq!(sandboxes, 0, "pod sandboxes removed with their pods");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_session_runs_on_the_oci_runtime_standalone_picks_and_stopping_standalone_stops_its_containers() {
    // No --runtime: with root and a working runc, standalone runs containers on runc.
    let mut cluster = Cluster::start_with(&[]);
    cluster.kubectl(&["apply", "-f", "-"], Some(&deployment("web", 3, json!({"name": "web", "image": "minimal"}))));
    let pods = wait_for("web-0..2 Running and Ready", 90, async || {
        let ps = cluster.pods();
        (ps.len() == 3 && ps.iter().all(ready)).then_some(ps)
    })
    .await;
    assert_eq!(cluster.runc_list().len(), 3, "the pods run as runc containers: {:?}", cluster.runc_list());
    let web0 = pods.iter().find(|p| p["metadata"]["name"] == "web-0").expect("web-0")["metadata"]["uid"].clone();
    cluster.kubectl(&["delete", "pod", "web-0", "--wait=false"], None);
    wait_for("a Running replacement for web-0", 60, async || {
        let ps = cluster.pods();
        let live: Vec<&Value> = ps.iter().filter(|p| ready(p)).collect();
        (live.len() == 3 && live.iter().all(|p| p["metadata"]["uid"] != web0)).then_some(())
    })
    .await;
    // The built-in image's idle process ends on SIGTERM: standalone's stop is quick and complete.
    let mut daemon = cluster.daemon.take().expect("daemon");
    assert!(daemon.terminate().success(), "standalone stops cleanly");
    std::mem::forget(daemon);
    assert!(cluster.runc_list().is_empty(), "no container outlives a stopped standalone: {:?}", cluster.runc_list());
    assert!(mounts_under(cluster.data()).is_empty(), "{:?}", mounts_under(cluster.data()));
    // Started again, it brings the pods back as a node restart does: each restarted once.
    cluster.daemon = Some(Cluster::launch(cluster.dir.path(), &cluster.flags));
    wait_for("the three pods Running again, each restarted once", 90, async || {
        let ps = cluster.pods();
        (ps.len() == 3 && ps.iter().all(|p| ready(p) && p["status"]["containerStatuses"][0]["restartCount"] == 1)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_security_context_sets_the_user_a_read_only_root_and_the_capabilities() {
    let cluster = Cluster::start(&[]);
    cluster.push(&ImageBuilder::busybox().expect("busybox-static"), "busybox", "1").await;
    let script = "id -u; id -g; touch /made 2>/dev/null || echo read-only; grep CapBnd /proc/self/status; sleep 3600";
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "locked"},
        "spec": {"securityContext": {"runAsUser": 1000, "runAsGroup": 3000},
            "containers": [{"name": "c", "image": format!("{}/busybox:1", cluster.registry), "command": ["sh", "-c", script],
                "securityContext": {"runAsGroup": 2000, "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    let logs = wait_for("the container's report", 60, async || {
        let pods = cluster.pods();
        pods.first().filter(|p| ready(p))?;
        let out = cluster.kubectl(&["logs", "locked"], None);
        out.contains("CapBnd").then_some(out)
    })
    .await;
    let lines: Vec<&str> = logs.lines().collect();
    // NET_BIND_SERVICE is capability 10, alone in the bounding set: 0x400 (a user other than root
    // holds none effective after exec, as with containerd).
    assert_eq!(lines, ["1000", "2000", "read-only", "CapBnd:\t0000000000000400"], "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_keep_pods_a_stopped_standalone_leaves_its_containers_for_the_next_start() {
    let mut cluster = Cluster::start(&["--keep-pods"]);
    cluster.kubectl(&["apply", "-f", "-"], Some(&deployment("web", 1, json!({"name": "web", "image": "minimal"}))));
    wait_for("web-0 Running", 60, async || cluster.pods().first().filter(|p| ready(p)).cloned()).await;
    let before = cluster.runc_list();
    assert_eq!(before.len(), 1, "{before:?}");
    let mut daemon = cluster.daemon.take().expect("daemon");
    assert!(daemon.terminate().success(), "standalone stops cleanly");
    std::mem::forget(daemon);
    assert_eq!(cluster.runc_list(), before, "the container keeps running");
    cluster.daemon = Some(Cluster::launch(cluster.dir.path(), &cluster.flags));
    wait_for("web-0 Ready again", 60, async || cluster.pods().first().filter(|p| ready(p)).cloned()).await;
    assert_eq!(cluster.runc_list(), before, "adopted, not restarted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_pull_policy_always_a_restarted_container_gets_the_image_its_tag_now_names() {
    let cluster = Cluster::start(&[]);
    let version = |v: &str| ImageBuilder::busybox().expect("busybox-static").file("/version", v, 0o644).build().expect("build");
    cluster.skopeo_push(&version("v1\n"), "app", "live").await;
    // The container ends after a second; `restartPolicy: Always` starts it again, and each start
    // goes through the pull policy.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app"},
        "spec": {"containers": [{"name": "c", "image": format!("{}/app:live", cluster.registry),
            "imagePullPolicy": "Always", "command": ["sh", "-c", "cat /version; sleep 1"]}]}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    let logs = |cluster: &Cluster| {
        let mut cmd = common::kubectl_command(&common::installed_kubectl(), &cluster.url());
        cmd.args(["logs", "app"]);
        let (status, out, _) = common::run_with_stdin(&mut cmd, None);
        status.success().then_some(out)
    };
    wait_for("the first instance printing v1", 60, async || logs(&cluster).filter(|l| l.trim() == "v1")).await;

    cluster.skopeo_push(&version("v2\n"), "app", "live").await;
    wait_for("a restarted instance printing v2", 60, async || logs(&cluster).filter(|l| l.trim() == "v2")).await;
    let pod = cluster.pods().into_iter().next().expect("the pod");
    assert!(pod["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1), "{pod}");
    let pulled = cluster
        .events()
        .iter()
        .filter(|e| e["reason"] == "Pulled" && e["involvedObject"]["name"] == "app")
        .map(|e| e["count"].as_i64().unwrap_or(1))
        .sum::<i64>();
    assert!(pulled >= 2, "a pull for the first start and for the restart ({pulled} Pulled events)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_image_reference_shows_invalid_image_name_an_absent_one_under_never_err_image_never_pull_and_the_node_keeps_running_pods() {
    let cluster = Cluster::start(&[]);
    cluster.push(&ImageBuilder::busybox().expect("busybox-static"), "busybox", "1").await;
    let bad = format!("{}/BusyBox:1", cluster.registry);
    let pod = |name: &str, image: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image, "command": ["sleep", "3600"]}]}})
        .to_string()
    };
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod("bad", &bad)));
    let waiting = wait_for("InvalidImageName", 60, async || {
        let pods = cluster.pods();
        let w = pods.iter().find(|p| p["metadata"]["name"] == "bad")?["status"]["containerStatuses"][0]["state"]["waiting"].clone();
        (w["reason"] == "InvalidImageName").then_some(w)
    })
    .await;
    let message = waiting["message"].as_str().unwrap_or_default();
    assert!(message.contains(&bad) && message.contains("lowercase"), "{waiting}");
    let events = cluster.events();
    assert!(
        events.iter().any(|e| e["reason"] == "InspectFailed" && e["type"] == "Warning" && e["involvedObject"]["name"] == "bad"),
        "an InspectFailed event: {events:?}"
    );
    // The agent is unharmed: a good pod beside it runs from the same registry.
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod("good", &format!("{}/busybox:1", cluster.registry))));
    wait_for("the good pod Running", 60, async || {
        cluster.pods().into_iter().find(|p| p["metadata"]["name"] == "good" && ready(p))
    })
    .await;

    // An absent image under `Never` is not pulled: its own waiting reason says why.
    let mut never: Value = serde_json::from_str(&pod("never", &format!("{}/busybox:2", cluster.registry))).expect("json");
    never["spec"]["containers"][0]["imagePullPolicy"] = json!("Never");
    cluster.kubectl(&["apply", "-f", "-"], Some(&never.to_string()));
    let waiting = wait_for("ErrImageNeverPull", 60, async || {
        let pods = cluster.pods();
        let w = pods.iter().find(|p| p["metadata"]["name"] == "never")?["status"]["containerStatuses"][0]["state"]["waiting"].clone();
        (w["reason"] == "ErrImageNeverPull").then_some(w)
    })
    .await;
    assert!(waiting["message"].as_str().is_some_and(|m| m.contains("busybox:2") && m.contains("Never")), "{waiting}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_whose_layer_escapes_its_root_fails_the_pull_and_a_good_push_under_the_tag_then_runs() {
    let cluster = Cluster::start(&[]);
    let hostile = ImageBuilder::busybox().expect("busybox-static").hostile_file("../../escaped", "x").build().expect("build");
    cluster.skopeo_push(&hostile, "evil", "1").await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "evil"},
        "spec": {"containers": [{"name": "c", "image": format!("{}/evil:1", cluster.registry), "command": ["sleep", "3600"]}]}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    let waiting = wait_for("ErrImagePull or ImagePullBackOff", 60, async || {
        let w = cluster.pods().first()?["status"]["containerStatuses"][0]["state"]["waiting"].clone();
        (w["reason"] == "ErrImagePull" || w["reason"] == "ImagePullBackOff").then_some(w)
    })
    .await;
    let events = cluster.events();
    let failed = events
        .iter()
        .find(|e| e["reason"] == "Failed" && e["message"].as_str().is_some_and(|m| m.contains("Failed to pull image")))
        .unwrap_or_else(|| panic!("a Failed event: {events:?}"));
    assert!(failed["message"].as_str().is_some_and(|m| m.contains("..")), "the event names the escaping path: {failed} ({waiting})");
    let store = cluster.agent().join("images");
    let count = |dir: &str| std::fs::read_dir(store.join(dir)).into_iter().flatten().count();
    assert_eq!((count("images"), count("layers/sha256"), count("tmp")), (0, 0, 0), "nothing of the refused image is kept");
    assert!(!cluster.agent().join("escaped").exists() && !store.join("escaped").exists(), "nothing written outside the layer");

    // The same tag, now good content: the waiting pod starts without being touched.
    cluster.skopeo_push(&ImageBuilder::busybox().expect("busybox-static").build().expect("build"), "evil", "1").await;
    wait_for("the pod Running once the tag is good", 90, async || cluster.pods().first().filter(|p| ready(p)).cloned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_corrupted_in_the_registry_fails_the_pull_keeps_nothing_and_the_repaired_image_runs() {
    let cluster = Cluster::start(&[]);
    let built = cluster.push(&ImageBuilder::busybox().expect("busybox-static").file("/rotten", "1", 0o644), "rotten", "1").await;
    let stored = cluster.data().join("registry/blobs/sha256").join(built.layer_digest.hex());
    let mut corrupt = built.layer.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0xff;
    std::fs::write(&stored, &corrupt).expect("corrupt the registry's copy of the layer");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rotten"},
        "spec": {"containers": [{"name": "c", "image": format!("{}/rotten:1", cluster.registry), "command": ["sleep", "3600"]}]}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    let waiting = wait_for("ErrImagePull or ImagePullBackOff", 60, async || {
        let w = cluster.pods().first()?["status"]["containerStatuses"][0]["state"]["waiting"].clone();
        (w["reason"] == "ErrImagePull" || w["reason"] == "ImagePullBackOff").then_some(w)
    })
    .await;
    let events = cluster.events();
    assert!(
        events.iter().any(|e| e["reason"] == "Failed"
            && e["message"].as_str().is_some_and(|m| (m.contains("Invalid digest") || m.contains("failed verification")) && m.contains(built.layer_digest.as_str()))),
        "a Failed event naming the layer that failed verification ({waiting}): {events:?}"
    );
    let store = cluster.agent().join("images");
    let count = |dir: &str| std::fs::read_dir(store.join(dir)).into_iter().flatten().count();
    assert_eq!((count("images"), count("layers/sha256"), count("tmp")), (0, 0, 0), "nothing of the failed pull is kept");
    assert!(!store.join("blobs/sha256").join(built.layer_digest.hex()).exists(), "the corrupt layer is not stored");

    std::fs::write(&stored, &built.layer).expect("repair the layer");
    wait_for("the pod Running once the layer is whole", 90, async || cluster.pods().first().filter(|p| ready(p)).cloned()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_of_an_oci_container_carry_timestamps_and_answer_since_time_and_previous() {
    let cluster = Cluster::start(&[]);
    cluster.push(&ImageBuilder::busybox().expect("busybox-static"), "busybox", "1").await;
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "talk"},
        "spec": {"containers": [{"name": "c", "image": format!("{}/busybox:1", cluster.registry),
            "command": ["sh", "-c", "echo early; sleep 0.2; echo oops >&2; sleep 1; echo late; sleep 8; exit 3"]}]}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    wait_for("a restarted container", 90, async || {
        let cs = cluster.pods().first()?["status"]["containerStatuses"][0].clone();
        (cs["restartCount"].as_i64() >= Some(1)).then_some(())
    })
    .await;
    let previous = cluster.kubectl(&["logs", "talk", "--previous", "--timestamps"], None);
    let lines: Vec<(&str, &str)> = previous.lines().filter_map(|l| l.split_once(' ')).collect();
    let texts: Vec<&str> = lines.iter().map(|(_, t)| *t).collect();
    assert_eq!(texts, ["early", "oops", "late"], "the previous instance's stdout and stderr: {previous}");
    let times: Vec<jiff::Timestamp> =
        lines.iter().map(|(t, _)| t.parse().unwrap_or_else(|e| panic!("{t:?} is not a timestamp: {e}"))).collect();
    assert!(times[2].duration_since(times[0]).as_secs_f64() >= 0.9, "late comes a second after early: {previous}");

    let since = cluster.kubectl(&["logs", "talk", "--previous", &format!("--since-time={}", lines[2].0)], None);
    assert_eq!(since, "late\n", "only what was written from that time on");
    let current = cluster.kubectl(&["logs", "talk", "--since=1h"], None);
    assert!(current.starts_with("early\n"), "the current instance has its own log: {current}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_network_pod_runs_on_the_oci_runtime_in_the_nodes_network_namespace() {
    let cluster = Cluster::start(&[]);
    cluster.push(&ImageBuilder::busybox().expect("busybox-static"), "busybox", "1").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
    // httpd answers the probe on the node's loopback, which only the node's network reaches.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hostnet"},
        "spec": {"hostNetwork": true, "containers": [{"name": "c", "image": format!("{}/busybox:1", cluster.registry),
            "command": ["sh", "-c", format!("readlink /proc/self/ns/net; exec httpd -f -p 127.0.0.1:{port}")],
            "readinessProbe": {"tcpSocket": {"host": "127.0.0.1", "port": port}, "periodSeconds": 1}}]}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    wait_for("the hostNetwork pod Ready", 60, async || cluster.pods().first().filter(|p| ready(p)).cloned()).await;
    let seen = cluster.kubectl(&["logs", "hostnet"], None);
    let node = std::fs::read_link("/proc/self/ns/net").expect("the node's network namespace");
    assert_eq!(seen.trim(), node.to_string_lossy(), "the container is in the node's network namespace");
    reqwest::get(format!("http://127.0.0.1:{port}/")).await.expect("httpd answers on the node's loopback");
}

/// The busybox test image with what interactive use and `kubectl cp` run in the container
/// (`tty`, `stty`, `tar`).
fn interactive_image() -> ImageBuilder {
    ImageBuilder::busybox()
        .expect("busybox-static")
        .symlink("/bin/tty", "busybox")
        .symlink("/bin/stty", "busybox")
        .symlink("/bin/tar", "busybox")
}

impl Cluster {
    /// Creates pod `name` from `spec` and waits until it is Ready.
    async fn running_pod(&self, name: &str, spec: Value) {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec});
        self.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
        wait_for(&format!("pod {name} Ready"), 90, async || {
            self.pods().into_iter().find(|p| p["metadata"]["name"] == name).filter(ready)
        })
        .await;
    }

    /// The shell command line running `kubectl <args>` of `bin` against this cluster, then
    /// printing its exit code and idling (so that the terminal keeps showing what happened).
    fn kubectl_in_terminal(&self, bin: &Path, args: &str) -> String {
        format!("env KUBECONFIG=/dev/null {} --server {} {args}; echo kubectl-exit=$?; sleep 120", bin.display(), self.url())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_oci_attach_it_drives_the_containers_own_terminal_follows_resizes_and_outlives_an_agent_kill_9() {
    use common::interactive::Terminal;
    let mut cluster = Cluster::start(&[]);
    cluster.push(&interactive_image(), "busybox", "1").await;
    let image = format!("{}/busybox:1", cluster.registry);
    cluster.running_pod("console", json!({"containers": [
        {"name": "sh", "image": image, "command": ["sh"], "stdin": true, "tty": true}]})).await;
    for (label, bin) in common::kubectls_under_test() {
        let name = format!("attach-{}", label.replace('.', "-"));
        let t = Terminal::start(cluster.data(), &name, &cluster.kubectl_in_terminal(&bin, "attach -it console"));
        // kubectl attach sends the terminal's size plus one, then the size (to make the program
        // redraw); a shell asked between the two sees the first. Wait for the second.
        t.ask("echo \"settled=$(stty size)\"", "settled=40 120");
        let shown = t.ask("echo \"tty=$(tty) size=$(stty size) term=$TERM seen=$SEEN\"; SEEN=\"$SEEN+$$\"", "tty=");
        assert!(shown.starts_with("tty=/dev/pts/"), "kubectl {label}: the container's stdin is its own terminal: {shown}");
        assert!(shown.contains("term=xterm "), "kubectl {label}: a terminal container learns its kind: {shown}");
        assert!(shown.contains("size=40 120"), "kubectl {label}: the client's terminal size reaches the shell: {shown}");
        t.resize(100, 30);
        t.ask("echo \"resized=$(stty size)\"", "resized=30 100");
    }
    let logs = cluster.kubectl(&["logs", "console"], None);
    assert!(logs.contains("resized=30 100"), "what the shell writes on its terminal is its log: {logs}");

    // The shim holds the terminal: the same shell, with its variables, after an agent kill -9.
    cluster.kill9_and_restart();
    let (_, bin) = common::newest_kubectl();
    let t = Terminal::start(cluster.data(), "after-kill", &cluster.kubectl_in_terminal(&bin, "attach -it console"));
    let shown = t.ask("echo \"again seen=$SEEN\"", "again seen=");
    assert!(shown.starts_with("again seen=+"), "the shell the earlier attaches talked to: {shown}");
    let restarts = cluster.kubectl(&["get", "pod", "console", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"], None);
    assert_eq!(restarts, "0", "neither detaching nor the agent's death ends the shell");
    drop(t);

    // `kubectl run -it --rm` makes a pod with stdin and a terminal and attaches to it.
    for (label, bin) in common::kubectls_under_test() {
        let pod = format!("one-off-{}", label.replace('.', "-"));
        let args = format!("run -it --rm --restart=Never {pod} --image={image} -- sh");
        let t = Terminal::start(cluster.data(), &pod, &cluster.kubectl_in_terminal(&bin, &args));
        let shown = t.ask("echo \"answer=$((6 * 7)) on $(tty)\"", "answer=");
        assert!(shown.starts_with("answer=42 on /dev/pts/"), "kubectl {label}: {shown}");
        t.type_line("exit 5");
        let exit = wait_for("kubectl run to end with the shell", 60, async || {
            t.screen().lines().find(|l| l.starts_with("kubectl-exit=")).map(str::to_string)
        })
        .await;
        assert_eq!(exit.trim(), "kubectl-exit=5", "kubectl {label}: kubectl run returns the shell's exit code: {}", t.screen());
        wait_for("the --rm pod to be deleted", 60, async || cluster.pods().iter().all(|p| p["metadata"]["name"] != pod.as_str()).then_some(()))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_oci_attach_i_feeds_a_container_started_with_stdin_and_run_i_ends_a_stdin_once_one() {
    use common::interactive::check_attach_stdin;
    let cluster = Cluster::start(&[]);
    cluster.push(&interactive_image(), "busybox", "1").await;
    let image = format!("{}/busybox:1", cluster.registry);
    cluster.running_pod("reader", json!({"containers": [
        {"name": "r", "image": image, "command": ["sh", "-c", "echo ready; while read l; do echo got:$l; done"], "stdin": true},
        {"name": "deaf", "image": image, "command": ["sleep", "100000"]}]})).await;
    let url = cluster.url();
    for (label, bin) in common::kubectls_under_test() {
        check_attach_stdin(&bin, &url, &label, &[&format!("--image={image}"), "--", "sh"]);
    }
}



#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_oci_exec_keeps_exit_codes_exec_it_gets_a_terminal_cp_round_trips_10_mib_and_port_forward_and_attach_work() {
    use common::interactive::Terminal;
    let cluster = Cluster::start(&[]);
    cluster.push(&interactive_image(), "busybox", "1").await;
    let image = format!("{}/busybox:1", cluster.registry);
    let port = free_port();
    let serve = format!("httpd -p {port} -h /www; echo started; while true; do echo tick; sleep 1; done");
    cluster.running_pod("web-0", json!({"containers": [{"name": "web", "image": image, "command": ["sh", "-c", serve]}]})).await;
    let url = cluster.url();
    // Pseudo-random, incompressible content.
    let mut data = Vec::with_capacity(10 << 20);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while data.len() < 10 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    let src = cluster.data().join("src.bin");
    std::fs::write(&src, &data).expect("write the source file");
    for (label, bin) in common::kubectls_under_test() {
        let kubectl = || common::kubectl_command(&bin, &url);
        let (status, out, err) = common::run_with_stdin(
            kubectl().args(["exec", "web-0", "--", "sh", "-c", "echo $HOSTNAME; echo oops >&2; exit 3"]),
            None,
        );
        assert_eq!(out, "web-0\n", "kubectl {label}: exec prints the pod name; stderr: {err}");
        assert_eq!(status.code(), Some(3), "kubectl {label}: exec exits with the command's code; stderr: {err}");
        assert!(err.contains("oops"), "kubectl {label}: {err}");

        // A dropped exec connection ends what the exec started, background children too.
        let marker = format!("{}{}", 7_000_000 + std::process::id() % 100_000, label.replace('.', ""));
        let mut dropped = kubectl()
            .args(["exec", "web-0", "--", "sh", "-c", &format!("sleep {marker}1 & sleep {marker}2")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("exec");
        let running = || processes_with(&marker);
        wait_for("the exec'd processes to start", 30, async || (running().len() >= 2).then_some(())).await;
        let _ = dropped.kill();
        let _ = dropped.wait();
        wait_for("the exec'd processes to be gone", 15, async || running().is_empty().then_some(())).await;

        let name = format!("exec-{}", label.replace('.', "-"));
        let t = Terminal::start(cluster.data(), &name, &cluster.kubectl_in_terminal(&bin, "exec -it web-0 -- sh"));
        let shown = t.ask("echo \"tty=$(tty) size=$(stty size)\"", "tty=");
        assert!(shown.starts_with("tty=/dev/pts/"), "kubectl {label}: exec -it runs on a terminal of the container: {shown}");
        assert!(shown.contains("size=40 120"), "kubectl {label}: {shown}");
        t.resize(100, 30);
        t.ask("echo \"resized=$(stty size)\"", "resized=30 100");
        t.type_line("exit 4");
        let exit = wait_for("kubectl exec -it to end", 60, async || {
            t.screen().lines().find(|l| l.starts_with("kubectl-exit=")).map(str::to_string)
        })
        .await;
        assert_eq!(exit.trim(), "kubectl-exit=4", "kubectl {label}: {}", t.screen());
        drop(t);

        let inside = format!("web-0:/tmp/in-{label}.bin");
        let back = cluster.data().join(format!("back-{label}.bin"));
        let (status, _, err) = common::run_with_stdin(kubectl().arg("cp").arg(&src).arg(&inside), None);
        assert!(status.success(), "kubectl {label}: cp into the pod: {err}");
        let (status, _, err) = common::run_with_stdin(kubectl().args(["cp", &inside]).arg(&back), None);
        assert!(status.success(), "kubectl {label}: cp out of the pod: {err}");
        assert!(std::fs::read(&back).expect("copied out") == data, "kubectl {label}: the file copied back differs");

        let local = free_port();
        let mut pf = kubectl()
            .args(["port-forward", "pod/web-0", &format!("{local}:{port}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("port-forward");
        let page = wait_for("the forwarded port to answer", 60, async || {
            reqwest::get(format!("http://127.0.0.1:{local}/index.html")).await.ok()?.text().await.ok()
        })
        .await;
        let _ = pf.kill();
        let _ = pf.wait();
        assert_eq!(page, "hello from the shepherd test image\n", "kubectl {label}: port-forward reaches httpd in the pod");

        let mut attach = kubectl()
            .args(["attach", "web-0"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("attach");
        let mut stdout = attach.stdout.take().expect("stdout");
        let seen = std::thread::spawn(move || {
            use std::io::Read;
            let mut got = Vec::new();
            let mut buf = [0u8; 64];
            while !String::from_utf8_lossy(&got).contains("tick") {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            String::from_utf8_lossy(&got).into_owned()
        });
        wait_for("attach to print output", 30, async || seen.is_finished().then_some(())).await;
        let _ = attach.kill();
        let _ = attach.wait();
        let out = seen.join().expect("reader");
        assert!(out.contains("tick"), "kubectl {label}: attach shows the container's output: {out:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_oci_config_map_and_secret_volumes_carry_their_modes_follow_edits_and_sub_path_stays() {
    let cluster = Cluster::start(&[]);
    cluster.push(&interactive_image(), "busybox", "1").await;
    let image = format!("{}/busybox:1", cluster.registry);
    let token = cluster.data().join("token");
    std::fs::write(&token, "hunter2-very-secret").expect("write token");
    cluster.kubectl(&["create", "configmap", "app", "--from-literal=a=1"], None);
    cluster.kubectl(&["create", "secret", "generic", "creds", &format!("--from-file=token={}", token.display())], None);
    let show = "while :; do echo \"file a=$(cat /srv/a) env a=$a sub a=$(cat /etc/app-a) mode=$(stat -L -c %a /srv/a)\"; \
        echo \"secret=$(cat /creds/token) mode=$(stat -L -c %a /creds/token)\"; sleep 0.5; done";
    cluster.running_pod("app", json!({
        "containers": [{"name": "c", "image": image, "command": ["sh", "-c", show],
            "envFrom": [{"configMapRef": {"name": "app"}}],
            "volumeMounts": [{"name": "conf", "mountPath": "/srv"}, {"name": "conf", "mountPath": "/etc/app-a", "subPath": "a"},
                {"name": "creds", "mountPath": "/creds"}]}],
        "volumes": [{"name": "conf", "configMap": {"name": "app"}}, {"name": "creds", "secret": {"secretName": "creds", "defaultMode": 0o400}}]
    }))
    .await;
    let logs_show = async |text: &str, seconds: u64| {
        wait_for(&format!("{text:?} in the pod's output"), seconds, async || {
            cluster.kubectl(&["logs", "app", "--tail", "2"], None).contains(text).then_some(())
        })
        .await
    };
    logs_show("file a=1 env a=1 sub a=1 mode=644", 30).await;
    logs_show("secret=hunter2-very-secret mode=400", 10).await;
    cluster.kubectl(&["patch", "configmap", "app", "-p", r#"{"data":{"a":"2"}}"#], None);
    // The file follows within 10 s; the environment and the subPath copy do not (as in Kubernetes).
    logs_show("file a=2 env a=1 sub a=1", 10).await;
    let restarts = cluster.kubectl(&["get", "pod", "app", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"], None);
    assert_eq!(restarts, "0", "the file changed without a restart");
}

/// `shepherd image import` while standalone runs: archives made by skopeo from an OCI layout (a
/// `docker save` tarball and an OCI archive) put busybox into the node's store, and pods under
/// `imagePullPolicy: Never` run it with no registry; `image ls` and `image rm` see it; a truncated
/// archive is refused with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_imported_from_docker_and_oci_archives_run_without_a_registry() {
    let cluster = Cluster::start(&[]);
    let work = tempfile::tempdir().expect("tempdir");
    let layout = work.path().join("layout");
    let image = ImageBuilder::busybox().expect("busybox-static").build().expect("build");
    image.write_oci_layout(&layout, "1").expect("layout");
    let shepherd = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_shepherd")).arg("image").args(args).arg("--data-dir").arg(cluster.data()).output().expect("run");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let archives = [
        ("docker-archive", "imported/busybox:1", "docker.io/imported/busybox:1"),
        ("oci-archive", "example.com/imported/busybox:2", "example.com/imported/busybox:2"),
    ];
    for (format, name, stored_as) in archives {
        let archive = work.path().join(format!("{format}.tar"));
        let out = skopeo(work.path(), &["copy", &format!("oci:{}:1", layout.display()), &format!("{format}:{}:{name}", archive.display())]);
        assert!(out.status.success(), "skopeo copy to {format}: {}", String::from_utf8_lossy(&out.stderr));
        let (ok, said, err) = shepherd(&["import", archive.to_str().expect("utf-8")]);
        assert!(ok, "import of a {format}: {err}");
        assert!(said.starts_with(&format!("imported {stored_as} (sha256:")), "{said}");

        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": name, "imagePullPolicy": "Never",
                "command": ["cat", shepherd_registry::testimage::MARKER_PATH]}]}});
        cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
        wait_for("the pod to finish", 60, async || {
            cluster.pods().into_iter().find(|p| p["metadata"]["name"] == format && p["status"]["phase"] == "Succeeded")
        })
        .await;
        let log = cluster.kubectl(&["logs", format], None);
        assert_eq!(log, "shepherd busybox test image\n", "the pod ran the imported image");
    }
    let (ok, listed, err) = shepherd(&["ls"]);
    assert!(ok, "{err}");
    assert!(listed.contains("docker.io/imported/busybox:1") && listed.contains("example.com/imported/busybox:2"), "{listed}");
    let (ok, _, err) = shepherd(&["rm", "example.com/imported/busybox:2"]);
    assert!(ok, "{err}");
    let (_, listed, _) = shepherd(&["ls"]);
    assert!(!listed.contains("example.com/imported/busybox:2") && listed.contains("docker.io/imported/busybox:1"), "{listed}");

    let whole = std::fs::read(work.path().join("oci-archive.tar")).expect("archive");
    let truncated = work.path().join("truncated.tar");
    std::fs::write(&truncated, &whole[..whole.len() / 2]).expect("write");
    let (ok, _, err) = shepherd(&["import", truncated.to_str().expect("utf-8")]);
    assert!(!ok && err.contains("truncated"), "{err}");
}

/// `standalone --registry-test-image busybox:1` seeds its own registry at start: a pod pulls the
/// test image from it with nothing pushed by hand, and `kubectl cp` works through its `tar`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_seeds_its_registry_with_the_test_image_and_kubectl_cp_uses_its_tar() {
    let cluster = Cluster::start(&["--registry-test-image", "busybox:1"]);
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "seeded"},
        "spec": {"containers": [{"name": "c", "image": format!("{}/busybox:1", cluster.registry), "command": ["sleep", "3600"]}]}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    wait_for("the pod Running", 60, async || cluster.pods().into_iter().find(|p| p["metadata"]["name"] == "seeded" && ready(p))).await;
    let work = tempfile::tempdir().expect("tempdir");
    let sent = work.path().join("sent.txt");
    std::fs::write(&sent, "through tar\n").expect("write");
    cluster.kubectl(&["cp", sent.to_str().expect("utf-8"), "seeded:/tmp/got.txt"], None);
    assert_eq!(cluster.kubectl(&["exec", "seeded", "--", "cat", "/tmp/got.txt"], None), "through tar\n");
    let back = work.path().join("back.txt");
    cluster.kubectl(&["cp", "seeded:/tmp/got.txt", back.to_str().expect("utf-8")], None);
    assert_eq!(std::fs::read_to_string(&back).expect("copied back"), "through tar\n");
}

/// Registry mirrors from `<data-dir>/registries.yaml`, as k3s's: an image of a registry that is
/// nowhere (`mirror.test`) is pulled through its mirrors in order (the first does not answer, the
/// second is standalone's registry), stored under its own name, and the Pulled Event says which
/// mirror answered after which failed. A file with a mistake stops the start with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_come_through_the_mirrors_of_registries_yaml_in_order() {
    let mut cluster = Cluster::start(&["--registry-test-image", "busybox:1"]);
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
    let config = format!(
        "mirrors:\n  mirror.test:\n    endpoint:\n      - http://127.0.0.1:{closed}\n      - http://{}\n",
        cluster.registry
    );
    std::fs::write(cluster.data().join("registries.yaml"), config).expect("write registries.yaml");
    cluster.kill9_and_restart();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mirrored"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "mirror.test/busybox:1",
            "command": ["cat", shepherd_registry::testimage::MARKER_PATH]}]}});
    cluster.kubectl(&["apply", "-f", "-"], Some(&pod.to_string()));
    wait_for("the pod to finish", 60, async || {
        cluster.pods().into_iter().find(|p| p["metadata"]["name"] == "mirrored" && p["status"]["phase"] == "Succeeded")
    })
    .await;
    assert_eq!(cluster.kubectl(&["logs", "mirrored"], None), "shepherd busybox test image\n");
    let pulled: Vec<String> = cluster
        .events()
        .into_iter()
        .filter(|e| e["reason"] == "Pulled" && e["involvedObject"]["name"] == "mirrored")
        .map(|e| e["message"].as_str().unwrap_or("").to_string())
        .collect();
    let expected = format!("(from mirror http://{} after http://127.0.0.1:{closed} failed (", cluster.registry);
    assert!(pulled.iter().any(|m| m.contains(&expected)), "the Pulled Event names the mirror and the failure: {pulled:?}");
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd")).args(["image", "ls", "--data-dir"]).arg(cluster.data()).output().expect("run");
    assert!(String::from_utf8_lossy(&out.stdout).contains("mirror.test/busybox:1"), "stored under its own name: {out:?}");

    std::fs::write(cluster.data().join("registries.yaml"), "mirrors:\n  docker.io:\n    endpoint: [mirror.lan:5000]\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["standalone", "--runtime", "oci", "--pod-network", "host", "--insecure-loopback", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(tempfile::tempdir().expect("tempdir").path())
        .args(["--registries"])
        .arg(cluster.data().join("registries.yaml"))
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("registries.yaml: mirrors.docker.io: endpoint \"mirror.lan:5000\" must start with http:// or https://"), "{err}");
}
