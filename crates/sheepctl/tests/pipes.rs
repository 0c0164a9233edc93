//! sheepctl in a shell pipeline whose reader goes away, as `sheepctl get pods | head -1` does.

mod common;

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

use common::Shepherd;

/// Linux's signal number, as a shell reports it in exit status 141 (128 + 13).
const SIGPIPE: i32 = 13;

#[test]
fn a_closed_pipe_ends_sheepctl_by_sigpipe_without_a_panic() {
    let shepherd = Shepherd::server();
    for args in [&["get", "namespaces"][..], &["get", "namespaces", "-o", "yaml"], &["describe", "namespace", "default"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sheepctl"))
            .args(["--server", &shepherd.url])
            .args(args)
            .env("KUBECONFIG", "/dev/null")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start sheepctl");
        // The reader is gone before sheepctl writes, as `head` is once it has its line.
        drop(child.stdout.take());
        let mut stderr = String::new();
        child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("read stderr");
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(SIGPIPE), "{args:?}: {status:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: nothing on stderr, got {stderr:?}");
    }
}
