//! Scenario `store`: durable creates/s with 1 and 64 clients, list latency and RSS with N pods, over
//! plain HTTP or TLS with a token, side by side on the embedded store's write-ahead-log engine, the
//! previous redb-only engine and etcd (a real one-member etcd on loopback, Debian's `etcd`); then
//! the same creates at the embedded engines alone, no HTTP.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shepherd_store::{HistoryLimits, LocalStore, Store};

use shepherd_store::{ETCD_NOT_BUILT, LocalEtcd};

use crate::cluster::Process;
use crate::procstat;
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

/// The store behind one column.
#[derive(Clone, Copy)]
enum Engine {
    /// The embedded store's default engine: a write-ahead log checkpointed into redb.
    Wal,
    /// The previous embedded engine, a redb commit per batch (`--store-engine redb`).
    RedbOnly,
    /// `--store etcd` on an etcd this scenario starts.
    Etcd,
}

impl Engine {
    fn label(self) -> &'static str {
        match self {
            Engine::Wal => "embedded (wal)",
            Engine::RedbOnly => "redb-only",
            Engine::Etcd => "etcd",
        }
    }
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
    /// etcd's own RSS beside the server's (etcd column only).
    etcd_rss: Option<f64>,
    /// A watch from before the creates: the time until every create's event arrived.
    replay_ms: f64,
    /// The 1-minute load average when the column's measurements ended.
    load: f64,
}

/// One column: its figures, or why the binary under test cannot run that store.
enum Column {
    Measured(Measured),
    NotBuilt(String),
}

/// Runs the scenario on each store in turn, each on a fresh server and data directory, side by
/// side: the embedded default (a write-ahead log checkpointed into redb), the previous redb-only
/// engine (`shepherd server --store-engine redb`) and etcd (`--store etcd` on a one-member etcd
/// started here, which a binary built without the `etcd` feature cannot run: its column says so).
pub async fn run(binary: &Path, pods: usize, sequential: usize, list_runs: usize, tls: bool) -> anyhow::Result<ScenarioResult> {
    let transport = if tls { "TLS + token" } else { "plain HTTP" };
    println!("scenario store: pods={pods} sequential={sequential} list_runs={list_runs}, {transport}");
    let engines = [Engine::Wal, Engine::RedbOnly, Engine::Etcd];
    let mut columns = Vec::new();
    for engine in engines {
        columns.push(measure(binary, engine, pods, sequential, list_runs, tls).await?);
    }

    let header: Vec<String> = engines.iter().map(|e| format!("{:>16}", e.label())).collect();
    println!("{:<34} {}", "", header.join(" "));
    let row = |what: &str, cell: &dyn Fn(&Measured) -> String| {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| match c {
                Column::Measured(m) => format!("{:>16}", cell(m)),
                Column::NotBuilt(_) => format!("{:>16}", "not built"),
            })
            .collect();
        println!("{what:<34} {}", cells.join(" "));
    };
    row("creates/s, 1 client", &|m| format!("{:.0}", m.one_rate));
    row("ms per create, 1 client", &|m| format!("{:.3}", m.one_ms));
    let at = |m: &Measured, q: &str| m.one[q].as_f64().map_or("-".into(), |v| format!("{v:.3}"));
    row("  p50 / p99 ms, 1 client", &|m| format!("{} / {}", at(m, "p50_ms"), at(m, "p99_ms")));
    row("creates/s, 64 clients", &|m| format!("{:.0}", m.many_rate));
    let listed = columns.iter().find_map(|c| if let Column::Measured(m) = c { Some(m.count) } else { None }).unwrap_or(0);
    row(&format!("list of {listed} pods p50 ms"), &|m| m.list["p50_ms"].as_f64().map_or("-".into(), |v| format!("{v:.1}")));
    row("watch replaying every create, ms", &|m| format!("{:.1}", m.replay_ms));
    row("server RSS MiB", &|m| format!("{:.1}", m.rss));
    row("etcd RSS MiB", &|m| m.etcd_rss.map_or("-".into(), |v| format!("{v:.1}")));
    for (engine, column) in engines.iter().zip(&columns) {
        if let Column::NotBuilt(why) = column {
            println!("{}: not measured: {why}", engine.label());
        }
    }

    let values = |c: &Column| match c {
        Column::Measured(m) => json!({"creates_per_s_1_client": m.one_rate, "ms_per_create_1_client": m.one_ms,
            "create_1_client": m.one, "creates_per_s_64_clients": m.many_rate, "list": m.list, "listed": m.count,
            "rss_mib": m.rss, "etcd_rss_mib": m.etcd_rss, "watch_replay_ms": m.replay_ms, "load_average": m.load}),
        Column::NotBuilt(why) => json!({"not_built": why}),
    };
    let mut all = values(&columns[0]);
    all["redb_only"] = values(&columns[1]);
    all["etcd"] = values(&columns[2]);

    // The store alone runs the engine linked into this binary, not `binary`'s.
    let (one, many) = (sequential * 5, pods.saturating_sub(sequential) * 5);
    println!("the store alone, no HTTP ({one} creates of 1 KiB by 1 writer, {many} by 64):");
    let wal_alone = at_store("wal", one, many).await?;
    let redb_alone = at_store("redb", one, many).await?;
    let pair = |what: &str, a: String, b: String| println!("{what:<34} {a:>16} {b:>16}");
    let q = |m: &Value, what: &str| m["one"][what].as_f64().map_or("-".into(), |v| format!("{v:.3}"));
    for what in ["p50_ms", "p99_ms", "max_ms"] {
        pair(&format!("  store alone, 1 writer, {what}"), q(&wal_alone, what), q(&redb_alone, what));
    }
    let rate = |m: &Value| m["creates_per_s_64_writers"].as_f64().map_or("-".into(), |v| format!("{v:.0}"));
    pair("  store alone, creates/s, 64 writers", rate(&wal_alone), rate(&redb_alone));
    all["at_store"] = wal_alone;
    all["redb_only"]["at_store"] = redb_alone;
    // Each column has the load when it ended; this one is the load at the end of the run.
    all["load_average"] = json!(procstat::load_average());
    println!("load average: {:.2}", procstat::load_average());
    Ok(ScenarioResult {
        name: "store",
        params: json!({"pods": pods, "sequential": sequential, "list_runs": list_runs, "tls": tls}),
        values: all,
    })
}

async fn measure(
    binary: &Path,
    engine: Engine,
    pods: usize,
    sequential: usize,
    list_runs: usize,
    tls: bool,
) -> anyhow::Result<Column> {
    // The server's data and log, and etcd's, in one directory removed at the end.
    let dir = tempfile::tempdir()?;
    let etcd = match engine {
        Engine::Etcd => Some(LocalEtcd::start_in(dir.path()).map_err(|e| anyhow::anyhow!("the etcd column runs a real etcd: {e}"))?),
        Engine::Wal | Engine::RedbOnly => None,
    };
    let endpoint = etcd.as_ref().map(LocalEtcd::endpoint).unwrap_or_default();
    let data_dir = dir.path().join("server");
    let data = data_dir.to_string_lossy().to_string();
    let mut args = vec!["server", "--controllers", "none", "--data-dir", &data];
    match engine {
        Engine::Wal => args.extend(["--store-engine", "wal"]),
        Engine::RedbOnly => args.extend(["--store-engine", "redb"]),
        Engine::Etcd => args.extend(["--store", "etcd", "--etcd-endpoints", &endpoint]),
    }
    let log = dir.path().join("server.log");
    let (server, http) = match Process::start_reachable_logged(binary, &args, &data_dir, tls, Some(&log)) {
        Ok(started) => started,
        Err(e) => {
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(line) = said.lines().find(|l| l.contains(ETCD_NOT_BUILT)) {
                return Ok(Column::NotBuilt(format!("{}: {}", binary.display(), line.trim_start_matches("Error: "))));
            }
            anyhow::bail!("starting the server for {}: {e}; its stderr:\n{said}", engine.label());
        }
    };
    println!("engine {}:", engine.label());

    // The revision before the creates, for the watch that replays them all at the end.
    let before: Value = http.get(format!("{}/api/v1/namespaces/default/pods?limit=1", server.url)).send().await?.json().await?;
    let before = before["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_string();

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
    let created = pods.max(sequential);
    anyhow::ensure!(count == created, "{}: listed {count} pods of the {created} created", engine.label());
    let list = summarize(&samples);
    println!("  list of {count} pods: {list}");
    // The embedded store keeps only the newest part of its history in memory and reads older events
    // back from its file; the others answer from memory.
    let replay = replay_watch(&http, &server.url, &before, count).await?;
    let replay_ms = replay.as_secs_f64() * 1000.0;
    println!("  watch from before the creates: all {count} events in {replay_ms:.1} ms");
    let rss = server.rss_mib();
    let etcd_rss = etcd.as_ref().and_then(LocalEtcd::pid).map(|pid| procstat::rss_mib(&pid.to_string()));
    match etcd_rss {
        Some(e) => println!("  server RSS with {count} pods: {rss:.1} MiB (etcd: {e:.1} MiB)"),
        None => println!("  server RSS with {count} pods: {rss:.1} MiB"),
    }
    // The server first, then its etcd.
    let load = procstat::load_average();
    drop(server);
    drop(etcd);
    Ok(Column::Measured(Measured {
        one_rate,
        one_ms,
        one: serde_json::to_value(&latency)?,
        many_rate,
        list: serde_json::to_value(&list)?,
        count,
        rss,
        etcd_rss,
        replay_ms,
        load,
    }))
}

/// Watches the pods from `revision` until `events` have arrived: how long the replay took.
async fn replay_watch(http: &reqwest::Client, url: &str, revision: &str, events: usize) -> anyhow::Result<Duration> {
    use futures::StreamExt;
    let started = Instant::now();
    let resp = http.get(format!("{url}/api/v1/namespaces/default/pods?watch=true&resourceVersion={revision}")).send().await?;
    anyhow::ensure!(resp.status().is_success(), "watching the pods from revision {revision}: {}", resp.status());
    let mut body = resp.bytes_stream();
    let (mut seen, mut partial) = (0, Vec::new());
    while seen < events {
        let chunk = tokio::time::timeout(Duration::from_secs(60), body.next())
            .await
            .map_err(|_| anyhow::anyhow!("the watch from revision {revision} stalled after {seen} of {events} events"))?
            .ok_or_else(|| anyhow::anyhow!("the watch from revision {revision} ended after {seen} of {events} events"))??;
        partial.extend_from_slice(&chunk);
        while let Some(nl) = partial.iter().position(|&b| b == b'\n') {
            const ADDED: &[u8] = b"\"type\":\"ADDED\"";
            seen += usize::from(partial[..nl].windows(ADDED.len()).any(|w| w == ADDED));
            partial.drain(..=nl);
        }
    }
    Ok(started.elapsed())
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
    // Its threads finish with the files before the directory goes.
    store.close().await?;
    Ok(json!({"one": serde_json::to_value(&latency)?, "creates_per_s_64_writers": rate}))
}
