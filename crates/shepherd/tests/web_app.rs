//! A small real app on standalone's defaults, deployed as a newcomer would: inside a network
//! namespace the test makes, `shepherd standalone` with no runtime or network flags (as root with
//! runc: the oci runtime, the bridge pod network, cluster DNS), `shepherd image import` of a
//! busybox OCI archive, then one `kubectl apply` of a ConfigMap, a 2-replica Deployment serving it
//! with busybox `httpd`, a Service and a Job that fetches the page by the Service's name.
//! Everything the test reaches is inside that namespace. Needs root, runc, skopeo, busybox-static,
//! nftables, iproute2, util-linux (nsenter), curl and kubectl.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::Netns;
use serde_json::Value;
use shepherd_registry::testimage::ImageBuilder;

const PAGE: &str = "<h1>hello from shepherd</h1>";
const IMAGE: &str = "shepherd.test/busybox:1";

fn require_root_and_tools() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "tests/web_app.rs needs root (oci runtime, pod network in a test-made namespace)");
    for (tool, package) in [
        ("runc", "runc"),
        ("skopeo", "skopeo"),
        ("nft", "nftables"),
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        ("curl", "curl"),
        ("kubectl", "kubectl"),
    ] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success());
        assert!(found, "tests/web_app.rs needs `{tool}` ({package})");
    }
}

fn manifests() -> String {
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: site
data:
  index.html: "{PAGE}"
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {{app: web}}
  template:
    metadata:
      labels: {{app: web}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: httpd
        image: {IMAGE}
        # Ends at once on SIGTERM, as most servers do (httpd alone, as PID 1, would ignore it).
        command: [sh, -c, "echo serving as $(hostname); trap 'exit 0' TERM; httpd -f -p 8080 -h /www & wait"]
        ports:
        - containerPort: 8080
        readinessProbe:
          httpGet: {{path: /, port: 8080}}
          periodSeconds: 1
        lifecycle:
          preStop:
            sleep: {{seconds: 2}}
        volumeMounts:
        - {{name: site, mountPath: /www}}
      volumes:
      - name: site
        configMap: {{name: site}}
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {{app: web}}
  ports:
  - port: 80
    targetPort: 8080
---
apiVersion: batch/v1
kind: Job
metadata:
  name: fetch
spec:
  backoffLimit: 6
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: fetch
        image: {IMAGE}
        command: [wget, -q, -O, -, http://web/]
"#
    )
}

struct Cluster<'a> {
    ns: &'a Netns,
    data: PathBuf,
    child: Option<Child>,
    said: std::sync::mpsc::Receiver<String>,
}

impl<'a> Cluster<'a> {
    fn start(ns: &'a Netns, data: PathBuf) -> Cluster<'a> {
        let mut child = ns
            .command(env!("CARGO_BIN_EXE_shepherd"))
            .arg("standalone")
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen", "127.0.0.1:0"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start shepherd standalone");
        let stdout = child.stdout.take().expect("stdout");
        let mut first = String::new();
        BufReader::new(stdout).read_line(&mut first).expect("the address line");
        assert!(first.contains("listening on https://"), "{first}");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, said) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                let _ = tx.send(line);
            }
        });
        Cluster { ns, data, child: Some(child), said }
    }

    fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let mut cmd = self.ns.command("kubectl");
        cmd.arg("--kubeconfig").arg(self.data.join("admin.kubeconfig")).args(args);
        let out = cmd.output().expect("run kubectl");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl(args);
        assert!(ok, "kubectl {args:?}: {err}");
        out
    }

    fn apply(&self, yaml: &str) {
        let mut cmd = self.ns.command("kubectl");
        cmd.arg("--kubeconfig").arg(self.data.join("admin.kubeconfig")).args(["apply", "-f", "-"]);
        let (status, _, err) = common::run_with_stdin(&mut cmd, Some(yaml));
        assert!(status.success(), "kubectl apply: {err}");
    }

    fn until<T>(&self, what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = f() {
                return v;
            }
            assert!(Instant::now() < deadline, "{what} within {limit:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn web_pods(&self) -> Vec<Value> {
        let (_, out, _) = self.kubectl(&["get", "pods", "-l", "app=web", "-o", "json"]);
        let list: Value = serde_json::from_str(&out).unwrap_or(Value::Null);
        list["items"].as_array().cloned().unwrap_or_default()
    }

    fn curl(&self, url: &str) -> Option<String> {
        let out = self.ns.command("curl").args(["-s", "-f", "-m", "3", url]).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Ctrl-C twice, as a user in a hurry: standalone is gone within 5 s.
    fn interrupt_twice(&mut self) {
        let mut child = self.child.take().expect("running");
        let pid = child.id().to_string();
        let started = Instant::now();
        for _ in 0..2 {
            let _ = Command::new("kill").args(["-INT", &pid]).status();
            std::thread::sleep(Duration::from_millis(300));
        }
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                assert!(status.success(), "standalone exits cleanly after Ctrl-C twice: {status}");
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(5), "standalone still running 5 s after Ctrl-C twice");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster<'_> {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        common::kill_leftovers(&[], Some(&self.data));
        for m in common::mounts_under(&self.data) {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
    }
}

fn import_busybox(work: &Path, data: &Path) {
    let layout = work.join("layout");
    let image = ImageBuilder::busybox().expect("busybox-static").build().expect("build the busybox image");
    image.write_oci_layout(&layout, "1").expect("write the OCI layout");
    let archive = work.join("busybox.tar");
    let out = Command::new("skopeo")
        .args(["copy", "--quiet", &format!("oci:{}:1", layout.display()), &format!("oci-archive:{}:{IMAGE}", archive.display())])
        .output()
        .expect("run skopeo");
    assert!(out.status.success(), "skopeo copy: {}", String::from_utf8_lossy(&out.stderr));
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd")).arg("image").arg("import").arg(&archive).arg("--data-dir").arg(data).output().expect("run");
    assert!(out.status.success(), "shepherd image import: {}", String::from_utf8_lossy(&out.stderr));
}

fn pod_ips(pods: &[Value]) -> Vec<(String, String)> {
    let mut ips: Vec<(String, String)> = pods
        .iter()
        .map(|p| (p["metadata"]["name"].as_str().unwrap_or("").to_string(), p["status"]["podIP"].as_str().unwrap_or("").to_string()))
        .collect();
    ips.sort();
    ips
}

fn ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

#[test]
fn a_small_web_app_runs_on_the_defaults_and_survives_a_rollout_and_a_restart() {
    require_root_and_tools();
    let work = tempfile::tempdir().expect("tempdir");
    let data = work.path().join("data");
    let ns = Netns::new(format!("shpapp{}", std::process::id() % 100_000));
    let mut cluster = Cluster::start(&ns, data.clone());
    let network = common::line_starting(&cluster.said, "pod network:", Duration::from_secs(10));
    assert!(network.starts_with("pod network: bridge shep0"), "standalone picks the bridge pod network as root: {network}");
    let registry = common::line_starting(&cluster.said, "registry:", Duration::from_secs(10));
    assert!(registry.starts_with("registry: http://127.0.0.1:5000 "), "the built-in registry, on by default: {registry}");
    let addons = common::line_starting(&cluster.said, "add-ons:", Duration::from_secs(10));
    assert!(addons.contains(&format!("{}/manifests", data.display())), "{addons}");
    import_busybox(work.path(), &data);

    cluster.apply(&manifests());
    cluster.ok(&["rollout", "status", "deployment/web", "--timeout=90s"]);
    cluster.ok(&["wait", "--for=condition=complete", "job/fetch", "--timeout=90s"]);
    // An attempt that ran before the Service had a ready endpoint may have failed and been retried,
    // as on any cluster: the attempt that succeeded printed the page.
    let done = cluster.ok(&["get", "pods", "-l", "job-name=fetch", "--field-selector=status.phase=Succeeded", "-o", "name"]);
    let done = done.lines().next().expect("a succeeded pod of the Job").to_string();
    assert_eq!(cluster.ok(&["logs", &done]), PAGE, "the Job fetched the page by the Service's name");

    // Pods reach beyond the node, masqueraded: a server in another test-made namespace, which
    // has no route back to the pod addresses, answers a pod.
    let outside = Netns::new(format!("shpout{}", std::process::id() % 100_000));
    let (inner, outer) = (format!("o{}", std::process::id() % 100_000), format!("i{}", std::process::id() % 100_000));
    ns.ip(&["link", "add", &inner, "type", "veth", "peer", "name", &outer, "netns", &outside.0]);
    ns.ip(&["addr", "add", "192.0.2.1/24", "dev", &inner]);
    ns.ip(&["link", "set", &inner, "up"]);
    outside.ip(&["addr", "add", "192.0.2.2/24", "dev", &outer]);
    outside.ip(&["link", "set", &outer, "up"]);
    let www = work.path().join("outside-www");
    std::fs::create_dir_all(&www).expect("mkdir");
    std::fs::write(www.join("index.html"), "from outside\n").expect("write");
    let mut server = outside.command("busybox").args(["httpd", "-f", "-p", "8080", "-h"]).arg(&www).spawn().expect("busybox httpd");
    cluster.apply(&format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: egress\nspec:\n  backoffLimit: 0\n  template:\n    spec:\n      \
         restartPolicy: Never\n      containers:\n      - name: get\n        image: {IMAGE}\n        \
         command: [wget, -q, -O, -, http://192.0.2.2:8080/]\n"
    ));
    let (waited, _, err) = cluster.kubectl(&["wait", "--for=condition=complete", "job/egress", "--timeout=60s"]);
    let log = cluster.kubectl(&["logs", "job/egress"]).1;
    let _ = server.kill();
    let _ = server.wait();
    assert!(waited, "a pod's request leaves the node masqueraded and is answered: {err} {log}");
    assert_eq!(log, "from outside\n");

    // The node reaches the ClusterIP, and port-forward reaches the Service's pods.
    let ip = cluster.ok(&["get", "service", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    assert_eq!(cluster.curl(&format!("http://{ip}/")).as_deref(), Some(PAGE), "the ClusterIP answers from the node");
    let mut forward = cluster
        .ns
        .command("kubectl")
        .arg("--kubeconfig")
        .arg(data.join("admin.kubeconfig"))
        .args(["port-forward", "svc/web", ":80"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kubectl port-forward");
    let mut line = String::new();
    // Kept open: kubectl says "Handling connection for ..." on each connection.
    let mut said = BufReader::new(forward.stdout.take().expect("stdout"));
    said.read_line(&mut line).expect("forwarding line");
    let local = line.split_whitespace().nth(2).expect("Forwarding from ADDR -> PORT").to_string();
    let forwarded = cluster.curl(&format!("http://{local}/"));
    let _ = forward.kill();
    let _ = forward.wait();
    drop(said);
    assert_eq!(forwarded.as_deref(), Some(PAGE), "kubectl port-forward svc/web answers ({line})");

    // kubectl cp into a pod and out of it (the ConfigMap's files are symlinks, which kubectl cp
    // skips, as on any cluster).
    let pod = cluster.web_pods()[0]["metadata"]["name"].as_str().expect("a pod").to_string();
    let sent = work.path().join("sent.txt");
    std::fs::write(&sent, "sent in\n").expect("write");
    cluster.ok(&["cp", sent.to_str().expect("utf-8"), &format!("{pod}:/tmp/sent.txt")]);
    assert_eq!(cluster.ok(&["exec", &pod, "--", "cat", "/tmp/sent.txt"]), "sent in\n");
    let back = work.path().join("back.txt");
    cluster.ok(&["cp", &format!("{pod}:/tmp/sent.txt"), back.to_str().expect("utf-8")]);
    assert_eq!(std::fs::read_to_string(&back).expect("copied out"), "sent in\n");

    // A rollout restart under a client looping requests: none is lost.
    let (stop, served, lost) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let client = {
        let (stop, served, lost) = (stop.clone(), served.clone(), lost.clone());
        let ns = cluster.ns.path();
        let url = format!("http://{ip}/");
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = Command::new("nsenter").arg(format!("--net={ns}")).args(["--", "curl", "-s", "-f", "-m", "3", &url]).output();
                match out {
                    Ok(o) if o.status.success() && o.stdout == PAGE.as_bytes() => served.fetch_add(1, Ordering::Relaxed),
                    _ => lost.fetch_add(1, Ordering::Relaxed),
                };
            }
        })
    };
    let before: Vec<String> = cluster.web_pods().iter().map(|p| p["metadata"]["name"].as_str().unwrap_or("").to_string()).collect();
    cluster.ok(&["rollout", "restart", "deployment/web"]);
    cluster.ok(&["rollout", "status", "deployment/web", "--timeout=120s"]);
    cluster.until("the old pods gone", Duration::from_secs(60), || {
        let now = cluster.web_pods();
        (now.len() == 2 && now.iter().all(|p| !before.iter().any(|b| p["metadata"]["name"] == b.as_str()))).then_some(())
    });
    stop.store(true, Ordering::Relaxed);
    client.join().expect("client");
    let (served, lost) = (served.load(Ordering::Relaxed), lost.load(Ordering::Relaxed));
    assert!(served > 20, "the client kept requesting through the rollout: {served} served");
    assert_eq!(lost, 0, "requests lost during the rollout restart ({served} served)");

    // Ctrl-C twice: no container process, no mount left; a new start brings the pods back with
    // their addresses and their earlier logs.
    let pods_before = pod_ips(&cluster.web_pods());
    cluster.interrupt_twice();
    let data_text = format!("{}/", data.display());
    let left: Vec<String> = common::processes_with(&data_text).into_iter().filter(|p| p.contains("shepherd-shim") || p.contains("runc")).collect();
    assert!(left.is_empty(), "container processes left after Ctrl-C twice: {left:?}");
    assert_eq!(common::mounts_under(&data), Vec::<String>::new(), "mounts left after Ctrl-C twice");
    drop(cluster);
    let cluster = Cluster::start(&ns, data.clone());
    let pods_after = cluster.until("both web pods Ready again", Duration::from_secs(90), || {
        let pods = cluster.web_pods();
        (pods.len() == 2 && pods.iter().all(ready)).then(|| pod_ips(&pods))
    });
    assert_eq!(pods_after, pods_before, "the pods came back with the same addresses");
    let name = &pods_after[0].0;
    let previous = cluster.ok(&["logs", "--previous", name]);
    assert_eq!(previous, format!("serving as {name}\n"), "kubectl logs --previous shows the log from before the restart");
    assert_eq!(cluster.curl(&format!("http://{ip}/")).as_deref(), Some(PAGE), "the Service answers after the restart");
}
