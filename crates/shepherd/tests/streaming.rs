//! `kubectl exec`, `cp`, `port-forward` and `attach` against `shepherd standalone`, with kubectl
//! 1.27 (SPDY/3.1) and the newest kubectl here (WebSocket v5), through the API server to the
//! node agent's streaming endpoint and into the container.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::interactive::{Terminal, attach_typing, check_attach_stdin};
use common::{Daemon, free_port, kubectl_command, kubectls_under_test, newest_kubectl, processes_with, run_with_stdin};

/// Polls `check` until it returns `Some`, or panics with `what` after `secs`.
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

fn kubectl(url: &str, args: &[&str]) -> (std::process::ExitStatus, String, String) {
    let (_, bin) = newest_kubectl();
    run_with_stdin(kubectl_command(&bin, url).args(args), None)
}

/// Creates a pod running `command` and waits until it runs.
fn running_pod(url: &str, name: &str, containers: &[(&str, &[&str])]) {
    let containers: Vec<serde_json::Value> = containers
        .iter()
        .map(|(c, cmd)| serde_json::json!({"name": c, "image": "busybox", "command": cmd}))
        .collect();
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"containers": containers}});
    let (_, bin) = newest_kubectl();
    let (status, _, err) = run_with_stdin(kubectl_command(&bin, url).args(["apply", "-f", "-"]), Some(&pod.to_string()));
    assert!(status.success(), "creating pod {name}: {err}");
    eventually(60, &format!("pod {name} to run"), || {
        let (_, out, _) = kubectl(url, &["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
        (out == "Running").then_some(())
    });
}

const IDLE: &[&str] = &["/usr/bin/busybox", "sh", "-c", "echo started; while true; do echo tick; sleep 1; done"];

fn standalone(dir: &Path) -> Daemon {
    Daemon::start("standalone", &dir.join("data"), &["--in-memory"])
}

#[test]
fn exec_prints_the_pod_name_and_exits_with_the_command_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    running_pod(&d.url, "web-0", &[("web", IDLE)]);
    for (label, bin) in kubectls_under_test() {
        let (status, out, err) =
            run_with_stdin(kubectl_command(&bin, &d.url).args(["exec", "web-0", "--", "sh", "-c", "echo $HOSTNAME; echo oops >&2; exit 3"]), None);
        assert_eq!(out, "web-0\n", "kubectl {label}: stdout; stderr: {err}");
        assert!(err.contains("oops"), "kubectl {label}: the command's stderr reaches kubectl's: {err}");
        assert_eq!(status.code(), Some(3), "kubectl {label}: exit code; stderr: {err}");
        let (status, out, err) = run_with_stdin(kubectl_command(&bin, &d.url).args(["exec", "-i", "web-0", "--", "cat"]), Some("piped\n"));
        assert!(status.success(), "kubectl {label}: exec -i: {err}");
        assert_eq!(out, "piped\n", "kubectl {label}: stdin reaches the command and its end ends cat");
    }
}

#[test]
fn exec_into_a_missing_container_names_the_pods_containers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    running_pod(&d.url, "two", &[("app", IDLE), ("side", IDLE)]);
    for (label, bin) in kubectls_under_test() {
        let (status, _, err) = run_with_stdin(kubectl_command(&bin, &d.url).args(["exec", "two", "-c", "nope", "--", "true"]), None);
        assert!(!status.success(), "kubectl {label}");
        assert!(err.contains("container nope is not valid for pod two") && err.contains("[app side]"), "kubectl {label}: {err}");
        // 400, as Kubernetes' API server answers a container name the pod lacks (before any node
        // is asked): the pod exists, the request names a part of it that does not.
        assert!(err.contains("(BadRequest)"), "kubectl {label}: {err}");
    }
    let (status, _, err) = kubectl(&d.url, &["exec", "two", "-c", "app", "--", "no-such-command"]);
    assert!(!status.success() && err.contains("\"no-such-command\": executable file not found"), "{err}");
    // Nothing is run in a pod that does not exist either.
    let (status, _, err) = kubectl(&d.url, &["exec", "ghost", "--", "true"]);
    assert!(!status.success() && (err.contains("NotFound") || err.contains("not found")), "{err}");
}

#[test]
fn cp_round_trips_a_10_mib_file_byte_exact_in_both_directions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    running_pod(&d.url, "files", &[("app", IDLE)]);
    // Pseudo-random, incompressible content.
    let mut data = Vec::with_capacity(10 << 20);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while data.len() < 10 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).expect("write source");
    for (label, bin) in kubectls_under_test() {
        // The process runtime's containers see the host's file system.
        let inside = dir.path().join(format!("inside-{label}.bin"));
        let back = dir.path().join(format!("back-{label}.bin"));
        let to_pod = format!("files:{}", inside.display());
        let (status, _, err) = run_with_stdin(kubectl_command(&bin, &d.url).args(["cp"]).arg(&src).arg(&to_pod), None);
        assert!(status.success(), "kubectl {label}: cp into the pod: {err}");
        assert!(std::fs::read(&inside).expect("copied in") == data, "kubectl {label}: the file in the pod differs");
        let (status, _, err) = run_with_stdin(kubectl_command(&bin, &d.url).args(["cp", &to_pod]).arg(&back), None);
        assert!(status.success(), "kubectl {label}: cp out of the pod: {err}");
        assert!(std::fs::read(&back).expect("copied out") == data, "kubectl {label}: the file copied back differs");
    }
}


fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[test]
fn port_forward_reaches_a_server_in_the_pod_over_many_connections() {
    let dir = tempfile::tempdir().expect("tempdir");
    let www = dir.path().join("www");
    std::fs::create_dir_all(&www).expect("www");
    std::fs::write(www.join("index.html"), "hello from the pod\n").expect("index");
    let d = standalone(dir.path());
    let pod_port = free_port();
    let listen = format!("127.0.0.1:{pod_port}");
    let www = www.display().to_string();
    let cmd: Vec<&str> = vec!["/usr/bin/busybox", "httpd", "-f", "-p", &listen, "-h", &www];
    running_pod(&d.url, "httpd", &[("web", &cmd)]);
    for (label, bin) in kubectls_under_test() {
        let local = free_port();
        let mut pf = kubectl_command(&bin, &d.url)
            .args(["port-forward", "pod/httpd", &format!("{local}:{pod_port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("port-forward");
        let first = eventually(30, "the forwarded port to answer", || http_get(local, "/").filter(|r| r.contains("200")));
        assert!(first.contains("hello from the pod"), "kubectl {label}: {first}");
        for _ in 0..5 {
            let again = http_get(local, "/").expect("another connection");
            assert!(again.contains("hello from the pod"), "kubectl {label}: {again}");
        }
        let missing = http_get(local, "/nope").expect("a 404 through the tunnel");
        assert!(missing.starts_with("HTTP/1.0 404") || missing.starts_with("HTTP/1.1 404"), "kubectl {label}: {missing}");
        let _ = pf.kill();
        let _ = pf.wait();
    }
}

#[test]
fn attach_sees_the_containers_output() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    running_pod(&d.url, "ticker", &[("app", IDLE)]);
    for (label, bin) in kubectls_under_test() {
        let mut child = kubectl_command(&bin, &d.url)
            .args(["attach", "ticker"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("attach");
        let mut stdout = child.stdout.take().expect("stdout");
        let seen = std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 64];
            let mut got = Vec::new();
            while !String::from_utf8_lossy(&got).contains("tick") {
                match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            String::from_utf8_lossy(&got).into_owned()
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while !seen.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        let out = seen.join().expect("reader");
        assert!(out.contains("tick"), "kubectl {label}: attach printed {out:?}");
    }
}

/// Creates a pod from `spec` (a container list and more) and waits until it runs.
fn running_pod_spec(url: &str, name: &str, spec: serde_json::Value) {
    let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec});
    let (_, bin) = newest_kubectl();
    let (status, _, err) = run_with_stdin(kubectl_command(&bin, url).args(["apply", "-f", "-"]), Some(&pod.to_string()));
    assert!(status.success(), "creating pod {name}: {err}");
    eventually(60, &format!("pod {name} to run"), || {
        let (_, out, _) = kubectl(url, &["get", "pod", name, "-o", "jsonpath={.status.phase}"]);
        (out == "Running").then_some(())
    });
}

#[test]
fn attach_with_a_terminal_drives_the_containers_own_shell_and_follows_resizes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    let shell = serde_json::json!({"containers": [
        {"name": "sh", "image": "busybox", "command": ["/usr/bin/busybox", "sh"], "stdin": true, "tty": true}]});
    running_pod_spec(&d.url, "console", shell);
    let mut previous: Option<String> = None;
    for (label, bin) in kubectls_under_test() {
        let name = format!("attach-{}", label.replace('.', "-"));
        let cmd = format!("env KUBECONFIG=/dev/null {} --server {} attach -it console; sleep 60", bin.display(), d.url);
        let t = Terminal::start(dir.path(), &name, &cmd);
        // kubectl attach sends the terminal's size plus one, then the size (to make the program
        // redraw); a shell asked between the two sees the first. Wait for the second.
        t.ask("echo \"settled=$(stty size)\"", "settled=40 120");
        let shown = t.ask("echo \"tty=$(tty) size=$(stty size) term=$TERM seen=$SEEN\"; SEEN=\"$SEEN+$$\"", "tty=");
        assert!(shown.starts_with("tty=/dev/pts/"), "kubectl {label}: the container's stdin is a terminal: {shown}");
        assert!(shown.contains("term=xterm "), "kubectl {label}: a terminal container learns its kind: {shown}");
        assert!(shown.contains("size=40 120"), "kubectl {label}: the client's terminal size reaches the shell: {shown}");
        // Each attach talks to the same shell, which outlives the attach before it.
        if let Some(before) = &previous {
            let seen = shown.split("seen=").nth(1).unwrap_or("");
            assert!(seen.contains('+') && before.split("seen=").nth(1).is_some(), "kubectl {label}: {shown} after {before}");
        }
        previous = Some(shown);
    }
    let (_, restarts, _) = kubectl(&d.url, &["get", "pod", "console", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"]);
    assert_eq!(restarts, "0", "detaching does not end the container's shell");

    // `kubectl run -it --rm` creates a pod with stdin and a terminal and attaches to it.
    let (_, bin) = newest_kubectl();
    let cmd = format!(
        "env KUBECONFIG=/dev/null {} --server {} run -it --rm --restart=Never one-off --image=busybox -- /usr/bin/busybox sh; \
         echo kubectl-exit=$?; sleep 60",
        bin.display(),
        d.url
    );
    let t = Terminal::start(dir.path(), "run", &cmd);
    let shown = t.ask("echo \"answer=$((6 * 7))\"", "answer=");
    assert_eq!(shown.trim(), "answer=42");
    t.type_line("exit 5");
    let exit = eventually(60, "kubectl run to end with the shell", || {
        t.screen().lines().find(|l| l.starts_with("kubectl-exit=")).map(str::to_string)
    });
    assert_eq!(exit.trim(), "kubectl-exit=5", "kubectl run returns the shell's exit code: {}", t.screen());
    eventually(60, "the --rm pod to be deleted", || {
        let (_, out, _) = kubectl(&d.url, &["get", "pods", "-o", "name"]);
        (!out.contains("one-off")).then_some(())
    });
}

const READER: [&str; 4] = ["/usr/bin/busybox", "sh", "-c", "echo ready; while read l; do echo got:$l; done"];

#[test]
fn a_containers_stdin_outlives_an_agent_killed_and_restarted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let mut d = Daemon::start("standalone", &data, &[]);
    running_pod_spec(&d.url, "keeper", serde_json::json!({"containers": [
        {"name": "r", "image": "busybox", "command": READER, "stdin": true}]}));
    let (_, bin) = newest_kubectl();
    let out = attach_typing(&bin, &d.url, "keeper", "r", "before");
    assert!(out.contains("got:before"), "{out:?}");
    d.kill9();
    let d = Daemon::start("standalone", &data, &[]);
    let out = attach_typing(&bin, &d.url, "keeper", "r", "after");
    assert!(out.contains("got:after"), "the re-adopted container's stdin takes input: {out:?}");
    let (_, restarts, _) = kubectl(&d.url, &["get", "pod", "keeper", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"]);
    assert_eq!(restarts, "0", "the same container, not a restarted one");
}

#[test]
fn attach_with_stdin_feeds_a_container_started_with_stdin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    running_pod_spec(&d.url, "reader", serde_json::json!({"containers": [
        {"name": "r", "image": "busybox", "command": READER, "stdin": true},
        {"name": "deaf", "image": "busybox", "command": IDLE}]}));
    for (label, bin) in kubectls_under_test() {
        check_attach_stdin(&bin, &d.url, &label, &["--image=busybox", "--", "/usr/bin/busybox", "sh"]);
    }
}


#[test]
fn a_dropped_exec_connection_leaves_no_process_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    running_pod(&d.url, "victim", &[("app", IDLE)]);
    for (label, bin) in kubectls_under_test() {
        // A background child and a foreground one, so the whole group has to go.
        let marker = format!("{}{}", 7_000_000 + std::process::id() % 100_000, label.replace('.', ""));
        let script = format!("sleep {marker}1 & sleep {marker}2");
        let mut child = kubectl_command(&bin, &d.url)
            .args(["exec", "victim", "--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("exec");
        eventually(30, "the exec'd processes to start", || (processes_with(&marker).len() >= 2).then_some(()));
        let _ = child.kill();
        let _ = child.wait();
        eventually(15, "the exec'd processes to be gone", || processes_with(&marker).is_empty().then_some(()));
        let _ = &label;
    }
}

#[test]
fn exec_with_a_terminal_runs_an_interactive_shell_in_tmux() {
    assert!(
        Command::new("tmux").arg("-V").output().is_ok(),
        "this test drives `kubectl exec -it` in a terminal and needs tmux (Debian package `tmux`; scripts/test.sh installs it)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    running_pod(&d.url, "shell", &[("app", IDLE)]);
    for (label, bin) in kubectls_under_test() {
        let session = format!("shepherd-exec-{}-{}", std::process::id(), label.replace('.', "-"));
        let socket = dir.path().join(format!("tmux-{}", label.replace('.', "-")));
        let tmux = |args: &[&str]| Command::new("tmux").arg("-S").arg(&socket).args(args).output().expect("tmux");
        let cmd = format!("env KUBECONFIG=/dev/null {} --server {} exec -it shell -- sh; echo kubectl-exit=$?; sleep 60", bin.display(), d.url);
        let started = tmux(&["new-session", "-d", "-s", &session, "-x", "120", "-y", "40", &cmd]);
        assert!(started.status.success(), "tmux: {}", String::from_utf8_lossy(&started.stderr));
        let pane = || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout).into_owned();
        eventually(30, "a shell prompt", || pane().contains('#').then_some(()));
        tmux(&["send-keys", "-t", &session, "echo \"tty=$(tty) size=$(stty size)\"", "Enter"]);
        let shown = eventually(30, "the shell to answer", || {
            let p = pane();
            p.lines().any(|l| l.starts_with("tty=/dev/pts/")).then_some(p)
        });
        assert!(shown.contains("size=40 120"), "kubectl {label}: the terminal size reaches the shell: {shown}");
        tmux(&["send-keys", "-t", &session, "exit 4", "Enter"]);
        let done = eventually(30, "kubectl to exit", || {
            let p = pane();
            p.contains("kubectl-exit=").then_some(p)
        });
        assert!(done.contains("kubectl-exit=4"), "kubectl {label}: the shell's exit code: {done}");
        tmux(&["kill-server"]);
    }
}

#[test]
fn the_agents_streaming_endpoint_refuses_callers_without_the_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    running_pod(&d.url, "guarded", &[("app", IDLE)]);
    let (_, port, _) = kubectl(&d.url, &["get", "nodes", "-o", "jsonpath={.items[0].status.daemonEndpoints.kubeletEndpoint.Port}"]);
    let port: u16 = port.parse().expect("the node publishes its streaming port");
    assert_ne!(port, 0);
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the agent");
    write!(
        s,
        "POST /exec/default/guarded/app?command=true HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: v4.channel.k8s.io\r\nAuthorization: Bearer guess\r\nContent-Length: 0\r\n\r\n"
    )
    .expect("write");
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).expect("read");
    let head = String::from_utf8_lossy(&buf[..n]);
    assert!(head.starts_with("HTTP/1.1 401"), "{head}");
}

#[test]
fn logs_honour_timestamps_since_time_tail_and_limit_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = standalone(dir.path());
    let cmd: &[&str] = &["/usr/bin/busybox", "sh", "-c", "echo first; sleep 2; echo second; exec sleep 100000"];
    running_pod(&d.url, "talker", &[("app", cmd)]);
    for (label, bin) in kubectls_under_test() {
        let logs = |args: &[&str]| {
            let (status, out, err) = run_with_stdin(kubectl_command(&bin, &d.url).arg("logs").arg("talker").args(args), None);
            assert!(status.success(), "kubectl {label} logs {args:?}: {err}");
            out
        };
        eventually(30, "the second line", || logs(&[]).contains("second").then_some(()));
        assert_eq!(logs(&[]), "first\nsecond\n", "kubectl {label}");
        let stamped = logs(&["--timestamps"]);
        let lines: Vec<&str> = stamped.lines().collect();
        assert_eq!(lines.len(), 2, "kubectl {label}: {stamped}");
        let (t1, text1) = lines[0].split_once(' ').expect("a time, then the text");
        let (t2, text2) = lines[1].split_once(' ').expect("a time, then the text");
        assert_eq!((text1, text2), ("first", "second"), "kubectl {label}");
        let (a, b): (jiff::Timestamp, jiff::Timestamp) = (t1.parse().expect("RFC 3339"), t2.parse().expect("RFC 3339"));
        assert!(b.duration_since(a) >= jiff::SignedDuration::from_millis(1500), "kubectl {label}: {t1} then {t2}");
        assert_eq!(logs(&["--since-time", t2]), "second\n", "kubectl {label}");
        assert_eq!(logs(&["--since", "1h"]), "first\nsecond\n", "kubectl {label}");
        assert_eq!(logs(&["--tail", "1"]), "second\n", "kubectl {label}");
        assert_eq!(logs(&["--limit-bytes", "3"]), "fir", "kubectl {label}");
    }
}
