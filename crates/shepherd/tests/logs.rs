//! The daemon's own log lines, as a service manager or a log file receives them.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["server", "--in-memory", "--insecure-loopback", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start shepherd");
    let stderr = child.stderr.take().expect("stderr");
    // The daemon logs one line once it is ready, then is quiet while idle.
    let mut lines = Vec::new();
    for line in BufReader::new(stderr).lines().take(1) {
        lines.push(line.expect("a log line"));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(!lines.is_empty(), "the daemon logged nothing at info");
    assert!(lines.iter().any(|l| l.contains("INFO") && l.contains("ready")), "{lines:?}");
    for line in &lines {
        assert!(!line.contains('\u{1b}'), "an ANSI escape in {line:?}");
    }
}
