//! Test harness: a real `shepherd` process on a loopback port, the real `sheepctl` binary, and
//! a small HTTP helper to set up objects behind sheepctl's back.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

/// The workspace's `target` directory.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

static BUILD: Mutex<bool> = Mutex::new(false);

/// `target/debug/shepherd`, built once with `cargo build -p shepherd` when missing (the binary
/// belongs to another crate, so cargo does not build it for these tests).
pub fn shepherd_bin() -> PathBuf {
    let bin = target_dir().join("debug").join("shepherd");
    let mut built = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if !bin.exists() && !*built {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "shepherd"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build -p shepherd");
        assert!(status.success(), "cargo build -p shepherd failed");
        *built = true;
    }
    assert!(bin.exists(), "{} is missing after cargo build -p shepherd", bin.display());
    bin
}

/// A running `shepherd` (server or standalone) with its own data directory.
pub struct Shepherd {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Shepherd {
    /// The API server alone, without controllers, so objects keep exactly the status a test
    /// gives them. (A `shepherd` built before controllers were wired in has no `--controllers`
    /// flag and runs none anyway.)
    pub fn server() -> Shepherd {
        Shepherd::try_start("server", &["--controllers", "none"]).unwrap_or_else(|| Shepherd::start("server", &[]))
    }

    /// Everything in one process: API server, controllers, scheduler and the local node.
    pub fn standalone() -> Shepherd {
        Shepherd::start("standalone", &[])
    }

    pub fn start(mode: &str, extra: &[&str]) -> Shepherd {
        match Shepherd::try_start(mode, extra) {
            Some(s) => s,
            None => panic!("shepherd {mode} {extra:?} did not print its address"),
        }
    }

    fn try_start(mode: &str, extra: &[&str]) -> Option<Shepherd> {
        let dir = tempfile::tempdir().expect("temp dir");
        // The process runtime unless a test names one (standalone would pick oci where runc runs).
        let default_runtime: &[&str] =
            if mode == "standalone" && !extra.contains(&"--runtime") { &["--runtime", "process"] } else { &[] };
        let mut child = Command::new(shepherd_bin())
            .arg(mode)
            .arg("--data-dir")
            .arg(dir.path())
            .args(["--listen", "127.0.0.1:0", "--insecure-loopback"])
            .args(default_runtime)
            // Run as root, standalone would build its pod network in this machine's namespace.
            .args(if mode == "standalone" && !extra.contains(&"--pod-network") { &["--pod-network", "host"][..] } else { &[] })
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start shepherd");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let url = line.split_whitespace().last().unwrap_or("").to_string();
        if !url.starts_with("http://") {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        Some(Shepherd { child, url, _dir: dir })
    }

    /// A raw API call; panics on transport errors, returns the status code and JSON body.
    pub fn api(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let client = reqwest::blocking::Client::new();
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut req = client.request(method.clone(), format!("{}{path}", self.url));
        if let Some(b) = body {
            let ct = if method == reqwest::Method::PATCH { "application/merge-patch+json" } else { "application/json" };
            req = req.header("Content-Type", ct).body(b.to_string());
        }
        let resp = req.send().expect("API request");
        let code = resp.status().as_u16();
        let text = resp.text().unwrap_or_default();
        (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// A call that must succeed.
    pub fn ok(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (code, v) = self.api(method, path, body);
        assert!((200..300).contains(&code), "{method} {path} -> {code}: {v}");
        v
    }

    pub fn sheepctl(&self, args: &[&str]) -> Run {
        sheepctl(Some(&self.url), args, None)
    }

    pub fn sheepctl_stdin(&self, args: &[&str], stdin: &str) -> Run {
        sheepctl(Some(&self.url), args, Some(stdin))
    }
}

impl Shepherd {
    /// Stops the daemon as Ctrl-C does: a standalone stops its containers first, which the
    /// oci runtime's would otherwise outlive (they are runc's, not the daemon's children).
    pub fn interrupt(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our unreaped child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let _ = self.child.wait();
    }
}

impl Drop for Shepherd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The outcome of one `sheepctl` run.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts success and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "sheepctl failed:\nstdout: {}\nstderr: {}", self.stdout, self.stderr);
        &self.stdout
    }
}

/// A sheepctl command isolated from the developer's environment (no SHEPHERD_API, no kubeconfig).
pub fn command(server: Option<&str>, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sheepctl"));
    if let Some(s) = server {
        cmd.args(["--server", s]);
    }
    cmd.args(args)
        .env_remove("SHEPHERD_API")
        .env("KUBECONFIG", "/nonexistent/sheepctl-test-kubeconfig")
        .env("HOME", std::env::temp_dir());
    cmd
}

pub fn sheepctl(server: Option<&str>, args: &[&str], stdin: Option<&str>) -> Run {
    let mut cmd = command(server, args);
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("start sheepctl");
    if let Some(text) = stdin {
        let mut input = child.stdin.take().expect("stdin");
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    let out = child.wait_with_output().expect("sheepctl output");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Replaces what changes from run to run (ages, timestamps, uids, resource versions, ports)
/// with fixed text of the same width, so column alignment stays part of the snapshot.
pub fn redact(text: &str) -> String {
    let ts = regex::Regex::new(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z").expect("regex");
    let uid = regex::Regex::new(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}").expect("regex");
    let rv = regex::Regex::new(r#"("?resourceVersion"?: ")\d+""#).expect("regex");
    let port = regex::Regex::new(r"127\.0\.0\.1:\d+").expect("regex");
    let age = regex::Regex::new(r"(^|\s)(\d{1,2}s)( *)").expect("regex");
    let text = ts.replace_all(text, "YYYY-MM-DDThh:mm:ssZ");
    let text = uid.replace_all(&text, "00000000-0000-0000-0000-000000000000");
    let text = rv.replace_all(&text, "${1}RV\"");
    let text = port.replace_all(&text, "127.0.0.1:PORT");
    let ages = |text: &str| {
        age.replace_all(text, |c: &regex::Captures| {
            let width = c[2].len() + c[3].len();
            let trailing = c.get(3).is_some_and(|m| !m.as_str().is_empty());
            if trailing { format!("{}{:<width$}", &c[1], "<a>".get(..width.min(3)).unwrap_or("<a>")) } else { format!("{}<a>", &c[1]) }
        })
        .into_owned()
    };
    // A match takes the spaces after an age, so an age right after another one (a Job's
    // DURATION then AGE) is only found by a second pass.
    ages(&ages(&text))
}

/// Reads lines from a child's stdout on a thread, so a test can wait for output with a timeout.
pub struct LineReader {
    rx: std::sync::mpsc::Receiver<String>,
}

impl LineReader {
    pub fn new(stdout: std::process::ChildStdout) -> LineReader {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        LineReader { rx }
    }

    /// The next line, or None after `timeout`.
    pub fn next(&self, timeout: Duration) -> Option<String> {
        self.rx.recv_timeout(timeout).ok()
    }

    /// Lines until one contains `needle`; panics after `timeout`.
    pub fn until(&self, needle: &str, timeout: Duration) -> Vec<String> {
        let deadline = std::time::Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    seen.push(line);
                    if hit {
                        return seen;
                    }
                }
                Err(_) => panic!("no line containing {needle:?} within {timeout:?}; saw {seen:#?}"),
            }
        }
    }
}
