//! `sheepctl exec`, `cp`, `attach` and `port-forward` against `shepherd standalone`: through the
//! API server to the node agent's streaming endpoint and into a real container.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{LineReader, Shepherd};
use serde_json::json;

fn run_pod(s: &Shepherd, name: &str, command: serde_json::Value) {
    s.ok("POST", "/api/v1/namespaces/default/pods", Some(json!({"metadata": {"name": name}, "spec": {"containers": [{
        "name": "c", "image": "busybox", "command": command}]}})));
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.ok("GET", &format!("/api/v1/namespaces/default/pods/{name}"), None)["status"]["phase"] != "Running" {
        assert!(Instant::now() < deadline, "pod {name} did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn exec_reports_the_exit_code_and_cp_copies_both_ways() {
    let s = Shepherd::standalone();
    run_pod(&s, "box", json!(["/usr/bin/busybox", "sh", "-c", "while true; do echo tick; sleep 1; done"]));
    let run = s.sheepctl(&["exec", "box", "--", "sh", "-c", "echo $HOSTNAME; exit 3"]);
    assert_eq!((run.code, run.stdout.as_str()), (3, "box\n"), "{run:?}");
    assert_eq!(s.sheepctl_stdin(&["exec", "-i", "box", "--", "tr", "a-z", "A-Z"], "shout\n").ok(), "SHOUT\n");
    let missing = s.sheepctl(&["exec", "box", "-c", "nope", "--", "true"]);
    assert!(missing.code != 0 && missing.stderr.contains("container nope is not valid for pod box"), "{missing:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    let data: Vec<u8> = (0..3 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, &data).expect("write");
    let inside = dir.path().join("inside.bin");
    let back = dir.path().join("back.bin");
    s.sheepctl(&["cp", src.to_str().expect("utf-8"), &format!("box:{}", inside.display())]).ok();
    assert!(std::fs::read(&inside).expect("copied in") == data, "the file in the container differs");
    s.sheepctl(&["cp", &format!("box:{}", inside.display()), back.to_str().expect("utf-8")]).ok();
    assert!(std::fs::read(&back).expect("copied out") == data, "the file copied back differs");

    let mut attach = common::command(Some(&s.url), &["attach", "box"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("attach");
    LineReader::new(attach.stdout.take().expect("stdout")).until("tick", Duration::from_secs(20));
    let _ = attach.kill();
    let _ = attach.wait();
    assert_eq!(s.sheepctl(&["logs", "box", "--since", "1h", "--tail", "1"]).ok(), "tick\n");
    assert_eq!(s.sheepctl(&["logs", "box", "--limit-bytes", "2"]).ok(), "ti");
    let stamped = s.sheepctl(&["logs", "box", "--timestamps", "--tail", "1"]);
    let (time, text) = stamped.ok().split_once(' ').expect("a time, then the text");
    assert!(time.parse::<jiff::Timestamp>().is_ok() && text == "tick\n", "{stamped:?}");
    s.api("DELETE", "/api/v1/namespaces/default/pods/box?gracePeriodSeconds=0", None);
}

#[test]
fn port_forward_carries_each_local_connection_to_the_pod() {
    let s = Shepherd::standalone();
    let free = || std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port();
    let (pod_port, local) = (free(), free());
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("index.html"), "served from the pod\n").expect("index");
    run_pod(&s, "web", json!(["/usr/bin/busybox", "httpd", "-f", "-p", format!("127.0.0.1:{pod_port}"), "-h", dir.path()]));
    let mut pf = common::command(Some(&s.url), &["port-forward", "web", &format!("{local}:{pod_port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("port-forward");
    // Keep reading its output: like kubectl, sheepctl ends when its stdout is closed.
    let output = LineReader::new(pf.stdout.take().expect("stdout"));
    output.until("Forwarding from", Duration::from_secs(20));
    let get = || -> std::io::Result<String> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", local))?;
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(c, "GET / HTTP/1.0\r\n\r\n")?;
        let mut answer = String::new();
        c.read_to_string(&mut answer)?;
        Ok(answer)
    };
    // The server in the pod may still be starting: wait for its first answer.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !get().is_ok_and(|a| a.contains("200")) {
        assert!(Instant::now() < deadline, "the forwarded port never answered");
        std::thread::sleep(Duration::from_millis(200));
    }
    for _ in 0..3 {
        let answer = get().expect("another connection");
        assert!(answer.contains("served from the pod"), "{answer}");
    }
    let _ = pf.kill();
    let _ = pf.wait();
    s.api("DELETE", "/api/v1/namespaces/default/pods/web?gracePeriodSeconds=0", None);
}

/// Types `line` into tmux session `session` (again every few seconds: keys sent before the attach
/// is connected go nowhere) until its screen shows a line starting with `answer`; returns it.
fn ask_in_tmux(tmux: &dyn Fn(&[&str]) -> std::process::Output, session: &str, line: &str, answer: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut typed = Instant::now() - Duration::from_secs(10);
    loop {
        if typed.elapsed() > Duration::from_secs(4) {
            tmux(&["send-keys", "-t", session, line, "Enter"]);
            typed = Instant::now();
        }
        let screen = String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", session]).stdout).into_owned();
        if let Some(l) = screen.lines().find(|l| l.starts_with(answer)) {
            return l.to_string();
        }
        assert!(Instant::now() < deadline, "no line starting with {answer:?} on the screen: {screen}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn attach_i_feeds_a_containers_stdin_and_attach_it_drives_its_terminal_on_the_oci_runtime() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs the oci runtime, which needs root");
    let runc = std::process::Command::new("/usr/sbin/runc").arg("--version").output();
    assert!(runc.is_ok_and(|o| o.status.success()), "this test runs the oci runtime, which needs runc (Debian package runc)");
    assert!(std::process::Command::new("tmux").arg("-V").output().is_ok(), "this test drives a terminal with tmux (Debian package tmux)");
    let mut s = Shepherd::start("standalone", &["--runtime", "oci"]);
    let reader = "echo ready; while read l; do echo got:$l; done";
    s.ok("POST", "/api/v1/namespaces/default/pods", Some(json!({"metadata": {"name": "duo"}, "spec": {
        "terminationGracePeriodSeconds": 1, "containers": [
        {"name": "r", "image": "minimal", "command": ["sh", "-c", reader], "stdin": true},
        {"name": "sh", "image": "minimal", "command": ["sh"], "stdin": true, "tty": true},
        {"name": "deaf", "image": "minimal", "command": ["sleep", "100000"]}]}})));
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.ok("GET", "/api/v1/namespaces/default/pods/duo", None)["status"]["phase"] != "Running" {
        assert!(Instant::now() < deadline, "pod duo did not start");
        std::thread::sleep(Duration::from_millis(200));
    }

    let mut attach = common::command(Some(&s.url), &["attach", "-i", "duo", "-c", "r"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("attach");
    let mut input = attach.stdin.take().expect("stdin");
    let lines = LineReader::new(attach.stdout.take().expect("stdout"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        use std::io::Write;
        let _ = writeln!(input, "hello");
        if lines.next(Duration::from_millis(500)).is_some_and(|l| l == "got:hello") {
            break;
        }
        assert!(Instant::now() < deadline, "the container never read what sheepctl attach -i sent");
    }
    let _ = attach.kill();
    let _ = attach.wait();

    let refused = s.sheepctl_stdin(&["attach", "-i", "duo", "-c", "deaf"], "x\n");
    assert!(refused.code != 0 && refused.stderr.contains("container deaf in pod duo has no stdin"), "{refused:?}");

    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("tmux");
    let tmux = |args: &[&str]| std::process::Command::new("tmux").arg("-S").arg(&socket).args(args).output().expect("tmux");
    let session = format!("sheepctl-attach-{}", std::process::id());
    let cmd = format!(
        "env -u SHEPHERD_API KUBECONFIG=/nonexistent HOME={} {} --server {} attach -it duo -c sh; sleep 60",
        dir.path().display(),
        env!("CARGO_BIN_EXE_sheepctl"),
        s.url
    );
    let started = tmux(&["new-session", "-d", "-s", &session, "-x", "120", "-y", "40", &cmd]);
    assert!(started.status.success(), "tmux: {}", String::from_utf8_lossy(&started.stderr));
    let shown = ask_in_tmux(&tmux, &session, "echo \"tty=$(tty) size=$(stty size)\"", "tty=");
    assert!(shown.starts_with("tty=/dev/pts/") && shown.contains("size=40 120"), "the container's own terminal at the window's size: {shown}");
    let resized = tmux(&["resize-window", "-t", &session, "-x", "100", "-y", "30"]);
    assert!(resized.status.success(), "tmux resize-window: {}", String::from_utf8_lossy(&resized.stderr));
    ask_in_tmux(&tmux, &session, "echo \"resized=$(stty size)\"", "resized=30 100");
    tmux(&["kill-server"]);
    s.interrupt();
}
