//! Data directories only their owner can read: created 0700, files 0600, wider ones tightened.
//!
//! The store holds every Secret-like value a user writes and the agent's directory holds container
//! logs; neither is anyone else's business on a shared host. New files get their mode from the
//! process's umask (set to 077 at start); what an earlier version or a careless copy left wider is
//! tightened here, and said so.

use std::fs::{self, DirBuilder};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;

use anyhow::Context;

/// Group and other permission bits.
const NOT_OWNER: u32 = 0o077;

/// Makes every file and directory the daemon creates from now on private to its user (0600 and
/// 0700), while leaving the umask of the containers it starts to the runtime.
pub fn private_umask() {
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(0o077) };
}

/// Creates `dir` (0700) if absent, and removes group and other access from it and everything in
/// it, logging what was tightened.
pub fn secure(dir: &Path) -> anyhow::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tightened = Vec::new();
    let top = mount_id(dir);
    tighten(dir, top, &mut tightened).with_context(|| format!("restricting permissions under {}", dir.display()))?;
    if !tightened.is_empty() {
        let shown: Vec<String> = tightened.iter().take(5).map(|p| p.display().to_string()).collect();
        tracing::warn!(
            dir = %dir.display(), count = tightened.len(), examples = ?shown,
            "data directory entries were readable by other users; group and other access removed"
        );
    }
    Ok(())
}

/// The id of the mount `path` is on (statx, Linux 5.8+); `None` where unknown.
fn mount_id(path: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statx writes into a zeroed struct we own; the path is NUL-terminated.
    unsafe {
        let mut buf: libc::statx = std::mem::zeroed();
        let r = libc::statx(libc::AT_FDCWD, c.as_ptr(), libc::AT_SYMLINK_NOFOLLOW, libc::STATX_MNT_ID, &mut buf);
        (r == 0 && buf.stx_mask & libc::STATX_MNT_ID != 0).then_some(buf.stx_mnt_id)
    }
}

/// Directories whose modes are container content, left as they are below them (the directory
/// above being private is enough): an image store (`blobs/sha256` and `layers` side by side),
/// whose unpacked layers and overlay roots a container's users rely on, and a pod's volumes
/// (`pods/<uid>/volumes`), whose ConfigMap files and emptyDirs keep the modes the pod asked for,
/// so that non-root containers the agent adopts after a restart can still read them.
fn holds_container_content(dir: &Path) -> bool {
    let pod_volumes = dir.file_name().is_some_and(|n| n == "volumes")
        && dir.parent().and_then(Path::parent).and_then(Path::file_name).is_some_and(|n| n == "pods");
    pod_volumes || (dir.join("blobs/sha256").is_dir() && dir.join("layers").is_dir())
}

/// Walks only the data directory's own mount: container roots, namespace files and whatever
/// else is mounted inside it belong to containers (a bind of the host's root among them).
fn tighten(path: &Path, top: Option<u64>, tightened: &mut Vec<std::path::PathBuf>) -> std::io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    if top.is_some() && mount_id(path) != top {
        return Ok(());
    }
    let mode = meta.permissions().mode();
    if mode & NOT_OWNER != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o7700 & !NOT_OWNER))?;
        tightened.push(path.to_path_buf());
    }
    if meta.is_dir() && !holds_container_content(path) {
        for entry in fs::read_dir(path)? {
            let entry = entry?;
            match tighten(&entry.path(), top, tightened) {
                // Removed meanwhile (a container ending): nothing left to protect.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).expect("metadata").permissions().mode() & 0o777
    }

    #[test]
    fn a_wide_data_directory_and_its_files_are_tightened_to_the_owner() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        fs::create_dir_all(dir.join("agent/containers/uid/web")).expect("mkdir");
        fs::write(dir.join("store.redb"), b"x").expect("write");
        fs::write(dir.join("agent/containers/uid/web/current.log"), b"x").expect("write");
        for p in ["", "agent", "agent/containers", "agent/containers/uid", "agent/containers/uid/web"] {
            fs::set_permissions(dir.join(p), fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        fs::set_permissions(dir.join("store.redb"), fs::Permissions::from_mode(0o644)).expect("chmod");
        fs::set_permissions(dir.join("agent/containers/uid/web/current.log"), fs::Permissions::from_mode(0o666)).expect("chmod");

        secure(&dir).expect("secure");
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("agent/containers/uid/web")), 0o700);
        assert_eq!(mode(&dir.join("store.redb")), 0o600);
        assert_eq!(mode(&dir.join("agent/containers/uid/web/current.log")), 0o600);
    }

    #[test]
    fn image_layers_keep_their_modes_because_they_are_image_content() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let layer = dir.join("agent/images/layers/sha256/abc/bin");
        fs::create_dir_all(&layer).expect("mkdir");
        fs::create_dir_all(dir.join("agent/images/blobs/sha256")).expect("mkdir");
        fs::write(layer.join("sh"), b"x").expect("write");
        fs::set_permissions(layer.join("sh"), fs::Permissions::from_mode(0o755)).expect("chmod");
        fs::set_permissions(dir.join("agent/images"), fs::Permissions::from_mode(0o755)).expect("chmod");
        secure(&dir).expect("secure");
        assert_eq!(mode(&dir.join("agent/images")), 0o700, "the store itself is private");
        assert_eq!(mode(&layer.join("sh")), 0o755);
    }

    #[test]
    fn pod_volume_files_keep_the_modes_their_pod_asked_for() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let volume = dir.join("agent/pods/uid-1/volumes/kubernetes.io~configmap/config");
        fs::create_dir_all(&volume).expect("mkdir");
        fs::write(volume.join("app.conf"), b"x").expect("write");
        fs::set_permissions(volume.join("app.conf"), fs::Permissions::from_mode(0o644)).expect("chmod");
        fs::set_permissions(dir.join("agent/pods"), fs::Permissions::from_mode(0o755)).expect("chmod");
        secure(&dir).expect("secure");
        assert_eq!(mode(&dir.join("agent/pods")), 0o700, "the agent's own directories are private");
        assert_eq!(mode(&volume.join("app.conf")), 0o644);
    }

    #[test]
    fn whatever_is_mounted_inside_the_data_directory_is_left_alone() {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test bind-mounts a directory and needs root");
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(dir.join("rootfs")).expect("mkdir");
        fs::create_dir_all(&outside).expect("mkdir");
        fs::write(outside.join("file"), b"x").expect("write");
        fs::set_permissions(outside.join("file"), fs::Permissions::from_mode(0o644)).expect("chmod");
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
        let (src, dst) = (c(&outside), c(&dir.join("rootfs")));
        // SAFETY: mount and umount2 with NUL-terminated paths.
        let mounted = unsafe { libc::mount(src.as_ptr(), dst.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) };
        assert_eq!(mounted, 0, "bind mount: {}", std::io::Error::last_os_error());
        let result = secure(&dir);
        // SAFETY: as above.
        unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) };
        result.expect("secure");
        assert_eq!(mode(&outside.join("file")), 0o644);
    }

    #[test]
    fn a_new_data_directory_is_created_for_the_owner_only() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("a/b");
        secure(&dir).expect("secure");
        assert_eq!(mode(&dir), 0o700);
    }
}
