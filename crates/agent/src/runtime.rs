//! The seam between the pod manager and whatever runs containers: what it asks, what it is told.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use jiff::Timestamp;
use tokio::sync::mpsc;

/// One container of one pod incarnation (a pod recreated under the same name has a new uid).
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub(crate) struct ContainerId {
    /// `namespace/name` of the pod.
    pub pod_key: String,
    pub pod_uid: String,
    pub name: String,
}

/// Everything a runtime needs to start one container instance.
#[derive(Debug, Clone)]
pub(crate) struct ContainerSpec {
    pub id: ContainerId,
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    pub hostname: String,
    pub memory_limit_bytes: Option<u64>,
    pub cpu_limit_millis: Option<u64>,
    /// The pod asked to fail (`shepherd.io/simulate-fail: "true"`); only the simulated runtime reads it.
    pub simulate_fail: bool,
    /// The pod asked to exit 0 this long after Running (`shepherd.io/simulate-exit-after-ms`);
    /// only the simulated runtime reads it.
    pub simulate_exit_after: Option<std::time::Duration>,
    pub restart_count: u32,
    /// Host paths the container sees at `destination` (volumes, and files the agent writes for it).
    pub mounts: Vec<Mount>,
    /// The pod's and container's `securityContext`, merged (the container's fields win).
    pub security: Security,
    /// The container's `stdin` and `tty`.
    pub interactive: Interactive,
}

/// A container that keeps a stdin open for `attach` (`stdin: true`), on a terminal (`tty: true`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Interactive {
    pub stdin: bool,
    /// `stdinOnce`: the container's stdin ends when the first attach that wrote to it ends.
    pub stdin_once: bool,
    pub tty: bool,
}

/// What a `securityContext` asks of the runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Security {
    pub run_as_user: Option<u32>,
    pub run_as_group: Option<u32>,
    pub read_only_root: bool,
    pub privileged: bool,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privileges: bool,
    /// Capability names as written (`NET_ADMIN`, `ALL`).
    pub cap_add: Vec<String>,
    pub cap_drop: Vec<String>,
}

impl Security {
    /// The fields set, by their API names (for a runtime that honours none of them).
    pub fn fields_set(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.run_as_user.is_some() {
            out.push("securityContext.runAsUser");
        }
        if self.run_as_group.is_some() {
            out.push("securityContext.runAsGroup");
        }
        if self.read_only_root {
            out.push("securityContext.readOnlyRootFilesystem");
        }
        if self.privileged {
            out.push("securityContext.privileged");
        }
        if self.no_new_privileges {
            out.push("securityContext.allowPrivilegeEscalation");
        }
        if !self.cap_add.is_empty() || !self.cap_drop.is_empty() {
            out.push("securityContext.capabilities");
        }
        out
    }
}

/// One bind mount into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// A file or directory on the host, prepared by the agent before the container starts.
    pub source: PathBuf,
    /// Absolute path inside the container.
    pub destination: String,
    pub read_only: bool,
}

/// A container instance the runtime accepted.
#[derive(Debug, Clone)]
pub(crate) struct Started {
    /// Tells events of this instance apart from those of earlier instances of the same container.
    pub instance: u64,
    pub started_at: Timestamp,
    /// False while the runtime is still creating it; a `RuntimeEvent::Running` follows.
    pub running: bool,
}

/// How an instance ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exit {
    pub code: i32,
    /// `Completed`, `Error`, `OOMKilled` or `ContainerStatusUnknown`.
    pub reason: String,
    pub started_at: Timestamp,
    pub finished_at: Timestamp,
}

impl Exit {
    pub fn reason_for(code: i32, oom_killed: bool) -> &'static str {
        match (code, oom_killed) {
            (_, true) => "OOMKilled",
            (0, _) => "Completed",
            _ => "Error",
        }
    }
}

/// What a runtime reports on its own, as it happens.
#[derive(Debug, Clone)]
pub(crate) enum RuntimeEvent {
    Running { id: ContainerId, instance: u64 },
    Exited { id: ContainerId, instance: u64, exit: Exit },
}

/// A container found from an earlier run of the agent.
#[derive(Debug, Clone)]
pub(crate) struct Adopted {
    pub id: ContainerId,
    pub image: String,
    pub instance: u64,
    pub restart_count: u32,
    pub started_at: Timestamp,
    /// `Some` when it ended while no agent watched it.
    pub exited: Option<Exit>,
}

/// Where one container's output is kept.
#[derive(Debug, Clone)]
pub(crate) struct LogFiles {
    pub current: PathBuf,
    /// The part of the current instance's output moved aside by rotation.
    pub rotated: PathBuf,
    pub previous: PathBuf,
}

/// An image a container needs, as its pod asks for it.
#[derive(Debug, Clone)]
pub(crate) struct ImagePull {
    pub image: String,
    /// `imagePullPolicy` as written (absent: Kubernetes' default for the tag).
    pub policy: Option<String>,
    /// (registry, username, password) from the pod's `imagePullSecrets`.
    pub credentials: Vec<(String, String, String)>,
}

/// How an image became available.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ImageReady {
    /// The runtime uses no images.
    Unused,
    /// Already on the node.
    Present,
    /// `via`: which mirror answered, and what failed first, when not the registry at once.
    Pulled { size: u64, duration: Duration, via: Option<String> },
}

/// Why a container's image is not available, by kubelet's waiting reasons.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ImageUnavailable {
    /// `InvalidImageName`: the reference does not parse; pulling again cannot help.
    InvalidName(String),
    /// `ErrImageNeverPull`: absent, and the pull policy is `Never`.
    NeverPull(String),
    /// `ErrImagePull`: the pull failed (not found, denied, unreachable, bad content).
    PullFailed(String),
}

impl ImageUnavailable {
    pub fn reason(&self) -> &'static str {
        match self {
            ImageUnavailable::InvalidName(_) => "InvalidImageName",
            ImageUnavailable::NeverPull(_) => "ErrImageNeverPull",
            ImageUnavailable::PullFailed(_) => "ErrImagePull",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            ImageUnavailable::InvalidName(m) | ImageUnavailable::NeverPull(m) | ImageUnavailable::PullFailed(m) => m,
        }
    }
}

#[async_trait]
pub(crate) trait Runtime: Send + Sync + 'static {
    /// Makes a container's image available before `start`; runtimes without images have nothing to do.
    async fn ensure_image(&self, _pull: &ImagePull) -> Result<ImageReady, ImageUnavailable> {
        Ok(ImageReady::Unused)
    }
    /// Whether `ensure_image` would pull (for kubelet's `Pulling` event before it does).
    fn will_pull(&self, _pull: &ImagePull) -> bool {
        false
    }
    /// Starts an instance of `spec`. Its end is reported as `RuntimeEvent::Exited`.
    async fn start(&self, spec: &ContainerSpec) -> Result<Started, String>;
    /// How soon an instance `start` left creating is reported Running or Exited, when the runtime
    /// can promise it (the simulated one, after its fixed delay); `None`: no promise.
    fn reports_within(&self) -> Option<Duration> {
        None
    }
    /// Asks an instance to stop: SIGTERM now, SIGKILL once `grace` has passed (at once for zero).
    fn stop(&self, id: &ContainerId, instance: u64, grace: Duration);
    /// Forgets a container whose pod is gone (state, logs, cgroups). Its instance must have ended.
    fn remove(&self, id: &ContainerId);
    /// Lets go of an ended container for a node going down with its pods: its root, cgroups and
    /// sandbox go, its record and logs stay, so the next agent on this data directory adopts it as
    /// ended and restarts it (one more restart, its log as the previous one), as kubelet does after
    /// a node restart. Its instance must have ended.
    fn retire(&self, id: &ContainerId) {
        self.remove(id);
    }
    /// Containers left by an earlier run; each running one is watched from now on.
    fn adopt(&self) -> Vec<Adopted>;
    /// The host pid of a running instance's main process, if it has one.
    fn pid(&self, id: &ContainerId) -> Option<u32>;
    fn log_files(&self, id: &ContainerId) -> Option<LogFiles>;
    /// The command line that runs a command inside a running container (the command is appended);
    /// `None` when commands run on the host (the process runtime shares its filesystem).
    fn exec_prefix(&self, _id: &ContainerId) -> Option<Vec<String>> {
        None
    }
    /// Stops watching (the agent is going away); containers keep running.
    fn detach(&self);
    /// Whether this runtime can give a container `mounts`; the reason it cannot is shown as the
    /// container's `CreateContainerConfigError` (nothing is started).
    fn check_mounts(&self, _mounts: &[Mount]) -> Result<(), String> {
        Ok(())
    }
    /// Where `attach` writes a running container's stdin (a named pipe), for a container started
    /// with `stdin: true` by a runtime that keeps one.
    fn stdin_pipe(&self, _id: &ContainerId) -> Option<PathBuf> {
        None
    }
    /// An attach that wrote to the container's stdin has ended: a `stdinOnce` container's stdin
    /// ends too (others keep theirs open).
    fn attach_ended(&self, _id: &ContainerId) {}
}

pub(crate) type EventSender = mpsc::UnboundedSender<RuntimeEvent>;
