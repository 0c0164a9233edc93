//! The per-container shim of the node agent's runtimes: waits for a container, writes its output to
//! the log file as CRI records and records how it ended, whether or not the agent still runs.
//!
//! The process runtime spawns the small `shepherd-shim` program in its `start` mode (see [`start`]),
//! which makes the container and stays as its shim. The oci runtime forks, prepares the shim's
//! descriptors in the fork, then execs the program in its `oci` mode. A fork that stayed a copy of the
//! agent would keep the agent's pages: shared copy-on-write at first, private to the shim as soon
//! as the agent writes to them, which adds up to megabytes per running container. The exec'd
//! program holds little more than its stack, and its text pages are shared by all shims. When the
//! program is missing, the fork runs the same code itself ([`run_process`], [`run_oci`]).
//!
//! Everything here runs in a forked copy of a multi-threaded process as well, so it makes only
//! async-signal-safe calls and never allocates.

mod crilog;
pub mod start;

use std::ffi::CStr;
use std::sync::atomic::{AtomicI32, Ordering};

pub use crilog::copy_output;

/// The program's file name, looked for beside the agent's own executable.
pub const PROGRAM: &str = "shepherd-shim";

/// The shim's keep-alive writer on a `stdinOnce` container's stdin pipe (-1: none or closed).
static STDIN_KEEP: AtomicI32 = AtomicI32::new(-1);

/// The shim's SIGUSR1: the first attach has ended, so a `stdinOnce` container's stdin ends.
extern "C" fn close_stdin_keep(_: libc::c_int) {
    let fd = STDIN_KEEP.swap(-1, Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: close is async-signal-safe; the descriptor is the shim's own.
        unsafe { libc::close(fd) };
    }
}

extern "C" fn exit_on_signal(_: libc::c_int) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { libc::_exit(0) }
}

/// Blocks SIGUSR1 until the shim handles it: between the fork and the handler's installation
/// (after an exec), the default action would end the shim.
///
/// # Safety
/// Async-signal-safe (sigprocmask).
pub unsafe fn hold_sigusr1() {
    let set = signal_set(&[libc::SIGUSR1]);
    // SAFETY: sigprocmask on a stack value.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Installs the SIGUSR1 handler (closing the kept stdin writer at `keep`, if any), then lets a
/// SIGUSR1 held by [`hold_sigusr1`] through.
unsafe fn handle_sigusr1(keep: Option<libc::c_int>) {
    // SAFETY: sigaction and sigprocmask on stack values.
    unsafe {
        if let Some(fd) = keep {
            STDIN_KEEP.store(fd, Ordering::SeqCst);
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = close_stdin_keep as *const () as usize;
        libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut());
        let set = signal_set(&[libc::SIGUSR1]);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Writes a non-negative code as decimal digits into `buf` without allocating.
pub fn format_code(code: i32, buf: &mut [u8; 12]) -> &[u8] {
    let mut n = code.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Closes every descriptor from `first` on.
///
/// # Safety
/// Async-signal-safe; the caller owns no descriptor at or above `first` that it still uses.
pub unsafe fn close_from(first: libc::c_int) {
    // SAFETY: closing descriptors is async-signal-safe; close_range may be missing on old kernels.
    unsafe {
        if libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, 0) != 0 {
            for fd in first..4096 {
                libc::close(fd);
            }
        }
    }
}

/// Writes `code` to `exit_file` and ends with it.
unsafe fn exit_with(code: i32, exit_file: &CStr) -> ! {
    // SAFETY: open, write, close on a stack buffer; _exit.
    unsafe {
        let mut buf = [0u8; 12];
        let text = format_code(code, &mut buf);
        let fd = libc::open(exit_file.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC, 0o644);
        if fd >= 0 {
            libc::write(fd, text.as_ptr().cast(), text.len());
            libc::close(fd);
        }
        libc::_exit(code)
    }
}

/// How a wait status reads as an exit code: 128 + signal for a signal death; `None` for a stop.
fn exit_code(status: libc::c_int) -> Option<i32> {
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Some(128 + libc::WTERMSIG(status))
    } else {
        None
    }
}

/// The process runtime's shim for the container process `child` (PID 1 of its namespaces).
///
/// Descriptors: 0 the container's stdin (typed into the terminal of a container on one), 1 the
/// log file, 3 the container's stdout pipe or, with `terminal`, the terminal's controlling side,
/// 4 its stderr pipe (none on a terminal), 5 with `stdin_keep` the kept stdin writer.
///
/// # Safety
/// Async-signal-safe, no allocation; `child` is this process's child.
pub unsafe fn run_process(child: libc::pid_t, exit_file: &CStr, terminal: bool, stdin_keep: bool) -> ! {
    // SAFETY (whole function): async-signal-safe calls on our own descriptors.
    unsafe {
        handle_sigusr1(stdin_keep.then_some(5));
        libc::prctl(libc::PR_SET_NAME, c"shepherd-shim".as_ptr(), 0, 0, 0);
        let (err, input) = if terminal { (-1, 0) } else { (4, -1) };
        if terminal {
            // Typing into a terminal whose program does not read must not stall its output:
            // what does not fit is dropped instead.
            libc::fcntl(3, libc::F_SETFL, libc::fcntl(3, libc::F_GETFL) | libc::O_NONBLOCK);
        }
        copy_output(3, err, input, 1, child);
        let mut status: libc::c_int = 0;
        let code = loop {
            let r = libc::waitpid(child, &mut status, 0);
            if r == child {
                match exit_code(status) {
                    Some(code) => break code,
                    None => continue,
                }
            }
            if r < 0 && *libc::__errno_location() != libc::EINTR {
                break 255;
            }
        };
        exit_with(code, exit_file)
    }
}

/// The oci runtime's shim (a child subreaper) for `runc`, which it started with `runc run
/// --detach`: reports runc's exit code, then waits for the container's init, whose pid runc
/// writes to `pid_file`.
///
/// Descriptors: 0 the container's stdin pipe (typed into the terminal of a container on one),
/// 1 and 2 the log file, 3 the pipe runc's exit code is reported on, 4 and 5 the pipes runc hands
/// the container as stdout and stderr, 6 with `stdin_keep` the kept stdin writer, 7 with
/// `console` the socket runc hands the terminal over on.
///
/// # Safety
/// Async-signal-safe, no allocation; `runc` is this process's child.
pub unsafe fn run_oci(runc: libc::pid_t, exit_file: &CStr, pid_file: &CStr, stdin_keep: bool, console: bool) -> ! {
    // SAFETY (whole function): async-signal-safe calls on our own descriptors and stack buffers.
    unsafe {
        // The agent's SIGUSR1 says the first attach has ended.
        handle_sigusr1(stdin_keep.then_some(6));
        libc::prctl(libc::PR_SET_NAME, c"shepherd-shim".as_ptr(), 0, 0, 0);
        // The container's output becomes CRI records: while runc starts it, then until its init
        // ends (its PID namespace, and with it every writer of the pipes, ends then too).
        copy_output(4, 5, -1, 1, runc);
        let mut container: Option<i32> = None;
        while let Some((pid, code)) = reap_any() {
            if pid == runc {
                let bytes = code.to_ne_bytes();
                libc::write(3, bytes.as_ptr().cast(), bytes.len());
                libc::close(3);
                break;
            }
            container = Some(code);
        }
        let terminal = if console { receive_terminal(7) } else { -1 };
        libc::close(7);
        if let Some(init) = read_pid(pid_file) {
            if terminal >= 0 {
                // As in the process runtime's shim: typing into a terminal whose program does
                // not read must not stall its output, so what does not fit is dropped.
                libc::fcntl(terminal, libc::F_SETFL, libc::fcntl(terminal, libc::F_GETFL) | libc::O_NONBLOCK);
                copy_output(terminal, -1, 0, 1, init);
            } else {
                copy_output(4, 5, -1, 1, init);
            }
        }
        libc::close(4);
        libc::close(5);
        while let Some((_, code)) = reap_any() {
            container = Some(code);
        }
        let Some(code) = container else { libc::_exit(255) };
        exit_with(code, exit_file)
    }
}

/// A signal set of `signals` (async-signal-safe: sigemptyset and sigaddset on a stack value).
fn signal_set(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: a sigset on the stack, emptied before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        set
    }
}

/// SIGTERM and SIGINT, the signals that end [`pause`].
fn stop_signals() -> libc::sigset_t {
    signal_set(&[libc::SIGTERM, libc::SIGINT])
}

/// Holds SIGTERM and SIGINT until [`pause`] handles them. Called in the container's process
/// before the agent can know its PID: the first process of a PID namespace drops a signal it has
/// no handler for unless the signal is blocked, so a stop sent between the exec and `pause`'s
/// handler would otherwise be lost (and the container killed only when its grace period ends).
/// The mask and a pending signal survive the exec.
///
/// # Safety
/// Async-signal-safe.
pub unsafe fn hold_stop_signals() {
    let set = stop_signals();
    // SAFETY: sigprocmask on a stack value.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// The idle process of a container of the built-in `minimal` image without a command: waits
/// until SIGTERM or SIGINT ends it (as PID 1 of its namespace it would otherwise ignore them).
/// A stop signal held by [`hold_stop_signals`] is let through once the handler is in place.
///
/// # Safety
/// Async-signal-safe.
pub unsafe fn pause() -> ! {
    // SAFETY: sigaction and sigprocmask on stack values; pause.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = exit_on_signal as *const () as usize;
        libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut());
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut());
        let set = stop_signals();
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        loop {
            libc::pause();
        }
    }
}

/// Replaces this process with the shim program `program` in process mode (see [`run_process`]);
/// returns only if the exec failed. The environment is left empty: the shim needs none.
///
/// # Safety
/// Async-signal-safe, no allocation; the descriptors are laid out as [`run_process`] says.
pub unsafe fn exec_process(program: &CStr, child: libc::pid_t, exit_file: &CStr, terminal: bool, stdin_keep: bool) {
    let mut pid = [0u8; 13];
    let flags = match (terminal, stdin_keep) {
        (false, false) => c"-",
        (true, false) => c"t",
        (false, true) => c"k",
        (true, true) => c"tk",
    };
    // SAFETY: every pointer points at a NUL-terminated string alive until the exec.
    unsafe {
        let argv = [
            program.as_ptr(),
            c"process".as_ptr(),
            pid_arg(child, &mut pid),
            exit_file.as_ptr(),
            flags.as_ptr(),
            std::ptr::null(),
        ];
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
    }
}

/// Replaces this process with the shim program `program` in oci mode (see [`run_oci`]); returns
/// only if the exec failed.
///
/// # Safety
/// Async-signal-safe, no allocation; the descriptors are laid out as [`run_oci`] says, and the
/// caller is a child subreaper (which an exec keeps).
pub unsafe fn exec_oci(program: &CStr, runc: libc::pid_t, exit_file: &CStr, pid_file: &CStr, stdin_keep: bool, console: bool) {
    let mut pid = [0u8; 13];
    let flags = match (stdin_keep, console) {
        (false, false) => c"-",
        (true, false) => c"k",
        (false, true) => c"c",
        (true, true) => c"kc",
    };
    // SAFETY: as in exec_process.
    unsafe {
        let argv = [
            program.as_ptr(),
            c"oci".as_ptr(),
            pid_arg(runc, &mut pid),
            exit_file.as_ptr(),
            pid_file.as_ptr(),
            flags.as_ptr(),
            std::ptr::null(),
        ];
        let envp: [*const libc::c_char; 1] = [std::ptr::null()];
        libc::execve(program.as_ptr(), argv.as_ptr(), envp.as_ptr());
    }
}

/// `pid` as a NUL-terminated decimal string in `buf`.
fn pid_arg(pid: libc::pid_t, buf: &mut [u8; 13]) -> *const libc::c_char {
    let mut digits = [0u8; 12];
    let text = format_code(pid, &mut digits);
    buf[..text.len()].copy_from_slice(text);
    buf[text.len()] = 0;
    buf.as_ptr().cast()
}

/// Waits for any child to end: its pid and exit code (128 + signal for a signal death); `None`
/// once no child is left.
///
/// # Safety
/// Async-signal-safe (waitpid only).
unsafe fn reap_any() -> Option<(libc::pid_t, i32)> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waitpid with a valid status pointer.
        let r = unsafe { libc::waitpid(-1, &mut status, 0) };
        if r < 0 {
            // SAFETY: reading errno.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return None;
        }
        if let Some(code) = exit_code(status) {
            return Some((r, code));
        }
    }
}

/// The pid in `file` (runc's pid file of the container init).
///
/// # Safety
/// Async-signal-safe (open, read, close on a stack buffer).
unsafe fn read_pid(file: &CStr) -> Option<libc::pid_t> {
    // SAFETY (whole function): open, read and close on a stack buffer.
    unsafe {
        let fd = libc::open(file.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let mut buf = [0u8; 16];
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        parse_pid(&buf[..usize::try_from(n).ok()?])
    }
}

fn parse_pid(text: &[u8]) -> Option<libc::pid_t> {
    let mut pid: libc::pid_t = 0;
    for d in text.iter().take_while(|d| d.is_ascii_digit()) {
        pid = pid.checked_mul(10)?.checked_add(libc::pid_t::from(d - b'0'))?;
    }
    (pid > 0).then_some(pid)
}

/// The terminal's controlling side, which runc sent on the console socket `listener` (already
/// connected by the time runc has ended: the connection waits in the backlog); -1 without one.
///
/// # Safety
/// Async-signal-safe (accept4, recvmsg, close); no allocation.
pub unsafe fn receive_terminal(listener: libc::c_int) -> libc::c_int {
    // SAFETY (whole function): system calls on stack buffers that outlive them.
    unsafe {
        let conn = loop {
            let c = libc::accept4(listener, std::ptr::null_mut(), std::ptr::null_mut(), libc::SOCK_CLOEXEC);
            if c >= 0 || *libc::__errno_location() != libc::EINTR {
                break c;
            }
        };
        if conn < 0 {
            return -1;
        }
        // runc sends the terminal's name as the data and the descriptor as SCM_RIGHTS.
        let mut name = [0u8; 256];
        let mut iov = libc::iovec { iov_base: name.as_mut_ptr().cast(), iov_len: name.len() };
        let mut control = [0u64; 8];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = loop {
            let n = libc::recvmsg(conn, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n >= 0 || *libc::__errno_location() != libc::EINTR {
                break n;
            }
        };
        libc::close(conn);
        if n < 0 {
            return -1;
        }
        let header = libc::CMSG_FIRSTHDR(&msg);
        if header.is_null() || (*header).cmsg_level != libc::SOL_SOCKET || (*header).cmsg_type != libc::SCM_RIGHTS {
            return -1;
        }
        std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>())
    }
}

/// The `shepherd-shim` program: `start <exit file>`, `process <child pid> <exit file> <-|t|k|tk>`, `oci <runc
/// pid> <exit file> <pid file> <-|k|c|kc>` or `pause`, started by the agent with the descriptors
/// each mode expects (see [`start::main`], [`run_process`], [`run_oci`], [`pause`]).
pub fn main() -> ! {
    let args: Vec<std::ffi::CString> = std::env::args_os()
        .skip(1)
        .filter_map(|a| std::ffi::CString::new(std::os::unix::ffi::OsStringExt::into_vec(a)).ok())
        .collect();
    let arg = |i: usize| args.get(i).map(|a| a.as_c_str());
    let flag = |i: usize, f: u8| arg(i).is_some_and(|a| a.to_bytes().contains(&f));
    let pid = |i: usize| arg(i).and_then(|a| parse_pid(a.to_bytes()));
    // SAFETY: the agent laid out the descriptors as each mode expects, and the pids are its children.
    unsafe {
        match (arg(0).map(CStr::to_bytes), args.len()) {
            (Some(b"process"), 4) => {
                if let (Some(child), Some(exit_file)) = (pid(1), arg(2)) {
                    run_process(child, exit_file, flag(3, b't'), flag(3, b'k'))
                }
            }
            (Some(b"oci"), 5) => {
                if let (Some(runc), Some(exit_file), Some(pid_file)) = (pid(1), arg(2), arg(3)) {
                    run_oci(runc, exit_file, pid_file, flag(4, b'k'), flag(4, b'c'))
                }
            }
            // The argument is the container's exit file, which names the container in `ps`.
            (Some(b"start"), 2) => start::main(),
            (Some(b"pause"), 1) => pause(),
            _ => {}
        }
    }
    eprintln!(
        "usage: {PROGRAM} start EXIT_FILE | process CHILD EXIT_FILE FLAGS | oci RUNC_PID EXIT_FILE PID_FILE FLAGS | pause\n\
         (started by the Shepherd node agent for each container, with the descriptors each mode expects)"
    );
    std::process::exit(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_formatted_without_allocating() {
        let mut buf = [0u8; 12];
        assert_eq!(format_code(0, &mut buf), b"0");
        assert_eq!(format_code(137, &mut buf), b"137");
        assert_eq!(format_code(255, &mut buf), b"255");
    }

    /// Starts a process that is PID 1 of a PID namespace of its own, holding the stop signals if
    /// `hold`, and that waits 300 ms without a handler before [`pause`]; sends it SIGTERM in that
    /// window. Returns whether it ended within two seconds (it is killed otherwise).
    fn ends_on_an_early_sigterm(hold: bool) -> bool {
        // SAFETY (whole function): the forked children make async-signal-safe calls only (unshare,
        // fork, write, nanosleep, waitpid, sigprocmask, sigaction, pause, _exit).
        unsafe {
            let (mut pid_pipe, mut ready_pipe) = ([0; 2], [0; 2]);
            assert_eq!(libc::pipe2(pid_pipe.as_mut_ptr(), libc::O_CLOEXEC), 0);
            assert_eq!(libc::pipe2(ready_pipe.as_mut_ptr(), libc::O_CLOEXEC), 0);
            let outer = libc::fork();
            assert!(outer >= 0, "fork");
            if outer == 0 {
                if libc::unshare(libc::CLONE_NEWPID) != 0 {
                    libc::_exit(3);
                }
                let init = libc::fork();
                if init == 0 {
                    if hold {
                        hold_stop_signals();
                    }
                    libc::write(ready_pipe[1], b"r".as_ptr().cast(), 1);
                    let window = libc::timespec { tv_sec: 0, tv_nsec: 300_000_000 };
                    libc::nanosleep(&window, std::ptr::null_mut());
                    pause();
                }
                libc::write(pid_pipe[1], init.to_ne_bytes().as_ptr().cast(), 4);
                let mut status = 0;
                libc::waitpid(init, &mut status, 0);
                libc::_exit(if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { 1 });
            }
            libc::close(pid_pipe[1]);
            libc::close(ready_pipe[1]);
            let mut pid = [0u8; 4];
            assert_eq!(libc::read(pid_pipe[0], pid.as_mut_ptr().cast(), 4), 4, "the namespace's first process started");
            let init = libc::pid_t::from_ne_bytes(pid);
            let mut ready = [0u8; 1];
            assert_eq!(libc::read(ready_pipe[0], ready.as_mut_ptr().cast(), 1), 1);
            libc::kill(init, libc::SIGTERM);
            let mut status = 0;
            let mut ended = false;
            for _ in 0..200 {
                if libc::waitpid(outer, &mut status, libc::WNOHANG) == outer {
                    ended = true;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            if !ended {
                libc::kill(init, libc::SIGKILL);
                libc::waitpid(outer, &mut status, 0);
            }
            libc::close(pid_pipe[0]);
            libc::close(ready_pipe[0]);
            assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) != 3, "unshare(CLONE_NEWPID) failed");
            ended
        }
    }

    #[test]
    fn a_stop_sent_before_pause_handles_it_still_ends_the_first_process_of_a_pid_namespace() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root: it makes PID namespaces (CLONE_NEWPID)");
        // The kernel drops a signal that the first process of a PID namespace has no handler for:
        // without the hold, the stop is lost.
        assert!(!ends_on_an_early_sigterm(false), "an early SIGTERM without the hold should have been dropped");
        assert!(ends_on_an_early_sigterm(true), "a held SIGTERM ends pause once its handler is in place");
    }

    #[test]
    fn pids_are_passed_as_nul_terminated_decimals_and_read_back() {
        let mut buf = [0u8; 13];
        let p = pid_arg(4_194_304, &mut buf);
        // SAFETY: pid_arg wrote a NUL-terminated string into `buf`.
        let text = unsafe { CStr::from_ptr(p) };
        assert_eq!(text.to_bytes(), b"4194304");
        assert_eq!(parse_pid(text.to_bytes()), Some(4_194_304));
        assert_eq!(parse_pid(b"123\n"), Some(123));
        assert_eq!(parse_pid(b"0"), None);
        assert_eq!(parse_pid(b"99999999999"), None);
    }
}
