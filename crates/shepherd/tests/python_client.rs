//! The official Kubernetes Python client against `shepherd standalone`: discovery, typed CRUD, watch.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Daemon;

/// The Python interpreter that can import `kubernetes`: `$SHEPHERD_PYTHON`, else `python3` on
/// PATH, else Debian's `/usr/bin/python3` (where `python3-kubernetes` installs; a pyenv or venv
/// `python3` first on PATH does not see it).
fn python_with_kubernetes() -> PathBuf {
    let candidates: Vec<PathBuf> = std::env::var_os("SHEPHERD_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("python3"), PathBuf::from("/usr/bin/python3")])
        .collect();
    for python in &candidates {
        let imports = Command::new(python)
            .args(["-c", "import kubernetes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if imports {
            return python.clone();
        }
    }
    panic!(
        "none of {candidates:?} can `import kubernetes`: install the Kubernetes Python client \
         (Debian: `apt-get install python3-kubernetes`), or set SHEPHERD_PYTHON to an interpreter that has it"
    );
}

/// A kubeconfig (JSON is YAML) with one context that points at `url`.
fn kubeconfig_for(url: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "shepherd", "cluster": {"server": url}}],
        "users": [{"name": "shepherd", "user": {}}],
        "contexts": [{"name": "shepherd", "context": {"cluster": "shepherd", "user": "shepherd", "namespace": "default"}}],
        "current-context": "shepherd",
    })
    .to_string()
}

#[test]
fn the_kubernetes_python_client_discovers_creates_patches_watches_and_deletes() {
    let python = python_with_kubernetes();
    let dir = tempfile::tempdir().expect("tempdir");
    let daemon = Daemon::start("standalone", &dir.path().join("data"), &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/kubernetes_client.py");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, kubeconfig_for(&daemon.url)).expect("write the kubeconfig");

    let mut child = Command::new(&python)
        .arg(&script)
        .arg(&kubeconfig)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the Python client script");
    // The script waits at most 90 s for each condition; this bounds a hung connection.
    let deadline = Instant::now() + Duration::from_secs(600);
    while child.try_wait().expect("wait for the script").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("script output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "the Python client script failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("all checks passed"), "{stdout}\n{stderr}");
}
