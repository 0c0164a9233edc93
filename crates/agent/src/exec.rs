//! Runs a command inside a running container, found by its main process's host pid: the
//! container's namespaces, cgroup, root, environment and working directory, with or without a
//! terminal. Works for any runtime that can name that pid.
//!
//! Process tree of one exec when the container has its own PID namespace:
//!
//! ```text
//! agent ── exec helper (host PID namespace, container's cgroup; waits, exits with the code)
//!            └── command (in the container's PID namespace; session leader; dies with the helper)
//! ```
//!
//! The helper exists for the same reason as the process runtime's shim: joining a PID namespace
//! only applies to children. The command leads its own session, so when the client goes away
//! the exec is ended with its process group (whatever a `sh -c` forked) and its terminal hung up.

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

/// What to run and how.
#[derive(Debug, Clone)]
pub(crate) struct ExecRequest {
    pub argv: Vec<String>,
    pub stdin: bool,
    pub tty: bool,
}

/// The pieces of a running exec.
pub(crate) struct Spawned {
    pub child: tokio::process::Child,
    /// The terminal's controlling side, with `tty`.
    pub pty: Option<File>,
}

/// A terminal size, as the resize channel sends it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
pub(crate) struct TermSize {
    #[serde(rename = "Width", alias = "width")]
    pub width: u16,
    #[serde(rename = "Height", alias = "height")]
    pub height: u16,
}

/// The namespaces an exec joins, in the order they are joined (the mount namespace last: after
/// it, `/proc` is the container's).
const NAMESPACES: [(&str, libc::c_int); 5] = [
    ("ipc", libc::CLONE_NEWIPC),
    ("uts", libc::CLONE_NEWUTS),
    ("net", libc::CLONE_NEWNET),
    ("pid", libc::CLONE_NEWPID),
    ("mnt", libc::CLONE_NEWNS),
];

/// Everything the forked child needs, prepared before the fork (only async-signal-safe calls
/// run between fork and exec).
struct ChildSetup {
    cgroup_procs: Vec<OwnedFd>,
    namespaces: Vec<(OwnedFd, libc::c_int)>,
    /// The container's root directory, entered after its mount namespace.
    root: Option<OwnedFd>,
    workdir: CString,
    new_pid_namespace: bool,
    tty: bool,
}

/// Opens `/proc/<pid>/ns/<name>` unless it is the namespace this process is already in.
fn foreign_namespace(pid: u32, name: &str) -> io::Result<Option<OwnedFd>> {
    let theirs = fs::metadata(format!("/proc/{pid}/ns/{name}"))?;
    let ours = fs::metadata(format!("/proc/self/ns/{name}"))?;
    if theirs.ino() == ours.ino() && theirs.dev() == ours.dev() {
        return Ok(None);
    }
    Ok(Some(File::open(format!("/proc/{pid}/ns/{name}"))?.into()))
}

/// The cgroup directories of `pid` (v2's single one, or one per v1 hierarchy), as `cgroup.procs` files.
fn cgroup_procs_of(pid: u32) -> Vec<OwnedFd> {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else { return Vec::new() };
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let base = if controllers.is_empty() {
            "/sys/fs/cgroup".to_string()
        } else {
            let first = controllers.split(',').next().unwrap_or(controllers);
            let first = first.strip_prefix("name=").unwrap_or(first);
            format!("/sys/fs/cgroup/{first}")
        };
        if path == "/" {
            continue;
        }
        if let Ok(f) = OpenOptions::new().write(true).open(format!("{base}{path}/cgroup.procs")) {
            out.push(f.into());
        }
    }
    out
}

/// The environment the container's main process was started with.
fn environment_of(pid: u32) -> io::Result<Vec<(String, String)>> {
    let raw = fs::read(format!("/proc/{pid}/environ"))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter_map(|kv| {
            let text = String::from_utf8_lossy(kv);
            let (k, v) = text.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
        })
        .collect())
}

/// The container's working directory as the container sees it.
fn workdir_of(pid: u32) -> String {
    fs::read_link(format!("/proc/{pid}/cwd"))
        .ok()
        .and_then(|p| p.to_str().map(str::to_string))
        .filter(|p| p.starts_with('/') && !p.ends_with(" (deleted)"))
        .unwrap_or_else(|| "/".into())
}

/// Opens a pseudo-terminal: (controlling side, terminal side).
pub(crate) fn open_pty() -> io::Result<(File, File)> {
    // SAFETY: plain libc calls on descriptors this function owns; ptsname_r writes into `name`.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if master < 0 {
            return Err(io::Error::last_os_error());
        }
        let master = File::from_raw_fd(master);
        if libc::grantpt(master.as_raw_fd()) != 0 || libc::unlockpt(master.as_raw_fd()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let path = std::ffi::CStr::from_ptr(name.as_ptr());
        let slave = libc::open(path.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if slave < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((master, File::from_raw_fd(slave)))
    }
}

/// Opens a pseudo-terminal on the terminal devices the container at `pid` sees (its own
/// `/dev/pts` when it mounts one, as runc does), so that inside, the command's terminal has a
/// name (`tty`, and programs asking for it, work); the host's when that cannot be opened.
fn open_pty_of(pid: u32) -> io::Result<(File, File)> {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(master) = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(format!("/proc/{pid}/root/dev/pts/ptmx"))
    else {
        return open_pty();
    };
    // SAFETY: ioctls on a descriptor owned here; TIOCSPTLCK reads an int that outlives the call.
    unsafe {
        let unlock: libc::c_int = 0;
        if libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) != 0 {
            return open_pty();
        }
        // The peer by descriptor: its path names the container's devpts, not the host's.
        let slave = libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if slave < 0 {
            return open_pty();
        }
        Ok((master, File::from_raw_fd(slave)))
    }
}

/// Applies a terminal size to a pty.
pub(crate) fn resize(pty: &File, size: TermSize) {
    let ws = libc::winsize { ws_row: size.height, ws_col: size.width, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer, which outlives the call.
    unsafe {
        libc::ioctl(pty.as_raw_fd(), libc::TIOCSWINSZ, &ws);
    }
}

/// Starts `req` in the container whose main process is `pid`.
pub(crate) fn spawn(pid: u32, req: &ExecRequest) -> io::Result<Spawned> {
    let Some(program) = req.argv.first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no command given"));
    };
    let mut namespaces = Vec::new();
    for (name, flag) in NAMESPACES {
        if let Some(fd) = foreign_namespace(pid, name)? {
            namespaces.push((fd, flag));
        }
    }
    let enters_mounts = namespaces.iter().any(|(_, f)| *f == libc::CLONE_NEWNS);
    let setup = ChildSetup {
        cgroup_procs: cgroup_procs_of(pid),
        new_pid_namespace: namespaces.iter().any(|(_, f)| *f == libc::CLONE_NEWPID),
        root: if enters_mounts { Some(File::open(format!("/proc/{pid}/root"))?.into()) } else { None },
        namespaces,
        workdir: CString::new(workdir_of(pid)).map_err(|_| io::Error::other("working directory has a NUL byte"))?,
        tty: req.tty,
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(&req.argv[1..]).env_clear();
    let env = environment_of(pid)?;
    let has_term = env.iter().any(|(k, _)| k == "TERM");
    cmd.envs(env);
    let mut pty = None;
    if req.tty {
        if !has_term {
            cmd.env("TERM", "xterm");
        }
        let (master, slave) = open_pty_of(pid)?;
        cmd.stdin(Stdio::from(slave.try_clone()?)).stdout(Stdio::from(slave.try_clone()?)).stderr(Stdio::from(slave));
        pty = Some(master);
    } else {
        cmd.stdin(if req.stdin { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    // SAFETY: `ChildSetup::run` only makes async-signal-safe calls on data prepared above.
    unsafe {
        cmd.pre_exec(move || setup.run());
    }
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let child = cmd.spawn()?;
    Ok(Spawned { child, pty })
}

/// Kills everything an exec started: the command's process group (it leads its own session)
/// and the helper. `helper` is the pid `spawn` returned; it must not have been reaped yet, so
/// that no pid here can belong to another process.
pub(crate) fn kill_tree(helper: u32) {
    let Ok(helper) = i32::try_from(helper) else { return };
    // SAFETY: getsid and kill have no memory-safety preconditions; the pids are our unreaped
    // child and its child.
    unsafe {
        // Without a PID namespace to join, the command is the helper itself.
        let leader = if libc::getsid(helper) == helper {
            Some(helper)
        } else {
            fs::read_to_string(format!("/proc/{helper}/task/{helper}/children"))
                .ok()
                .and_then(|s| s.split_whitespace().next().and_then(|c| c.parse::<i32>().ok()))
        };
        if let Some(p) = leader {
            libc::kill(-p, libc::SIGKILL);
            libc::kill(p, libc::SIGKILL);
        }
        libc::kill(helper, libc::SIGKILL);
    }
}

impl ChildSetup {
    /// Runs in the forked child before exec.
    fn run(&self) -> io::Result<()> {
        // SAFETY (whole function): only async-signal-safe libc calls on data prepared before fork.
        unsafe {
            for fd in &self.cgroup_procs {
                libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1);
            }
            for (fd, flag) in &self.namespaces {
                if libc::setns(fd.as_raw_fd(), *flag) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if let Some(root) = &self.root
                && (libc::fchdir(root.as_raw_fd()) != 0 || libc::chroot(c".".as_ptr()) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            if self.new_pid_namespace {
                let child = libc::fork();
                if child < 0 {
                    return Err(io::Error::last_os_error());
                }
                if child > 0 {
                    helper(child);
                }
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            }
            libc::setsid();
            if self.tty {
                libc::ioctl(0, libc::TIOCSCTTY, 0);
            }
            libc::umask(0o022);
            if libc::chdir(self.workdir.as_ptr()) != 0 {
                libc::chdir(c"/".as_ptr());
            }
            Ok(())
        }
    }
}

/// The helper in the host PID namespace: waits for the command and ends the same way.
fn helper(child: libc::pid_t) -> ! {
    // SAFETY: async-signal-safe calls only; the helper never returns to Rust code after the fork.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, 0);
        libc::prctl(libc::PR_SET_NAME, c"shepherd-exec".as_ptr(), 0, 0, 0);
        let mut status: libc::c_int = 0;
        loop {
            let r = libc::waitpid(child, &mut status, 0);
            if r == child {
                if libc::WIFEXITED(status) {
                    libc::_exit(libc::WEXITSTATUS(status));
                }
                if libc::WIFSIGNALED(status) {
                    libc::_exit(128 + libc::WTERMSIG(status));
                }
            } else if r < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(255);
            }
        }
    }
}

/// How long an exec's output may keep flowing after its command ended (a background process
/// still holding the pipes).
pub(crate) const OUTPUT_DRAIN: Duration = Duration::from_millis(500);
