//! Scenario `cluster-dns`: `shepherd server --cluster-dns-listen` on loopback, one UDP client
//! asking for a Service's A record in a loop, one query in flight: queries per second and the
//! latency of each, median of several runs.

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::Process;
use crate::report::{ScenarioResult, summarize};

const NAME: &str = "web.default.svc.cluster.local";

/// Sizes of one run.
pub struct Params {
    pub runs: usize,
    pub queries: usize,
}

/// A DNS query for `name`'s A record with id `id` (RFC 1035 4.1: header, then one question).
fn query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(64);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// The reply's (id, rcode, answer count).
fn header(reply: &[u8]) -> Option<(u16, u8, u16)> {
    (reply.len() >= 12).then(|| {
        (u16::from_be_bytes([reply[0], reply[1]]), reply[3] & 0x0f, u16::from_be_bytes([reply[6], reply[7]]))
    })
}

/// Sends one query and waits for its answer; the answer count.
fn ask(socket: &UdpSocket, id: u16) -> anyhow::Result<u16> {
    socket.send(&query(id, NAME))?;
    let mut buf = [0u8; 512];
    loop {
        let n = socket.recv(&mut buf)?;
        if let Some((got, rcode, answers)) = header(&buf[..n])
            && got == id
        {
            anyhow::ensure!(rcode == 0, "{NAME}: rcode {rcode}");
            return Ok(answers);
        }
    }
}

pub async fn run(binary: &std::path::Path, p: Params) -> anyhow::Result<ScenarioResult> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().to_string_lossy().to_string();
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let listen = format!("127.0.0.1:{port}");
    let server = Process::start(binary, &["server", "--in-memory", "--data-dir", &data, "--cluster-dns-listen", &listen])?;
    let url = server.url.clone();
    let http = reqwest::Client::new();
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80}]}});
    let r = http.post(format!("{url}/api/v1/namespaces/default/services")).json(&svc).send().await?;
    anyhow::ensure!(r.status().is_success(), "creating the Service: {}", r.status());

    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.connect(&listen)?;
    socket.set_read_timeout(Some(Duration::from_secs(2)))?;
    // Until the allocator has given the Service its address and the cache has it.
    let start = Instant::now();
    while !matches!(ask(&socket, 0), Ok(1)) {
        anyhow::ensure!(start.elapsed() < Duration::from_secs(60), "{NAME} never answered with an address");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut rates = Vec::with_capacity(p.runs);
    let mut latencies = Vec::with_capacity(p.runs * p.queries);
    for run in 0..p.runs {
        let start = Instant::now();
        for i in 0..p.queries {
            let t = Instant::now();
            let answers = ask(&socket, ((run * p.queries + i) % 65_535 + 1) as u16)?;
            anyhow::ensure!(answers == 1, "{NAME}: {answers} answers");
            latencies.push(t.elapsed());
        }
        rates.push(p.queries as f64 / start.elapsed().as_secs_f64());
    }
    rates.sort_by(|a, b| a.total_cmp(b));
    let median = rates[rates.len() / 2];
    let latency = summarize(&latencies);
    println!("cluster DNS, one client, one query in flight: median {median:.0} queries/s over {} runs of {}", p.runs, p.queries);
    println!("cluster DNS query latency: {latency}");
    Ok(ScenarioResult {
        name: "cluster-dns",
        params: json!({"runs": p.runs, "queries": p.queries}),
        values: json!({"queries_per_second_median": median, "queries_per_second_runs": rates, "latency": latency}),
    })
}
