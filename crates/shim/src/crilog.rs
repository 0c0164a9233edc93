//! The writer of container log files in the CRI format, one record per line: `<RFC 3339 time>
//! <stdout|stderr> <F|P> <text>`, `P` marking a piece of a longer line. It runs in a shim, which
//! may be a forked copy of a multi-threaded agent, so it only makes async-signal-safe calls and
//! never allocates.

/// The longest piece of a line one record holds; longer lines are cut into `P` records.
const PIECE: usize = 16 * 1024;

/// Formats `secs.nanos` since the epoch as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ` into `out`.
fn format_time(secs: i64, nanos: i64, out: &mut [u8; 30]) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (the proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut put = |at: usize, width: usize, mut v: i64| {
        for i in (0..width).rev() {
            out[at + i] = b'0' + (v % 10) as u8;
            v /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, month);
    put(8, 2, day);
    put(11, 2, rem / 3600);
    put(14, 2, rem / 60 % 60);
    put(17, 2, rem % 60);
    put(20, 9, nanos);
    out[4] = b'-';
    out[7] = b'-';
    out[10] = b'T';
    out[13] = b':';
    out[16] = b':';
    out[19] = b'.';
    out[29] = b'Z';
}

/// Writes one record to `fd` with a single `write` (records stay whole in an append-mode file).
///
/// # Safety
/// Async-signal-safe: clock_gettime and write on a stack buffer.
unsafe fn write_record(fd: libc::c_int, stream: &[u8], partial: bool, text: &[u8]) {
    let mut ts: libc::timespec = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    let mut time = [0u8; 30];
    format_time(ts.tv_sec, ts.tv_nsec, &mut time);
    let mut rec = [0u8; PIECE + 64];
    let mut n = 0;
    let parts: [&[u8]; 6] = [&time, b" ", stream, if partial { b" P " } else { b" F " }, text, b"\n"];
    for part in parts {
        rec[n..n + part.len()].copy_from_slice(part);
        n += part.len();
    }
    let mut done = 0;
    while done < n {
        // SAFETY: writes from a live stack buffer.
        let w = unsafe { libc::write(fd, rec[done..].as_ptr().cast(), n - done) };
        if w <= 0 {
            // SAFETY: reading errno.
            if w < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return;
        }
        done += w as usize;
    }
}

/// One output stream being turned into records.
struct Pending {
    fd: libc::c_int,
    name: &'static [u8],
    buf: [u8; PIECE],
    len: usize,
    open: bool,
    /// A terminal: what arrives is logged at once, a prompt without its newline included.
    eager: bool,
}

impl Pending {
    /// Writes the complete lines in the buffer, and the buffer itself when it is full of one piece.
    unsafe fn emit(&mut self, log: libc::c_int, eof: bool) {
        let mut start = 0;
        while let Some(i) = self.buf[start..self.len].iter().position(|b| *b == b'\n') {
            // SAFETY: see write_record.
            unsafe { write_record(log, self.name, false, &self.buf[start..start + i]) };
            start += i + 1;
        }
        if start > 0 {
            self.buf.copy_within(start..self.len, 0);
            self.len -= start;
        }
        if self.len == PIECE || ((eof || self.eager) && self.len > 0) {
            // SAFETY: see write_record.
            unsafe { write_record(log, self.name, true, &self.buf[..self.len]) };
            self.len = 0;
        }
    }

    /// Reads what is available; false at the end of the stream.
    unsafe fn read(&mut self, log: libc::c_int) -> bool {
        // SAFETY: reads into the unused tail of the buffer.
        let n = unsafe { libc::read(self.fd, self.buf[self.len..].as_mut_ptr().cast(), PIECE - self.len) };
        if n > 0 {
            self.len += n as usize;
            // SAFETY: see emit.
            unsafe { self.emit(log, false) };
            return true;
        }
        // SAFETY: reading errno.
        let errno = unsafe { *libc::__errno_location() };
        if n < 0 && (errno == libc::EINTR || errno == libc::EAGAIN) {
            return true;
        }
        // SAFETY: see emit.
        unsafe { self.emit(log, true) };
        false
    }
}

/// Copies a container's stdout and stderr pipes into `log` as records until both end, or until
/// `child` has exited and what it left in the pipes is read (a process it left behind outside a
/// PID namespace must not keep the shim from reporting the exit).
///
/// For a container on a terminal, `stdout` is the terminal's controlling side, `stderr` is -1,
/// and what arrives on `input` (the container's stdin pipe) is typed into the terminal.
///
/// # Safety
/// Runs in a forked child: async-signal-safe calls only, no allocation.
pub unsafe fn copy_output(
    stdout: libc::c_int,
    stderr: libc::c_int,
    input: libc::c_int,
    log: libc::c_int,
    child: libc::pid_t,
) {
    let tty = stderr < 0;
    let mut input = input;
    let mut streams = [
        Pending { fd: stdout, name: b"stdout", buf: [0; PIECE], len: 0, open: true, eager: tty },
        Pending { fd: stderr, name: b"stderr", buf: [0; PIECE], len: 0, open: stderr >= 0, eager: false },
    ];
    let mut typed = [0u8; 4096];
    // SAFETY (whole body): poll, read, write, fcntl and the pidfd_open syscall on our descriptors.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, child, 0) as libc::c_int;
        let mut exited = false;
        while streams.iter().any(|s| s.open) && !exited {
            let mut fds = [
                libc::pollfd { fd: if streams[0].open { stdout } else { -1 }, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: if streams[1].open { stderr } else { -1 }, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: input, events: libc::POLLIN, revents: 0 },
            ];
            // Without a pidfd (old kernels), look at the child now and then.
            let timeout = if pidfd >= 0 { -1 } else { 200 };
            let r = libc::poll(fds.as_mut_ptr(), 4, timeout);
            if r < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                break;
            }
            for (i, s) in streams.iter_mut().enumerate() {
                if s.open && fds[i].revents != 0 {
                    s.open = s.read(log);
                }
            }
            if input >= 0 && fds[3].revents != 0 {
                let n = libc::read(input, typed.as_mut_ptr().cast(), typed.len());
                if n > 0 {
                    write_all(stdout, &typed[..n as usize]);
                } else if n == 0 || *libc::__errno_location() != libc::EINTR {
                    input = -1;
                }
            }
            if (pidfd >= 0 && fds[2].revents != 0) || (pidfd < 0 && r == 0 && !alive(child)) {
                exited = true;
            }
        }
        // The child is gone: take what is left in the pipes without waiting for more.
        for s in streams.iter_mut().filter(|s| s.open) {
            let flags = libc::fcntl(s.fd, libc::F_GETFL);
            libc::fcntl(s.fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
            loop {
                let before = s.len;
                let n = libc::read(s.fd, s.buf[s.len..].as_mut_ptr().cast(), PIECE - s.len);
                if n <= 0 {
                    break;
                }
                s.len = before + n as usize;
                s.emit(log, false);
            }
            s.emit(log, true);
        }
    }
}

/// Writes all of `data` to `fd`, giving up on an error other than an interruption.
///
/// # Safety
/// Async-signal-safe: write only.
unsafe fn write_all(fd: libc::c_int, data: &[u8]) {
    let mut done = 0;
    while done < data.len() {
        // SAFETY: writes from a live buffer.
        let w = unsafe { libc::write(fd, data[done..].as_ptr().cast(), data.len() - done) };
        if w <= 0 {
            // SAFETY: reading errno.
            if w < 0 && unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return;
        }
        done += w as usize;
    }
}

/// Whether `pid` (our child) has not exited yet, without reaping it.
unsafe fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: waitid with WNOWAIT only inspects; `info` is written by the kernel.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOHANG | libc::WNOWAIT) == 0
            && info.si_pid() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_formatted_as_rfc3339_with_nanoseconds() {
        let mut out = [0u8; 30];
        format_time(1_796_056_993, 5, &mut out);
        let text = std::str::from_utf8(&out).expect("ascii");
        assert_eq!(text, "2026-11-30T16:43:13.000000005Z");
        format_time(951_782_400, 0, &mut out);
        assert_eq!(&out[..10], b"2000-02-29");
    }
}
