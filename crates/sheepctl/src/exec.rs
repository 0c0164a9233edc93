//! `sheepctl exec` and `sheepctl attach`: a command in a container (or a container's output) over
//! the pod's `exec`/`attach` subresource (WebSocket, `v5.channel.k8s.io`), with the local terminal
//! in raw mode and its size following the window for `-t`.

use std::os::fd::AsRawFd;

use futures::SinkExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{AttachParams, AttachedProcess, TerminalSize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::connection::Cluster;

pub struct ExecArgs {
    pub pod: String,
    pub container: Option<String>,
    pub stdin: bool,
    pub tty: bool,
    pub command: Vec<String>,
}

/// What `attach` connects to and how.
pub struct AttachArgs {
    pub pod: String,
    pub container: Option<String>,
    pub stdin: bool,
    pub tty: bool,
}

/// Whether a session gets a terminal, as kubectl decides: only with stdin (`-t` alone is
/// dropped silently), and only when the local stdin is a terminal (else with a warning).
fn use_terminal(stdin: bool, tty: bool) -> bool {
    if !(stdin && tty) {
        return false;
    }
    // SAFETY: isatty has no memory-safety preconditions.
    let terminal = unsafe { libc::isatty(std::io::stdin().as_raw_fd()) } == 1;
    if !terminal {
        eprintln!("Unable to use a TTY - input is not a terminal or the right kind of file");
    }
    terminal
}

/// The streams a session asks for: on a terminal, stderr comes merged into stdout.
fn session_params(container: Option<&String>, stdin: bool, tty: bool) -> AttachParams {
    let params = AttachParams::default().stdin(stdin).stdout(true).stderr(!tty).tty(tty);
    match container {
        Some(c) => params.container(c.clone()),
        None => params,
    }
}

/// Puts the local terminal in raw mode until dropped.
struct RawTerminal {
    saved: libc::termios,
}

impl RawTerminal {
    fn enable() -> Option<RawTerminal> {
        let fd = std::io::stdin().as_raw_fd();
        // SAFETY: tcgetattr/tcsetattr read and write a termios we own.
        unsafe {
            if libc::isatty(fd) != 1 {
                return None;
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(fd, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            libc::tcsetattr(fd, libc::TCSANOW, &raw);
            Some(RawTerminal { saved })
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        // SAFETY: restores the attributes read in `enable`.
        unsafe {
            libc::tcsetattr(std::io::stdin().as_raw_fd(), libc::TCSANOW, &self.saved);
        }
    }
}

fn window_size() -> Option<TerminalSize> {
    // SAFETY: TIOCGWINSZ writes a winsize into `ws`.
    unsafe {
        let mut ws: libc::winsize = std::mem::zeroed();
        (libc::ioctl(std::io::stdout().as_raw_fd(), libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0)
            .then_some(TerminalSize { width: ws.ws_col, height: ws.ws_row })
    }
}

/// The exit code a finished remote command reports in its status (0 for success).
fn exit_code(status: Option<Status>) -> anyhow::Result<i32> {
    let Some(s) = status else { return Ok(0) };
    if s.status.as_deref() == Some("Success") {
        return Ok(0);
    }
    if s.reason.as_deref() == Some("NonZeroExitCode")
        && let Some(code) = s
            .details
            .as_ref()
            .and_then(|d| d.causes.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.reason.as_deref() == Some("ExitCode")))
            .and_then(|c| c.message.as_deref())
            .and_then(|m| m.parse::<i32>().ok())
    {
        return Ok(code);
    }
    anyhow::bail!("{}", s.message.as_deref().unwrap_or("the command failed in the container"))
}

/// Copies local stdin, the remote output and terminal sizes until the remote side finishes.
async fn pump(mut attached: AttachedProcess, stdin: bool, tty: bool) -> anyhow::Result<i32> {
    let raw = if tty { RawTerminal::enable() } else { None };
    if let Some(mut sizes) = attached.terminal_size() {
        tokio::spawn(async move {
            if let Some(size) = window_size() {
                let _ = sizes.send(size).await;
            }
            let Ok(mut winch) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()) else { return };
            while winch.recv().await.is_some() {
                if let Some(size) = window_size()
                    && sizes.send(size).await.is_err()
                {
                    return;
                }
            }
        });
    }
    if stdin && let Some(mut remote) = attached.stdin() {
        tokio::spawn(async move {
            let mut local = tokio::io::stdin();
            let mut buf = vec![0u8; 32 * 1024];
            loop {
                match local.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if remote.write_all(&buf[..n]).await.is_err() || remote.flush().await.is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = remote.shutdown().await;
        });
    }
    let out = attached.stdout().map(|mut r| {
        tokio::spawn(async move {
            let mut w = tokio::io::stdout();
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.flush().await;
        })
    });
    let err = attached.stderr().map(|mut r| {
        tokio::spawn(async move {
            let mut w = tokio::io::stderr();
            let _ = tokio::io::copy(&mut r, &mut w).await;
            let _ = w.flush().await;
        })
    });
    let status = match attached.take_status() {
        Some(s) => s.await,
        None => None,
    };
    for task in [out, err].into_iter().flatten() {
        let _ = task.await;
    }
    drop(raw);
    exit_code(status)
}

/// The server's own words for a refusal, else the client's error.
fn reason(e: kube::Error) -> String {
    match e {
        kube::Error::Api(s) => s.message.clone(),
        other => other.to_string(),
    }
}

/// `sheepctl exec POD [-c C] [-i] [-t] -- COMMAND...`: the command's exit code.
pub async fn exec(cluster: &Cluster, args: &ExecArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(!args.command.is_empty(), "you must specify at least one command for the container");
    let api: kube::Api<Pod> = kube::Api::namespaced(cluster.client(), &cluster.namespace);
    let name = &crate::target::pod(cluster, &args.pod).await?;
    let tty = use_terminal(args.stdin, args.tty);
    let params = session_params(args.container.as_ref(), args.stdin, tty);
    let attached = api.exec(name, args.command.clone(), &params).await.map_err(|e| anyhow::anyhow!("exec in pod \"{name}\": {}", reason(e)))?;
    pump(attached, args.stdin, tty).await
}

/// `sheepctl attach POD [-c C] [-i] [-t]`: the container's output from now on, and with `-i` the
/// local stdin to the container's (which needs `stdin: true` in its spec), until the container
/// ends or the user interrupts; on a terminal with `-it` when the container has one.
pub async fn attach(cluster: &Cluster, args: &AttachArgs) -> anyhow::Result<i32> {
    let api: kube::Api<Pod> = kube::Api::namespaced(cluster.client(), &cluster.namespace);
    let name = &crate::target::pod(cluster, &args.pod).await?;
    let mut tty = use_terminal(args.stdin, args.tty);
    if tty {
        // As kubectl: a terminal only when the container has one of its own.
        let pod = api.get(name).await.map_err(|e| anyhow::anyhow!("attach to pod \"{name}\": {}", reason(e)))?;
        let containers = pod.spec.map(|s| s.containers).unwrap_or_default();
        let container = match &args.container {
            Some(c) => containers.iter().find(|k| &k.name == c),
            None => containers.first(),
        };
        if let Some(c) = container
            && c.tty != Some(true)
        {
            eprintln!("Unable to use a TTY - container {} did not allocate one", c.name);
            tty = false;
        }
    }
    let params = session_params(args.container.as_ref(), args.stdin, tty);
    let attached = api.attach(name, &params).await.map_err(|e| anyhow::anyhow!("attach to pod \"{name}\": {}", reason(e)))?;
    if tty {
        // The container's program drew its prompt before the attach; typing brings a new one.
        eprintln!("If you don't see a command prompt, try pressing enter.");
    }
    pump(attached, args.stdin, tty).await
}
