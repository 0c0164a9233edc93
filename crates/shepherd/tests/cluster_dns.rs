//! Cluster DNS end to end: `shepherd standalone --cluster-dns-listen` on loopback, asked by `dig`
//! (Debian's bind9-dnsutils) for Services, named ports, headless Services, names that do not exist,
//! after a malformed packet, and for an outside name it forwards to an upstream this test runs.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Daemon;
use hickory_proto::op::{Message, MessageType, OpCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The address the test's upstream gives `outside.example.`: documentation space, only ever data.
const OUTSIDE_IP: &str = "192.0.2.44";

fn free_port() -> u16 {
    // One port free for both UDP and TCP on loopback.
    loop {
        let udp = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
        let port = udp.local_addr().expect("addr").port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn answer_upstream(packet: &[u8]) -> Option<Vec<u8>> {
    let query = Message::from_vec(packet).ok()?;
    let mut reply = Message::response(query.metadata.id, OpCode::Query);
    reply.metadata.message_type = MessageType::Response;
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    for q in &query.queries {
        reply.add_query(q.clone());
        if q.query_type() == RecordType::A && q.name().to_ascii().eq_ignore_ascii_case("outside.example.") {
            reply.add_answer(Record::from_rdata(q.name().clone(), 60, RData::A(A(OUTSIDE_IP.parse().ok()?))));
        }
    }
    reply.to_vec().ok()
}

/// A tiny DNS server on loopback (UDP and TCP) that knows one outside name.
async fn upstream() -> SocketAddr {
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("upstream udp");
    let addr = udp.local_addr().expect("addr");
    let tcp = tokio::net::TcpListener::bind(addr).await.expect("upstream tcp");
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, peer)) = udp.recv_from(&mut buf).await {
            if let Some(reply) = answer_upstream(&buf[..n]) {
                let _ = udp.send_to(&reply, peer).await;
            }
        }
    });
    tokio::spawn(async move {
        while let Ok((mut s, _)) = tcp.accept().await {
            tokio::spawn(async move {
                let Ok(len) = s.read_u16().await else { return };
                let mut packet = vec![0u8; usize::from(len)];
                if s.read_exact(&mut packet).await.is_err() {
                    return;
                }
                if let Some(reply) = answer_upstream(&packet) {
                    let _ = s.write_u16(reply.len() as u16).await;
                    let _ = s.write_all(&reply).await;
                }
            });
        }
    });
    addr
}

/// `dig` against the cluster DNS: (status, answer lines' data), e.g. ("NOERROR", ["10.96.0.12"]).
fn dig(port: u16, args: &[&str]) -> (String, Vec<String>) {
    let out = Command::new("dig")
        .args(["@127.0.0.1", "-p", &port.to_string(), "+tries=1", "+time=2", "+noall", "+comments", "+answer"])
        .args(args)
        .output()
        .expect("dig (Debian package bind9-dnsutils) must be installed for the cluster DNS tests");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let status = text
        .split("status: ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or("NO REPLY")
        .to_string();
    let answers = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().skip(4).collect::<Vec<_>>().join(" "))
        .collect();
    (status, answers)
}

async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create(http: &reqwest::Client, url: &str, path: &str, body: Value) -> Value {
    let resp = http.post(format!("{url}{path}")).json(&body).send().await.expect("post");
    assert!(resp.status().is_success(), "POST {path}: {}", resp.status());
    resp.json().await.expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_dns_answers_services_named_ports_headless_and_nxdomain_and_forwards_the_rest() {
    let upstream = upstream().await;
    let port = free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let listen = format!("127.0.0.1:{port}");
    let upstream_flag = upstream.to_string();
    let daemon = Daemon::start(
        "server",
        dir.path(),
        &["--in-memory", "--cluster-dns-listen", &listen, "--dns-upstream", &upstream_flag],
    );
    let http = reqwest::Client::new();
    let url = daemon.url.clone();

    create(&http, &url, "/api/v1/namespaces/default/services", json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}}))
    .await;
    create(&http, &url, "/api/v1/namespaces/default/services", json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "db"},
        "spec": {"clusterIP": "None", "ports": [{"name": "sql", "port": 5432}]}}))
    .await;
    create(&http, &url, "/api/v1/namespaces/default/endpoints", json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "db"},
        "subsets": [{"addresses": [{"ip": "10.244.0.7"}, {"ip": "10.244.1.9"}],
            "notReadyAddresses": [{"ip": "10.244.1.10"}], "ports": [{"name": "sql", "port": 15432}]}]}))
    .await;

    // The cluster IP is allocated by the controller; DNS answers with whatever it became.
    let cluster_ip = {
        let mut ip = String::new();
        for _ in 0..600 {
            let svc: Value = http.get(format!("{url}/api/v1/namespaces/default/services/web")).send().await.expect("get")
                .json().await.expect("json");
            if let Some(s) = svc["spec"]["clusterIP"].as_str().filter(|s| !s.is_empty()) {
                ip = s.to_string();
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(!ip.is_empty(), "web got no cluster IP");
        ip
    };
    let (status, answers) = wait_for("web's A record", || {
        let r = dig(port, &["web.default.svc.cluster.local", "A"]);
        (r.1 == vec![cluster_ip.clone()]).then_some(r)
    })
    .await;
    assert_eq!(status, "NOERROR");
    assert_eq!(answers, vec![cluster_ip.clone()]);

    // The same over TCP.
    assert_eq!(dig(port, &["+tcp", "web.default.svc.cluster.local", "A"]), ("NOERROR".into(), vec![cluster_ip.clone()]));

    let (status, srv) = dig(port, &["_http._tcp.web.default.svc.cluster.local", "SRV"]);
    assert_eq!((status.as_str(), srv), ("NOERROR", vec!["0 100 8080 web.default.svc.cluster.local.".to_string()]));

    let (status, mut headless) = wait_for("db's endpoints", || {
        let r = dig(port, &["db.default.svc.cluster.local", "A"]);
        (r.1.len() == 2).then_some(r)
    })
    .await;
    headless.sort();
    assert_eq!((status.as_str(), headless), ("NOERROR", vec!["10.244.0.7".to_string(), "10.244.1.9".to_string()]));
    let (_, mut srv) = dig(port, &["_sql._tcp.db.default.svc.cluster.local", "SRV"]);
    srv.sort();
    assert_eq!(
        srv,
        vec!["0 50 15432 10-244-0-7.db.default.svc.cluster.local.", "0 50 15432 10-244-1-9.db.default.svc.cluster.local."]
    );
    assert_eq!(dig(port, &["10-244-1-9.db.default.svc.cluster.local", "A"]).1, vec!["10.244.1.9"]);

    let (status, answers) = dig(port, &["nope.default.svc.cluster.local", "A"]);
    assert_eq!((status.as_str(), answers.len()), ("NXDOMAIN", 0));
    assert_eq!(dig(port, &["_nope._tcp.web.default.svc.cluster.local", "SRV"]).0, "NXDOMAIN");

    // Garbage and a truncated header get no reply, and the server keeps answering.
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    for junk in [&[0xde, 0xad, 0xbe, 0xef][..], &[0u8; 3][..], &[0xffu8; 300][..]] {
        sock.send_to(junk, ("127.0.0.1", port)).expect("send junk");
    }
    sock.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
    let mut buf = [0u8; 512];
    assert!(sock.recv_from(&mut buf).is_err(), "a malformed packet got a reply");
    assert_eq!(dig(port, &["web.default.svc.cluster.local", "A"]).1, vec![cluster_ip.clone()]);

    // Outside the cluster domain: the test's upstream answers, over UDP and TCP.
    assert_eq!(dig(port, &["outside.example", "A"]), ("NOERROR".into(), vec![OUTSIDE_IP.to_string()]));
    assert_eq!(dig(port, &["+tcp", "outside.example", "A"]), ("NOERROR".into(), vec![OUTSIDE_IP.to_string()]));

    // kube-dns in kube-system names the server, as Kubernetes exposes CoreDNS.
    let mut svc = Value::Null;
    for _ in 0..600 {
        let resp = http.get(format!("{url}/api/v1/namespaces/kube-system/services/kube-dns")).send().await.expect("get");
        if resp.status().is_success() {
            svc = resp.json().await.expect("json");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(svc["spec"]["clusterIP"], "10.96.0.10", "{svc}");
    assert_eq!(svc["metadata"]["labels"]["k8s-app"], "kube-dns");
    let ports: Vec<(Value, Value, Value)> = svc["spec"]["ports"].as_array().expect("ports").iter()
        .map(|p| (p["protocol"].clone(), p["port"].clone(), p["targetPort"].clone())).collect();
    assert_eq!(ports, vec![(json!("UDP"), json!(53), json!(port)), (json!("TCP"), json!(53), json!(port))]);
    let ep: Value = http.get(format!("{url}/api/v1/namespaces/kube-system/endpoints/kube-dns")).send().await.expect("get")
        .json().await.expect("json");
    assert_eq!(ep["subsets"][0]["addresses"], json!([{"ip": "127.0.0.1"}]), "{ep}");
    assert_eq!(ep["subsets"][0]["ports"][0]["port"], json!(port));
    wait_for("kube-dns's A record", || {
        (dig(port, &["kube-dns.kube-system.svc.cluster.local", "A"]).1 == vec!["10.96.0.10"]).then_some(())
    })
    .await;
    drop(daemon);
}

async fn pod_log(http: &reqwest::Client, url: &str, name: &str) -> String {
    match http.get(format!("{url}/api/v1/namespaces/default/pods/{name}/log")).send().await {
        Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
        _ => String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_get_the_cluster_search_path_and_nameserver_unless_on_the_host_network() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", dir.path(), &["--cluster-dns", "10.96.0.10", "--cluster-domain", "corp.test"]);
    let http = reqwest::Client::new();
    let url = daemon.url.clone();
    let script = "cat /etc/resolv.conf; echo END; sleep 1000";
    for (name, host_network) in [("cluster-first", false), ("on-host", true)] {
        create(&http, &url, "/api/v1/namespaces/default/pods", json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"hostNetwork": host_network, "containers": [{"name": "c", "image": "minimal",
                "command": ["sh", "-c", script]}]}}))
        .await;
    }
    let mut logs = Vec::new();
    for name in ["cluster-first", "on-host"] {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = pod_log(&http, &url, name).await;
            if log.contains("END") {
                logs.push(log);
                break;
            }
            assert!(Instant::now() < deadline, "{name} printed no resolv.conf");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert_eq!(
        logs[0],
        "search default.svc.corp.test svc.corp.test corp.test\nnameserver 10.96.0.10\noptions ndots:5\nEND\n"
    );
    let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    assert_eq!(logs[1], format!("{host}END\n"), "a host-network pod keeps the node's resolv.conf");
    drop(daemon);
}

#[test]
fn a_cluster_dns_port_in_use_fails_the_start_with_the_address_named() {
    let taken = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["server", "--in-memory", "--insecure-loopback", "--listen", "127.0.0.1:0", "--cluster-dns-listen", &addr])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .expect("run shepherd");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no API address is printed: {}", String::from_utf8_lossy(&out.stdout));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cluster DNS on udp {addr}")), "{err}");
}

/// A cluster DNS listening on every address (`--cluster-dns-listen 0.0.0.0:PORT`) is named in
/// `kube-dns`'s Endpoints by the local node's address, where pods can reach it, not left without
/// endpoints. Runs inside a network namespace the test makes, with a veth link (both ends inside)
/// for the node's address.
#[test]
fn a_cluster_dns_on_every_address_is_reached_at_the_nodes_address() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test makes a network namespace and needs root");
    let ns = common::Netns::new(format!("shp{}dns", std::process::id() % 100_000));
    ns.ip(&["link", "add", "node0", "type", "veth", "peer", "name", "node0-peer"]);
    ns.ip(&["addr", "add", "10.99.0.1/24", "dev", "node0"]);
    ns.ip(&["link", "set", "node0", "up"]);
    ns.ip(&["link", "set", "node0-peer", "up"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let child = ns
        .command(env!("CARGO_BIN_EXE_shepherd"))
        .arg("standalone")
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--in-memory", "--insecure-loopback", "--listen", "127.0.0.1:0", "--runtime", "process", "--pod-network", "host", "--node-ip", "10.99.0.1"])
        .args(["--cluster-dns-listen", "0.0.0.0:5353", "--dns-upstream", "127.0.0.1:9"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start shepherd");
    let daemon = Daemon::from_child(child);
    let endpoints = format!("{}/api/v1/namespaces/kube-system/endpoints/kube-dns", daemon.url);
    let deadline = Instant::now() + Duration::from_secs(30);
    let subsets = loop {
        let out = ns.command("curl").args(["-s", "-m", "5", &endpoints]).output().expect("curl");
        let ep: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        if ep["subsets"].as_array().is_some_and(|s| !s.is_empty()) {
            break ep["subsets"].clone();
        }
        assert!(Instant::now() < deadline, "kube-dns has no endpoints: {ep}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(subsets[0]["addresses"][0]["ip"], "10.99.0.1", "{subsets}");
    assert_eq!(subsets[0]["ports"][0]["port"], 5353, "{subsets}");
    let out = ns
        .command("dig")
        .args(["@10.99.0.1", "-p", "5353", "+tries=1", "+time=2", "+short", "kube-dns.kube-system.svc.cluster.local"])
        .output()
        .expect("dig");
    let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(answer.parse::<std::net::Ipv4Addr>().is_ok(), "no address for kube-dns at the node's address: {out:?}");
}
