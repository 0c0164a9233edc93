//! A pod's sandbox: the IPC and UTS namespaces its containers share, kept alive by bind mounts
//! of their namespace files, and the `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf` they see.
//!
//! The namespaces outlive every process (and the agent): only the bind mounts hold them, so
//! containers restarted later, or by another agent run, join the same ones. The network namespace
//! is not made here: whoever gives pods networks makes and pins it, and `ensure` takes its path
//! (`None`: the node's network, as for `hostNetwork` pods).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::spec::SandboxPaths;

pub(crate) fn paths(dir: &Path, net: Option<&Path>) -> SandboxPaths {
    SandboxPaths {
        ipc: dir.join("ipc"),
        uts: dir.join("uts"),
        net: net.map(Path::to_path_buf),
        hosts: dir.join("hosts"),
        hostname: dir.join("hostname"),
        resolv_conf: dir.join("resolv.conf"),
    }
}

/// A file with a bind mount on it lives on another device than its directory.
fn is_mounted(path: &Path) -> bool {
    let (Ok(meta), Some(parent)) = (fs::metadata(path), path.parent()) else { return false };
    fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev())
}

fn c_path(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| io::Error::other("path contains a NUL byte"))
}

/// Makes the sandbox under `dir` unless it exists. `ip` is the pod's address for `/etc/hosts`;
/// `net` the pod's network namespace file, joined by each of its containers (`None`: the node's).
pub(crate) fn ensure(dir: &Path, hostname: &str, ip: &str, net: Option<&Path>) -> io::Result<SandboxPaths> {
    let p = paths(dir, net);
    fs::create_dir_all(dir)?;
    let hosts = format!(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n{ip}\t{hostname}\n"
    );
    fs::write(&p.hosts, hosts)?;
    fs::write(&p.hostname, format!("{hostname}\n"))?;
    // The host's resolver configuration, as kubelet gives pods of the host network.
    let resolv = fs::read("/etc/resolv.conf").unwrap_or_default();
    fs::write(&p.resolv_conf, resolv)?;
    if is_mounted(&p.ipc) && is_mounted(&p.uts) {
        return Ok(p);
    }
    for f in [&p.ipc, &p.uts] {
        fs::write(f, b"")?;
    }
    let (ipc, uts, name) = (c_path(&p.ipc)?, c_path(&p.uts)?, CString::new(hostname).map_err(io::Error::other)?);
    // A thread of its own enters the new namespaces (unshare affects only the calling thread for
    // these two), pins them with bind mounts and ends, leaving the agent's other threads as they were.
    std::thread::spawn(move || -> io::Result<()> {
        // SAFETY: plain system calls on NUL-terminated strings that live until the calls return.
        unsafe {
            if libc::unshare(libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::sethostname(name.as_ptr(), name.as_bytes().len()) != 0 {
                return Err(io::Error::last_os_error());
            }
            let tid = libc::gettid();
            for (kind, target) in [("ipc", &ipc), ("uts", &uts)] {
                let source = CString::new(format!("/proc/self/task/{tid}/ns/{kind}")).map_err(io::Error::other)?;
                if libc::mount(source.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    })
    .join()
    .map_err(|_| io::Error::other("the namespace thread panicked"))??;
    Ok(p)
}

/// Releases the namespaces and removes the sandbox's files. Idempotent.
pub(crate) fn remove(dir: &Path) {
    let p = paths(dir, None);
    for f in [&p.ipc, &p.uts] {
        if let Ok(c) = c_path(f) {
            // SAFETY: umount2 on a NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let _ = fs::remove_dir_all(dir);
}
