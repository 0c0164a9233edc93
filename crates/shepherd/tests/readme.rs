//! README.md's quick start, run as a newcomer runs it: its commands as written, from a fresh
//! directory (relative paths, default flags), as root with runc installed, so `standalone` picks
//! the oci runtime by itself. Every other test passes absolute temporary directories and explicit
//! flags; this one is what the first reader of README.md meets.
//!
//! The directory is fresh but inside the workspace (under `target/`), with a `target` link to the
//! workspace's: README's `cargo build` finds the workspace from there and its `target/release/...`
//! paths resolve. Everything runs inside a network namespace the test makes. Needs root, runc,
//! iproute2 (`ip netns`) and nsenter.

mod common;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::Netns;

fn require_root_and_tools() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "tests/readme.rs runs README's quick start as root (the oci runtime, a network namespace)");
    for (tool, package) in [("runc", "runc"), ("ip", "iproute2"), ("nsenter", "util-linux")] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success());
        assert!(found, "tests/readme.rs needs `{tool}` (Debian package {package}): README's quick start picks runc when it is there");
    }
}

/// The shell blocks of README.md's "Start Shepherd" section, in order.
fn quick_start(readme: &str) -> Vec<String> {
    let section = readme.split("\n## Start Shepherd\n").nth(1).expect("README.md has a \"## Start Shepherd\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "```sh" {
            let block: Vec<&str> = lines.by_ref().take_while(|l| l.trim() != "```").collect();
            blocks.push(block.join("\n"));
        }
    }
    blocks
}

/// The statements of a shell block: its lines, a here-document joined to the line that opens it.
fn statements(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = block.lines();
    while let Some(line) = lines.next() {
        if line.trim().is_empty() {
            continue;
        }
        let mut statement = line.to_string();
        if let Some(rest) = line.split("<<'").nth(1) {
            let end = rest.split('\'').next().unwrap_or_default().to_string();
            for l in lines.by_ref() {
                statement.push('\n');
                statement.push_str(l);
                if l == end {
                    break;
                }
            }
        }
        out.push(statement);
    }
    out
}

/// A statement's command, without its trailing `# comment`.
fn command_of(statement: &str) -> &str {
    if statement.contains('\n') {
        return statement;
    }
    statement.split(" #").next().unwrap_or(statement).trim()
}

/// The quick start's run: the fresh directory, the namespace, the functions the reader defined.
struct Session {
    dir: PathBuf,
    ns: Netns,
    /// Shell function definitions the session made (README's `sheepctl() { ... }`), run before
    /// each later statement as the reader's shell would still have them.
    prelude: String,
}

impl Session {
    /// `bash -c SCRIPT` in the fresh directory, inside the namespace, in a process group of its own.
    fn bash(&self, script: &str) -> Command {
        let mut cmd = self.ns.command("bash");
        cmd.arg("-c").arg(format!("{}{script}", self.prelude)).current_dir(&self.dir);
        cmd.process_group(0);
        cmd
    }

    /// Runs `statement` to its end; fails the test with its output if it fails.
    fn run(&self, statement: &str) -> String {
        let out = self.bash(statement).stdin(Stdio::null()).output().expect("run bash");
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "README's `{statement}` failed ({}):\n{stdout}\n{stderr}", out.status);
        stdout.into_owned()
    }

    /// Runs `statement`, which runs until interrupted (a watch), for `time`, then interrupts it as
    /// Ctrl-C in a terminal does (SIGINT to its process group); returns what it printed.
    fn interrupted_after(&self, statement: &str, time: Duration) -> String {
        let out = self.dir.join("interrupted.out");
        let file = std::fs::File::create(&out).expect("output file");
        let mut child = self.bash(statement).stdin(Stdio::null()).stdout(file).stderr(Stdio::null()).spawn().expect("run bash");
        std::thread::sleep(time);
        // SAFETY: kill has no memory preconditions; the group is the one just started.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
        let _ = child.wait();
        std::fs::read_to_string(&out).unwrap_or_default()
    }

    /// Runs `statement` until `holds` is true of its output, for up to `limit`.
    fn until(&self, statement: &str, limit: Duration, holds: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.bash(statement).stdin(Stdio::null()).output().expect("run bash");
            let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
            if out.status.success() && holds(&text) {
                return text;
            }
            assert!(Instant::now() < deadline, "README's `{statement}` never showed what README says; last:\n{text}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The pods `sheepctl get pods` lists as Running, by name.
fn running(table: &str) -> Vec<String> {
    let mut names: Vec<String> = table
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(2) == Some("Running"))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    names.sort();
    names
}

/// A command printing the UID of pod `name`: kubectl, with the kubeconfig README points to.
fn uid_of(name: &str) -> String {
    format!("kubectl --kubeconfig shepherd-data/admin.kubeconfig get pod {name} -o jsonpath='{{.metadata.uid}}'")
}

/// The standalone started by README's first block: Ctrl-C'd (SIGINT to its group, as a terminal
/// sends it) by `stop` or when dropped, then whatever it left is killed and unmounted and the
/// fresh directory removed.
struct Standalone {
    child: Child,
    dir: PathBuf,
    stopped: bool,
}

impl Standalone {
    /// Ctrl-C, once, and up to a minute for the pods' grace periods; returns the mounts it left
    /// below the fresh directory.
    fn stop(&mut self) -> Vec<String> {
        self.stopped = true;
        let group = -(self.child.id() as i32);
        // SAFETY: kill has no memory preconditions; the group is the one this test started.
        unsafe { libc::kill(group, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
        let left = common::mounts_under(&self.dir);
        common::kill_leftovers(&[], Some(&self.dir));
        for m in &left {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        left
    }
}

impl Drop for Standalone {
    fn drop(&mut self) {
        if !self.stopped {
            self.stop();
        }
    }
}

#[test]
fn readme_quick_start_works_literally_as_root_with_runc() {
    require_root_and_tools();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("the workspace");
    let readme = std::fs::read_to_string(workspace.join("README.md")).expect("README.md");
    let blocks = quick_start(&readme);
    assert!(blocks.len() >= 2, "README's quick start has a block that starts Shepherd and one that uses it: {blocks:#?}");

    let dir = workspace.join(format!("target/readme-quick-start-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the fresh directory");
    std::os::unix::fs::symlink(workspace.join("target"), dir.join("target")).expect("link target/");
    let session = Session { dir: dir.clone(), ns: Netns::new(format!("shep-readme-{}", std::process::id())), prelude: String::new() };

    // The first block, in a terminal of its own: it builds and starts `shepherd standalone`.
    let log = dir.join("standalone.log");
    let out = std::fs::File::create(&log).expect("log file");
    let child = session
        .bash(&blocks[0])
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .expect("start README's first block");
    let standalone = std::cell::RefCell::new(Standalone { child, dir: dir.clone(), stopped: false });
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // The second block, statement by statement, in another "terminal" in the same directory.
    let mut session = session;
    let mut deleted: Option<(String, String)> = None;
    for statement in statements(&blocks[1]) {
        let command = command_of(&statement).to_string();
        if command.ends_with("}") && command.contains("() {") {
            session.prelude.push_str(&command);
            session.prelude.push('\n');
        } else if command.starts_with("sheepctl apply") {
            // The reader types this once the first block's build is done and the server says it
            // listens (a cold release build takes minutes).
            let mut first = standalone.borrow_mut();
            let deadline = Instant::now() + Duration::from_secs(40 * 60);
            while !log_text().contains(" listening on ") {
                if let Ok(Some(status)) = first.child.try_wait() {
                    panic!("README's first block ended ({status}) before Shepherd listened:\n{}", log_text());
                }
                assert!(Instant::now() < deadline, "README's first block did not start Shepherd:\n{}", log_text());
                std::thread::sleep(Duration::from_millis(200));
            }
            drop(first);
            session.until(&statement, Duration::from_secs(30), |_| true);
        } else if command == "sheepctl get pods" {
            let table = session.until(&command, Duration::from_secs(60), |t| running(t).len() == 3);
            assert_eq!(running(&table), ["web-0", "web-1", "web-2"], "README: web-0, web-1, web-2 Running\n{table}");
            assert!(table.contains("Running"), "{table}");
        } else if let Some(pod) = command.strip_prefix("sheepctl delete pod ") {
            let uid = session.run(&uid_of(pod));
            session.run(&command);
            deleted = Some((pod.to_string(), uid));
        } else if command == "sheepctl get pods -w" {
            // A watch runs until interrupted: the replacement shows there, Running.
            let (pod, uid) = deleted.clone().expect("README deletes a pod before watching");
            let seen = session.interrupted_after(&command, Duration::from_secs(3));
            assert!(running(&seen).len() >= 3, "`{command}` for 3 s showed fewer than 3 Running pods:\n{seen}");
            session.until(&format!("{} 2>/dev/null; true", uid_of(&pod)), Duration::from_secs(30), |now| now.trim() != uid.trim());
            session.until("sheepctl get pods", Duration::from_secs(30), |t| running(t).len() == 3);
        } else {
            session.run(&statement);
        }
    }
    assert!(deleted.is_some(), "README's quick start deletes a pod and shows its replacement");
    let text = log_text();
    assert!(text.contains("runtime: oci"), "as root with runc installed, standalone picks the oci runtime and says so:\n{text}");
    assert!(!text.contains("RunContainerError") && !text.contains("could not start"), "a container failed to start:\n{text}");
    let left = standalone.borrow_mut().stop();
    assert!(left.is_empty(), "Ctrl-C left mounts under the directory: {left:#?}");
}
