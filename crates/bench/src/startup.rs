//! Scenario `startup`: what a newcomer waits for. `shepherd standalone` with nothing but a data
//! directory and a free port, inside a network namespace the scenario makes, so its defaults
//! apply in full (as root with runc: the oci runtime, the bridge pod network, cluster DNS): the
//! time from the command to the API ready (`/readyz` 200), to the node Ready, and to the cluster
//! DNS answering at the kube-dns ClusterIP; then `shepherd image import` of a ~5 MB OCI archive;
//! then the newcomer app (a ConfigMap, a 2-replica Deployment of busybox httpd with a readiness
//! probe, a Service) from the first create to both pods Ready. Each run starts from an empty data
//! directory. Needs root, runc, iproute2 and nftables; the machine's own
//! network namespace is not touched (the measuring side runs this binary again inside, `--inside`).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::RngCore;
use serde_json::{Value, json};

use crate::report::{ScenarioResult, median};

pub struct Params {
    pub runs: usize,
}

const IMAGE: &str = "bench.test/app:1";
/// The kube-dns ClusterIP of the default Service range.
const CLUSTER_DNS: &str = "10.96.0.10";

/// Runs the measurement in a network namespace of its own.
pub fn run(binary: &Path, out: &Path, p: &Params) -> anyhow::Result<ScenarioResult> {
    let values = crate::netns::measure_inside("startup", binary, out, &["--runs".into(), p.runs.to_string()])?;
    Ok(ScenarioResult { name: "startup", params: json!({"runs": p.runs}), values })
}

/// A ~5 MB image archive (busybox and 4 MiB of random bytes) as an OCI layout in a tar.
fn archive(work: &Path) -> anyhow::Result<std::path::PathBuf> {
    let mut filler = vec![0u8; 4 << 20];
    rand::rng().fill_bytes(&mut filler);
    let image = shepherd_registry::testimage::ImageBuilder::busybox()
        .map_err(|e| anyhow::anyhow!("{e} (package busybox-static)"))?
        .file("/srv/filler", filler, 0o644)
        .build()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let layout = work.join("layout");
    image.write_oci_layout(&layout, IMAGE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let file = work.join("app.tar");
    let ok = Command::new("tar").arg("-C").arg(&layout).arg("-cf").arg(&file).arg(".").status()?.success();
    anyhow::ensure!(ok, "tar of the OCI layout failed");
    Ok(file)
}

/// Whether the cluster DNS answers an A query for kube-dns's own name within 50 ms (a query sent
/// before the Service's rules exist is lost, and `dig` would wait a whole second for it).
fn dns_answers() -> bool {
    let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in "kube-dns.kube-system.svc.cluster.local".split('.') {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    let Ok(socket) = std::net::UdpSocket::bind("0.0.0.0:0") else { return false };
    let _ = socket.set_read_timeout(Some(Duration::from_millis(50)));
    if socket.send_to(&query, (CLUSTER_DNS, 53)).is_err() {
        return false;
    }
    let mut answer = [0u8; 512];
    // An answer to this query (same id), without error, with at least one record.
    matches!(socket.recv(&mut answer), Ok(n) if n > 12 && answer[..2] == [0x12, 0x34] && answer[3] & 0x0f == 0 && answer[7] > 0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct Run {
    api: f64,
    node: f64,
    dns: f64,
    import: f64,
    app: f64,
}

/// Measures inside the namespace and prints `RESULT {json}`.
pub async fn inside(binary: &Path, p: &Params) -> anyhow::Result<()> {
    let work = tempfile::tempdir()?;
    let archive = archive(work.path())?;
    let size = std::fs::metadata(&archive)?.len();
    let mut runs = Vec::new();
    for i in 0..p.runs.max(1) {
        let data = work.path().join(format!("data-{i}"));
        let r = one(binary, &data, &archive).await?;
        println!(
            "run {}: API ready {:.0} ms, node Ready {:.0} ms, DNS answering {:.0} ms, import {:.0} ms, app Ready {:.0} ms",
            i + 1,
            r.api,
            r.node,
            r.dns,
            r.import,
            r.app
        );
        runs.push(r);
    }
    let m = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let values = json!({
        "api_ready_ms_p50": m(|r| r.api), "node_ready_ms_p50": m(|r| r.node), "dns_answering_ms_p50": m(|r| r.dns),
        "import_ms_p50": m(|r| r.import), "archive_bytes": size, "app_ready_ms_p50": m(|r| r.app), "runs": runs.len(),
    });
    println!("RESULT {values}");
    Ok(())
}

async fn one(binary: &Path, data: &Path, archive: &Path) -> anyhow::Result<Run> {
    let started = Instant::now();
    let mut child = Command::new(binary)
        .arg("standalone")
        .arg("--data-dir")
        .arg(data)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?).read_line(&mut line)?;
    let url = line.split_whitespace().last().unwrap_or_default().to_string();
    let result = measure(binary, data, archive, &url, started).await;
    // Ctrl-C twice: stop the pods at once.
    for _ in 0..2 {
        let _ = Command::new("kill").args(["-INT", &child.id().to_string()]).status();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait()?.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    result
}

async fn measure(binary: &Path, data: &Path, archive: &Path, url: &str, started: Instant) -> anyhow::Result<Run> {
    anyhow::ensure!(url.starts_with("https://"), "standalone printed no address");
    let ca = std::fs::read(data.join("pki/ca.crt"))?;
    let token = std::fs::read_to_string(data.join("admin.token"))?;
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.trim()))?);
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
        .default_headers(headers)
        .timeout(Duration::from_secs(5))
        .build()?;
    let deadline = started + Duration::from_secs(60);
    let (mut api, mut node, mut dns) = (None, None, None);
    while api.is_none() || node.is_none() || dns.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "not ready within 60 s (API {api:?}, node {node:?}, DNS {dns:?})");
        if api.is_none() && http.get(format!("{url}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
            api = Some(started.elapsed());
        }
        if api.is_some() && node.is_none() {
            let nodes: Value = match http.get(format!("{url}/api/v1/nodes")).send().await {
                Ok(r) => r.json().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            };
            let ready = nodes["items"].as_array().into_iter().flatten().any(|n| {
                n["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            if ready {
                node = Some(started.elapsed());
            }
        }
        if dns.is_none() && dns_answers() {
            dns = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let t = Instant::now();
    let out = Command::new(binary).args(["image", "import"]).arg(archive).arg("--data-dir").arg(data).output()?;
    anyhow::ensure!(out.status.success(), "image import: {}", String::from_utf8_lossy(&out.stderr));
    let import = t.elapsed();

    let app = Instant::now();
    let objects = [
        ("api/v1/namespaces/default/configmaps", json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "site"},
            "data": {"index.html": "<h1>hello</h1>"}})),
        ("apis/apps/v1/namespaces/default/deployments", json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "httpd", "image": IMAGE, "command": ["httpd", "-f", "-p", "8080", "-h", "/www"],
                    "readinessProbe": {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1},
                    "volumeMounts": [{"name": "site", "mountPath": "/www"}]}],
                    "volumes": [{"name": "site", "configMap": {"name": "site"}}]}}}})),
        ("api/v1/namespaces/default/services", json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}})),
    ];
    for (path, body) in objects {
        let r = http.post(format!("{url}/{path}")).json(&body).send().await?;
        anyhow::ensure!(r.status().is_success(), "creating {path}: {}", r.text().await.unwrap_or_default());
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let d: Value = http.get(format!("{url}/apis/apps/v1/namespaces/default/deployments/web")).send().await?.json().await?;
        if d["status"]["readyReplicas"] == 2 {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the app was not Ready within 60 s: {}", d["status"]);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let app = app.elapsed();
    let (api, node, dns) = (api.unwrap_or_default(), node.unwrap_or_default(), dns.unwrap_or_default());
    Ok(Run { api: ms(api), node: ms(node), dns: ms(dns), import: ms(import), app: ms(app) })
}
