//! Starting and observing real Shepherd processes.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The administrator's bearer token of servers started by [`Process::start_reachable`] with TLS.
const BENCH_TOKEN: &str = "bench-admin-token";

/// A server or standalone serves plain HTTP (`--insecure-loopback`) unless started secure.
fn insecure_for(args: &[&str]) -> &'static [&'static str] {
    if matches!(args.first(), Some(&"server" | &"standalone")) { &["--insecure-loopback"] } else { &[] }
}

pub struct Process {
    pub child: Child,
    pub url: String,
}

impl Process {
    /// Starts `shepherd <args> --listen 127.0.0.1:0` and reads the address it prints; a server
    /// or standalone serves plain HTTP (`--insecure-loopback`): the benchmarks measure the rest.
    pub fn start(binary: &Path, args: &[&str]) -> anyhow::Result<Process> {
        Process::spawn(binary, args, insecure_for(args), Stdio::inherit())
    }

    /// Starts `shepherd <args>` as a user would: TLS, and every request authenticated.
    pub fn start_secure(binary: &Path, args: &[&str]) -> anyhow::Result<Process> {
        Process::spawn(binary, args, &[], Stdio::inherit())
    }

    /// Starts a `server` or `standalone` whose data dir is `data_dir`, reached by the client
    /// returned beside it: plain HTTP without authentication, or with `tls` as users run it, TLS
    /// verified with the cluster CA and every request bearing an administrator's token (`--token`).
    pub fn start_reachable(binary: &Path, args: &[&str], data_dir: &Path, tls: bool) -> anyhow::Result<(Process, reqwest::Client)> {
        Process::start_reachable_logged(binary, args, data_dir, tls, None)
    }

    /// [`Process::start_reachable`] with the process's stderr written to `log` (when given) rather
    /// than the harness's, for a caller that reads why a start failed.
    pub fn start_reachable_logged(
        binary: &Path,
        args: &[&str],
        data_dir: &Path,
        tls: bool,
        log: Option<&Path>,
    ) -> anyhow::Result<(Process, reqwest::Client)> {
        let stderr = match log {
            Some(path) => Stdio::from(std::fs::File::create(path)?),
            None => Stdio::inherit(),
        };
        if !tls {
            return Ok((Process::spawn(binary, args, insecure_for(args), stderr)?, reqwest::Client::new()));
        }
        let process = Process::spawn(binary, &[args, &["--token", BENCH_TOKEN]].concat(), &[], stderr)?;
        // The server writes its CA before it prints its address.
        let pem = std::fs::read(data_dir.join("pki/ca.crt"))?;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, reqwest::header::HeaderValue::from_str(&format!("Bearer {BENCH_TOKEN}"))?);
        let http = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&pem)?)
            .default_headers(headers)
            .build()?;
        Ok((process, http))
    }

    fn spawn(binary: &Path, args: &[&str], insecure: &[&str], stderr: Stdio) -> anyhow::Result<Process> {
        let mut child = Command::new(binary)
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .args(insecure)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {}: {e} (build it with cargo build --release)", binary.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let url = line.split_whitespace().last().unwrap_or("").to_string();
        anyhow::ensure!(url.starts_with("http://") || url.starts_with("https://"), "unexpected first line from shepherd: {line:?}");
        Ok(Process { child, url })
    }

    /// Stops the process with SIGTERM, as Ctrl-C would (standalone then stops its containers,
    /// which a SIGKILL would leave running), killing it after `limit`.
    pub fn terminate(&mut self, limit: std::time::Duration) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Resident set size in MiB, from /proc.
    pub fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
