//! Headless Chromium under chromedriver, for the dashboard's browser test and benchmark.
//!
//! Debian's `chromium` and `chromium-driver` packages; the flags keep the browser off the network
//! (no background services, no component updates) and out of any profile but a fresh one. The
//! session accepts the server's certificate (WebDriver's `acceptInsecureCerts`): a cluster's CA is
//! its own, generated at its first start.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use serde_json::{Value, json};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A browser session; chromedriver, the browser and its profile go when it is dropped.
pub struct Browser {
    pub client: Client,
    /// chromedriver's port on loopback.
    pub port: u16,
    driver: Child,
    profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        // The browser outlives chromedriver when its session was not closed (a test that failed
        // half-way): its processes are the ones started with this session's profile.
        let profile = format!("--user-data-dir={}", self.profile.path().display());
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            if cmdline.split(|b| *b == 0).any(|arg| arg == profile.as_bytes()) {
                let _ = Command::new("kill").arg("-KILL").arg(entry.file_name()).status();
            }
        }
    }
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless browser of `width` x `height`.
    pub async fn start(width: u32, height: u32) -> Result<Browser, String> {
        for bin in [CHROMIUM, CHROMEDRIVER] {
            if !Path::new(bin).exists() {
                return Err(format!(
                    "{bin} is missing: the dashboard's browser tests and benchmark need Debian's chromium and \
                     chromium-driver packages (scripts/test.sh installs them)"
                ));
            }
        }
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
        let profile = tempfile::tempdir().map_err(|e| format!("browser profile: {e}"))?;
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting chromedriver: {e}"))?;
        let args = [
            "--headless=new".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            format!("--user-data-dir={}", profile.path().display()),
            format!("--window-size={width},{height}"),
        ];
        // A cluster serves TLS with a certificate of its own CA, made at its first start, which this
        // fresh profile cannot know: WebDriver's acceptInsecureCerts lets the page load over it.
        let caps = json!({"goog:chromeOptions": {"binary": CHROMIUM, "args": args}, "acceptInsecureCerts": true});
        let Value::Object(caps) = caps else {
            return Err("capabilities are an object".into());
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector).capabilities(caps.clone()).connect(&format!("http://127.0.0.1:{port}")).await {
                Ok(client) => return Ok(Browser { client, port, driver, profile }),
                Err(e) if Instant::now() >= deadline => {
                    let mut driver = driver;
                    let _ = driver.kill();
                    let _ = driver.wait();
                    return Err(format!("chromedriver on port {port} did not start a browser: {e}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Runs `script` (a function body that returns a value) until it returns something truthy
    /// (not null, false, 0 or ""), and returns that; `Err` with the last answer after `limit`.
    pub async fn wait_for(&self, script: &str, limit: Duration) -> Result<Value, Value> {
        let deadline = Instant::now() + limit;
        loop {
            let last = match self.client.execute(script, vec![]).await {
                Ok(v) if !matches!(v, Value::Null | Value::Bool(false)) && v != json!(0) && v != json!("") => return Ok(v),
                Ok(v) => v,
                Err(e) => json!(e.to_string()),
            };
            if Instant::now() >= deadline {
                return Err(last);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
