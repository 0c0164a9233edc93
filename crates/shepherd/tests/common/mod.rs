//! Starting the real `shepherd` binary for end-to-end tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `shepherd` process and the address it printed.
pub struct Daemon {
    pub child: Child,
    pub url: String,
    /// The daemon's command line as /proc shows it: a standalone daemon's containers are forked
    /// from it and keep this command line, which is how `Drop` finds the ones a test left running.
    cmdline: Vec<u8>,
}

impl Daemon {
    /// Starts `shepherd <mode> --data-dir DIR --listen 127.0.0.1:0 <extra>` and waits for its
    /// "listening on" line.
    pub fn start(mode: &str, data_dir: &Path, extra: &[&str]) -> Daemon {
        let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .arg(mode)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start shepherd");
        Daemon::from_child(child)
    }

    /// Waits for the "listening on" line of a `shepherd` started with a piped stdout.
    pub fn from_child(mut child: Child) -> Daemon {
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).expect("read address line");
        let url = line.split_whitespace().last().expect("address").to_string();
        assert!(url.starts_with("http://"), "unexpected first line: {line:?}");
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap_or_default();
        Daemon { child, url, cmdline }
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        for _ in 0..100 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill9();
        panic!("shepherd did not exit within 5 s of SIGTERM");
    }
}

impl Drop for Daemon {
    /// Kills the daemon and every container it left running, so no test outlives its run.
    fn drop(&mut self) {
        self.kill9();
        if self.cmdline.is_empty() {
            return;
        }
        let Ok(procs) = std::fs::read_dir("/proc") else { return };
        for entry in procs.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
            if std::fs::read(entry.path().join("cmdline")).is_ok_and(|c| c == self.cmdline) {
                // A container's first process is the init of its PID namespace: killing it ends
                // everything inside.
                let _ = Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
            }
        }
    }
}
