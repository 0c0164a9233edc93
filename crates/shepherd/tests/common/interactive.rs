//! Driving interactive kubectl sessions: a terminal in tmux, and `attach -i` fed from a pipe.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::kubectl_command;

/// Polls `check` every 100 ms until it returns `Some`, or panics with `what` after `secs`.
fn eventually<T>(secs: u64, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `command` in a detached tmux session of its own (120x40) and reads its screen.
pub struct Terminal {
    socket: PathBuf,
    session: String,
}

impl Terminal {
    pub fn start(dir: &Path, name: &str, command: &str) -> Terminal {
        assert!(
            Command::new("tmux").arg("-V").output().is_ok(),
            "this test drives kubectl in a terminal and needs tmux (Debian package `tmux`)"
        );
        let t = Terminal { socket: dir.join(format!("tmux-{name}")), session: format!("shepherd-{name}-{}", std::process::id()) };
        let started = t.tmux(&["new-session", "-d", "-s", &t.session, "-x", "120", "-y", "40", command]);
        assert!(started.status.success(), "tmux: {}", String::from_utf8_lossy(&started.stderr));
        t
    }

    pub fn tmux(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux").arg("-S").arg(&self.socket).args(args).output().expect("tmux")
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-t", &self.session]).stdout).into_owned()
    }

    /// Resizes the terminal kubectl runs in, as a user dragging the window would.
    pub fn resize(&self, width: u16, height: u16) {
        let out = self.tmux(&["resize-window", "-t", &self.session, "-x", &width.to_string(), "-y", &height.to_string()]);
        assert!(out.status.success(), "tmux resize-window: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn type_line(&self, line: &str) {
        self.tmux(&["send-keys", "-t", &self.session, line, "Enter"]);
    }

    /// Types `line` (again, every few seconds: the first keys may come before the attach) until
    /// the screen shows a line starting with `answer`; returns that line.
    pub fn ask(&self, line: &str, answer: &str) -> String {
        let mut typed = Instant::now() - Duration::from_secs(10);
        eventually(60, &format!("{answer:?} on the screen"), || {
            if typed.elapsed() > Duration::from_secs(5) {
                self.type_line(line);
                typed = Instant::now();
            }
            self.screen().lines().find(|l| l.starts_with(answer)).map(str::to_string)
        })
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        self.tmux(&["kill-server"]);
    }
}

/// `kubectl attach -i` to `pod`'s `container`, typing `word` now and then (what is typed before
/// the attach is connected goes nowhere) until the output shows `got:<word>` (or 60 s pass);
/// returns the output.
pub fn attach_typing(bin: &Path, url: &str, pod: &str, container: &str, word: &str) -> String {
    let mut child = kubectl_command(bin, url)
        .args(["attach", "-i", pod, "-c", container])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("attach");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = child.stdout.take().expect("stdout");
    let want = format!("got:{word}");
    let reader = std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains(&want) {
            match stdout.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !reader.is_finished() && Instant::now() < deadline {
        use std::io::Write;
        let _ = writeln!(stdin, "{word}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let _ = child.kill();
    let _ = child.wait();
    reader.join().expect("reader")
}


/// What `kubectl attach -i` and `kubectl run -i` must do with kubectl `label` (`bin`) against a
/// pod `reader` whose container `r` echoes `got:<line>` for each line it reads and whose container
/// `deaf` has no stdin: typed lines reach `r`, attaching to `deaf` fails naming it, and `run -i
/// --rm` with `run_image` (the image flag and the shell command before `-c`) feeds a stdinOnce
/// container whose stdin ends with kubectl's.
pub fn check_attach_stdin(bin: &Path, url: &str, label: &str, run_image: &[&str]) {
    let word = format!("hello-{}", label.replace('.', "-"));
    let out = attach_typing(bin, url, "reader", "r", &word);
    assert!(out.contains(&format!("got:{word}")), "kubectl {label}: the container read what was typed: {out:?}");

    let (status, _, err) =
        super::run_with_stdin(kubectl_command(bin, url).args(["attach", "-i", "reader", "-c", "deaf"]), Some("x\n"));
    assert!(!status.success(), "kubectl {label}: attaching stdin to a container without one fails");
    assert!(err.contains("container deaf in pod reader has no stdin") && err.contains("stdin: true"), "kubectl {label}: {err}");

    // `kubectl run -i` makes a stdinOnce container: its stdin ends with kubectl's, so `cat`
    // ends, and so does the pod (deleted by --rm).
    let name = format!("once-{}", label.replace('.', "-"));
    let mut args = vec!["run", "-i", "--rm", "--restart=Never", name.as_str()];
    args.extend_from_slice(run_image);
    args.extend_from_slice(&["-c", "cat; echo done-reading"]);
    let (status, out, err) = super::run_with_stdin(kubectl_command(bin, url).args(&args), Some("piped-in\n"));
    assert!(status.success(), "kubectl {label}: run -i: {err}");
    assert!(out.contains("piped-in\ndone-reading"), "kubectl {label}: run -i printed {out:?}; stderr {err}");
}
