//! Every buffer the daemon retains shows its size and its bound in `/metrics`.

mod common;

use common::Daemon;

fn value(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retained_buffers_and_their_limits_are_in_the_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let flags = ["--in-memory", "--history-events", "1234", "--history-mib", "3", "--history-seconds", "77",
        "--history-memory-mib", "2"];
    let daemon = Daemon::start("server", dir.path(), &flags);
    let text = reqwest::get(format!("{}/metrics", daemon.url)).await.expect("metrics").text().await.expect("text");
    assert_eq!(value(&text, "store_watch_history_events_limit"), Some(1234.0), "{text}");
    assert_eq!(value(&text, "store_watch_history_bytes_limit"), Some(3.0 * 1024.0 * 1024.0));
    assert_eq!(value(&text, "store_watch_history_age_limit_seconds"), Some(77.0));
    assert_eq!(value(&text, "store_watch_history_memory_bytes_limit"), Some(2.0 * 1024.0 * 1024.0), "{text}");
    // Each watched prefix's live buffer is capped at 1,024 events, and the metric says so.
    assert_eq!(value(&text, "store_live_buffer_events_limit"), Some(1024.0), "{text}");
    // The system namespaces were written at start: they are objects and history events.
    assert!(value(&text, "store_objects").is_some_and(|v| v >= 1.0), "{text}");
    assert!(value(&text, "store_watch_history_events").is_some_and(|v| v >= 1.0), "{text}");
    for name in ["store_object_bytes", "store_object_memory_bytes", "store_watch_history_bytes", "store_watch_history_memory_bytes", "store_live_watchers", "store_live_buffer_events",
        "store_live_buffer_events_limit", "apiserver_connections", "apiserver_connections_limit"] {
        assert!(value(&text, name).is_some(), "{name} missing from /metrics");
        assert!(text.contains(&format!("# HELP {name} ")), "{name} has no HELP text");
    }
    // Counters: nothing has fallen behind or read the history back yet.
    for name in ["store_watch_resumes", "store_watch_history_file_reads", "store_watch_history_file_events"] {
        assert_eq!(value(&text, &format!("{name}_total")), Some(0.0), "{name}_total in {text}");
        assert!(text.contains(&format!("# TYPE {name} counter")), "{name} is not a counter");
    }
}
