//! A container's root filesystem: an overlay of its image's unpacked layers under a private upper dir.

use std::collections::HashSet;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, UnmountFlags};

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::store::{ImageRecord, ImageStore};

/// The file in a container's directory naming the unpacked layers its root is made of.
const LAYERS_IN_USE: &str = "layers";

impl ImageStore {
    /// Unpacked layers under some container's root (see `mount_rootfs`).
    pub(crate) fn layers_in_use(&self) -> Result<HashSet<Digest>> {
        let dir = self.root().join("containers");
        let mut used = HashSet::new();
        for entry in fs::read_dir(&dir).map_err(|e| ImageError::io("listing", &dir, e))?.flatten() {
            let text = fs::read_to_string(entry.path().join(LAYERS_IN_USE)).unwrap_or_default();
            used.extend(text.lines().filter_map(|l| Digest::parse(l).ok()));
        }
        Ok(used)
    }

    fn container_dir(&self, container_id: &str) -> Result<PathBuf> {
        let invalid = |reason: &str| ImageError::InvalidContainerId {
            id: container_id.to_string(),
            reason: reason.into(),
        };
        if container_id.is_empty() || container_id.len() > 128 {
            return Err(invalid("must be 1 to 128 characters"));
        }
        if !container_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            || container_id.starts_with('.')
        {
            return Err(invalid(
                "only letters, digits, '-', '_' and '.' (not first) are allowed",
            ));
        }
        Ok(self.root().join("containers").join(container_id))
    }

    /// Mounts `image`'s layers (unpacked, see `ensure_layer`) read-only under a fresh writable
    /// layer for `container_id` and returns the root's path. Mounting an already mounted
    /// container returns its root unchanged, so an agent can re-adopt containers after a restart.
    pub fn mount_rootfs(&self, container_id: &str, image: &ImageRecord) -> Result<PathBuf> {
        let dir = self.container_dir(container_id)?;
        let rootfs = dir.join("rootfs");
        if is_mount_point(&rootfs) {
            return Ok(rootfs);
        }
        let upper = dir.join("upper");
        let work = dir.join("work");
        for path in [&rootfs, &upper, &work] {
            fs::create_dir_all(path).map_err(|e| ImageError::io("creating", path, e))?;
        }
        // The layers stay in use for as long as this root exists, even once the reference has
        // moved to another image (a re-pull under `Always`): garbage collection reads this list.
        let in_use: String = image.layers.iter().map(|l| format!("{}\n", l.diff_id)).collect();
        let list = dir.join(LAYERS_IN_USE);
        fs::write(&list, in_use).map_err(|e| ImageError::io("writing", &list, e))?;
        let mut lower: Vec<PathBuf> = Vec::with_capacity(image.layers.len() + 1);
        // overlayfs lists the topmost lower layer first; the manifest lists the base first.
        for layer in image.layers.iter().rev() {
            let path = self.layer_path(&layer.diff_id);
            if !path.is_dir() {
                return Err(ImageError::NotPresent {
                    reference: image.reference.clone(),
                });
            }
            lower.push(path);
        }
        if lower.is_empty() {
            // overlayfs needs a lower layer; an image without layers starts from an empty root.
            let empty = dir.join("empty");
            fs::create_dir_all(&empty).map_err(|e| ImageError::io("creating", &empty, e))?;
            fs::set_permissions(&empty, fs::Permissions::from_mode(0o755))
                .map_err(|e| ImageError::io("setting the mode of", &empty, e))?;
            lower.push(empty);
        }
        // The merged root takes the upper directory's mode: give it the image's, so that users
        // other than root can enter `/`.
        let root_mode = fs::metadata(&lower[0]).map(|m| m.mode() & 0o7777).unwrap_or(0o755);
        fs::set_permissions(&upper, fs::Permissions::from_mode(root_mode))
            .map_err(|e| ImageError::io("setting the mode of", &upper, e))?;
        check_option_paths(
            lower
                .iter()
                .map(PathBuf::as_path)
                .chain([upper.as_path(), work.as_path()]),
        )?;
        let mounted = match legacy_options(&lower, &upper, &work) {
            Some(options) => rustix::mount::mount("overlay", &rootfs, "overlay", MountFlags::empty(), Some(&*options)),
            None => mount_layer_by_layer(&lower, &upper, &work, &rootfs),
        };
        mounted.map_err(|e| {
            let hint = if e == rustix::io::Errno::PERM {
                " (mounting needs root)"
            } else {
                ""
            };
            ImageError::io(
                "mounting the overlay root at",
                &rootfs,
                io::Error::other(format!("{e}{hint}")),
            )
        })?;
        Ok(rootfs)
    }

    /// Unmounts the container's root and removes its writable layer; nothing of it remains.
    /// Removing a container that has no root is not an error.
    pub fn remove_rootfs(&self, container_id: &str) -> Result<()> {
        let dir = self.container_dir(container_id)?;
        let rootfs = dir.join("rootfs");
        if is_mount_point(&rootfs) {
            let unmounted = rustix::mount::unmount(&rootfs, UnmountFlags::empty()).or_else(|e| {
                // A process still holding the root open keeps it busy; detach it so it goes with them.
                if e == rustix::io::Errno::BUSY {
                    rustix::mount::unmount(&rootfs, UnmountFlags::DETACH)
                } else {
                    Err(e)
                }
            });
            unmounted.map_err(|e| ImageError::io("unmounting", &rootfs, e.into()))?;
        }
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ImageError::io("removing", &dir, e)),
        }
    }
}

fn check_option_paths<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    for path in paths {
        let text = path.to_str().unwrap_or(",");
        if text.contains([',', ':']) {
            return Err(ImageError::Internal(format!(
                "the image store path {} contains ',' or ':', which overlay mount options cannot carry",
                path.display()
            )));
        }
    }
    Ok(())
}

/// The classic `mount(2)` options, or `None` when they do not fit the one page the kernel reads.
fn legacy_options(lower: &[PathBuf], upper: &Path, work: &Path) -> Option<CString> {
    let lower: Vec<&str> = lower.iter().filter_map(|p| p.to_str()).collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.join(":"),
        upper.to_str().unwrap_or_default(),
        work.to_str().unwrap_or_default()
    );
    if options.len() >= 4095 {
        None
    } else {
        CString::new(options).ok()
    }
}

/// Images with many layers: the mount API (Linux 6.8+) takes each lower layer as its own
/// `lowerdir+` parameter, so the page limit on the joined options does not apply.
fn mount_layer_by_layer(lower: &[PathBuf], upper: &Path, work: &Path, target: &Path) -> rustix::io::Result<()> {
    use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags};
    let fs = rustix::mount::fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)?;
    for layer in lower {
        rustix::mount::fsconfig_set_string(&fs, "lowerdir+", layer)?;
    }
    rustix::mount::fsconfig_set_string(&fs, "upperdir", upper)?;
    rustix::mount::fsconfig_set_string(&fs, "workdir", work)?;
    rustix::mount::fsconfig_create(&fs)?;
    let mount = rustix::mount::fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, MountAttrFlags::empty())?;
    rustix::mount::move_mount(
        &mount,
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
}

/// A mounted root has another device than the directory holding it.
fn is_mount_point(path: &Path) -> bool {
    let (Ok(meta), Some(parent)) = (fs::symlink_metadata(path), path.parent()) else {
        return false;
    };
    fs::symlink_metadata(parent).is_ok_and(|p| p.dev() != meta.dev())
}
