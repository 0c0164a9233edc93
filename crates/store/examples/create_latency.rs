//! Create latency of one writer and throughput of 64, embedded store (write-ahead log), the
//! previous redb-only engine, and etcd (a local single-member etcd this example starts):
//! `cargo run --release -p shepherd-store --features etcd --example create_latency [N] [--no-etcd]`.

use std::sync::Arc;
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
    println!("{name:>9}: {n} creates of 1 KiB, one writer: p50 {:.2} ms, p99 {:.2} ms", at(0.5), at(0.99));
}

async fn throughput(name: &str, store: Arc<dyn Store>, n: usize) {
    let started = Instant::now();
    let writers: Vec<_> = (0..64)
        .map(|w| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in (w..n).step_by(64) {
                    let key = format!("/registry/core/configmaps/many/c{i}");
                    store.create(&key, Bytes::from(vec![b'x'; 1024])).await.expect("create");
                }
            })
        })
        .collect();
    for w in writers {
        w.await.expect("writer");
    }
    println!("{name:>9}: {n} creates of 1 KiB, 64 writers: {:.0}/s", n as f64 / started.elapsed().as_secs_f64());
}

#[tokio::main]
async fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(500);
    let dir = tempfile::tempdir().expect("tempdir");
    let embedded = LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("open");
    measure("embedded", &embedded, n).await;
    throughput("embedded", Arc::new(embedded), n * 10).await;
    let redb_only = LocalStore::open_redb_only(&dir.path().join("r.redb"), HistoryLimits::default()).expect("open");
    measure("redb-only", &redb_only, n).await;
    throughput("redb-only", Arc::new(redb_only), n * 10).await;
    if std::env::args().any(|a| a == "--no-etcd") {
        return;
    }
    let etcd = LocalEtcd::start().expect("etcd");
    let store = EtcdStore::connect(EtcdConfig::new(vec![etcd.endpoint()], "/bench")).await.expect("connect");
    measure("etcd", &store, n).await;
    throughput("etcd", Arc::new(store), n * 10).await;
}
