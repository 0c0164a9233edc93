//! Create latency of one writer, embedded store (redb) against etcd (a local single-member etcd
//! this example starts): `cargo run --release -p shepherd-store --features etcd --example
//! create_latency [N]`.

use std::time::Instant;

use bytes::Bytes;
use shepherd_store::{EtcdConfig, EtcdStore, HistoryLimits, LocalEtcd, LocalStore, Store};

async fn measure(name: &str, store: &dyn Store, n: usize) {
    let value = Bytes::from(vec![b'x'; 1024]);
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let started = Instant::now();
        store.create(&format!("/registry/core/configmaps/default/c{i}"), value.clone()).await.expect("create");
        took.push(started.elapsed());
    }
    took.sort();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize].as_secs_f64() * 1000.0;
    println!("{name:>8}: {n} creates of 1 KiB, one writer: p50 {:.2} ms, p99 {:.2} ms", at(0.5), at(0.99));
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(500);
    let dir = tempfile::tempdir().expect("tempdir");
    let embedded = LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("redb");
    measure("embedded", &embedded, n).await;
    let etcd = LocalEtcd::start().expect("etcd");
    let store = EtcdStore::connect(EtcdConfig::new(vec![etcd.endpoint()], "/bench")).await.expect("connect");
    measure("etcd", &store, n).await;
}
