//! Early answers: a request the server answers before reading its body (unauthenticated, too
//! large) still gets that answer, not a connection reset. A binary of its own: the 30 MB it sends
//! would slow the timed connection tests of `connections.rs` beside it.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::Daemon;

fn address(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

/// A client that sends a whole large body before reading (as Python's requests does) gets the
/// answer a server gave before reading the body (401 unauthenticated, 413 too large), not a
/// connection reset: the rest of the body is read out first.
#[test]
fn a_large_body_answered_before_it_is_read_gets_its_answer_not_a_reset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("server", dir.path(), &["--in-memory", "--controllers", "none", "--token", "t0ken"]);
    let body = vec![b'x'; 30 << 20];
    for (token, expected) in [(None, "HTTP/1.1 401"), (Some("t0ken"), "HTTP/1.1 413")] {
        let mut stream = TcpStream::connect(address(&daemon.url)).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let head = format!(
            "POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).expect("send the head");
        stream.write_all(&body).unwrap_or_else(|e| panic!("sending the body ({expected} expected): {e}"));
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
                Err(e) => panic!("reading the answer ({expected} expected): {e}"),
            }
        }
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with(expected), "{answer}");
    }
}
