//! The `process` runtime: each container is a host process, isolated with namespaces and cgroups
//! when the agent runs as root.
//!
//! Process tree of one container instance:
//!
//! ```text
//! agent ── shim (in the container's cgroups, outside its PID namespace)
//!            └── container process (PID 1 of new PID, mount, UTS and IPC namespaces)
//! ```
//!
//! The shim exists because a new PID namespace only applies to the children of the process that
//! creates it. It waits for the container process, writes its exit code to the container's `exit`
//! file (128 + signal for a signal death, so an OOM kill reads 137) and exits with the same code.
//! The agent never forks itself (a fork of a large multi-threaded process stalls its other threads
//! while the page tables are copied): it spawns the small `shepherd-shim` program, which makes the
//! namespaces and the container process and stays as the shim (see `shepherd_shim::start`), so a
//! running container costs a shim of a few hundred KB; a container of the `minimal` image without
//! a command idles in that program's `pause` mode.
//! The container process dies with its shim (`PR_SET_PDEATHSIG`), and everything in the PID
//! namespace dies with the container process. Neither depends on the agent: an agent killed with
//! `kill -9` leaves its containers running, and the next agent re-adopts them from the
//! `state.json` each start writes (pids plus their start times from `/proc/<pid>/stat`, so a
//! recycled pid is never mistaken for a container). Exits are watched through pidfds, which work
//! for adopted processes that are no longer the agent's children.
//!
//! Volumes: the container process makes `ContainerSpec.mounts` in its own mount namespace (after
//! the shim's `unshare`, before its `exec`), so the host never sees them; `mountns` says how, and how a mount
//! path the host lacks is made without writing into the host's real filesystem. Without root
//! there is no mount namespace, and a container with mounts is refused (it waits in
//! `CreateContainerConfigError`) instead of running without its volumes.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

use shepherd_shim::start::Start;

use crate::cgroup::{self, Cgroups, Limits};
use crate::mountns::MountPlan;
use crate::runtime::{Adopted, ContainerId, ContainerSpec, EventSender, Exit, LogFiles, Runtime, RuntimeEvent, Started};

/// The built-in image whose container, given no command, idles until told to stop.
pub const MINIMAL_IMAGE: &str = "minimal";

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Settings of the process runtime.
#[derive(Debug, Clone)]
pub(crate) struct ProcessConfig {
    pub data_dir: PathBuf,
    pub log_max_bytes: u64,
    pub pids_limit: Option<u64>,
}

/// What `state.json` records about a running instance.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StateFile {
    id: ContainerId,
    image: String,
    restart_count: u32,
    started_at: Timestamp,
    shim_pid: i32,
    shim_start: u64,
    main_pid: i32,
    main_start: u64,
    isolated: bool,
    cgroup_dirs: Vec<PathBuf>,
    oom_file: Option<PathBuf>,
    oom_before: u64,
}

struct Live {
    instance: u64,
    state: StateFile,
    exited: watch::Receiver<bool>,
    watcher: AbortHandle,
}

pub(crate) struct ProcessRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    config: ProcessConfig,
    cgroups: Cgroups,
    isolate: bool,
    events: EventSender,
    next_instance: AtomicU64,
    live: Mutex<HashMap<ContainerId, Live>>,
    rotation: Mutex<Option<AbortHandle>>,
    /// The `shepherd-shim` program; without it no container starts (each start says why).
    shim: Option<CString>,
    /// Containers start at [`START_NICE`] (the agent may put them back to its own priority).
    start_low: bool,
}

/// The nice value a shim starts at, the lowest: making a container (the shim's exec and C
/// runtime start-up, its namespaces and mounts, the container's fork) yields the CPU to what
/// already runs, the API server and agent of a standalone first of all. On two busy cores this
/// halves the API's answer to a pod create while pods start (`shepherd-bench pod-density`). The
/// shim and the container go back to the agent's priority once the container is made.
const START_NICE: i32 = 19;

/// The calling thread's nice value (Linux keeps one per thread).
fn thread_nice() -> io::Result<i32> {
    // SAFETY: errno is this thread's; getpriority has no preconditions and returns -1 both for
    // an error and for nice -1, which errno tells apart.
    unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, 0);
        if n == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n)
    }
}

/// Sets the calling thread's nice value.
fn set_thread_nice(n: i32) -> io::Result<()> {
    // SAFETY: setpriority on the calling thread has no preconditions.
    match unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, n) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Whether this process may raise a priority again (CAP_SYS_NICE): without it a shim started
/// at [`START_NICE`] could not put its container back at the agent's priority.
fn may_raise_priority() -> bool {
    const CAP_SYS_NICE: u32 = 23;
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|caps| u64::from_str_radix(caps.trim(), 16).ok())
            .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0)
    })
}

/// The `shepherd-shim` program beside the agent's executable (or, for a test binary in cargo's
/// `deps` directory, beside that directory); warns once per runtime when it is missing.
pub(crate) fn shim_program() -> Option<CString> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let candidates = [Some(dir), dir.parent().filter(|_| dir.ends_with("deps"))];
    let found = candidates.into_iter().flatten().map(|d| d.join(shepherd_shim::PROGRAM)).find(|p| p.is_file());
    if found.is_none() {
        warn!(
            expected = %dir.join(shepherd_shim::PROGRAM).display(),
            "the shepherd-shim program is missing: the process runtime cannot start containers without it \
             (cargo build -p shepherd builds it)"
        );
    }
    found.and_then(|p| cstring(&p))
}

impl ProcessRuntime {
    /// Needs a Tokio runtime (it starts the log rotation task).
    pub fn new(config: ProcessConfig, events: EventSender) -> Self {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            warn!("not running as root: containers run as plain host processes, without namespaces or cgroup limits");
        }
        let cgroups = if root { Cgroups::detect() } else { Cgroups::default() };
        let containers = config.data_dir.join("containers");
        cgroups.remove_stale(|name| {
            name.split_once('_').is_some_and(|(uid, c)| containers.join(uid).join(c).join("state.json").exists())
        });
        let inner = Arc::new(Inner {
            config,
            cgroups,
            isolate: root,
            events,
            next_instance: AtomicU64::new(1),
            live: Mutex::default(),
            rotation: Mutex::default(),
            shim: shim_program(),
            start_low: may_raise_priority(),
        });
        let weak = Arc::downgrade(&inner);
        let rotation = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let Some(inner) = weak.upgrade() else { return };
                inner.rotate_logs();
            }
        });
        *inner.rotation.lock().unwrap_or_else(|e| e.into_inner()) = Some(rotation.abort_handle());
        ProcessRuntime { inner }
    }

}

impl Inner {
    /// The container's mounts as the forked child makes them; see `mountns` for what is refused.
    fn check_mounts(&self, mounts: &[crate::runtime::Mount], scratch: &Path) -> Result<MountPlan, String> {
        if mounts.is_empty() {
            return Ok(MountPlan::default());
        }
        if !self.isolate {
            return Err("volume mounts need the agent to run as root: the process runtime binds volumes in the \
                        container's own mount namespace, which it creates only as root"
                .into());
        }
        crate::mountns::plan(mounts, scratch)
    }

    fn containers_dir(&self) -> PathBuf {
        self.config.data_dir.join("containers")
    }

    fn dir_of(&self, id: &ContainerId) -> PathBuf {
        self.containers_dir().join(path_safe(&id.pod_uid)).join(path_safe(&id.name))
    }

    fn cgroup_name(id: &ContainerId) -> String {
        format!("{}_{}", path_safe(&id.pod_uid), path_safe(&id.name))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ContainerId, Live>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Starts watching `state`'s shim; returns the instance number given to it.
    fn watch(self: &Arc<Self>, state: StateFile) -> u64 {
        let instance = self.next_instance.fetch_add(1, Ordering::Relaxed);
        let (exited_tx, exited) = watch::channel(false);
        let dir = self.dir_of(&state.id);
        let events = self.events.clone();
        let s = state.clone();
        let task = tokio::spawn(async move {
            wait_for_exit(s.shim_pid, s.shim_start).await;
            // The shim may be our child (started by this agent): reap it.
            // SAFETY: waitpid with WNOHANG and a valid status pointer.
            unsafe {
                let mut status = 0;
                libc::waitpid(s.shim_pid, &mut status, libc::WNOHANG);
            }
            let code = fs::read_to_string(dir.join("exit")).ok().and_then(|c| c.trim().parse::<i32>().ok());
            let oom = s.oom_file.as_deref().is_some_and(|f| cgroup::oom_kills(f) > s.oom_before);
            let exit = match code {
                Some(code) => Exit {
                    code,
                    reason: Exit::reason_for(code, oom).into(),
                    started_at: s.started_at,
                    finished_at: Timestamp::now(),
                },
                None => Exit {
                    code: 137,
                    reason: if oom { "OOMKilled".into() } else { "ContainerStatusUnknown".into() },
                    started_at: s.started_at,
                    finished_at: Timestamp::now(),
                },
            };
            debug!(pod = %s.id.pod_key, container = %s.id.name, code = exit.code, reason = %exit.reason, "container exited");
            exited_tx.send_replace(true);
            let _ = events.send(RuntimeEvent::Exited { id: s.id.clone(), instance, exit });
        });
        let live = Live { instance, state, exited, watcher: task.abort_handle() };
        if let Some(old) = self.lock().insert(live.state.id.clone(), live) {
            old.watcher.abort();
        }
        instance
    }

    fn spawn(self: &Arc<Self>, spec: &ContainerSpec) -> Result<StateFile, String> {
        let id = &spec.id;
        let dir = self.dir_of(id);
        fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let files = log_files(&dir);
        if files.current.exists() {
            let _ = fs::rename(&files.current, &files.previous);
        }
        let _ = fs::remove_file(&files.rotated);
        let _ = fs::remove_file(dir.join("exit"));

        if let Some(field) = spec.security.fields_set().first() {
            return Err(format!("{field} is not supported by the process runtime; run the agent with --runtime oci"));
        }
        let mut argv: Vec<String> = spec.command.iter().chain(spec.args.iter()).cloned().collect();
        let idle = argv.is_empty();
        if idle && spec.image != MINIMAL_IMAGE {
            return Err(format!(
                "image {:?} has no command: the process runtime runs the container's command on the host, and only the \
                 built-in image {MINIMAL_IMAGE:?} has a default (an idle process)",
                spec.image
            ));
        }
        let Some(shim) = &self.shim else {
            return Err(format!(
                "the {} program is missing beside the agent's executable: the process runtime starts every container \
                 through it (cargo build -p shepherd builds it)",
                shepherd_shim::PROGRAM
            ));
        };
        if idle {
            argv.extend([String::from_utf8_lossy(shim.as_bytes()).into_owned(), "pause".into()]);
        }
        let scratch = dir.join("mounts");
        let mounts = self.check_mounts(&spec.mounts, &scratch)?;
        if !mounts.binds.is_empty() {
            fs::create_dir_all(&scratch).map_err(|e| format!("creating {}: {e}", scratch.display()))?;
        }
        // The pod's own network namespace (the node's without one), entered by the shim first.
        let netns = crate::network::netns_of(&self.config.data_dir, &id.pod_uid);
        if let Some(p) = &netns {
            File::open(p).map_err(|e| format!("opening the pod network namespace {}: {e}", p.display()))?;
        }
        let stdin = make_stdin_pipe(spec, &dir)?;

        let cgroups = if self.isolate {
            let limits = Limits {
                memory_bytes: spec.memory_limit_bytes,
                cpu_millis: spec.cpu_limit_millis,
                pids: self.config.pids_limit,
            };
            self.cgroups.create(&Self::cgroup_name(id), limits)
        } else {
            Default::default()
        };
        let oom_before = cgroups.oom_file.as_deref().map(cgroup::oom_kills).unwrap_or(0);

        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&files.current)
            .map_err(|e| format!("opening log {}: {e}", files.current.display()))?;

        // Sorted by name, the last value of a name winning, as the container always saw them.
        let mut env = BTreeMap::new();
        env.extend([("PATH", PATH), ("HOSTNAME", spec.hostname.as_str()), ("HOME", "/root")]);
        if spec.interactive.tty {
            // As CRI runtimes and the oci runtime do; the container's own env may override it.
            env.insert("TERM", "xterm");
        }
        for (k, v) in &spec.env {
            env.insert(k, v);
        }
        let nul = |what: &str| format!("{what} contains a NUL byte");
        let start = Start {
            argv: argv.iter().map(|a| CString::new(a.as_str())).collect::<Result<_, _>>().map_err(|_| nul("the command"))?,
            env: env.iter().map(|(k, v)| CString::new(format!("{k}={v}"))).collect::<Result<_, _>>().map_err(|_| nul("the environment"))?,
            working_dir: spec.working_dir.as_deref().map(CString::new).transpose().map_err(|_| nul("the working directory"))?,
            hostname: CString::new(spec.hostname.clone()).map_err(|_| nul("the hostname"))?,
            exit_file: cstring(&dir.join("exit")).ok_or_else(|| nul("the container directory path"))?,
            procs_files: cgroups.procs_files.iter().filter_map(|p| cstring(p)).collect(),
            netns: netns.as_deref().map(|p| cstring(p).ok_or_else(|| nul("the network namespace path"))).transpose()?,
            isolate: self.isolate,
            idle,
            tty: spec.interactive.tty,
            stdin: stdin.as_deref().map(|p| cstring(p).ok_or_else(|| nul("the container directory path"))).transpose()?,
            stdin_once: spec.interactive.stdin_once,
            mounts,
            nice: if self.start_low { thread_nice().ok() } else { None },
        };
        let (shim_pid, main_pid) = match start_shim(shim, &start, log) {
            Ok(pids) => pids,
            Err(e) => {
                cgroup::remove_dirs(&cgroups.dirs);
                return Err(format!("starting {:?}: {e}", argv[0]));
            }
        };
        let shim_start = start_time(shim_pid).unwrap_or(0);
        let main_start = start_time(main_pid).unwrap_or(0);
        let state = StateFile {
            id: id.clone(),
            image: spec.image.clone(),
            restart_count: spec.restart_count,
            started_at: Timestamp::now(),
            shim_pid,
            shim_start,
            main_pid,
            main_start,
            isolated: self.isolate,
            cgroup_dirs: cgroups.dirs.clone(),
            oom_file: cgroups.oom_file.clone(),
            oom_before,
        };
        let json = serde_json::to_vec_pretty(&state).map_err(|e| format!("encoding state: {e}"))?;
        write_atomically(&dir.join("state.json"), &json).map_err(|e| format!("writing state of {}: {e}", id.name))?;
        info!(pod = %id.pod_key, container = %id.name, shim_pid, main_pid, "container started");
        Ok(state)
    }
}

#[async_trait]
impl Runtime for ProcessRuntime {
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
        tokio::spawn(async move {
            if *exited.borrow() {
                return;
            }
            if !grace.is_zero() {
                signal_container(&state, libc::SIGTERM);
                if tokio::time::timeout(grace, exited.wait_for(|e| *e)).await.is_ok() {
                    return;
                }
            }
            signal_container(&state, libc::SIGKILL);
            if tokio::time::timeout(Duration::from_secs(2), exited.wait_for(|e| *e)).await.is_err() {
                // The container process is gone or unknown: the shim's death takes it along.
                signal_checked(state.shim_pid, state.shim_start, libc::SIGKILL);
            }
        });
    }

    fn remove(&self, id: &ContainerId) {
        self.retire(id);
        let dir = self.inner.dir_of(id);
        if let Err(e) = fs::remove_dir_all(&dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            warn!(dir = %dir.display(), error = %e, "cannot remove container directory");
        }
        if let Some(parent) = dir.parent() {
            let _ = fs::remove_dir(parent);
        }
    }

    fn retire(&self, id: &ContainerId) {
        let removed = self.inner.lock().remove(id);
        let dir = self.inner.dir_of(id);
        let dirs = match &removed {
            Some(l) => {
                l.watcher.abort();
                l.state.cgroup_dirs.clone()
            }
            None => read_state(&dir).map(|s| s.cgroup_dirs).unwrap_or_else(|| self.inner.cgroups.dirs_of(&Inner::cgroup_name(id))),
        };
        tokio::spawn(cgroup::remove_dirs_when_empty(dirs));
    }

    fn adopt(&self) -> Vec<Adopted> {
        let mut found = Vec::new();
        let Ok(pods) = fs::read_dir(self.inner.containers_dir()) else { return found };
        for pod in pods.flatten() {
            let Ok(containers) = fs::read_dir(pod.path()) else { continue };
            for c in containers.flatten() {
                let dir = c.path();
                let Some(state) = read_state(&dir) else {
                    warn!(dir = %dir.display(), "container directory without a readable state.json; ignoring it");
                    continue;
                };
                let alive = start_time(state.shim_pid).is_some_and(|t| t == state.shim_start);
                let (id, image, restart_count, started_at) =
                    (state.id.clone(), state.image.clone(), state.restart_count, state.started_at);
                if alive {
                    info!(pod = %id.pod_key, container = %id.name, pid = state.main_pid, "re-adopting running container");
                    let instance = self.inner.watch(state);
                    found.push(Adopted { id, image, instance, restart_count, started_at, exited: None });
                } else {
                    let code = fs::read_to_string(dir.join("exit")).ok().and_then(|c| c.trim().parse::<i32>().ok());
                    let oom = state.oom_file.as_deref().is_some_and(|f| cgroup::oom_kills(f) > state.oom_before);
                    let exit = Exit {
                        code: code.unwrap_or(137),
                        reason: match code {
                            Some(c) => Exit::reason_for(c, oom).into(),
                            None => "ContainerStatusUnknown".into(),
                        },
                        started_at,
                        finished_at: Timestamp::now(),
                    };
                    let instance = self.inner.next_instance.fetch_add(1, Ordering::Relaxed);
                    found.push(Adopted { id, image, instance, restart_count, started_at, exited: Some(exit) });
                }
            }
        }
        found
    }

    fn pid(&self, id: &ContainerId) -> Option<u32> {
        self.inner.lock().get(id).filter(|l| l.state.main_pid > 0).map(|l| l.state.main_pid as u32)
    }

    fn log_files(&self, id: &ContainerId) -> Option<LogFiles> {
        Some(log_files(&self.inner.dir_of(id)))
    }

    fn check_mounts(&self, mounts: &[crate::runtime::Mount]) -> Result<(), String> {
        self.inner.check_mounts(mounts, Path::new("/nonexistent")).map(drop)
    }

    fn stdin_pipe(&self, id: &ContainerId) -> Option<PathBuf> {
        Some(self.inner.dir_of(id).join("stdin")).filter(|p| p.exists())
    }

    fn attach_ended(&self, id: &ContainerId) {
        // Only a shim of a container with a stdin pipe gets here, and every such shim handles
        // SIGUSR1 (closing its writer, if it keeps one).
        if let Some(l) = self.inner.lock().get(id) {
            signal_checked(l.state.shim_pid, l.state.shim_start, libc::SIGUSR1);
        }
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

impl Drop for ProcessRuntime {
    fn drop(&mut self) {
        if let Some(r) = self.inner.rotation.lock().unwrap_or_else(|e| e.into_inner()).take() {
            r.abort();
        }
    }
}

/// Spawns the `shepherd-shim` program (`program`) in its `start` mode with `log` as its stdout,
/// hands it `start` and waits until the container's program has been exec'd: the pids of the shim
/// and of the container process, or why the start failed.
///
/// The spawn is a `posix_spawn` (no `pre_exec`, an absolute path): the child shares the agent's
/// memory until its exec, so the agent's other threads do not stall on a copy of its page tables
/// as they would on a fork, however large the agent.
fn start_shim(program: &CStr, start: &Start, log: File) -> io::Result<(i32, i32)> {
    use std::io::{Read, Write};
    use std::os::unix::ffi::OsStrExt;
    // The shim inherits the spawning thread's priority; the thread has its own back at once.
    let lowered = start.nice.filter(|_| set_thread_nice(START_NICE).is_ok());
    let spawned = Command::new(std::ffi::OsStr::from_bytes(program.to_bytes()))
        .arg("start")
        // Names the container (its directory) on the shim's command line, as the shim's other
        // modes do, for `ps` and for whoever cleans up after an agent.
        .arg(std::ffi::OsStr::from_bytes(start.exit_file.to_bytes()))
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::from(log))
        .stderr(Stdio::piped())
        .spawn();
    if let Some(n) = lowered
        && let Err(e) = set_thread_nice(n)
    {
        warn!(error = %e, "could not restore a thread's priority after starting a shim");
    }
    let mut child = spawned?;
    let shim_pid = child.id() as i32;
    let (Some(mut input), Some(mut status)) = (child.stdin.take(), child.stderr.take()) else {
        return Err(io::Error::other("the shim's pipes are missing"));
    };
    // The shim reads all of its input before it writes anything, so this cannot deadlock.
    let written = input.write_all(&start.encode());
    drop(input);
    let mut report = Vec::new();
    let read = status.read_to_end(&mut report);
    let mut main_pid = None;
    let mut failure = None;
    let mut records = report.chunks_exact(5);
    for r in records.by_ref() {
        let value = i32::from_ne_bytes([r[1], r[2], r[3], r[4]]);
        match r[0] {
            shepherd_shim::start::STATUS_PID => main_pid = Some(value),
            shepherd_shim::start::STATUS_ERROR => failure = Some(io::Error::from_raw_os_error(value)),
            _ => {
                failure = Some(io::Error::other(String::from_utf8_lossy(&report).trim().to_string()));
                break;
            }
        }
    }
    if failure.is_none() && !records.remainder().is_empty() {
        failure = Some(io::Error::other(String::from_utf8_lossy(&report).trim().to_string()));
    }
    let failure = failure.or(read.err()).or(written.err());
    match (failure, main_pid) {
        (None, Some(main_pid)) => Ok((shim_pid, main_pid)),
        (failure, _) => {
            // The shim ends on its own once its container (if it made one) has.
            let _ = child.wait();
            Err(failure.unwrap_or_else(|| io::Error::other("the shim ended without starting the container")))
        }
    }
}

/// The named pipe `stdin` in the container's directory for `stdin: true` (the shim opens it as
/// `stdin_pipe` says); none otherwise.
fn make_stdin_pipe(spec: &ContainerSpec, dir: &Path) -> Result<Option<PathBuf>, String> {
    let pipe = dir.join("stdin");
    let _ = fs::remove_file(&pipe);
    if !spec.interactive.stdin {
        return Ok(None);
    }
    let c = cstring(&pipe).ok_or("container directory path contains a NUL byte")?;
    // SAFETY: mkfifo reads a NUL-terminated path.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        return Err(format!("creating {}: {}", pipe.display(), io::Error::last_os_error()));
    }
    Ok(Some(pipe))
}

/// The stdin a container starts with: for `stdin: true`, a named pipe `stdin` in its directory,
/// opened for reading and writing so that it never ends, however many `attach`es come and go
/// (for `stdinOnce`, read-only, with the returned writer for the shim to keep until the first
/// attach ends); otherwise nothing. Shared with the oci runtime, whose shim holds it the same way.
pub(crate) fn stdin_pipe(spec: &ContainerSpec, dir: &Path) -> Result<(Stdio, Option<File>), String> {
    let Some(pipe) = make_stdin_pipe(spec, dir)? else { return Ok((Stdio::null(), None)) };
    let open = |o: &mut OpenOptions| o.open(&pipe).map_err(|e| format!("opening {}: {e}", pipe.display()));
    let both = open(OpenOptions::new().read(true).write(true))?;
    if spec.interactive.stdin_once {
        // Read-only for the container, so that it sees the end once the shim's writer goes.
        Ok((Stdio::from(open(OpenOptions::new().read(true))?), Some(both)))
    } else {
        Ok((Stdio::from(both), None))
    }
}

fn cstring(p: &Path) -> Option<CString> {
    CString::new(p.as_os_str().as_encoded_bytes()).ok()
}

/// Keeps ids usable as single path components.
pub(crate) fn path_safe(s: &str) -> String {
    let cleaned: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' { c } else { '_' }).collect();
    if cleaned.is_empty() || cleaned.chars().all(|c| c == '.') { format!("_{cleaned}") } else { cleaned }
}

pub(crate) fn log_files(dir: &Path) -> LogFiles {
    LogFiles { current: dir.join("current.log"), rotated: dir.join("current.log.1"), previous: dir.join("previous.log") }
}

/// Copy-truncate rotation: the container keeps its append-mode descriptor, so the file is copied
/// aside and truncated in place (output written between the two steps is lost).
pub(crate) fn rotate_if_larger(files: &LogFiles, max: u64) -> io::Result<()> {
    let len = match fs::metadata(&files.current) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if len <= max {
        return Ok(());
    }
    fs::copy(&files.current, &files.rotated)?;
    OpenOptions::new().write(true).open(&files.current)?.set_len(0)
}

fn read_state(dir: &Path) -> Option<StateFile> {
    let bytes = fs::read(dir.join("state.json")).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Replaces `path` with `bytes` (a reader sees the old file or the new one, never a part). Not
/// synced: the file only lets a restarted agent re-adopt running containers, and after a crash of
/// the machine there are none (an unreadable file is ignored with a warning); a sync per container
/// start would compete with the store's own syncs on the same disk.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes)?;
    fs::rename(tmp, path)
}

/// The start time (clock ticks after boot) of `pid` from `/proc/<pid>/stat`; `None` if it is gone.
pub(crate) fn start_time(pid: i32) -> Option<u64> {
    if pid <= 0 {
        return None;
    }
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Field 22 of stat(5) is the start time; `rest` begins at field 3, and a zombie does not count.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Sends `sig` to `pid` only if it is still the process that started at `start`.
pub(crate) fn signal_checked(pid: i32, start: u64, sig: libc::c_int) -> bool {
    if pid <= 0 || start_time(pid) != Some(start) {
        return false;
    }
    // SAFETY: kill has no memory-safety preconditions; pid identity was checked just above.
    unsafe { libc::kill(pid, sig) == 0 }
}

fn signal_container(state: &StateFile, sig: libc::c_int) {
    if state.main_pid > 0 && start_time(state.main_pid) == Some(state.main_start) {
        // Without a PID namespace, signal the container's process group so its children go too.
        let target = if state.isolated { state.main_pid } else { -state.main_pid };
        // SAFETY: see signal_checked.
        unsafe { libc::kill(target, sig) };
    } else if state.main_pid == 0 {
        signal_checked(state.shim_pid, state.shim_start, sig);
    }
}

/// Resolves once the process `pid` (started at `start`) has ended.
pub(crate) async fn wait_for_exit(pid: i32, start: u64) {
    // SAFETY: pidfd_open returns a new descriptor we own, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        return;
    }
    // SAFETY: fd is a fresh descriptor owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if start_time(pid) != Some(start) {
        return;
    }
    // SAFETY: the AsyncFd owns the descriptor; nothing else closes it while it is registered.
    match unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
        Ok(afd) => {
            let _ = afd.readable().await;
        }
        Err(_) => {
            while start_time(pid) == Some(start) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime_inner(isolate: bool, data_dir: &Path) -> Inner {
        let (events, _) = tokio::sync::mpsc::unbounded_channel();
        Inner {
            config: ProcessConfig { data_dir: data_dir.to_path_buf(), log_max_bytes: 1 << 20, pids_limit: None },
            cgroups: Cgroups::default(),
            isolate,
            events,
            next_instance: AtomicU64::new(1),
            live: Mutex::default(),
            rotation: Mutex::default(),
            shim: None,
            start_low: false,
        }
    }

    fn spec_with(mounts: Vec<crate::runtime::Mount>) -> ContainerSpec {
        ContainerSpec {
            id: ContainerId { pod_key: "ns/p".into(), pod_uid: "u".into(), name: "c".into() },
            image: MINIMAL_IMAGE.into(),
            command: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            working_dir: None,
            hostname: "p".into(),
            memory_limit_bytes: None,
            cpu_limit_millis: None,
            simulate_fail: false,
            simulate_exit_after: None,
            restart_count: 0,
            mounts,
            security: Default::default(),
            interactive: Default::default(),
        }
    }

    #[test]
    fn mounts_need_root_rather_than_being_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("vol");
        fs::create_dir(&volume).expect("mkdir");
        let mount = crate::runtime::Mount { source: volume.clone(), destination: "/srv".into(), read_only: false };
        let spec = spec_with(vec![mount]);
        let err = runtime_inner(false, dir.path()).check_mounts(&spec.mounts, dir.path()).err().unwrap_or_default();
        assert!(err.contains("need the agent to run as root"), "{err}");
        assert!(runtime_inner(true, dir.path()).check_mounts(&spec.mounts, dir.path()).is_ok());
        assert!(runtime_inner(false, dir.path()).check_mounts(&[], dir.path()).expect("none").binds.is_empty());
    }

    #[test]
    fn ids_become_single_path_components() {
        assert_eq!(path_safe("../etc"), ".._etc");
        assert_eq!(path_safe(".."), "_..");
        assert_eq!(path_safe("web-0"), "web-0");
    }

    #[test]
    fn the_start_time_of_this_process_is_readable_and_stable() {
        let me = std::process::id() as i32;
        let t = start_time(me);
        assert!(t.is_some());
        assert_eq!(start_time(me), t);
        assert_eq!(start_time(-1), None);
    }

    #[test]
    fn logs_larger_than_the_cap_are_moved_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = log_files(dir.path());
        fs::write(&files.current, vec![b'x'; 100]).expect("write");
        rotate_if_larger(&files, 200).expect("rotate");
        assert_eq!(fs::metadata(&files.current).map(|m| m.len()).ok(), Some(100));
        rotate_if_larger(&files, 50).expect("rotate");
        assert_eq!(fs::metadata(&files.current).map(|m| m.len()).ok(), Some(0));
        assert_eq!(fs::metadata(&files.rotated).map(|m| m.len()).ok(), Some(100));
    }
}
