//! The channels of Kubernetes' remote command protocol (stdin, stdout, stderr, error, resize),
//! independent of the transport (WebSocket or SPDY) carrying them, and the exec and attach
//! sessions that run over them.

use std::io::SeekFrom;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::debug;

use crate::exec::{self, ExecRequest, TermSize};
use crate::logs::{LogQuery, Renderer};

pub(crate) const STDIN: u8 = 0;
pub(crate) const STDOUT: u8 = 1;
pub(crate) const STDERR: u8 = 2;
pub(crate) const ERROR: u8 = 3;
pub(crate) const RESIZE: u8 = 4;

/// What a session sends to the client.
#[derive(Debug)]
pub(crate) enum Outgoing {
    Data(u8, Bytes),
    /// The final status (the error channel's one message); the transport closes after it.
    Finish(Value),
}

/// The session's side of the channels; the transport holds the other ends.
pub(crate) struct Channels {
    /// The client's stdin; ends when the client closes it (or goes away).
    pub stdin: mpsc::Receiver<Bytes>,
    pub resize: mpsc::Receiver<TermSize>,
    pub out: mpsc::Sender<Outgoing>,
    /// Becomes true when the client has gone away.
    pub gone: watch::Receiver<bool>,
}

/// The transport's side of the channels.
pub(crate) struct TransportEnds {
    pub stdin: Option<mpsc::Sender<Bytes>>,
    pub resize: mpsc::Sender<TermSize>,
    pub out: mpsc::Receiver<Outgoing>,
    pub gone: watch::Sender<bool>,
}

impl TransportEnds {
    /// Routes one message the client sent on channel `ch`.
    pub async fn incoming(&mut self, ch: u8, data: Bytes) {
        match ch {
            STDIN => {
                if let Some(tx) = &self.stdin
                    && tx.send(data).await.is_err()
                {
                    self.stdin = None;
                }
            }
            RESIZE => match serde_json::from_slice::<TermSize>(&data) {
                Ok(size) => {
                    let _ = self.resize.try_send(size);
                }
                Err(e) => debug!(error = %e, "ignoring a malformed resize message"),
            },
            _ => {}
        }
    }

    /// The client closed its stdin.
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }
}

/// A connected pair of channel ends.
pub(crate) fn channels() -> (Channels, TransportEnds) {
    let (stdin_tx, stdin_rx) = mpsc::channel(16);
    let (resize_tx, resize_rx) = mpsc::channel(4);
    let (out_tx, out_rx) = mpsc::channel(16);
    let (gone_tx, gone_rx) = watch::channel(false);
    (
        Channels { stdin: stdin_rx, resize: resize_rx, out: out_tx, gone: gone_rx },
        TransportEnds { stdin: Some(stdin_tx), resize: resize_tx, out: out_rx, gone: gone_tx },
    )
}

/// The error channel's message for a command that ended with `code`, as the kubelet sends it.
pub(crate) fn exit_status(argv: &[String], code: i32) -> Value {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command {argv:?}, exit code {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// The error channel's message for a session that could not run.
pub(crate) fn failure(message: impl Into<String>) -> Value {
    json!({"metadata": {}, "status": "Failure", "message": message.into(), "reason": "InternalError", "code": 500})
}

async fn gone(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|g| *g).await;
}

/// Copies a reader to channel `ch` until it ends.
async fn pump_out(mut from: impl tokio::io::AsyncRead + Unpin, ch: u8, out: mpsc::Sender<Outgoing>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if out.send(Outgoing::Data(ch, Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Runs `req` in the container whose main process is `pid`, over `chans`, until the command ends
/// (its status goes to the error channel) or the client goes away (the command is killed).
pub(crate) async fn run_exec(pid: u32, req: ExecRequest, mut chans: Channels) {
    let spawned = match exec::spawn(pid, &req) {
        Ok(s) => s,
        Err(e) => {
            let program = req.argv.first().map(String::as_str).unwrap_or("");
            let why = match e.kind() {
                std::io::ErrorKind::NotFound => format!("exec: {program:?}: executable file not found in $PATH"),
                _ => format!("starting {:?}: {e}", req.argv),
            };
            let _ = chans.out.send(Outgoing::Finish(failure(format!("failed to exec in container: {why}")))).await;
            return;
        }
    };
    let mut child = spawned.child;
    let helper = child.id().unwrap_or(0);
    let mut pumps = tokio::task::JoinSet::new();
    let mut stdin_writer: Option<Box<dyn tokio::io::AsyncWrite + Unpin + Send>> = None;
    let mut pty_for_resize = None;
    if let Some(pty) = spawned.pty {
        let reader = match pty.try_clone() {
            Ok(r) => r,
            Err(e) => {
                exec::kill_tree(helper);
                let _ = child.wait().await;
                let _ = chans.out.send(Outgoing::Finish(failure(format!("failed to set up the terminal: {e}")))).await;
                return;
            }
        };
        if let Ok(w) = pty.try_clone() {
            stdin_writer = Some(Box::new(tokio::fs::File::from_std(w)));
        }
        pty_for_resize = Some(pty);
        pumps.spawn(pump_out(tokio::fs::File::from_std(reader), STDOUT, chans.out.clone()));
    } else {
        if let Some(w) = child.stdin.take() {
            stdin_writer = Some(Box::new(w));
        }
        if let Some(r) = child.stdout.take() {
            pumps.spawn(pump_out(r, STDOUT, chans.out.clone()));
        }
        if let Some(r) = child.stderr.take() {
            pumps.spawn(pump_out(r, STDERR, chans.out.clone()));
        }
    }
    let mut stdin = chans.stdin;
    let feeder = tokio::spawn(async move {
        let Some(mut w) = stdin_writer else { return };
        while let Some(data) = stdin.recv().await {
            if w.write_all(&data).await.is_err() || w.flush().await.is_err() {
                return;
            }
        }
        let _ = w.shutdown().await;
    });
    let mut resize = chans.resize;
    let resizer = tokio::spawn(async move {
        while let Some(size) = resize.recv().await {
            if let Some(pty) = &pty_for_resize {
                exec::resize(pty, size);
            }
        }
    });
    let status = tokio::select! {
        s = child.wait() => s,
        () = gone(&mut chans.gone) => {
            debug!(helper, "client went away: killing the exec");
            exec::kill_tree(helper);
            let _ = child.wait().await;
            feeder.abort();
            resizer.abort();
            return;
        }
    };
    // Output written just before the end is still in the pipes: read it, but do not wait for a
    // background process that keeps them open.
    let _ = tokio::time::timeout(exec::OUTPUT_DRAIN, async { while pumps.join_next().await.is_some() {} }).await;
    pumps.abort_all();
    feeder.abort();
    resizer.abort();
    // What the command left running in the background keeps running, as with any runtime's exec.
    let code = match status {
        Ok(s) => s.code().unwrap_or(137),
        Err(e) => {
            let _ = chans.out.send(Outgoing::Finish(failure(format!("waiting for the command: {e}")))).await;
            return;
        }
    };
    let _ = chans.out.send(Outgoing::Finish(exit_status(&req.argv, code))).await;
}

/// What an attach connects to.
pub(crate) struct AttachTarget {
    /// The container's log file, whose new records are its output.
    pub log: PathBuf,
    /// The container's stdin pipe, when the client sends stdin, and what to do once the client's
    /// stdin has ended (or the client has gone).
    pub stdin: Option<(PathBuf, Box<dyn FnOnce() + Send>)>,
    /// The host pid of the container's main process, when the client has a terminal: its stdin,
    /// if that is a terminal, is resized with the client's.
    pub terminal_of: Option<u32>,
}

/// Copies what the client types into the container's stdin pipe. The pipe stays open after the
/// client goes (the container holds it too), so a later attach continues the same stdin.
async fn feed_stdin(pipe: PathBuf, mut stdin: mpsc::Receiver<Bytes>) {
    let mut w = match tokio::fs::OpenOptions::new().write(true).open(&pipe).await {
        Ok(w) => w,
        Err(e) => {
            debug!(error = %e, pipe = %pipe.display(), "cannot open the container's stdin");
            return;
        }
    };
    while let Some(data) = stdin.recv().await {
        if w.write_all(&data).await.is_err() || w.flush().await.is_err() {
            return;
        }
    }
}

/// Applies the client's terminal size to the terminal that is the stdin of process `pid`.
async fn follow_resizes(pid: u32, mut resize: mpsc::Receiver<TermSize>) {
    let fd0 = format!("/proc/{pid}/fd/0");
    let is_terminal = std::fs::read_link(&fd0).is_ok_and(|t| t.starts_with("/dev/pts/"));
    let terminal = if is_terminal {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_NOCTTY).open(&fd0).ok()
    } else {
        None
    };
    while let Some(size) = resize.recv().await {
        if let Some(t) = &terminal {
            exec::resize(t, size);
        }
    }
}

/// How long an attach waits, after its container ended, for the shim's exit file (the sign that
/// the last output is in the log) before it ends anyway (a shim killed before writing it).
const DRAIN_WAIT: Duration = Duration::from_secs(2);

/// Streams a container's output from now on (its log file), and the client's input to its
/// stdin, until the container ends (and its output is all sent) or the client goes away.
pub(crate) async fn run_attach(target: AttachTarget, alive: impl Fn() -> bool + Send + 'static, mut chans: Channels) {
    let AttachTarget { log, stdin, terminal_of } = target;
    let interactive = stdin.is_some();
    let feeder = stdin.map(|(pipe, ended)| {
        let ended = CallOnDrop(Some(ended));
        AbortOnDrop(tokio::spawn(async move {
            feed_stdin(pipe, chans.stdin).await;
            drop(ended);
        }))
    });
    let resizer = terminal_of.map(|pid| AbortOnDrop(tokio::spawn(follow_resizes(pid, chans.resize))));
    let _tasks = (feeder, resizer);
    // Someone typing sees the echo sooner.
    let poll = Duration::from_millis(if interactive { 20 } else { 100 });
    let mut offset = tokio::fs::metadata(&log).await.map(|m| m.len()).unwrap_or(0);
    let mut render = Renderer::new(&LogQuery::default());
    // The shim writes the exit file beside the log once it has copied the container's last output
    // into it: the container's end alone does not mean its output is all in the log.
    let exit_file = log.with_file_name("exit");
    let mut ended_at: Option<Instant> = None;
    loop {
        // Both looked at before the log's length, so output written before them is in it.
        let running = alive();
        let drained = !running && tokio::fs::try_exists(&exit_file).await.unwrap_or(false);
        let len = tokio::fs::metadata(&log).await.map(|m| m.len()).unwrap_or(0);
        if len < offset {
            offset = 0;
        }
        if len > offset {
            let mut buf = Vec::new();
            let read = async {
                let mut f = tokio::fs::File::open(&log).await?;
                f.seek(SeekFrom::Start(offset)).await?;
                (&mut f).take(len - offset).read_to_end(&mut buf).await
            };
            if read.await.is_ok() {
                // Whole records only; a partly written one is read again next time.
                let whole = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                offset += whole as u64;
                let text = render.all(&buf[..whole]);
                if !text.is_empty() && chans.out.send(Outgoing::Data(STDOUT, Bytes::from(text))).await.is_err() {
                    return;
                }
            }
        } else if !running && (drained || ended_at.get_or_insert_with(Instant::now).elapsed() >= DRAIN_WAIT) {
            let _ = chans.out.send(Outgoing::Finish(json!({"metadata": {}, "status": "Success"}))).await;
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            () = gone(&mut chans.gone) => return,
        }
    }
}

/// Runs a closure when dropped, also when the task holding it is aborted.
struct CallOnDrop(Option<Box<dyn FnOnce() + Send>>);

impl Drop for CallOnDrop {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Ends a helper task with the session that started it.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_non_zero_exit_is_reported_with_its_code_as_the_kubelet_does() {
        let argv = vec!["sh".to_string(), "-c".to_string(), "exit 3".to_string()];
        let s = exit_status(&argv, 3);
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0], json!({"reason": "ExitCode", "message": "3"}));
        assert_eq!(exit_status(&argv, 0)["status"], "Success");
    }

    /// What an attach sends until it finishes.
    async fn attach_output(log: PathBuf, alive: impl Fn() -> bool + Send + 'static) -> (String, bool) {
        let (out, mut sent) = mpsc::channel(16);
        let (_stdin, stdin) = mpsc::channel(1);
        let (_resize, resize) = mpsc::channel(1);
        let (_gone, gone) = watch::channel(false);
        let target = AttachTarget { log, stdin: None, terminal_of: None };
        tokio::spawn(run_attach(target, alive, Channels { stdin, resize, out, gone }));
        let mut text = String::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), sent.recv()).await {
                Ok(Some(Outgoing::Data(_, data))) => text.push_str(&String::from_utf8_lossy(&data)),
                Ok(Some(Outgoing::Finish(_))) => return (text, true),
                Ok(None) | Err(_) => return (text, false),
            }
        }
    }

    #[tokio::test]
    async fn an_attach_to_an_ended_container_sends_what_its_shim_copies_before_the_exit_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("current.log");
        std::fs::write(&log, b"").expect("log");
        // The container has ended; its shim still copies its last line into the log, then writes
        // the exit file.
        let shim = {
            let (log, exit) = (log.clone(), dir.path().join("exit"));
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let mut f = std::fs::OpenOptions::new().append(true).open(&log).expect("open log");
                std::io::Write::write_all(&mut f, b"2026-12-01T00:00:00.000000000Z stdout F last words\n").expect("write");
                std::fs::write(exit, b"0").expect("exit file");
            })
        };
        let (text, finished) = attach_output(log, || false).await;
        shim.await.expect("shim");
        assert!(finished, "the attach finishes");
        assert_eq!(text, "last words\n", "the output copied after the container ended reaches the client");
    }

    #[tokio::test]
    async fn an_attach_to_an_ended_container_whose_shim_never_writes_the_exit_file_still_finishes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("current.log");
        std::fs::write(&log, b"").expect("log");
        let started = Instant::now();
        let (text, finished) = attach_output(log, || false).await;
        assert!(finished && text.is_empty());
        assert!(started.elapsed() >= DRAIN_WAIT, "it waited for the output first");
    }
}
