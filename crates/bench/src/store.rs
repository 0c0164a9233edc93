//! Scenario `store`: durable creates/s with 1 and 64 clients, list latency and RSS with N pods, over
//! plain HTTP or TLS with a token, on the embedded store's write-ahead-log engine and on the
//! previous redb-only engine side by side; then the same creates at the store alone, no HTTP.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd_store::{HistoryLimits, LocalStore, Store};

use crate::cluster::Process;
use crate::report::{ScenarioResult, summarize};

fn pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "c", "image": "minimal", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}})
}

/// Creates `n` pods from `clients` concurrent clients: the time it took, and each create's latency.
async fn create_n(
    http: &reqwest::Client,
    url: &str,
    prefix: &str,
    n: usize,
    clients: usize,
) -> anyhow::Result<(Duration, Vec<Duration>)> {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (http, url, next, prefix) = (http.clone(), url.to_string(), next.clone(), prefix.to_string());
        tasks.push(tokio::spawn(async move {
            let mut took = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, anyhow::Error>(took);
                }
                let sent = Instant::now();
                let r = http.post(format!("{url}/api/v1/namespaces/default/pods")).json(&pod(&format!("{prefix}-{i}"))).send().await?;
                anyhow::ensure!(r.status().as_u16() == 201, "create failed: {}", r.status());
                r.bytes().await?;
                took.push(sent.elapsed());
            }
        }));
    }
    let mut took = Vec::with_capacity(n);
    for t in tasks {
        took.extend(t.await??);
    }
    Ok((started.elapsed(), took))
}

/// What one engine measured.
struct Measured {
    one_rate: f64,
    one_ms: f64,
    /// Each create's latency, 1 client.
    one: Value,
    many_rate: f64,
    list: Value,
    count: usize,
    rss: f64,
}

/// Runs the scenario on each embedded engine in turn, each on a fresh server and data directory:
/// the default (a write-ahead log checkpointed into redb) and the previous redb-only engine
/// (`shepherd server --store-engine redb`), side by side.
pub async fn run(binary: &Path, pods: usize, sequential: usize, list_runs: usize, tls: bool) -> anyhow::Result<ScenarioResult> {
    let transport = if tls { "TLS + token" } else { "plain HTTP" };
    println!("scenario store: pods={pods} sequential={sequential} list_runs={list_runs}, {transport}");
    let wal = measure(binary, "wal", pods, sequential, list_runs, tls).await?;
    let redb = measure(binary, "redb", pods, sequential, list_runs, tls).await?;
    println!("{:<34} {:>16} {:>16}", "", "embedded (wal)", "redb-only");
    let row = |what: &str, a: String, b: String| println!("{what:<34} {a:>16} {b:>16}");
    row("creates/s, 1 client", format!("{:.0}", wal.one_rate), format!("{:.0}", redb.one_rate));
    row("ms per create, 1 client", format!("{:.3}", wal.one_ms), format!("{:.3}", redb.one_ms));
    let at = |m: &Measured, q: &str| m.one[q].as_f64().map_or("-".into(), |v| format!("{v:.3}"));
    row("  p50 / p99 ms, 1 client", format!("{} / {}", at(&wal, "p50_ms"), at(&wal, "p99_ms")), format!("{} / {}", at(&redb, "p50_ms"), at(&redb, "p99_ms")));
    row("creates/s, 64 clients", format!("{:.0}", wal.many_rate), format!("{:.0}", redb.many_rate));
    let p50 = |m: &Measured| m.list["p50_ms"].as_f64().map_or("-".into(), |v| format!("{v:.1}"));
    row(&format!("list of {} pods p50 ms", wal.count), p50(&wal), p50(&redb));
    row("server RSS MiB", format!("{:.1}", wal.rss), format!("{:.1}", redb.rss));

    // The store alone runs the engine linked into this binary, not `binary`'s.
    let (one, many) = (sequential * 5, pods.saturating_sub(sequential) * 5);
    println!("the store alone, no HTTP ({one} creates of 1 KiB by 1 writer, {many} by 64):");
    let wal_alone = at_store("wal", one, many).await?;
    let redb_alone = at_store("redb", one, many).await?;
    let q = |m: &Value, what: &str| m["one"][what].as_f64().map_or("-".into(), |v| format!("{v:.3}"));
    for what in ["p50_ms", "p99_ms", "max_ms"] {
        row(&format!("  store alone, 1 writer, {what}"), q(&wal_alone, what), q(&redb_alone, what));
    }
    let rate = |m: &Value| m["creates_per_s_64_writers"].as_f64().map_or("-".into(), |v| format!("{v:.0}"));
    row("  store alone, creates/s, 64 writers", rate(&wal_alone), rate(&redb_alone));

    let values = |m: &Measured| {
        json!({"creates_per_s_1_client": m.one_rate, "ms_per_create_1_client": m.one_ms, "create_1_client": m.one,
            "creates_per_s_64_clients": m.many_rate, "list": m.list, "listed": m.count, "rss_mib": m.rss})
    };
    let mut all = values(&wal);
    all["at_store"] = wal_alone;
    all["redb_only"] = values(&redb);
    all["redb_only"]["at_store"] = redb_alone;
    Ok(ScenarioResult {
        name: "store",
        params: json!({"pods": pods, "sequential": sequential, "list_runs": list_runs, "tls": tls}),
        values: all,
    })
}

async fn measure(
    binary: &Path,
    engine: &str,
    pods: usize,
    sequential: usize,
    list_runs: usize,
    tls: bool,
) -> anyhow::Result<Measured> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let args = ["server", "--controllers", "none", "--data-dir", &data, "--store-engine", engine];
    let (server, http) = Process::start_reachable(binary, &args, dir.path(), tls)?;
    println!("engine {engine}:");

    let (one, took) = create_n(&http, &server.url, "seq", sequential, 1).await?;
    let one_rate = sequential as f64 / one.as_secs_f64();
    let one_ms = one.as_secs_f64() * 1000.0 / sequential as f64;
    let latency = summarize(&took);
    println!("  durable creates, 1 client: {one_rate:.0}/s ({one_ms:.3} ms each; {latency})");

    let rest = pods.saturating_sub(sequential);
    let (many, _) = create_n(&http, &server.url, "par", rest, 64).await?;
    let many_rate = rest as f64 / many.as_secs_f64();
    println!("  durable creates, 64 clients: {many_rate:.0}/s");

    let mut samples = Vec::new();
    let mut count = 0;
    for _ in 0..list_runs {
        let t = Instant::now();
        let body = http.get(format!("{}/api/v1/namespaces/default/pods", server.url)).send().await?.bytes().await?;
        samples.push(t.elapsed());
        count = serde_json::from_slice::<Value>(&body)?["items"].as_array().map_or(0, Vec::len);
    }
    let list = summarize(&samples);
    println!("  list of {count} pods: {list}");
    let rss = server.rss_mib();
    println!("  server RSS with {count} pods: {rss:.1} MiB");
    Ok(Measured { one_rate, one_ms, one: serde_json::to_value(&latency)?, many_rate, list: serde_json::to_value(&list)?, count, rss })
}

/// Creates at the store alone, on a fresh data directory: `one` by a single writer (each one's
/// latency) and `many` by 64 concurrent writers (creates/s), 1 KiB values.
async fn at_store(engine: &str, one: usize, many: usize) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store.redb");
    let store: Arc<dyn Store> = match engine {
        "wal" => Arc::new(LocalStore::open_redb(&path, HistoryLimits::default())?),
        _ => Arc::new(LocalStore::open_redb_only(&path, HistoryLimits::default())?),
    };
    let value = vec![b'x'; 1024];
    let mut took = Vec::with_capacity(one);
    for i in 0..one {
        let started = Instant::now();
        store.create(&format!("/registry/core/configmaps/one/c{i}"), value.clone().into()).await?;
        took.push(started.elapsed());
    }
    let latency = summarize(&took);
    let started = Instant::now();
    let writers: Vec<_> = (0..64)
        .map(|w| {
            let (store, value) = (store.clone(), value.clone());
            tokio::spawn(async move {
                for i in (w..many).step_by(64) {
                    store.create(&format!("/registry/core/configmaps/many/c{i}"), value.clone().into()).await?;
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for w in writers {
        w.await??;
    }
    let rate = many as f64 / started.elapsed().as_secs_f64();
    println!("  {engine}: 1 writer {latency}; 64 writers {rate:.0}/s");
    drop(store);
    // Let its threads finish with the files before the directory goes.
    while LocalStore::redb_is_held(&path) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(json!({"one": serde_json::to_value(&latency)?, "creates_per_s_64_writers": rate}))
}
