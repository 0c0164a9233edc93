//! The `oci` runtime: containers from OCI images, run by `runc` in pod sandboxes.
//!
//! Process tree of one container instance:
//!
//! ```text
//! agent ── shim (child subreaper, own session)
//!            ├── runc run --detach   (exits once the container runs)
//!            └── container init      (reparented to the shim when runc exits; PID 1 of its namespace)
//! ```
//!
//! runc in detached mode hands the container the pipes it was started with as stdio; the shim
//! reads them and writes the container's log file in the CRI format (timestamped records, as the
//! process runtime's shim does), so output keeps flowing to `kubectl logs` with no agent. As in the
//! process runtime, the agent's fork starts runc, then execs the small `shepherd-shim` program. The shim
//! reports runc's result on a pipe, then waits for the container's init (which the kernel reparents to it, the nearest
//! subreaper) and writes its exit code to the container's `exit` file (128 + signal for a signal
//! death) before ending: exit codes survive an agent `kill -9`. The next agent re-adopts running
//! containers from `state.json` and runc's own state (`runc state`), checking pids against their
//! start times; one that ended meanwhile is reported from its `exit` file and cgroup OOM counter.
//!
//! A container with `stdin: true` reads a named pipe (`stdin` in its directory) that `attach`
//! writes to, held open by the container (and, for `stdinOnce`, by the shim until the first
//! attach ends), so it survives the agent. One with `tty: true` runs on a terminal runc makes
//! inside the container and hands over on a console socket (`--console-socket`); the shim keeps
//! its controlling side, types the stdin pipe into it and logs what it shows.
//!
//! Layout under the agent's data directory: `oci/containers/<pod uid>/<name>/` (bundle
//! `config.json`, `state.json`, logs, `exit`), `oci/sandboxes/<pod uid>/` (see `sandbox`),
//! `oci/runc/` (runc's `--root`), `images/` (the image store; overlay roots live there).

mod sandbox;
pub(crate) mod spec;

use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use shepherd_image::{
    Credentials, DiskUsage, Ensured, GcPolicy, ImageError, ImageRef, ImageStore, PullDecision, PullPolicy, Puller,
};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

use shepherd_shim::close_from;

use crate::cgroup::{self, Cgroups};
use crate::process::{
    MINIMAL_IMAGE, log_files, path_safe, rotate_if_larger, shim_program, signal_checked, start_time, wait_for_exit,
};
use crate::runtime::{
    Adopted, ContainerId, ContainerSpec, EventSender, Exit, ImagePull, ImageReady, ImageUnavailable, LogFiles, Runtime, RuntimeEvent, Started,
};
use spec::{ImageDefaults, SpecInputs};

/// Where runc is looked for when none is named.
pub const DEFAULT_RUNC: &str = "/usr/sbin/runc";

/// The cgroup (under each hierarchy's root) holding this runtime's containers.
const CGROUP_PARENT: &str = "shepherd-oci";

/// What the `minimal` image runs when given no command: an idle shell that ends on SIGTERM (a
/// PID 1 without a handler would ignore it and wait for the SIGKILL).
const IDLE: [&str; 3] = ["/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"];

/// Settings of the oci runtime.
#[derive(Debug, Clone)]
pub(crate) struct OciConfig {
    pub data_dir: PathBuf,
    pub runc: PathBuf,
    /// Every pod's address (pods share the node's network for now), for `/etc/hosts`.
    pub node_ip: String,
    pub insecure_registries: Vec<String>,
    /// Registry mirrors, credentials and TLS (`registries.yaml`).
    pub registries: shepherd_image::RegistriesConfig,
    pub log_max_bytes: u64,
    pub pids_limit: Option<u64>,
}

/// A container's root filesystem as prepared for one start.
struct Root {
    path: PathBuf,
    image: ImageDefaults,
    /// The built-in `minimal` image (the host's root) is never writable.
    readonly: bool,
}

/// What `state.json` records about a running instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StateFile {
    id: ContainerId,
    image: String,
    restart_count: u32,
    started_at: Timestamp,
    runc_id: String,
    shim_pid: i32,
    shim_start: u64,
    init_pid: i32,
    init_start: u64,
    oom_file: Option<PathBuf>,
}

struct Live {
    instance: u64,
    state: StateFile,
    exited: watch::Receiver<bool>,
    watcher: AbortHandle,
}

pub(crate) struct OciRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    config: OciConfig,
    cgroups: Cgroups,
    puller: Puller,
    events: EventSender,
    next_instance: AtomicU64,
    live: Mutex<HashMap<ContainerId, Live>>,
    rotation: Mutex<Option<AbortHandle>>,
    /// The `shepherd-shim` program; without it each shim stays a fork of the agent.
    shim: Option<CString>,
}

/// Why the oci runtime cannot run here.
pub(crate) fn unavailable(runc: &Path) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("the oci runtime needs root".into());
    }
    match Command::new(runc).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Ok(s) if s.success() => None,
        Ok(s) => Some(format!("{} --version failed ({s})", runc.display())),
        Err(e) => Some(format!("cannot run {}: {e}", runc.display())),
    }
}

impl OciRuntime {
    /// Needs a Tokio runtime (it starts the log rotation task).
    pub fn new(mut config: OciConfig, events: EventSender) -> io::Result<Self> {
        // runc resolves a relative root path against the bundle directory, and some paths are
        // handed to it from here: every path below starts from an absolute data directory.
        config.data_dir = std::path::absolute(&config.data_dir)?;
        let store = ImageStore::open(config.data_dir.join("images")).map_err(io::Error::other)?;
        let puller = Puller::new(Arc::new(store), config.insecure_registries.clone()).with_registries(config.registries.clone());
        fs::create_dir_all(config.data_dir.join("oci/runc"))?;
        let inner = Arc::new(Inner {
            config,
            cgroups: Cgroups::detect(),
            puller,
            events,
            next_instance: AtomicU64::new(1),
            live: Mutex::default(),
            rotation: Mutex::default(),
            shim: shim_program(),
        });
        let weak = Arc::downgrade(&inner);
        let rotation = tokio::spawn(async move {
            let mut ticks: u64 = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let Some(inner) = weak.upgrade() else { return };
                inner.rotate_logs();
                ticks += 1;
                // Image garbage collection every five minutes, as kubelet's.
                if ticks.is_multiple_of(60) {
                    let _ = tokio::task::spawn_blocking(move || inner.collect_images()).await;
                }
            }
        });
        *inner.rotation.lock().unwrap_or_else(|e| e.into_inner()) = Some(rotation.abort_handle());
        Ok(OciRuntime { inner })
    }
}

impl Inner {
    fn containers_dir(&self) -> PathBuf {
        self.config.data_dir.join("oci/containers")
    }

    fn dir_of(&self, id: &ContainerId) -> PathBuf {
        self.containers_dir().join(path_safe(&id.pod_uid)).join(path_safe(&id.name))
    }

    fn sandbox_dir(&self, pod_uid: &str) -> PathBuf {
        self.config.data_dir.join("oci/sandboxes").join(path_safe(pod_uid))
    }

    /// The network namespace the pod's containers join: the pod's own when the agent made and
    /// pinned one (`--pod-network bridge`; never for `hostNetwork` pods), else `None`, the node's.
    fn pod_network(&self, pod_uid: &str) -> Option<PathBuf> {
        crate::network::netns_of(&self.config.data_dir, pod_uid)
    }

    fn runc_root(&self) -> PathBuf {
        self.config.data_dir.join("oci/runc")
    }

    fn runc_id(id: &ContainerId) -> String {
        format!("{}_{}", path_safe(&id.pod_uid), path_safe(&id.name))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ContainerId, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn runc(&self) -> Command {
        let mut cmd = Command::new(&self.config.runc);
        cmd.arg("--root").arg(self.runc_root());
        cmd
    }

    fn rotate_logs(&self) {
        let ids: Vec<ContainerId> = self.lock().keys().cloned().collect();
        for id in ids {
            let files = log_files(&self.dir_of(&id));
            if let Err(e) = rotate_if_larger(&files, self.config.log_max_bytes) {
                warn!(container = %id.name, pod = %id.pod_key, error = %e, "log rotation failed");
            }
        }
    }

    /// Removes the least recently used images no live container uses once the disk holding the
    /// store is fuller than the policy's high mark. Blocking.
    fn collect_images(&self) {
        let in_use: std::collections::HashSet<String> = self
            .lock()
            .values()
            .filter_map(|l| ImageRef::parse(&l.state.image).ok())
            .map(|r| r.to_string())
            .collect();
        let store = self.puller.store();
        let collected = DiskUsage::of(store.root()).and_then(|disk| store.collect_garbage(GcPolicy::default(), disk, &in_use));
        if let Err(e) = collected {
            warn!(error = %e, "image garbage collection failed");
        }
    }

    /// Removes what an ended instance leaves: runc's state and cgroups, the root mount. Blocking.
    fn clean_instance(&self, id: &ContainerId) {
        let runc_id = Self::runc_id(id);
        // runc keeps a directory per container under its root: without one there is nothing to
        // delete, and a runc run saved (tens of milliseconds each).
        let known = self.runc_root().join(&runc_id).exists();
        let out = known.then(|| {
            self.runc().args(["delete", "--force", &runc_id]).stdout(Stdio::null()).stderr(Stdio::piped()).output()
        });
        if let Some(Ok(o)) = out
            && !o.status.success()
        {
            let text = String::from_utf8_lossy(&o.stderr);
            if !text.contains("does not exist") {
                warn!(container = %runc_id, error = %text.trim(), "runc delete failed");
            }
        }
        let _ = fs::remove_dir(self.dir_of(id).join("rootfs"));
        if let Err(e) = self.puller.store().remove_rootfs(&runc_id) {
            warn!(container = %runc_id, error = %e, "cannot remove the container's root");
        }
    }

    fn exit_of(&self, dir: &Path, state: &StateFile) -> Exit {
        let code = fs::read_to_string(dir.join("exit")).ok().and_then(|c| c.trim().parse::<i32>().ok());
        let oom = state.oom_file.as_deref().is_some_and(|f| cgroup::oom_kills(f) > 0);
        let reason = match code {
            Some(c) => Exit::reason_for(c, oom).to_string(),
            None if oom => "OOMKilled".into(),
            None => "ContainerStatusUnknown".into(),
        };
        Exit { code: code.unwrap_or(137), reason, started_at: state.started_at, finished_at: Timestamp::now() }
    }

    /// Starts watching `state`'s shim; returns the instance number given to it.
    fn watch(self: &Arc<Self>, state: StateFile) -> u64 {
        let instance = self.next_instance.fetch_add(1, Ordering::Relaxed);
        let (exited_tx, exited) = watch::channel(false);
        let this = Arc::downgrade(self);
        let s = state.clone();
        let task = tokio::spawn(async move {
            wait_for_exit(s.shim_pid, s.shim_start).await;
            // SAFETY: waitpid with WNOHANG and a valid status pointer (reaps the shim if it is ours).
            unsafe {
                let mut status = 0;
                libc::waitpid(s.shim_pid, &mut status, libc::WNOHANG);
            }
            let Some(inner) = this.upgrade() else { return };
            let dir = inner.dir_of(&s.id);
            let exit = inner.exit_of(&dir, &s);
            // Cleaned before the exit is reported, so a restart never races with the cleaning.
            let cleaner = inner.clone();
            let id = s.id.clone();
            let _ = tokio::task::spawn_blocking(move || cleaner.clean_instance(&id)).await;
            debug!(pod = %s.id.pod_key, container = %s.id.name, code = exit.code, reason = %exit.reason, "container exited");
            exited_tx.send_replace(true);
            let _ = inner.events.send(RuntimeEvent::Exited { id: s.id.clone(), instance, exit });
        });
        let live = Live { instance, state, exited, watcher: task.abort_handle() };
        if let Some(old) = self.lock().insert(live.state.id.clone(), live) {
            old.watcher.abort();
        }
        instance
    }

    /// The root filesystem and image defaults of `spec`'s container.
    fn prepare_root(&self, spec: &ContainerSpec, dir: &Path) -> Result<Root, String> {
        if spec.image == MINIMAL_IMAGE {
            // The built-in image is the host's filesystem, read-only, as the process runtime uses
            // it: an empty root with the host's `/` bound over it by runc (see `spec::build`), so
            // the bind exists only in the container's mount namespace, never under the data dir.
            let rootfs = dir.join("rootfs");
            fs::create_dir_all(&rootfs).map_err(|e| format!("creating {}: {e}", rootfs.display()))?;
            return Ok(Root { path: rootfs, image: ImageDefaults::default(), readonly: true });
        }
        let reference = ImageRef::parse(&spec.image).map_err(|e| e.to_string())?;
        let store = self.puller.store();
        let record = store
            .image(&reference.to_string())
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("image {reference} is not present on this node"))?;
        let config = store.config(&record).map_err(|e| e.to_string())?;
        let rootfs = store.mount_rootfs(&Self::runc_id(&spec.id), &record).map_err(|e| e.to_string())?;
        Ok(Root { path: rootfs, image: ImageDefaults::from_config(&config), readonly: false })
    }

    fn spawn(self: &Arc<Self>, spec: &ContainerSpec) -> Result<StateFile, String> {
        let mut phases = Phases::start();
        let id = &spec.id;
        let dir = self.dir_of(id);
        fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        // An earlier instance of this container is over (the pod manager restarts only those).
        self.clean_instance(id);
        let files = log_files(&dir);
        if files.current.exists() {
            let _ = fs::rename(&files.current, &files.previous);
        }
        for f in [files.rotated.clone(), dir.join("exit"), dir.join("runc.log"), dir.join("init.pid")] {
            let _ = fs::remove_file(f);
        }

        phases.mark("clean");
        let net = self.pod_network(&id.pod_uid);
        let sandbox = sandbox::ensure(&self.sandbox_dir(&id.pod_uid), &spec.hostname, &self.config.node_ip, net.as_deref())
            .map_err(|e| format!("creating the pod sandbox: {e}"))?;
        phases.mark("sandbox");
        let root = self.prepare_root(spec, &dir)?;
        phases.mark("root");
        let result = self.run_in(spec, &dir, &root, &sandbox, &mut phases);
        if result.is_err() {
            self.clean_instance(id);
        }
        debug!(pod = %id.pod_key, container = %id.name, "start phases: {phases}");
        result
    }

    fn run_in(
        self: &Arc<Self>,
        spec: &ContainerSpec,
        dir: &Path,
        root: &Root,
        sandbox: &spec::SandboxPaths,
        phases: &mut Phases,
    ) -> Result<StateFile, String> {
        let id = &spec.id;
        let (rootfs, image) = (root.path.as_path(), &root.image);
        let mut argv = spec::argv(image, &spec.command, &spec.args);
        if argv.is_empty() {
            if spec.image != MINIMAL_IMAGE {
                return Err(format!("image {:?} has no command: set the container's command or the image's Entrypoint/Cmd", spec.image));
            }
            argv = IDLE.iter().map(|s| s.to_string()).collect();
        }
        // runAsUser replaces the image's user (its group from the image's passwd unless
        // runAsGroup names one); runAsGroup alone replaces only the group.
        let mut user = match spec.security.run_as_user {
            Some(uid) => spec::resolve_user(Some(&uid.to_string()), rootfs)?,
            None => spec::resolve_user(image.user.as_deref(), rootfs)?,
        };
        if let Some(gid) = spec.security.run_as_group {
            user.1 = gid;
        }
        let runc_id = Self::runc_id(id);
        let cgroups_path = format!("/{CGROUP_PARENT}/{runc_id}");
        let inputs = SpecInputs {
            rootfs,
            host_root: spec.image == MINIMAL_IMAGE,
            readonly_root: root.readonly,
            image,
            sandbox,
            cgroups_path: cgroups_path.clone(),
            pids_limit: self.config.pids_limit,
        };
        let oci = spec::build(spec, &inputs, argv, user)?;
        let json = serde_json::to_vec_pretty(&oci).map_err(|e| format!("encoding the runtime spec: {e}"))?;
        // Read by runc at once and written anew by every start: nothing to sync.
        fs::write(dir.join("config.json"), &json).map_err(|e| format!("writing the runtime spec: {e}"))?;
        phases.mark("spec");

        let files = log_files(dir);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&files.current)
            .map_err(|e| format!("opening log {}: {e}", files.current.display()))?;
        let (report_read, report_write) = pipe().map_err(|e| format!("creating a pipe: {e}"))?;
        let (out_read, out_write) = pipe().map_err(|e| format!("creating a pipe: {e}"))?;
        let (err_read, err_write) = pipe().map_err(|e| format!("creating a pipe: {e}"))?;
        let c_path = |p: PathBuf| CString::new(p.into_os_string().into_encoded_bytes()).map_err(|_| "container directory path contains a NUL byte");
        let (stdin, stdin_keep) = crate::process::stdin_pipe(spec, dir)?;
        let console = if spec.interactive.tty { Some(ConsoleSocket::listen(&runc_id)?) } else { None };
        let exit_file = c_path(dir.join("exit"))?;
        let pid_file = c_path(dir.join("init.pid"))?;
        let mut runc_args: Vec<std::ffi::OsString> = vec![self.config.runc.clone().into(), "--root".into(), self.runc_root().into()];
        runc_args.extend(["--log".into(), dir.join("runc.log").into()]);
        runc_args.extend(["--log-format", "json", "run", "--detach"].map(Into::into));
        if let Some(c) = &console {
            runc_args.extend(["--console-socket".into(), c.address.clone().into()]);
        }
        runc_args.push("--bundle".into());
        runc_args.extend([dir.as_os_str().to_owned(), "--pid-file".into(), dir.join("init.pid").into(), runc_id.clone().into()]);
        let runc_args = SpawnArgs::new(runc_args).ok_or("a runc argument contains a NUL byte")?;
        // The fork of this command becomes the shim, which never returns to exec the command's
        // program: it starts runc itself (see `ShimSetup::run`), with the stdio set here.
        let mut cmd = Command::new(&self.config.runc);
        cmd.stdin(stdin).stdout(Stdio::from(out_write)).stderr(Stdio::from(err_write));
        let setup = ShimSetup {
            report_fd: report_write.as_raw_fd(),
            log_fd: log.as_raw_fd(),
            out_fd: out_read.as_raw_fd(),
            err_fd: err_read.as_raw_fd(),
            stdin_keep: stdin_keep.as_ref().map_or(-1, |k| k.as_raw_fd()),
            console_fd: console.as_ref().map_or(-1, |c| c.fd.as_raw_fd()),
            exit_file,
            pid_file,
            runc_args,
            shim: self.shim.clone(),
            arg_area: arg_area(),
        };
        // SAFETY: `ShimSetup::run` only makes async-signal-safe calls on data prepared before the fork.
        unsafe {
            cmd.pre_exec(move || setup.run());
        }
        let child = cmd.spawn().map_err(|e| format!("starting {}: {e}", self.config.runc.display()))?;
        drop((cmd, report_write, log, out_read, err_read, stdin_keep, console));
        phases.mark("fork");
        let shim_pid = child.id() as i32;
        drop(child);
        let shim_start = start_time(shim_pid).unwrap_or(0);

        let mut report = [0u8; 4];
        let mut reader = fs::File::from(report_read);
        let runc_code = match reader.read_exact(&mut report) {
            Ok(()) => i32::from_ne_bytes(report),
            Err(_) => -1,
        };
        phases.mark("runc");
        if runc_code != 0 {
            signal_checked(shim_pid, shim_start, libc::SIGKILL);
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(shim_pid, std::ptr::null_mut(), 0) };
            return Err(runc_error(&dir.join("runc.log"), runc_code));
        }
        let init_pid: i32 = fs::read_to_string(dir.join("init.pid"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .ok_or("runc started the container but wrote no pid file")?;
        let state = StateFile {
            id: id.clone(),
            image: spec.image.clone(),
            restart_count: spec.restart_count,
            started_at: Timestamp::now(),
            runc_id,
            shim_pid,
            shim_start,
            init_pid,
            init_start: start_time(init_pid).unwrap_or(0),
            oom_file: self.cgroups.oom_file_of(&cgroups_path),
        };
        let json = serde_json::to_vec_pretty(&state).map_err(|e| format!("encoding state: {e}"))?;
        replace_file(&dir.join("state.json"), &json).map_err(|e| format!("writing state of {}: {e}", id.name))?;
        phases.mark("state");
        info!(pod = %id.pod_key, container = %id.name, image = %spec.image, shim_pid, init_pid, "container started");
        Ok(state)
    }

    /// runc's view of a container: its init pid while it runs.
    fn runc_state(&self, runc_id: &str) -> Option<(i32, String)> {
        let out = self.runc().args(["state", runc_id]).stderr(Stdio::null()).output().ok()?;
        if !out.status.success() {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some((v.get("pid")?.as_i64()? as i32, v.get("status")?.as_str()?.to_string()))
    }

    /// Tears down the pod's sandbox once no container of it is left.
    fn remove_sandbox_if_unused(&self, pod_uid: &str) {
        let pod_dir = self.containers_dir().join(path_safe(pod_uid));
        let _ = fs::remove_dir(&pod_dir);
        if !pod_dir.exists() {
            sandbox::remove(&self.sandbox_dir(pod_uid));
        }
    }
}

/// Replaces `path` whole (a write beside it, then a rename), without syncing: the file must
/// survive the agent, not the machine, whose reboot ends the containers it describes anyway.
fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes)?;
    fs::rename(&tmp, path)
}

/// How long each step of a container start took, for the debug log.
struct Phases {
    last: std::time::Instant,
    took: Vec<(&'static str, Duration)>,
}

impl Phases {
    fn start() -> Self {
        Phases { last: std::time::Instant::now(), took: Vec::new() }
    }

    fn mark(&mut self, name: &'static str) {
        let now = std::time::Instant::now();
        self.took.push((name, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (name, took)) in self.took.iter().enumerate() {
            write!(f, "{}{name} {:.1} ms", if i == 0 { "" } else { ", " }, took.as_secs_f64() * 1000.0)?;
        }
        Ok(())
    }
}

/// The runc error from its JSON log, for the container's status message.
fn runc_error(log: &Path, code: i32) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let last = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["level"] == "error" || v["level"] == "fatal")
        .filter_map(|v| v["msg"].as_str().map(str::to_string))
        .next_back();
    match last {
        Some(msg) => format!("runc: {msg}"),
        None => format!("runc failed to start the container (exit status {code})"),
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array on success.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

const SHIM_COMMAND_LINE: &[u8] = b"shepherd-shim";

/// Where this process's command line lies in its memory (`arg_start`, `arg_end` of `proc(5)`).
fn arg_area() -> Option<(usize, usize)> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // Fields 48 and 49; the text after the command name starts at field 3.
    Some((fields.get(45)?.parse().ok()?, fields.get(46)?.parse().ok()?))
}

/// Data the forked shim uses; prepared before the fork because it may not allocate.
struct ShimSetup {
    report_fd: RawFd,
    /// The container's log file, which the shim writes in the CRI format.
    log_fd: RawFd,
    /// Read ends of the pipes runc hands the container as stdout and stderr.
    out_fd: RawFd,
    err_fd: RawFd,
    /// A `stdinOnce` container's stdin writer, which the shim keeps until the first attach ends
    /// (-1: none).
    stdin_keep: RawFd,
    /// A container on a terminal: the socket on which runc hands over the terminal's
    /// controlling side (-1: none).
    console_fd: RawFd,
    exit_file: CString,
    /// Where runc writes the container init's pid.
    pid_file: CString,
    /// runc's command line, its program first.
    runc_args: SpawnArgs,
    /// The `shepherd-shim` program the shim execs; without it the fork runs the shim itself.
    shim: Option<CString>,
    /// Where the fork's inherited command line lies, rewritten when the fork stays the shim.
    arg_area: Option<(usize, usize)>,
}

/// A command line as `posix_spawn` takes it, built before the fork.
struct SpawnArgs {
    strings: Vec<CString>,
    /// Pointers into `strings`, then a null.
    pointers: Vec<*const libc::c_char>,
}

// SAFETY: the pointers only point into `strings`, owned alongside and never changed.
unsafe impl Send for SpawnArgs {}
// SAFETY: as for Send; nothing is mutated through a shared reference.
unsafe impl Sync for SpawnArgs {}

impl SpawnArgs {
    fn new(args: Vec<std::ffi::OsString>) -> Option<Self> {
        let strings: Vec<CString> = args.into_iter().map(|a| CString::new(a.into_encoded_bytes()).ok()).collect::<Option<_>>()?;
        let pointers = strings.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect();
        Some(SpawnArgs { strings, pointers })
    }
}

unsafe extern "C" {
    static environ: *const *mut libc::c_char;
}

impl ShimSetup {
    /// Runs in the forked child, which becomes the shim and starts runc as its own child. Returns
    /// only on failure. See the module docs.
    ///
    /// runc starts by `posix_spawn` (a `vfork`-like clone), not a second `fork`: the shim is a
    /// copy of the agent's whole address space, and copying its page tables a second time only
    /// to exec runc is wasted work on every start.
    unsafe fn run(&self) -> io::Result<()> {
        // SAFETY (whole function): system calls on data prepared before the fork; glibc's
        // posix_spawn without file actions or attributes allocates nothing on the heap.
        unsafe {
            libc::setsid();
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            libc::umask(0o022);
            let mut pid: libc::pid_t = 0;
            let argv = self.runc_args.pointers.as_ptr().cast::<*mut libc::c_char>();
            let failed = libc::posix_spawn(&mut pid, self.runc_args.strings[0].as_ptr(), std::ptr::null(), std::ptr::null(), argv, environ);
            if failed != 0 {
                return Err(io::Error::from_raw_os_error(failed));
            }
            self.shim(pid)
        }
    }

    /// Lays out the shim's descriptors as `shepherd_shim::run_oci` expects, then execs the shim
    /// program, or runs the same code in this fork without one.
    unsafe fn shim(&self, runc: libc::pid_t) -> ! {
        // SAFETY (whole function): async-signal-safe calls only.
        unsafe {
            shepherd_shim::hold_sigusr1();
            // Out of the way first, so that placing one cannot close another; fds 1 and 2 are the
            // pipes' write ends (runc's stdio), which the shim must not keep open.
            let high = |fd: RawFd| if fd >= 0 { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) } else { -1 };
            let (report, log, out, err) = (high(self.report_fd), high(self.log_fd), high(self.out_fd), high(self.err_fd));
            let (keep, console) = (high(self.stdin_keep), high(self.console_fd));
            libc::dup2(report, 3);
            libc::dup2(out, 4);
            libc::dup2(err, 5);
            libc::dup2(log, 1);
            libc::dup2(log, 2);
            // Descriptor 0 stays: the container's stdin pipe (or /dev/null), which the shim
            // types into the terminal of a container on one.
            if keep >= 0 {
                libc::dup2(keep, 6);
            }
            if console >= 0 {
                libc::dup2(console, 7);
            }
            close_from(8);
            let (keep, console) = (keep >= 0, console >= 0);
            if let Some(program) = &self.shim {
                shepherd_shim::exec_oci(program, runc, &self.exit_file, &self.pid_file, keep, console);
            }
            // `ps` shows the command line the fork inherited (the agent's): overwrite this
            // copy of it, so that the shim is not mistaken for a second agent.
            if let Some((start, end)) = self.arg_area
                && end > start
            {
                let area = std::slice::from_raw_parts_mut(start as *mut u8, end - start);
                area.fill(0);
                let n = SHIM_COMMAND_LINE.len().min(area.len().saturating_sub(1));
                area[..n].copy_from_slice(&SHIM_COMMAND_LINE[..n]);
            }
            shepherd_shim::run_oci(runc, &self.exit_file, &self.pid_file, keep, console)
        }
    }
}

/// The socket runc connects to with `--console-socket` to hand over a new container's terminal.
/// In the abstract namespace (no file to clean up, no path-length limit of the data directory),
/// under a name nobody can guess ahead.
struct ConsoleSocket {
    fd: OwnedFd,
    /// As runc takes it: `@` for the abstract namespace, then the name.
    address: String,
}

impl ConsoleSocket {
    fn listen(runc_id: &str) -> Result<Self, String> {
        let fail = |what: &str| format!("{what} the console socket: {}", io::Error::last_os_error());
        let mut nonce = [0u8; 8];
        // SAFETY: getrandom writes at most the buffer's length into it.
        unsafe { libc::getrandom(nonce.as_mut_ptr().cast(), nonce.len(), 0) };
        let mut name = format!("shepherd-console-{}-{:016x}", std::process::id(), u64::from_ne_bytes(nonce));
        // The container's id helps whoever lists sockets; the abstract name is at most 107 bytes.
        name.push('-');
        name.extend(runc_id.chars().take(107 - name.len()));
        // SAFETY: socket, bind and listen on a descriptor owned here, with a sockaddr_un filled
        // within its bounds.
        unsafe {
            let raw = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0);
            if raw < 0 {
                return Err(fail("creating"));
            }
            let fd = OwnedFd::from_raw_fd(raw);
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            // sun_path[0] stays 0: the abstract namespace.
            for (i, b) in name.bytes().enumerate() {
                addr.sun_path[i + 1] = b as libc::c_char;
            }
            let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
            if libc::bind(fd.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len as libc::socklen_t) != 0 {
                return Err(fail("binding"));
            }
            if libc::listen(fd.as_raw_fd(), 1) != 0 {
                return Err(fail("listening on"));
            }
            Ok(ConsoleSocket { fd, address: format!("@{name}") })
        }
    }
}

fn signal_init(state: &StateFile, sig: libc::c_int) -> bool {
    signal_checked(state.init_pid, state.init_start, sig)
}

#[async_trait]
impl Runtime for OciRuntime {
    async fn ensure_image(&self, pull: &ImagePull) -> Result<ImageReady, ImageUnavailable> {
        if pull.image == MINIMAL_IMAGE {
            // The host's own root, as in the process runtime: no image to report on.
            return Ok(ImageReady::Unused);
        }
        let reference = ImageRef::parse(&pull.image).map_err(|e| ImageUnavailable::InvalidName(e.to_string()))?;
        let policy = PullPolicy::from_spec(pull.policy.as_deref(), &reference)
            .map_err(|e| ImageUnavailable::PullFailed(format!("imagePullPolicy: {e}")))?;
        let registry = reference.registry().to_string();
        let credentials = pull
            .credentials
            .iter()
            .find(|(r, _, _)| *r == registry)
            .map(|(_, username, password)| Credentials::Basic { username: username.clone(), password: password.clone() })
            .unwrap_or_default();
        match self.inner.puller.ensure(&reference, policy, &credentials).await {
            Ok(Ensured::AlreadyPresent(_)) => Ok(ImageReady::Present),
            Ok(Ensured::Pulled { image, duration, via }) => Ok(ImageReady::Pulled { size: image.size, duration, via }),
            Err(e @ ImageError::NeverPull { .. }) => Err(ImageUnavailable::NeverPull(e.to_string())),
            Err(e) => Err(ImageUnavailable::PullFailed(e.to_string())),
        }
    }

    fn will_pull(&self, pull: &ImagePull) -> bool {
        let Ok(reference) = ImageRef::parse(&pull.image) else { return false };
        let Ok(policy) = PullPolicy::from_spec(pull.policy.as_deref(), &reference) else { return false };
        let store = self.inner.puller.store();
        let present = store.image(&reference.to_string()).ok().flatten().is_some_and(|r| store.is_complete(&r));
        pull.image != MINIMAL_IMAGE && matches!(policy.decide(&reference, present), Ok(PullDecision::Pull))
    }

    async fn start(&self, spec: &ContainerSpec) -> Result<Started, String> {
        let inner = self.inner.clone();
        let spec2 = spec.clone();
        let state = tokio::task::spawn_blocking(move || inner.spawn(&spec2))
            .await
            .map_err(|e| format!("start task failed: {e}"))??;
        let started_at = state.started_at;
        let instance = self.inner.watch(state);
        Ok(Started { instance, started_at, running: true })
    }

    fn stop(&self, id: &ContainerId, instance: u64, grace: Duration) {
        let (state, mut exited) = {
            let live = self.inner.lock();
            match live.get(id) {
                Some(l) if l.instance == instance => (l.state.clone(), l.exited.clone()),
                _ => return,
            }
        };
        let inner = self.inner.clone();
        tokio::spawn(async move {
            if *exited.borrow() {
                return;
            }
            if !grace.is_zero() {
                signal_init(&state, libc::SIGTERM);
                if tokio::time::timeout(grace, exited.wait_for(|e| *e)).await.is_ok() {
                    return;
                }
            }
            signal_init(&state, libc::SIGKILL);
            if tokio::time::timeout(Duration::from_secs(2), exited.wait_for(|e| *e)).await.is_err() {
                let runc_id = state.runc_id.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    inner.runc().args(["kill", "--all", &runc_id, "KILL"]).stderr(Stdio::null()).status()
                })
                .await;
            }
        });
    }

    fn remove(&self, id: &ContainerId) {
        if let Some(l) = self.inner.lock().remove(id) {
            l.watcher.abort();
        }
        let inner = self.inner.clone();
        let id = id.clone();
        let runc_knows = inner.runc_root().join(Inner::runc_id(&id)).exists();
        let work = move || {
            inner.clean_instance(&id);
            let dir = inner.dir_of(&id);
            if let Err(e) = fs::remove_dir_all(&dir)
                && e.kind() != io::ErrorKind::NotFound
            {
                warn!(dir = %dir.display(), error = %e, "cannot remove container directory");
            }
            inner.remove_sandbox_if_unused(&id.pod_uid);
        };
        if runc_knows {
            // A `runc delete` takes tens of milliseconds: the removal finishes in the background.
            tokio::task::spawn_blocking(work);
        } else {
            // The usual case (the watcher cleaned runc's state when the instance ended): a few
            // unmounts and removals, done now, so that an agent stopping right after a removal
            // (standalone's exit) leaves nothing mounted.
            work();
        }
    }

    fn retire(&self, id: &ContainerId) {
        if let Some(l) = self.inner.lock().remove(id) {
            l.watcher.abort();
        }
        // Blocking (a runc delete at most): done now, so an agent stopping right after leaves
        // nothing mounted.
        self.inner.clean_instance(id);
        sandbox::remove(&self.inner.sandbox_dir(&id.pod_uid));
    }

    fn adopt(&self) -> Vec<Adopted> {
        let mut found = Vec::new();
        let Ok(pods) = fs::read_dir(self.inner.containers_dir()) else { return found };
        for pod in pods.flatten() {
            let Ok(containers) = fs::read_dir(pod.path()) else { continue };
            for c in containers.flatten() {
                let dir = c.path();
                let Some(state) = fs::read(dir.join("state.json")).ok().and_then(|b| serde_json::from_slice::<StateFile>(&b).ok())
                else {
                    warn!(dir = %dir.display(), "container directory without a readable state.json; ignoring it");
                    continue;
                };
                let shim_alive = start_time(state.shim_pid).is_some_and(|t| t == state.shim_start);
                let runc = self.inner.runc_state(&state.runc_id);
                let running = shim_alive
                    && runc.as_ref().is_some_and(|(pid, status)| *pid == state.init_pid && status == "running");
                let (id, image, restart_count, started_at) =
                    (state.id.clone(), state.image.clone(), state.restart_count, state.started_at);
                if running {
                    info!(pod = %id.pod_key, container = %id.name, pid = state.init_pid, "re-adopting running container");
                    let instance = self.inner.watch(state);
                    found.push(Adopted { id, image, instance, restart_count, started_at, exited: None });
                } else {
                    if shim_alive {
                        // runc lost it, or it is no longer the recorded process: end it for good.
                        signal_init(&state, libc::SIGKILL);
                        signal_checked(state.shim_pid, state.shim_start, libc::SIGKILL);
                    }
                    let exit = self.inner.exit_of(&dir, &state);
                    self.inner.clean_instance(&id);
                    let instance = self.inner.next_instance.fetch_add(1, Ordering::Relaxed);
                    found.push(Adopted { id, image, instance, restart_count, started_at, exited: Some(exit) });
                }
            }
        }
        found
    }

    fn pid(&self, id: &ContainerId) -> Option<u32> {
        self.inner.lock().get(id).filter(|l| l.state.init_pid > 0).map(|l| l.state.init_pid as u32)
    }

    fn log_files(&self, id: &ContainerId) -> Option<LogFiles> {
        Some(log_files(&self.inner.dir_of(id)))
    }

    fn stdin_pipe(&self, id: &ContainerId) -> Option<PathBuf> {
        Some(self.inner.dir_of(id).join("stdin")).filter(|p| p.exists())
    }

    fn attach_ended(&self, id: &ContainerId) {
        // Every shim handles SIGUSR1 (closing its writer on the stdin pipe, if it keeps one).
        if let Some(l) = self.inner.lock().get(id) {
            signal_checked(l.state.shim_pid, l.state.shim_start, libc::SIGUSR1);
        }
    }

    fn exec_prefix(&self, id: &ContainerId) -> Option<Vec<String>> {
        let root = self.inner.runc_root();
        Some(vec![
            self.inner.config.runc.to_string_lossy().into_owned(),
            "--root".into(),
            root.to_string_lossy().into_owned(),
            "exec".into(),
            Inner::runc_id(id),
        ])
    }

    fn detach(&self) {
        if let Some(r) = self.inner.rotation.lock().unwrap_or_else(|e| e.into_inner()).take() {
            r.abort();
        }
        for (_, live) in self.inner.lock().drain() {
            live.watcher.abort();
        }
    }
}

impl Drop for OciRuntime {
    fn drop(&mut self) {
        if let Some(r) = self.inner.rotation.lock().unwrap_or_else(|e| e.into_inner()).take() {
            r.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_shim::receive_terminal;

    /// Connects to `address` (runc's form, `@` for the abstract namespace) and sends `fd` as
    /// runc does: the terminal's name as data, the descriptor as SCM_RIGHTS.
    fn send_as_runc(address: &str, fd: RawFd) {
        let name = address.strip_prefix('@').expect("an abstract address");
        // SAFETY: socket, connect and sendmsg on a descriptor owned here and stack buffers.
        unsafe {
            let sock = OwnedFd::from_raw_fd(libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0));
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (i, b) in name.bytes().enumerate() {
                addr.sun_path[i + 1] = b as libc::c_char;
            }
            let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
            let connected = libc::connect(sock.as_raw_fd(), (&addr as *const libc::sockaddr_un).cast(), len as libc::socklen_t);
            assert_eq!(connected, 0, "connect: {}", io::Error::last_os_error());
            let mut data = *b"/dev/ptmx";
            let mut iov = libc::iovec { iov_base: data.as_mut_ptr().cast(), iov_len: data.len() };
            let mut control = [0u64; 4];
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
            let header = libc::CMSG_FIRSTHDR(&msg);
            (*header).cmsg_level = libc::SOL_SOCKET;
            (*header).cmsg_type = libc::SCM_RIGHTS;
            (*header).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>(), fd);
            assert!(libc::sendmsg(sock.as_raw_fd(), &msg, 0) > 0, "sendmsg: {}", io::Error::last_os_error());
        }
    }

    #[test]
    fn the_console_socket_receives_the_descriptor_runc_sends_and_reports_none_without_a_sender() {
        let socket = ConsoleSocket::listen("pod_container").expect("listen");
        assert!(socket.address.starts_with("@shepherd-console-") && socket.address.ends_with("-pod_container"), "{}", socket.address);
        // SAFETY: accept on a non-blocking listener with nothing pending returns at once.
        assert_eq!(unsafe { receive_terminal(socket.fd.as_raw_fd()) }, -1, "nobody connected");

        let (read, write) = pipe().expect("pipe");
        send_as_runc(&socket.address, write.as_raw_fd());
        drop(write);
        // SAFETY: the connection is pending, its message sent.
        let received = unsafe { receive_terminal(socket.fd.as_raw_fd()) };
        assert!(received >= 0, "a descriptor arrives");
        // SAFETY: the received descriptor is ours now.
        let mut sent = fs::File::from(unsafe { OwnedFd::from_raw_fd(received) });
        io::Write::write_all(&mut sent, b"through").expect("write through the received descriptor");
        drop(sent);
        let mut text = String::new();
        fs::File::from(read).read_to_string(&mut text).expect("read");
        assert_eq!(text, "through", "the received descriptor is the one sent");
    }

    #[test]
    fn a_long_container_id_keeps_the_console_socket_name_within_the_abstract_limit() {
        let socket = ConsoleSocket::listen(&"x".repeat(200)).expect("listen");
        assert_eq!(socket.address.len(), 108, "the `@` and 107 bytes: {}", socket.address);
    }
}
