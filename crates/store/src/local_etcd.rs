//! `LocalEtcd`: an etcd on loopback ports in a temporary directory (one member, or a cluster of
//! several), for tests and benchmarks of the etcd backend. It runs Debian's `etcd` (package
//! `etcd-server`) and needs nothing of the backend itself, so it is built without the `etcd` feature
//! too (the benchmark harness starts one for a server binary built with it).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd, stopped (and its directory removed) on drop.
pub struct LocalEtcd {
    child: Option<Child>,
    binary: PathBuf,
    dir: PathBuf,
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Serves `/health` and `/metrics` over plain HTTP, whatever the client port asks for.
    metrics_port: u16,
    /// `name=peer URL` of every member, etcd's --initial-cluster.
    initial_cluster: String,
    tls: Option<LocalEtcdTls>,
}

/// PEM files etcd serves its clients with; clients must present a certificate the CA signed.
#[derive(Clone, Debug)]
pub struct LocalEtcdTls {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Where the etcd binary is looked for: `SHEPHERD_ETCD`, else Debian's path, else `PATH`.
fn etcd_binary() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("SHEPHERD_ETCD") {
        return Ok(PathBuf::from(p));
    }
    let debian = Path::new("/usr/bin/etcd");
    if debian.exists() {
        return Ok(debian.to_path_buf());
    }
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("etcd")).find(|p| p.is_file()))
        .ok_or_else(|| {
            "etcd is not installed: the etcd backend's tests run a real etcd; install Debian's etcd-server \
             (apt-get install etcd-server) or set SHEPHERD_ETCD to an etcd binary"
                .to_string()
        })
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

impl LocalEtcd {
    /// Starts etcd and waits until it answers its health check.
    pub fn start() -> Result<LocalEtcd, String> {
        Self::start_in(&std::env::temp_dir())
    }

    /// [`LocalEtcd::start`] with its directory (data and log) under `parent`.
    pub fn start_in(parent: &Path) -> Result<LocalEtcd, String> {
        let binary = etcd_binary()?;
        let mut last = String::new();
        // A port found free can be taken before etcd binds it: try again with others.
        for _ in 0..3 {
            match Self::start_once(&binary, parent) {
                Ok(etcd) => return Ok(etcd),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn start_once(binary: &Path, parent: &Path) -> Result<LocalEtcd, String> {
        let mut etcd = Self::member(binary, "test", None, parent)?;
        etcd.initial_cluster = format!("test={}", etcd.peer_url());
        etcd.spawn()?;
        Ok(etcd)
    }

    /// An etcd whose directory and ports are chosen but which does not run yet: `restart` starts
    /// it (a test of a server started before its etcd).
    pub fn unstarted() -> Result<LocalEtcd, String> {
        let mut etcd = Self::member(&etcd_binary()?, "test", None, &std::env::temp_dir())?;
        etcd.initial_cluster = format!("test={}", etcd.peer_url());
        Ok(etcd)
    }

    /// A single member that serves its clients over TLS and requires their certificates.
    pub fn start_tls(tls: LocalEtcdTls) -> Result<LocalEtcd, String> {
        let mut etcd = Self::member(&etcd_binary()?, "test", Some(tls), &std::env::temp_dir())?;
        etcd.initial_cluster = format!("test={}", etcd.peer_url());
        etcd.spawn()?;
        Ok(etcd)
    }

    /// A cluster of `members` etcd processes that form one quorum, started together.
    pub fn start_cluster(members: usize) -> Result<Vec<LocalEtcd>, String> {
        let binary = etcd_binary()?;
        let tmp = std::env::temp_dir();
        let mut cluster =
            (0..members).map(|i| Self::member(&binary, &format!("member{i}"), None, &tmp)).collect::<Result<Vec<_>, _>>()?;
        let initial: Vec<String> = cluster.iter().map(|m| format!("{}={}", m.name, m.peer_url())).collect();
        for m in &mut cluster {
            m.initial_cluster = initial.join(",");
        }
        // A member is healthy only once a quorum runs: launch all, then wait for each.
        for m in &mut cluster {
            m.launch()?;
        }
        for m in &mut cluster {
            m.wait_healthy()?;
        }
        Ok(cluster)
    }

    fn member(binary: &Path, name: &str, tls: Option<LocalEtcdTls>, parent: &Path) -> Result<LocalEtcd, String> {
        let unique = format!("shepherd-etcd-{}-{}", std::process::id(), free_port()?);
        let dir = parent.join(unique);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        Ok(LocalEtcd {
            child: None,
            binary: binary.to_path_buf(),
            dir,
            name: name.to_string(),
            client_port: free_port()?,
            peer_port: free_port()?,
            metrics_port: free_port()?,
            initial_cluster: String::new(),
            tls,
        })
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// Runs etcd over this directory and ports and waits until it is healthy.
    fn spawn(&mut self) -> Result<(), String> {
        self.launch()?;
        self.wait_healthy()
    }

    fn launch(&mut self) -> Result<(), String> {
        let client = self.endpoint();
        let peer = self.peer_url();
        let metrics = format!("http://127.0.0.1:{}", self.metrics_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .map_err(|e| e.to_string())?;
        let mut command = Command::new(&self.binary);
        command
            .args(["--name", &self.name, "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--listen-metrics-urls", &metrics])
            .args(["--initial-cluster", &self.initial_cluster]);
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.cert_file)
                .arg("--key-file")
                .arg(&tls.key_file)
                .arg("--trusted-ca-file")
                .arg(&tls.ca_file)
                .arg("--client-cert-auth");
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    fn wait_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.http_get("/health").is_ok_and(|body| body.contains("true")) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
                let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join("\n");
                return Err(format!("etcd exited with {status}:\n{tail}"));
            }
            if Instant::now() > deadline {
                return Err("etcd did not become healthy within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL: etcd stops at once, its data stays.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same data and ports.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill9();
        self.spawn()
    }

    /// The client URL (`http://127.0.0.1:PORT`, `https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The etcd process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// etcd's Prometheus metrics, as text.
    pub fn metrics(&self) -> Result<String, String> {
        self.http_get("/metrics")
    }

    fn http_get(&self, path: &str) -> Result<String, String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.metrics_port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(5))).map_err(|e| e.to_string())?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").map_err(|e| e.to_string())?;
        let mut body = String::new();
        s.read_to_string(&mut body).map_err(|e| e.to_string())?;
        Ok(body)
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
