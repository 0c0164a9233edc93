//! The process runtime's `start` mode: the program makes a container from what the agent wrote on
//! its stdin, then stays as its shim.
//!
//! The agent only spawns this program (a `posix_spawn`, which shares the agent's memory until the
//! exec instead of copying its page tables, so the agent's other threads do not stall). Everything
//! a container needs before its exec happens here, in a process of a few hundred KB: joining the
//! cgroups and the pod's network namespace, the new namespaces, the fork of the container process,
//! its mounts, terminal, hostname and environment.
//!
//! The agent hears back on the program's stderr, a pipe, in records of a tag byte and a
//! native-endian `i32`: `p` the container process's pid, `e` the errno of a failed step (in which
//! case the program has ended or is ending). The pipe reaches end-of-file once the container's
//! program has been exec'd (the container's copy is close-on-exec) or the start has failed. An idle
//! container is not exec'd (it is this program, in `pause`): it closes the pipe itself.

use std::ffi::{CStr, CString};
use std::io::Read;
use std::os::fd::FromRawFd;

/// Status record: the container process's pid.
pub const STATUS_PID: u8 = b'p';
/// Status record: the errno of the step that failed.
pub const STATUS_ERROR: u8 = b'e';

/// What the container is made of.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Start {
    /// The program (looked up in the container's `PATH`) and its arguments.
    pub argv: Vec<CString>,
    /// `KEY=value`, in the order the container sees them.
    pub env: Vec<CString>,
    pub working_dir: Option<CString>,
    pub hostname: CString,
    /// Where the shim writes the container's exit code.
    pub exit_file: CString,
    /// The cgroups' `cgroup.procs` files the shim joins (and the container with it).
    pub procs_files: Vec<CString>,
    /// The pod's network namespace, entered first, so the shim and the container share it.
    pub netns: Option<CString>,
    /// New PID, mount, UTS and IPC namespaces (the agent runs as root).
    pub isolate: bool,
    /// The container idles in `pause` (it holds the stop signals from before its exec).
    pub idle: bool,
    /// The container gets a terminal of its own as stdin, stdout and stderr.
    pub tty: bool,
    /// The named pipe that is the container's stdin (none: `/dev/null`).
    pub stdin: Option<CString>,
    /// The container's stdin ends after the first attach (the shim keeps a writer until then).
    pub stdin_once: bool,
    /// Made in the container's mount namespace (only with `isolate`).
    pub mounts: MountPlan,
    /// The nice value the shim and the container take once the container is made: the agent
    /// starts the shim at a lower priority than its own (see the agent's `START_NICE`) and
    /// passes its own here. None: the shim keeps the priority it started with.
    pub nice: Option<i32>,
}

/// The container's volume mounts; the agent's `mountns` plans them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct MountPlan {
    /// Where the overlays' tmpfs goes (a directory in the container's own directory).
    pub scratch: Option<CString>,
    /// Directories overlaid, parents before children, before any bind.
    pub overlays: Vec<Overlay>,
    /// A root of the container's own, for mount paths in top-level directories the host lacks.
    pub new_root: Option<NewRoot>,
    pub binds: Vec<BindMount>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Overlay {
    pub target: CString,
    pub upper: CString,
    pub work: CString,
    pub options: CString,
}

#[derive(Debug, Clone, PartialEq)]
pub struct NewRoot {
    /// The new root, on the scratch tmpfs.
    pub dir: CString,
    /// The host's top-level entries, mirrored into it.
    pub entries: Vec<RootEntry>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RootEntry {
    pub host: CString,
    pub inside: CString,
    pub kind: EntryKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EntryKind {
    Dir,
    File,
    Symlink(CString),
}

#[derive(Debug, Clone, PartialEq)]
pub struct BindMount {
    pub source: CString,
    pub destination: CString,
    pub read_only: bool,
    /// Made (in the overlay) before the bind, in order; the last is a file for a file volume.
    pub create: Vec<CString>,
    pub file: bool,
}

fn push(out: &mut Vec<u8>, tag: u8, fields: &[&CStr]) {
    out.push(tag);
    for f in fields {
        out.extend_from_slice(f.to_bytes_with_nul());
    }
}

impl Start {
    /// The bytes the agent writes to the program's stdin: records of a tag byte and a fixed
    /// number of NUL-terminated strings (a `CString` holds no NUL, so nothing needs escaping).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let flags: String = [(self.isolate, 'i'), (self.idle, 'p'), (self.tty, 't'), (self.stdin_once, 'o')]
            .iter()
            .filter_map(|&(on, c)| on.then_some(c))
            .collect();
        push(&mut out, b'f', &[&CString::new(flags).unwrap_or_default()]);
        push(&mut out, b'h', &[&self.hostname]);
        push(&mut out, b'x', &[&self.exit_file]);
        for a in &self.argv {
            push(&mut out, b'a', &[a]);
        }
        for e in &self.env {
            push(&mut out, b'e', &[e]);
        }
        for (tag, v) in [(b'w', &self.working_dir), (b'n', &self.netns), (b's', &self.stdin), (b'S', &self.mounts.scratch)] {
            if let Some(v) = v {
                push(&mut out, tag, &[v]);
            }
        }
        for p in &self.procs_files {
            push(&mut out, b'c', &[p]);
        }
        if let Some(n) = self.nice {
            push(&mut out, b'N', &[&CString::new(n.to_string()).unwrap_or_default()]);
        }
        for o in &self.mounts.overlays {
            push(&mut out, b'O', &[&o.target, &o.upper, &o.work, &o.options]);
        }
        if let Some(root) = &self.mounts.new_root {
            push(&mut out, b'R', &[&root.dir]);
            for e in &root.entries {
                match &e.kind {
                    EntryKind::Dir => push(&mut out, b'D', &[&e.host, &e.inside]),
                    EntryKind::File => push(&mut out, b'F', &[&e.host, &e.inside]),
                    EntryKind::Symlink(target) => push(&mut out, b'L', &[&e.host, &e.inside, target]),
                }
            }
        }
        for b in &self.mounts.binds {
            let flags = match (b.read_only, b.file) {
                (false, false) => c"-",
                (true, false) => c"r",
                (false, true) => c"f",
                (true, true) => c"rf",
            };
            push(&mut out, b'B', &[&b.source, &b.destination, flags]);
            for c in &b.create {
                push(&mut out, b'C', &[c]);
            }
        }
        out
    }

    /// Reads what [`Start::encode`] wrote.
    pub fn decode(mut bytes: &[u8]) -> Result<Start, String> {
        let mut s = Start::default();
        let take = |bytes: &mut &[u8]| -> Result<CString, String> {
            let end = bytes.iter().position(|&b| b == 0).ok_or("a field without its NUL")?;
            let field = CString::new(&bytes[..end]).map_err(|e| e.to_string())?;
            *bytes = &bytes[end + 1..];
            Ok(field)
        };
        while let Some((&tag, rest)) = bytes.split_first() {
            bytes = rest;
            let b = &mut bytes;
            match tag {
                b'f' => {
                    let flags = take(b)?;
                    let on = |c: u8| flags.as_bytes().contains(&c);
                    (s.isolate, s.idle, s.tty, s.stdin_once) = (on(b'i'), on(b'p'), on(b't'), on(b'o'));
                }
                b'h' => s.hostname = take(b)?,
                b'x' => s.exit_file = take(b)?,
                b'a' => s.argv.push(take(b)?),
                b'e' => s.env.push(take(b)?),
                b'w' => s.working_dir = Some(take(b)?),
                b'n' => s.netns = Some(take(b)?),
                b's' => s.stdin = Some(take(b)?),
                b'S' => s.mounts.scratch = Some(take(b)?),
                b'c' => s.procs_files.push(take(b)?),
                b'N' => {
                    let n = take(b)?;
                    let n = n.to_str().ok().and_then(|n| n.parse::<i32>().ok()).filter(|n| (-20..=19).contains(n));
                    s.nice = Some(n.ok_or("a nice value that is not a whole number from -20 to 19")?);
                }
                b'O' => {
                    let overlay = Overlay { target: take(b)?, upper: take(b)?, work: take(b)?, options: take(b)? };
                    s.mounts.overlays.push(overlay);
                }
                b'R' => s.mounts.new_root = Some(NewRoot { dir: take(b)?, entries: Vec::new() }),
                b'D' | b'F' | b'L' => {
                    let (host, inside) = (take(b)?, take(b)?);
                    let kind = match tag {
                        b'D' => EntryKind::Dir,
                        b'F' => EntryKind::File,
                        _ => EntryKind::Symlink(take(b)?),
                    };
                    let root = s.mounts.new_root.as_mut().ok_or("a root entry before its root")?;
                    root.entries.push(RootEntry { host, inside, kind });
                }
                b'B' => {
                    let (source, destination, flags) = (take(b)?, take(b)?, take(b)?);
                    let (read_only, file) = (flags.as_bytes().contains(&b'r'), flags.as_bytes().contains(&b'f'));
                    s.mounts.binds.push(BindMount { source, destination, read_only, create: Vec::new(), file });
                }
                b'C' => {
                    let path = take(b)?;
                    s.mounts.binds.last_mut().ok_or("a path to create before its mount")?.create.push(path);
                }
                other => return Err(format!("unknown field {:?}", char::from(other))),
            }
        }
        if s.argv.is_empty() || s.exit_file.is_empty() {
            return Err("no program or no exit file".into());
        }
        Ok(s)
    }
}

fn errno() -> i32 {
    // SAFETY: reading errno.
    unsafe { *libc::__errno_location() }
}

/// Sends a status record to the agent.
fn report(status: libc::c_int, tag: u8, value: i32) {
    let mut record = [tag, 0, 0, 0, 0];
    record[1..].copy_from_slice(&value.to_ne_bytes());
    // SAFETY: write from a stack buffer; one record is far below PIPE_BUF, so it is never split.
    unsafe { libc::write(status, record.as_ptr().cast(), record.len()) };
}

/// Reports the errno of the step that just failed and ends (with 1, as a failed exec does).
fn fail(status: libc::c_int) -> ! {
    report(status, STATUS_ERROR, errno());
    // SAFETY: _exit has no preconditions.
    unsafe { libc::_exit(1) }
}

unsafe extern "C" {
    static mut environ: *const *const libc::c_char;
}

/// The `start` mode: reads a [`Start`] from stdin and makes the container. Descriptors: 1 the
/// log file, 2 the status pipe.
pub fn main() -> ! {
    // SAFETY: sigprocmask; the agent may signal a shim (SIGUSR1) as soon as it knows its pid.
    unsafe { crate::hold_sigusr1() };
    let start = {
        let mut input = Vec::new();
        // Read unbuffered: std's stdin would keep an 8 KiB buffer, a private page or two in every
        // shim for the container's whole life.
        // SAFETY: descriptor 0 is this process's; ManuallyDrop leaves it open.
        let mut stdin = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
        stdin.read_to_end(&mut input).map_err(|e| e.to_string()).and_then(|_| Start::decode(&input))
    };
    match start {
        // SAFETY: this process is single-threaded and owns its descriptors.
        Ok(start) => unsafe { start.run() },
        Err(e) => {
            // The status pipe: the agent shows what is not a record as it came.
            eprintln!("shepherd-shim start: {e}");
            std::process::exit(2)
        }
    }
}

impl Start {
    /// See the module docs; the parent stays as the container's shim ([`crate::run_process`]).
    ///
    /// # Safety
    /// Single-threaded; descriptors 0 to 2 as [`main`] says.
    unsafe fn run(self) -> ! {
        // SAFETY (whole function): libc calls on this process's own descriptors and on
        // NUL-terminated strings owned by `self`.
        unsafe {
            // Out of the way of the container's descriptors, and closed by its exec; the shim's
            // own stderr is the log, as its stdout.
            let status = libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3);
            libc::dup2(1, 2);
            if let Some(wd) = &self.working_dir
                && libc::chdir(wd.as_ptr()) != 0
            {
                fail(status);
            }
            let mut keep = -1;
            let stdin = match &self.stdin {
                Some(fifo) if self.stdin_once => {
                    // Read-only for the container, so that it sees the end once the shim's writer
                    // goes; the writer is opened first, so that the read-only open does not block.
                    keep = libc::open(fifo.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
                    if keep < 0 {
                        fail(status);
                    }
                    libc::open(fifo.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC)
                }
                // Read and write: it never ends, however many attaches come and go.
                Some(fifo) => libc::open(fifo.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC),
                None => libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC),
            };
            if stdin < 0 {
                fail(status);
            }
            libc::dup2(stdin, 0);
            libc::close(stdin);
            let terminal = if self.tty { Some(open_pty().unwrap_or_else(|_| fail(status))) } else { None };
            for f in &self.procs_files {
                let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
            }
            libc::setsid();
            if let Some(ns) = &self.netns {
                let fd = libc::open(ns.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    fail(status);
                }
                libc::close(fd);
            }
            if self.isolate
                && libc::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC) != 0
            {
                fail(status);
            }
            // The container writes into pipes; the shim turns what comes out into timestamped
            // log records.
            let (mut out, mut err) = ([0; 2], [0; 2]);
            if libc::pipe2(out.as_mut_ptr(), libc::O_CLOEXEC) != 0 || libc::pipe2(err.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                fail(status);
            }
            let pid = libc::fork();
            if pid < 0 {
                fail(status);
            }
            if pid > 0 {
                // Watching the container is not start-up work: back to the agent's priority, so
                // that its logs keep pace with it. Nothing is lost if this is refused.
                if let Some(n) = self.nice {
                    libc::setpriority(libc::PRIO_PROCESS, 0, n);
                }
                report(status, STATUS_PID, pid);
                libc::close(status);
                libc::close(out[1]);
                libc::close(err[1]);
                // The shim lives as long as its container: what it allocated goes back to the
                // system, so that its private memory is its stack and little else.
                let mut exit_file = [0u8; libc::PATH_MAX as usize];
                let path = self.exit_file.as_bytes();
                let n = path.len().min(exit_file.len() - 1);
                exit_file[..n].copy_from_slice(&path[..n]);
                drop(self);
                libc::malloc_trim(0);
                let exit_file = CStr::from_bytes_until_nul(&exit_file).unwrap_or(c"/dev/null");
                match terminal {
                    Some((master, _)) => shim(pid, exit_file, master, -1, keep),
                    None => shim(pid, exit_file, out[0], err[0], keep),
                }
            }
            self.container(status, out[1], err[1], terminal.map(|(_, t)| t))
        }
    }

    /// The container process, PID 1 of its namespaces: set up, then exec'd.
    unsafe fn container(&self, status: libc::c_int, out: libc::c_int, err: libc::c_int, terminal: Option<libc::c_int>) -> ! {
        // SAFETY (whole function): as in `run`; the pointers handed to execvp outlive it.
        unsafe {
            // The program starts with no signal blocked (but the stop signals of an idle one) and
            // SIGPIPE at its default, as the Rust runtime of this program does not leave it.
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            if self.idle {
                crate::hold_stop_signals();
            }
            if let Some(terminal) = terminal {
                libc::setsid();
                libc::dup2(terminal, 0);
                libc::dup2(terminal, 1);
                libc::dup2(terminal, 2);
                libc::ioctl(0, libc::TIOCSCTTY, 0);
            } else {
                libc::dup2(out, 1);
                libc::dup2(err, 2);
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            // The agent keeps its own files private (umask 077); a container gets the usual one.
            libc::umask(0o022);
            if self.isolate {
                libc::mount(std::ptr::null(), c"/".as_ptr(), std::ptr::null(), libc::MS_REC | libc::MS_PRIVATE, std::ptr::null());
                libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                );
                libc::sethostname(self.hostname.as_ptr(), self.hostname.as_bytes().len());
                if self.mounts.apply().is_err() {
                    fail(status);
                }
                // Entered again after the mounts, in case it lies on one.
                if let Some(wd) = &self.working_dir
                    && !self.mounts.binds.is_empty()
                {
                    libc::chdir(wd.as_ptr());
                }
            } else {
                // Its own process group, so signals reach whatever the container forks.
                libc::setpgid(0, 0);
            }
            // The container runs at the agent's priority, never at the one its start had.
            if let Some(n) = self.nice
                && libc::setpriority(libc::PRIO_PROCESS, 0, n) != 0
            {
                fail(status);
            }
            if self.idle && self.look_as_if_execd() {
                // Everything the exec would close is close-on-exec: the status pipe's end tells the
                // agent the container runs.
                crate::close_from(3);
                default_handlers();
                crate::pause()
            }
            let argv: Vec<*const libc::c_char> = self.argv.iter().map(|a| a.as_ptr()).chain([std::ptr::null()]).collect();
            let envp: Vec<*const libc::c_char> = self.env.iter().map(|e| e.as_ptr()).chain([std::ptr::null()]).collect();
            // execvp looks the program up in the container's own PATH.
            environ = envp.as_ptr();
            libc::execvp(argv[0], argv.as_ptr());
            fail(status)
        }
    }
}

impl Start {
    /// An idle container runs this program's `pause`, which the container process already is: it
    /// skips the exec, which would start the C runtime over (the dynamic loader, and glibc's probe
    /// of the CPU's caches, whose CPUID instructions each trap to the hypervisor of a virtual
    /// machine: about 1 ms of CPU per container there, half of what the agent spends on a pod's
    /// start). What an exec would have shown is put in place first: the command line (`ps`)
    /// and the environment (`/proc/PID/environ`, which an exec into the container starts from),
    /// with `PR_SET_MM_MAP`, which CRIU restores processes with. Where the kernel refuses (no
    /// checkpoint/restore support, or a bounds check), this returns false and the program is
    /// exec'd.
    ///
    /// # Safety
    /// In the container process, single-threaded, before its exec.
    unsafe fn look_as_if_execd(&self) -> bool {
        let joined = |strings: &[CString]| -> &'static [u8] {
            Vec::leak(strings.iter().flat_map(|s| s.as_bytes_with_nul().iter().copied()).collect())
        };
        let (args, env) = (joined(&self.argv), joined(&self.env));
        if args.is_empty() || env.is_empty() {
            return false;
        }
        // The rest of the map stays as it is: /proc/self/stat shows it (fields 26-28 and 45-47),
        // and brk(0) the current break.
        let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return false };
        let Some((_, rest)) = stat.rsplit_once(')') else { return false };
        let fields: Vec<u64> = rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
        // Field N of proc(5) (counted from 1) is fields[N - 3]: pid and comm come before `rest`.
        let field = |n: usize| fields.get(n - 3).copied().unwrap_or(0);
        // SAFETY: brk(0) only reports the current break.
        let brk = unsafe { libc::syscall(libc::SYS_brk, 0) } as u64;
        let map = MmMap {
            start_code: field(26),
            end_code: field(27),
            start_data: field(45),
            end_data: field(46),
            start_brk: field(47),
            brk,
            start_stack: field(28),
            arg_start: args.as_ptr() as u64,
            arg_end: args.as_ptr() as u64 + args.len() as u64,
            env_start: env.as_ptr() as u64,
            env_end: env.as_ptr() as u64 + env.len() as u64,
            auxv: std::ptr::null_mut(),
            auxv_size: 0,
            exe_fd: u32::MAX,
        };
        let size = std::mem::size_of::<MmMap>() as libc::c_ulong;
        // SAFETY: the kernel reads `size` bytes of `map`; the new ranges stay allocated for good.
        unsafe { libc::prctl(libc::PR_SET_MM, libc::PR_SET_MM_MAP, &map as *const MmMap as libc::c_ulong, size, 0) == 0 }
    }
}

/// `struct prctl_mm_map` of linux/prctl.h: a process's memory map as `PR_SET_MM_MAP` sets it
/// (`exe_fd` all ones: the executable stays; `auxv_size` 0: the auxiliary vector stays).
#[repr(C)]
struct MmMap {
    start_code: u64,
    end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
    auxv: *mut u64,
    auxv_size: u32,
    exe_fd: u32,
}

/// Puts every caught signal back to its default action, as an exec does (the Rust runtime's
/// handlers for stack overflows among them); ignored ones stay ignored.
///
/// # Safety
/// Single-threaded; sigaction on stack values.
unsafe fn default_handlers() {
    // SAFETY: sigaction on stack values; signals that cannot be caught are refused harmlessly.
    unsafe {
        for signal in 1..libc::SIGRTMAX() {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
                continue;
            }
            if current.sa_sigaction != libc::SIG_DFL && current.sa_sigaction != libc::SIG_IGN {
                let default: libc::sigaction = std::mem::zeroed();
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
    }
}

/// The shim: lays out its descriptors as [`crate::run_process`] expects, then runs it.
unsafe fn shim(child: libc::pid_t, exit_file: &CStr, stdout: libc::c_int, stderr: libc::c_int, keep: libc::c_int) -> ! {
    // SAFETY (whole function): descriptor calls on this process's own descriptors.
    unsafe {
        // Out of the way first, so that placing one cannot close another. On a terminal there is
        // no stderr, and what comes on the shim's stdin (the container's stdin pipe) is typed into
        // the terminal.
        let high = |fd: libc::c_int| if fd >= 0 { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 100) } else { -1 };
        let (out, err, keep) = (high(stdout), high(stderr), high(keep));
        libc::dup2(out, 3);
        if err >= 0 {
            libc::dup2(err, 4);
        } else {
            libc::close(4);
        }
        if keep >= 0 {
            libc::dup2(keep, 5);
            crate::close_from(6);
        } else {
            crate::close_from(5);
        }
        crate::run_process(child, exit_file, err < 0, keep >= 0)
    }
}

/// A new pseudo-terminal: (controlling side, terminal side), both close-on-exec.
fn open_pty() -> Result<(libc::c_int, libc::c_int), ()> {
    // SAFETY: libc calls on descriptors opened here; ptsname_r writes into `name`.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if master < 0 || libc::grantpt(master) != 0 || libc::unlockpt(master) != 0 {
            return Err(());
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(master, name.as_mut_ptr(), name.len()) != 0 {
            return Err(());
        }
        let terminal = libc::open(name.as_ptr(), libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if terminal < 0 {
            return Err(());
        }
        Ok((master, terminal))
    }
}

impl MountPlan {
    /// Makes the mounts, in the container's own (private) mount namespace; on failure errno says
    /// why.
    ///
    /// # Safety
    /// Runs in the container process before its exec.
    unsafe fn apply(&self) -> Result<(), ()> {
        let none = std::ptr::null();
        // SAFETY (whole body): the pointers are NUL-terminated strings owned by `self`.
        unsafe {
            if let Some(scratch) = &self.scratch {
                let nosuid = libc::MS_NOSUID | libc::MS_NODEV;
                if libc::mount(c"tmpfs".as_ptr(), scratch.as_ptr(), c"tmpfs".as_ptr(), nosuid, c"mode=0755".as_ptr().cast()) != 0 {
                    return Err(());
                }
            }
            // The sources may lie below an overlaid directory, where their paths would lead into
            // the overlay instead of the volume: hold them open from before.
            let mut held = Vec::with_capacity(self.binds.len());
            for m in &self.binds {
                let fd = libc::open(m.source.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(());
                }
                held.push(fd);
            }
            for o in &self.overlays {
                if libc::mkdir(o.upper.as_ptr(), 0o755) != 0 || libc::mkdir(o.work.as_ptr(), 0o700) != 0 {
                    return Err(());
                }
                if libc::mount(c"overlay".as_ptr(), o.target.as_ptr(), c"overlay".as_ptr(), 0, o.options.as_ptr().cast()) != 0 {
                    return Err(());
                }
            }
            if let Some(root) = &self.new_root {
                root.enter()?;
            }
            for (m, fd) in self.binds.iter().zip(held) {
                for (i, p) in m.create.iter().enumerate() {
                    if m.file && i + 1 == m.create.len() {
                        let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644);
                        if fd < 0 {
                            return Err(());
                        }
                        libc::close(fd);
                    } else if libc::mkdir(p.as_ptr(), 0o755) != 0 && errno() != libc::EEXIST {
                        return Err(());
                    }
                }
                let path = CString::new(format!("/proc/self/fd/{fd}")).map_err(drop)?;
                let flags = libc::MS_BIND | libc::MS_REC;
                if libc::mount(path.as_ptr(), m.destination.as_ptr(), none, flags, none.cast()) != 0 {
                    return Err(());
                }
                libc::close(fd);
                // A bind mount takes MS_RDONLY only through a remount of itself.
                let ro = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
                if m.read_only && libc::mount(none, m.destination.as_ptr(), none, ro, none.cast()) != 0 {
                    return Err(());
                }
            }
        }
        Ok(())
    }
}

impl NewRoot {
    /// Builds the new root and chroots into it.
    ///
    /// # Safety
    /// Runs in the container process before its exec.
    unsafe fn enter(&self) -> Result<(), ()> {
        let none = std::ptr::null();
        // SAFETY (whole body): NUL-terminated strings owned by `self`.
        unsafe {
            // A tmpfs of its own, left out of the recursive binds below (one of which holds it);
            // an overlay's upper layer cannot lie on such a mount, so it is not the scratch one.
            let nosuid = libc::MS_NOSUID | libc::MS_NODEV;
            if libc::mkdir(self.dir.as_ptr(), 0o755) != 0
                || libc::mount(c"tmpfs".as_ptr(), self.dir.as_ptr(), c"tmpfs".as_ptr(), nosuid, c"mode=0755".as_ptr().cast()) != 0
                || libc::mount(none, self.dir.as_ptr(), none, libc::MS_UNBINDABLE, none.cast()) != 0
            {
                return Err(());
            }
            for e in &self.entries {
                let made = match &e.kind {
                    EntryKind::Symlink(target) => {
                        libc::symlink(target.as_ptr(), e.inside.as_ptr());
                        continue;
                    }
                    EntryKind::Dir => libc::mkdir(e.inside.as_ptr(), 0o755) == 0,
                    EntryKind::File => {
                        let fd = libc::open(e.inside.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644);
                        fd >= 0 && libc::close(fd) == 0
                    }
                };
                let flags = libc::MS_BIND | libc::MS_REC;
                if !made || libc::mount(e.host.as_ptr(), e.inside.as_ptr(), none, flags, none.cast()) != 0 {
                    return Err(());
                }
            }
            if libc::chdir(self.dir.as_ptr()) != 0 || libc::chroot(c".".as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return Err(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> CString {
        CString::new(s).expect("no NUL")
    }

    #[test]
    fn a_start_reads_back_as_it_was_written() {
        let start = Start {
            argv: vec![c("sh"), c("-c"), c("echo 'a b'")],
            env: vec![c("HOME=/root"), c("PATH=/bin"), c("EMPTY=")],
            working_dir: Some(c("/srv")),
            hostname: c("web-0"),
            exit_file: c("/d/exit"),
            procs_files: vec![c("/sys/fs/cgroup/x/cgroup.procs")],
            netns: Some(c("/run/netns/p")),
            isolate: true,
            idle: false,
            tty: true,
            stdin: Some(c("/d/stdin")),
            stdin_once: true,
            nice: Some(-3),
            mounts: MountPlan {
                scratch: Some(c("/d/mounts")),
                overlays: vec![Overlay { target: c("/etc"), upper: c("/u"), work: c("/w"), options: c("lowerdir=/etc") }],
                new_root: Some(NewRoot {
                    dir: c("/d/mounts/root"),
                    entries: vec![
                        RootEntry { host: c("/etc"), inside: c("/r/etc"), kind: EntryKind::Dir },
                        RootEntry { host: c("/f"), inside: c("/r/f"), kind: EntryKind::File },
                        RootEntry { host: c("/bin"), inside: c("/r/bin"), kind: EntryKind::Symlink(c("usr/bin")) },
                    ],
                }),
                binds: vec![
                    BindMount { source: c("/v"), destination: c("/data/x"), read_only: true, create: vec![c("/data"), c("/data/x")], file: true },
                    BindMount { source: c("/w"), destination: c("/srv"), read_only: false, create: Vec::new(), file: false },
                ],
            },
        };
        assert_eq!(Start::decode(&start.encode()), Ok(start.clone()));
        let bare = Start { argv: vec![c("true")], exit_file: c("/x"), ..Start::default() };
        assert_eq!(Start::decode(&bare.encode()), Ok(bare));
    }

    #[test]
    fn a_malformed_start_is_refused() {
        assert!(Start::decode(b"").is_err(), "no program");
        assert!(Start::decode(b"ash").is_err(), "a field without its NUL");
        assert!(Start::decode(b"ash\0x/e\0Z\0").is_err(), "an unknown field");
        assert!(Start::decode(b"ash\0x/e\0C/p\0").is_err(), "a path to create before its mount");
        assert!(Start::decode(b"ash\0x/e\0N20\0").is_err(), "a nice value above 19");
        assert!(Start::decode(b"ash\0x/e\0N-\0").is_err(), "a nice value that is no number");
        assert_eq!(Start::decode(b"ash\0x/e\0N-20\0").map(|s| s.nice), Ok(Some(-20)));
    }
}
