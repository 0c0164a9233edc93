//! Starting the real `shepherd` binary for end-to-end tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `shepherd` process and the address it printed.
pub struct Daemon {
    pub child: Child,
    pub url: String,
    /// The daemon's command line as /proc shows it: a standalone daemon's containers are forked
    /// from it and keep this command line, which is how `Drop` finds the ones a test left running.
    cmdline: Vec<u8>,
    /// The data directory, which the command line of each of its containers' shims names.
    data_dir: Option<PathBuf>,
}

impl Daemon {
    /// Starts `shepherd <mode> --data-dir DIR --listen 127.0.0.1:0 <extra>` and waits for its
    /// "listening on" line.
    /// Starts `shepherd <mode>`. A `standalone` without `--runtime` runs the process runtime (the
    /// suite's default: fast, and what most tests inspect); `tests/oci.rs` runs the oci runtime.
    pub fn start(mode: &str, data_dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::spawn(mode, data_dir, &["--insecure-loopback"], extra)
    }

    /// Starts `shepherd <mode>` with `flags` before `extra`, on a port of its choosing.
    pub fn spawn(mode: &str, data_dir: &Path, flags: &[&str], extra: &[&str]) -> Daemon {
        let default_runtime: &[&str] =
            if mode == "standalone" && !extra.contains(&"--runtime") { &["--runtime", "process"] } else { &[] };
        let child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .arg(mode)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(flags)
            .args(default_runtime)
            .args(host_network_unless_named(mode, &[flags, extra].concat()))
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
        assert!(url.starts_with("http://") || url.starts_with("https://"), "unexpected first line: {line:?}");
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap_or_default();
        let data_dir = data_dir_of(child.id(), &cmdline);
        Daemon { child, url, cmdline, data_dir }
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
        kill_leftovers(&self.cmdline, self.data_dir.as_deref());
    }
}

/// The `--data-dir` that process `pid` was started with (its command line `cmdline`), made
/// absolute against its working directory.
fn data_dir_of(pid: u32, cmdline: &[u8]) -> Option<PathBuf> {
    let mut args = cmdline.split(|b| *b == 0).map(std::ffi::OsStr::from_bytes);
    let dir = loop {
        let arg = args.next()?;
        if arg == "--data-dir" {
            break PathBuf::from(args.next()?);
        }
        if let Some(d) = arg.as_bytes().strip_prefix(b"--data-dir=") {
            break PathBuf::from(std::ffi::OsStr::from_bytes(d));
        }
    };
    if dir.is_absolute() { Some(dir) } else { std::fs::read_link(format!("/proc/{pid}/cwd")).ok().map(|cwd| cwd.join(dir)) }
}

/// `--pod-network host` for a standalone whose flags name no pod network. Run as root, standalone
/// builds its pod network (a bridge, routes, nftables rules) in the network namespace it runs in;
/// tests leave the machine's own namespace untouched, and those that exercise the pod network
/// start standalone inside a namespace they made, naming `--pod-network bridge` or running
/// README's command there.
pub fn host_network_unless_named(mode: &str, flags: &[&str]) -> &'static [&'static str] {
    if mode == "standalone" && !flags.contains(&"--pod-network") { &["--pod-network", "host"] } else { &[] }
}

/// Starts `shepherd standalone --data-dir DIR --listen 127.0.0.1:0 FLAGS` (with
/// `--pod-network host` unless FLAGS name one); returns it and every line it writes to stderr
/// (each also passed on to the test's own stderr).
pub fn standalone_with_stderr(data_dir: &Path, flags: &[&str]) -> (Daemon, std::sync::mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .arg("standalone")
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen", "127.0.0.1:0"])
        .args(host_network_unless_named("standalone", flags))
        .args(flags)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start shepherd");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            let _ = tx.send(line);
        }
    });
    (Daemon::from_child(child), lines)
}

/// The first of `lines` that starts with `prefix`, within `limit`; fails the test otherwise.
pub fn line_starting(lines: &std::sync::mpsc::Receiver<String>, prefix: &str, limit: Duration) -> String {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(line) if line.starts_with(prefix) => return line,
            Ok(_) => {}
            Err(_) => panic!("no line starting with {prefix:?} within {limit:?}"),
        }
    }
}

/// Every mount at or below `dir`, deepest first (the order to unmount them in).
pub fn mounts_under(dir: &Path) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let (dir, below) = (dir.display().to_string(), format!("{}/", dir.display()));
    let mut found: Vec<String> =
        table.lines().filter_map(|l| l.split(' ').nth(4)).filter(|m| *m == dir || m.starts_with(&below)).map(str::to_string).collect();
    found.sort_by_key(|m| std::cmp::Reverse(m.len()));
    found
}

/// Kills what a `shepherd` process (already killed) left running: the processes with its exact
/// command line (a standalone's containers forked without a `shepherd-shim` keep it) and the
/// `shepherd-shim` processes whose command line names a path inside `data_dir`
/// (`shepherd-shim MODE PID <data dir>/.../exit ...`). A container's first process is the init of
/// its PID namespace, so killing it (and its shim) ends everything inside.
pub fn kill_leftovers(cmdline: &[u8], data_dir: Option<&Path>) {
    let inside = data_dir.map(|d| {
        let mut dir = d.as_os_str().as_encoded_bytes().to_vec();
        dir.push(b'/');
        dir
    });
    let Ok(procs) = std::fs::read_dir("/proc") else { return };
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else { continue };
        let Ok(c) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let shim = inside.as_ref().is_some_and(|dir| {
            c.split(|b| *b == 0).next().is_some_and(|argv0| argv0.ends_with(b"shepherd-shim"))
                && c.windows(dir.len()).any(|w| w == dir.as_slice())
        });
        // An empty command line (the process was gone when it was read) matches nobody's: kernel
        // threads have one too.
        if (!cmdline.is_empty() && c == cmdline) || shim {
            let _ = Command::new("kill").arg("-KILL").arg(pid.to_string()).status();
        }
    }
}

/// The processes (kubectl aside) whose command line contains `needle`, as `pid: command line`.
pub fn processes_with(needle: &str) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) && !text.contains("kubectl") {
            out.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    out
}

/// A TCP port on loopback that nothing listens on (at the moment of asking).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A child process killed (and reaped) when the test lets go of it, failing or not.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One kubectl binary against one server.
pub struct Kubectl {
    pub bin: PathBuf,
    pub url: String,
}

impl Kubectl {
    /// Runs `args` with `stdin`: whether it succeeded, stdout, stderr.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let (status, out, err) = run_with_stdin(kubectl_command(&self.bin, &self.url).args(args), stdin);
        (status.success(), out, err)
    }

    /// Runs `args`; the test fails if kubectl does.
    pub fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.run(args, stdin);
        assert!(ok, "kubectl {args:?}: {err}{out}");
        out
    }

    /// Runs `args` with `-o json` and parses what it prints.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all, None)).expect("kubectl -o json")
    }
}

/// The `kubectl` on PATH (on the test machines, a dispatcher that picks a version).
pub fn installed_kubectl() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
        .expect("kubectl is installed (.ci/run installs it)")
}

/// `kubectl.1.<minor>` beside the installed kubectl (the Google Cloud SDK ships versioned
/// binaries side by side), if present.
pub fn versioned_kubectl(minor: u32) -> Option<PathBuf> {
    let dir = std::fs::canonicalize(installed_kubectl()).ok()?.parent()?.to_path_buf();
    Some(dir.join(format!("kubectl.1.{minor}"))).filter(|p| p.is_file())
}

/// The newest versioned kubectl beside the installed one, else the installed one: (label, binary).
pub fn newest_kubectl() -> (String, PathBuf) {
    let installed = installed_kubectl();
    let dir = std::fs::canonicalize(&installed).ok().and_then(|p| p.parent().map(Path::to_path_buf));
    let newest = dir
        .and_then(|d| std::fs::read_dir(d).ok())
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let minor: u32 = e.file_name().to_str()?.strip_prefix("kubectl.1.")?.parse().ok()?;
            Some((minor, e.path()))
        })
        .max();
    match newest {
        Some((minor, path)) => (format!("1.{minor}"), path),
        None => ("default".to_string(), installed),
    }
}

/// The kubectls a compatibility test runs: 1.27 where installed, and the newest.
pub fn kubectls_under_test() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = versioned_kubectl(27).map(|p| ("1.27".to_string(), p)).into_iter().collect();
    let newest = newest_kubectl();
    if out.iter().all(|(_, p)| *p != newest.1) {
        out.push(newest);
    }
    out
}

/// `kubectl --server URL` with no kubeconfig, for the caller to add arguments and environment.
pub fn kubectl_command(bin: &Path, url: &str) -> Command {
    let mut cmd = Command::new(bin);
    cmd.arg("--server").arg(url).env("KUBECONFIG", "/dev/null");
    cmd
}

/// Runs `cmd` with `stdin` written to it (or closed): its exit status, stdout and stderr.
pub fn run_with_stdin(cmd: &mut Command, stdin: Option<&str>) -> (std::process::ExitStatus, String, String) {
    use std::io::Write;
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run kubectl");
    if let Some(input) = stdin {
        child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().expect("kubectl output");
    (out.status, String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

pub mod interactive;

/// A `shepherd server` started without `--insecure-loopback`.
pub fn secure_server(dir: &Path, extra: &[&str]) -> Daemon {
    let daemon = Daemon::spawn("server", dir, &["--controllers", "none"], extra);
    assert!(daemon.url.starts_with("https://"), "served without TLS: {}", daemon.url);
    daemon
}

pub fn ca_pem(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("pki/ca.crt")).expect("the cluster CA is in the data dir")
}

/// A client that trusts the cluster CA only.
pub fn https_client(dir: &Path) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(ca_pem(dir).as_bytes()).expect("CA");
    reqwest::Client::builder().tls_built_in_root_certs(false).add_root_certificate(ca).build().expect("client")
}

/// Leader election short enough for a test, with the margins of client-go's defaults
/// (15 s / 10 s / 2 s).
pub const ELECTION: [&str; 6] = [
    "--leader-elect-lease-duration",
    "4s",
    "--leader-elect-renew-deadline",
    "3s",
    "--leader-elect-retry-period",
    "500ms",
];
pub const LEASE: Duration = Duration::from_secs(4);

/// A `shepherd controller-manager` or `shepherd scheduler` candidate with [`ELECTION`]'s timing,
/// its stderr collected, killed on drop.
pub struct Candidate {
    pub child: Child,
    pub identity: String,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Candidate {
    pub fn start(role: &str, server: &str, extra: &[&str]) -> Candidate {
        use std::io::Read;
        let mut child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args([role, "--server", server])
            .args(extra)
            .args(ELECTION)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start candidate");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("first line");
        // "shepherd controller-manager candidate ID against URL"
        let identity = line.split_whitespace().nth(3).expect("identity").to_string();
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Candidate { child, identity, stderr }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").arg(sig).arg(self.child.id().to_string()).status().expect("kill");
        assert!(ok.success(), "kill {sig} failed");
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A network namespace the test made (`ip netns add`), deleted when dropped.
pub struct Netns(pub String);

impl Netns {
    pub fn new(name: String) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        run_ok(Command::new("ip").args(["-n", &name, "link", "set", "lo", "up"]));
        Netns(name)
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.0)
    }

    /// `ip -n NAME ARGS...`: configures this namespace only.
    pub fn ip(&self, args: &[&str]) {
        run_ok(Command::new("ip").arg("-n").arg(&self.0).args(args));
    }

    /// A command run inside this namespace. nsenter (not `ip netns exec`) keeps the host's mount
    /// namespace, so the agent's bind mounts of pod namespaces outlive the agent process.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path())).arg("--").arg(program);
        cmd
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}
