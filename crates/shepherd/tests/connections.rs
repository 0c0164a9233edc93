//! Connection floods stop nothing: idle connections do not lock kubectl out, half-sent headers
//! are cut off after the header time-out, and past the connection cap new connections are closed
//! at once instead of piling up.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;

/// Raises this process's soft open-file limit to its hard limit; returns the new soft limit.
fn raise_own_open_file_limit() -> u64 {
    let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
    }
    l.rlim_cur
}

fn address(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

async fn metric(url: &str, name: &str) -> Option<f64> {
    let text = reqwest::get(format!("{url}/metrics")).await.ok()?.text().await.ok()?;
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// `shepherd server --in-memory` started with a soft open-file limit of 1024, the usual default.
fn server_with_default_open_file_limit(dir: &std::path::Path, extra: &[&str]) -> Daemon {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shepherd"));
    cmd.args(["server", "--in-memory", "--insecure-loopback", "--listen", "127.0.0.1:0", "--data-dir"]).arg(dir).args(extra);
    cmd.env("RUST_LOG", "warn").stdout(Stdio::piped()).stderr(Stdio::inherit());
    // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
            l.rlim_cur = l.rlim_max.min(1024);
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
            Ok(())
        });
    }
    Daemon::from_child(cmd.spawn().expect("start shepherd"))
}

/// Runs `kubectl get pods -A` against `url` without a kubeconfig; returns how long it took.
fn kubectl_get_pods(url: &str) -> Duration {
    let started = Instant::now();
    let out = Command::new("kubectl")
        .args(["--server", url, "get", "pods", "-A", "--request-timeout", "10s"])
        .env("KUBECONFIG", "/dev/null")
        .output()
        .expect("run kubectl");
    assert!(out.status.success(), "kubectl failed: {}", String::from_utf8_lossy(&out.stderr));
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_connections_do_not_stop_kubectl_from_answering() {
    assert!(raise_own_open_file_limit() > 2_500, "this test needs an open-file hard limit above 2,500");
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = server_with_default_open_file_limit(dir.path(), &[]);
    let addr = address(&daemon.url);
    // kubectl's first run against a server fetches and caches discovery: time a warm one, the
    // usual case, so the machine's load matters less than the server.
    let baseline = kubectl_get_pods(&daemon.url);
    eprintln!("kubectl get pods, no other connections: {baseline:?}");
    let idle: Vec<TcpStream> = (0..2_000).map(|_| TcpStream::connect(&addr).expect("connect")).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&daemon.url, "apiserver_connections").await.unwrap_or(0.0) < 2_000.0 {
        assert!(Instant::now() < deadline, "the server never held 2,000 connections open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let took = kubectl_get_pods(&daemon.url);
    eprintln!("kubectl get pods beside 2,000 idle connections: {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_half_its_headers_is_closed_after_the_header_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("server", dir.path(), &["--in-memory", "--request-header-timeout", "1s"]);
    let mut conn = TcpStream::connect(address(&daemon.url)).expect("connect");
    conn.write_all(b"GET /api/v1/namespaces/default/pods HTTP/1.1\r\nHost: localhost\r\nAccept: app").expect("write");
    let started = Instant::now();
    conn.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let mut buf = [0u8; 1024];
    let n = conn.read(&mut buf).expect("the server closes the connection (not a client-side timeout)");
    let took = started.elapsed();
    eprintln!("half-sent headers -> closed after {took:?}: {:?}", String::from_utf8_lossy(&buf[..n]));
    assert!(took >= Duration::from_millis(900), "closed too early: {took:?}");
    assert!(took < Duration::from_secs(10), "closed too late: {took:?}");
    // hyper answers 408 or just closes; either way nothing more comes.
    let mut rest = Vec::new();
    let _ = conn.read_to_end(&mut rest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_connection_cap_new_connections_are_closed_and_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("server", dir.path(), &["--in-memory", "--max-connections", "20"]);
    let addr = address(&daemon.url);
    let held: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(&addr).expect("connect")).collect();
    // The 21st connection is accepted and closed at once.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut extra = TcpStream::connect(&addr).expect("connect");
        extra.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        let _ = extra.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut buf = [0u8; 64];
        if matches!(extra.read(&mut buf), Ok(0) | Err(_)) {
            break;
        }
        assert!(Instant::now() < deadline, "a connection past the cap was served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(held);
    // Once the held connections end, the server is reachable again and reports the rejections.
    let deadline = Instant::now() + Duration::from_secs(30);
    let rejected = loop {
        if let Some(r) = metric(&daemon.url, "apiserver_connections_rejected_total").await {
            break r;
        }
        assert!(Instant::now() < deadline, "the server stayed unreachable after the flood ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(rejected >= 1.0, "rejections counted: {rejected}");
    assert_eq!(metric(&daemon.url, "apiserver_connections_limit").await, Some(20.0));
}

#[test]
fn a_server_asked_for_zero_threads_refuses_to_start_and_names_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    for flag in ["--api-threads", "--controller-threads"] {
        let out = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["server", "--in-memory", "--insecure-loopback", "--listen", "127.0.0.1:0", flag, "0"])
            .arg("--data-dir")
            .arg(dir.path())
            .output()
            .expect("run shepherd");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag} 0 started a server");
        assert!(stderr.contains(flag) && stderr.contains("must be at least 1"), "{flag} 0: {stderr}");
    }
}
