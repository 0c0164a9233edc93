//! Scenarios that change a network namespace (bridges, routes, nftables) run inside one of their
//! own: this binary runs again there, with `--inside`, and prints `RESULT {json}` as its last word.
//! The machine's own network namespace is never touched.

use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

/// Deletes the namespace when dropped.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// Runs `shepherd-bench --shepherd BINARY --out OUT SCENARIO --inside ARGS...` inside a new
/// network namespace (needs root and iproute2); passes its output through and returns its result.
pub fn measure_inside(scenario: &str, binary: &Path, out: &Path, args: &[String]) -> anyhow::Result<Value> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let root = status.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"));
    anyhow::ensure!(root, "{scenario} needs root (a network namespace of its own)");
    let name = format!("shepbench{}", std::process::id());
    let ok = Command::new("ip").args(["netns", "add", &name]).status().is_ok_and(|s| s.success());
    anyhow::ensure!(ok, "ip netns add {name} failed (package iproute2)");
    let ns = Netns(name);
    let _ = Command::new("ip").args(["-n", &ns.0, "link", "set", "lo", "up"]).status();
    let output = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", ns.0))
        .arg("--")
        .arg(std::env::current_exe()?)
        .arg("--shepherd")
        .arg(binary)
        .arg("--out")
        .arg(out)
        .args([scenario, "--inside"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?
        .wait_with_output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let mut values = None;
    for line in text.lines() {
        match line.strip_prefix("RESULT ") {
            Some(r) => values = serde_json::from_str::<Value>(r).ok(),
            None => println!("{line}"),
        }
    }
    anyhow::ensure!(output.status.success(), "the measurement inside the namespace failed");
    values.ok_or_else(|| anyhow::anyhow!("the measurement printed no result"))
}
