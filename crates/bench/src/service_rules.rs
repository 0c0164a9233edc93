//! Scenario `service-rules`: `shepherd server` and `shepherd agent --pod-network bridge` in a
//! network namespace the scenario makes, N Services of M endpoints each, then one endpoint of one
//! Service changed at a time: how long until the agent's nftables table has it, and the CPU the
//! agent (and the `nft` it runs) spent on it, as the agent logs them; then Services added and
//! removed one at a time, the same figures; also how many full rebuilds happened meanwhile, what
//! one costs, and what the checks of the table cost (the one every second, and one that lists).
//!
//! Needs root, iproute2 and nftables. The machine's own network namespace is not touched: the
//! measuring side runs this same binary again inside the namespace (`--inside`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};

use crate::cluster::Process;
use crate::report::{ScenarioResult, median};

pub struct Params {
    pub services: usize,
    pub endpoints: usize,
    pub changes: usize,
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the measurement in a network namespace of its own and returns what it found.
pub fn run(binary: &Path, out: &Path, p: &Params) -> anyhow::Result<ScenarioResult> {
    let args = ["--services".to_string(), p.services.to_string(), "--endpoints".into(), p.endpoints.to_string(), "--changes".into(), p.changes.to_string()];
    let values = crate::netns::measure_inside("service-rules", binary, out, &args)?;
    Ok(ScenarioResult {
        name: "service-rules",
        params: json!({"services": p.services, "endpoints_per_service": p.endpoints, "changes": p.changes}),
        values,
    })
}

fn endpoints_object(i: usize, endpoints: usize, generation: usize) -> Value {
    // 10.200.0.0/14 holds 256K addresses: the Service's block of endpoints, the changed one
    // moved by `generation`.
    let address = |j: usize| {
        let n = (i * endpoints + j + if j == 0 { generation * 1_000_003 } else { 0 }) % (1 << 18);
        format!("10.{}.{}.{}", 200 + n / 65_536, (n / 256) % 256, n % 256)
    };
    json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": format!("svc-{i}")},
        "subsets": [{"addresses": (0..endpoints).map(|j| json!({"ip": address(j)})).collect::<Vec<_>>(),
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]})
}

/// The `key=value` number fields of the agent's log lines whose message contains `message`.
fn logged(log: &str, message: &str, field: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains(message))
        .filter_map(|l| l.split(&format!("{field}=")).nth(1)?.split_whitespace().next()?.parse().ok())
        .collect()
}

fn p99(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * 0.99).round() as usize).copied().unwrap_or(0.0)
}

fn services_in_table() -> usize {
    let out = Command::new("nft").args(["list", "map", "ip", "shepherd", "service-ips"]).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).matches("goto svc-").count()).unwrap_or(0)
}

/// Runs `act`, then waits for the agent's next "service rules applied" line(s): their
/// event-to-rule times and CPU.
async fn applied_after<F, Fut>(read_log: &impl Fn() -> String, act: F) -> anyhow::Result<(Vec<f64>, Vec<f64>)>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let before = logged(&read_log(), "service rules applied", "cpu_ms").len();
    act().await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = read_log();
        let applied = logged(&log, "service rules applied", "cpu_ms");
        if applied.len() > before {
            let e = logged(&log, "service rules applied", "event_to_rule_ms");
            return Ok((e.get(before..).unwrap_or_default().to_vec(), applied[before..].to_vec()));
        }
        anyhow::ensure!(Instant::now() < deadline, "the change never reached the table");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The measurement itself, inside the namespace.
pub async fn inside(binary: &Path, p: &Params) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("server").to_string_lossy().to_string();
    let server = Process::start(binary, &["server", "--in-memory", "--data-dir", &data])?;
    let url = server.url.clone();
    let log_path = dir.path().join("agent.log");
    let agent = Command::new(binary)
        .args(["agent", "--server", &url, "--node-name", "bench", "--runtime", "process", "--pod-network", "bridge"])
        .arg("--data-dir")
        .arg(dir.path().join("agent"))
        .env("RUST_LOG", "warn,shepherd_agent::proxy=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?)
        .spawn()?;
    // Killed on every way out, errors included.
    let mut agent = KillOnDrop(agent);
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    let http = reqwest::Client::new();
    let started = Instant::now();
    let posts = (0..p.services).flat_map(|i| {
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("svc-{i}")},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}});
        [("services", svc), ("endpoints", endpoints_object(i, p.endpoints, 0))]
    });
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(posts)
        .map(|(plural, body)| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r = http.post(format!("{url}/api/v1/namespaces/default/{plural}")).json(&body).send().await?;
                anyhow::ensure!(r.status().is_success(), "creating {plural}: {}", r.status());
                Ok(())
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<Vec<()>>>()?;
    while services_in_table() < p.services {
        anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "the agent's table never held {} Services", p.services);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("{} Services x {} endpoints created and in the table after {:.1?}", p.services, p.endpoints, started.elapsed());
    // Let the rebuild after the last changes pass.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (mut event_to_rule, mut cpu) = (Vec::new(), Vec::new());
    let nft_before = logged(&read_log(), "service rules applied", "nft_cpu_ms").len();
    let rebuilds_before = logged(&read_log(), "service table rebuilt", "cpu_ms").len();
    for k in 0..p.changes {
        let i = (k * 7919) % p.services;
        let body = endpoints_object(i, p.endpoints, k + 1);
        let (e, c) = applied_after(&read_log, || async {
            let r = http.put(format!("{url}/api/v1/namespaces/default/endpoints/svc-{i}")).json(&body).send().await?;
            anyhow::ensure!(r.status().is_success(), "changing endpoints svc-{i}: {}", r.status());
            Ok(())
        })
        .await?;
        event_to_rule.extend(e);
        cpu.extend(c);
        // Apart, so that each change is one transaction and a resync passes between two.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    let nft_cpu = logged(&read_log(), "service rules applied", "nft_cpu_ms").split_off(nft_before);
    let rebuilds_during_changes = logged(&read_log(), "service table rebuilt", "cpu_ms").len().saturating_sub(rebuilds_before);

    // Services that come and go: the Endpoints first (no rules without the Service), then the
    // Service, which is one event; its deletion is another.
    let rebuilds_before = logged(&read_log(), "service table rebuilt", "cpu_ms").len();
    let (mut add_ms, mut add_cpu, mut remove_ms, mut remove_cpu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for k in 0..p.changes.min(10) {
        let name = format!("new-{k}");
        let mut eps = endpoints_object(p.services + k, p.endpoints, 0);
        eps["metadata"]["name"] = json!(name);
        let r = http.post(format!("{url}/api/v1/namespaces/default/endpoints")).json(&eps).send().await?;
        anyhow::ensure!(r.status().is_success(), "creating endpoints {name}: {}", r.status());
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}});
        let (e, c) = applied_after(&read_log, || async {
            let r = http.post(format!("{url}/api/v1/namespaces/default/services")).json(&svc).send().await?;
            anyhow::ensure!(r.status().is_success(), "creating service {name}: {}", r.status());
            Ok(())
        })
        .await?;
        add_ms.extend(e);
        add_cpu.extend(c);
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let (e, c) = applied_after(&read_log, || async {
            let r = http.delete(format!("{url}/api/v1/namespaces/default/services/{name}")).send().await?;
            anyhow::ensure!(r.status().is_success(), "deleting service {name}: {}", r.status());
            Ok(())
        })
        .await?;
        remove_ms.extend(e);
        remove_cpu.extend(c);
        let _ = http.delete(format!("{url}/api/v1/namespaces/default/endpoints/{name}")).send().await?;
        tokio::time::sleep(Duration::from_millis(1_500)).await;
    }
    let rebuilds_during_adds = logged(&read_log(), "service table rebuilt", "cpu_ms").len().saturating_sub(rebuilds_before);

    // The table flushed by hand: how long until a check finds and rebuilds it, and at what cost.
    let before = logged(&read_log(), "service table rebuilt", "cpu_ms").len();
    let flushed = Instant::now();
    let ok = Command::new("nft").args(["flush", "table", "ip", "shepherd"]).status().is_ok_and(|s| s.success());
    anyhow::ensure!(ok, "nft flush table ip shepherd failed");
    while logged(&read_log(), "service table rebuilt", "cpu_ms").len() <= before {
        anyhow::ensure!(flushed.elapsed() < Duration::from_secs(120), "the flushed table was never rebuilt");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let repaired_ms = flushed.elapsed().as_secs_f64() * 1e3;
    let repair_cpu = logged(&read_log(), "service table rebuilt", "cpu_ms").get(before).copied().unwrap_or(0.0);

    let log = read_log();
    let rebuild_cpu = logged(&log, "service table rebuilt", "cpu_ms");
    let rebuild_took = logged(&log, "service table rebuilt", "took_ms");
    let check_cpu = logged(&log, "service table checked", "cpu_ms");
    let listed_cpu = logged(&log, "service table listed and compared", "cpu_ms");
    let listed_took = logged(&log, "service table listed and compared", "took_ms");
    let _ = agent.0.kill();
    let _ = agent.0.wait();
    let (e50, e99, c50, c99) = (median(event_to_rule.clone()), p99(event_to_rule.clone()), median(cpu.clone()), p99(cpu.clone()));
    let (rebuild_cpu, rebuild_took) = (median(rebuild_cpu), median(rebuild_took));
    let (checks, check_cpu, lists) = (check_cpu.len(), median(check_cpu), listed_cpu.len());
    let (listed_cpu, listed_took) = (median(listed_cpu), median(listed_took));
    let values = json!({
        "event_to_rule_ms": {"p50": e50, "p99": e99, "n": event_to_rule.len()},
        "change_cpu_ms": {"p50": c50, "p99": c99, "n": cpu.len()},
        "change_nft_cpu_ms_median": median(nft_cpu.clone()),
        "service_add": {"event_to_rule_ms_median": median(add_ms.clone()), "cpu_ms_median": median(add_cpu.clone()), "n": add_cpu.len()},
        "service_remove": {"event_to_rule_ms_median": median(remove_ms), "cpu_ms_median": median(remove_cpu.clone()), "n": remove_cpu.len()},
        "rebuild_cpu_ms_median": rebuild_cpu,
        "flushed_table_rebuilt_after_ms": repaired_ms,
        "flushed_table_rebuild_cpu_ms": repair_cpu,
        "rebuilds_during_changes": rebuilds_during_changes,
        "rebuilds_during_adds_and_removes": rebuilds_during_adds,
        "rebuild_took_ms_median": rebuild_took,
        "idle_check_cpu_ms_median": check_cpu,
        "idle_checks": checks,
        "listing_check_cpu_ms_median": listed_cpu,
        "listing_check_took_ms_median": listed_took,
        "listing_checks": lists,
        "load_average": crate::procstat::load_average(),
    });
    println!(
        "one endpoint change at {} Services x {}: event to rule p50 {e50:.1} ms p99 {e99:.1} ms; CPU (agent + nft) p50 {c50:.1} ms p99 {c99:.1} ms over {} changes",
        p.services, p.endpoints, cpu.len()
    );
    println!("  of which nft: median {:.1} ms", median(nft_cpu));
    println!(
        "a Service added: event to rule median {:.1} ms, CPU {:.1} ms; removed: CPU {:.1} ms (over {}); full rebuilds meanwhile: {rebuilds_during_adds}",
        median(add_ms),
        median(add_cpu.clone()),
        median(remove_cpu),
        add_cpu.len()
    );
    println!(
        "full rebuilds: {rebuilds_during_changes} while the changes ran; one costs median {rebuild_cpu:.1} ms CPU, {rebuild_took:.1} ms; \
         the check of the table every second: median {check_cpu:.2} ms CPU ({checks}); a check that lists the table: \
         median {listed_cpu:.1} ms CPU, {listed_took:.1} ms ({lists})"
    );
    println!("the table flushed by hand: rebuilt after {repaired_ms:.0} ms, {repair_cpu:.1} ms CPU");
    println!("RESULT {values}");
    drop(server);
    // The namespace goes with the caller; the table goes now in case it lingers.
    let _ = Command::new("nft").args(["delete", "table", "ip", "shepherd"]).status();
    Ok(())
}
