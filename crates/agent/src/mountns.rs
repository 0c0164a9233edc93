//! The process runtime's volume mounts: planned before the container starts, made in the
//! container's own mount namespace between fork and exec.
//!
//! There is no image root, so the container sees the host's filesystem. A mount path that exists
//! on the host is bound over directly. One that does not is made without touching the host's
//! real filesystem:
//! - below an existing directory other than `/`: that directory gets, in the container's
//!   namespace only, an overlay whose lower layer is the directory itself and whose upper layer
//!   lies on a tmpfs private to the container; the missing directories (or the file, for a file
//!   volume) are created in that overlay. The directory looks the same to the container (what it
//!   writes there stays in its tmpfs), except that mounts nested below it on the host are not
//!   carried into the overlay.
//! - in a top-level directory the host lacks (`/data`): the container gets a root of its own, a
//!   tmpfs holding a recursive bind of every entry of the host's `/` (and its symbolic links), in
//!   which the missing directory is made; the container is chrooted into it.
//!
//! Then the volume is bound over the path.

use std::ffi::CString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::runtime::Mount;

/// What the forked child does, prepared before the fork (the child may not allocate).
#[derive(Debug, Default)]
pub(crate) struct MountPlan {
    /// Directories overlaid, parents before children, before any bind.
    overlays: Vec<Overlay>,
    binds: Vec<BindMount>,
    /// Where the overlays' tmpfs goes (a directory in the container's own directory).
    scratch: Option<CString>,
    /// A root of the container's own, for mount paths in top-level directories the host lacks.
    new_root: Option<NewRoot>,
}

#[derive(Debug)]
struct NewRoot {
    /// The new root, on the scratch tmpfs.
    dir: CString,
    /// The host's top-level entries, mirrored into it.
    entries: Vec<RootEntry>,
}

#[derive(Debug)]
struct RootEntry {
    host: CString,
    inside: CString,
    kind: EntryKind,
}

#[derive(Debug)]
enum EntryKind {
    Dir,
    File,
    Symlink(CString),
}

#[derive(Debug)]
struct Overlay {
    target: CString,
    upper: CString,
    work: CString,
    options: CString,
}

#[derive(Debug)]
struct BindMount {
    source: CString,
    destination: CString,
    read_only: bool,
    /// Made (in the overlay) before the bind, in order; the last is a file for a file volume.
    create: Vec<CString>,
    file: bool,
}

/// A mount whose path does not exist on the host: where the overlay goes and what to create.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Missing {
    pub overlay_at: PathBuf,
    pub create: Vec<PathBuf>,
}

fn cstring(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| format!("path {} contains a NUL byte", p.display()))
}

fn kind(dir: bool) -> &'static str {
    if dir { "directory" } else { "file" }
}

/// Checks `mounts` against the host and says, for each (parents first), what is missing.
pub(crate) fn check(mounts: &[Mount]) -> Result<Vec<(Mount, Option<Missing>)>, String> {
    let mut mounts = mounts.to_vec();
    mounts.sort_by_key(|m| Path::new(&m.destination).components().count());
    let mut out = Vec::new();
    for mut m in mounts {
        let dest = Path::new(&m.destination);
        if !dest.is_absolute() || dest.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(format!("mount path {:?} is not an absolute path without ..", m.destination));
        }
        // A path the host lacks below a symbolic link (`/var/run` -> `/run`) is made where the link
        // leads, which is where the container looks for it.
        if fs::symlink_metadata(dest).is_err() {
            m.destination = resolve_existing_links(dest).to_string_lossy().into_owned();
        }
        let dest = Path::new(&m.destination);
        let source = fs::metadata(&m.source).map_err(|e| format!("volume source {}: {e}", m.source.display()))?;
        let missing = match fs::symlink_metadata(dest) {
            Ok(_) => {
                let target = fs::metadata(dest).map_err(|e| format!("mount path {}: {e}", m.destination))?;
                if source.is_dir() != target.is_dir() {
                    return Err(format!(
                        "mount path {} is a {} on this host, and the volume is a {}",
                        m.destination,
                        kind(target.is_dir()),
                        kind(source.is_dir())
                    ));
                }
                None
            }
            Err(_) => Some(missing_below(dest, &m.destination)?),
        };
        out.push((m, missing));
    }
    Ok(out)
}

/// `dest` with the symbolic links of its longest existing prefix resolved on the host.
fn resolve_existing_links(dest: &Path) -> PathBuf {
    let mut existing = dest.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(mut real) = fs::canonicalize(&existing) {
            real.extend(rest.iter().rev());
            return real;
        }
        match (existing.parent().map(Path::to_path_buf), existing.file_name().map(|n| n.to_os_string())) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => return dest.to_path_buf(),
        }
    }
}

fn missing_below(dest: &Path, shown: &str) -> Result<Missing, String> {
    let mut create = vec![dest.to_path_buf()];
    let mut at = dest.parent();
    while let Some(dir) = at {
        match fs::symlink_metadata(dir) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(format!("mount path {shown}: {} is not a directory on this host", dir.display()));
            }
            Err(_) => create.push(dir.to_path_buf()),
        }
        at = dir.parent();
    }
    let overlay_at = at.map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
    // The overlay's mount options separate paths with ',' and ':'.
    if overlay_at.as_os_str().as_encoded_bytes().iter().any(|b| matches!(b, b',' | b':' | b'\\')) {
        return Err(format!("mount path {shown}: {} has a character overlay options cannot carry", overlay_at.display()));
    }
    create.reverse();
    Ok(Missing { overlay_at, create })
}

impl MountPlan {
    /// The plan for `mounts`, with the overlays' scratch space under `scratch` (which the caller
    /// creates; it lies in the agent's data directory, not in the host's real filesystem).
    pub(crate) fn new(mounts: &[Mount], scratch: &Path) -> Result<MountPlan, String> {
        let checked = check(mounts)?;
        let mut plan = MountPlan::default();
        let mut overlaid: Vec<PathBuf> = Vec::new();
        let mut wanted: Vec<PathBuf> = checked.iter().filter_map(|(_, m)| m.as_ref().map(|m| m.overlay_at.clone())).collect();
        wanted.sort_by_key(|p| p.components().count());
        if wanted.first().is_some_and(|p| p == Path::new("/")) {
            plan.new_root = Some(mirror_root(&scratch.join("root"))?);
            wanted.retain(|p| p != Path::new("/"));
        }
        for dir in wanted {
            // Everything below an overlaid directory is writable already.
            if overlaid.iter().any(|o| dir.starts_with(o)) {
                continue;
            }
            let n = overlaid.len();
            let (upper, work) = (scratch.join(format!("upper{n}")), scratch.join(format!("work{n}")));
            let options = format!("lowerdir={},upperdir={},workdir={}", dir.display(), upper.display(), work.display());
            plan.overlays.push(Overlay {
                target: cstring(&dir)?,
                upper: cstring(&upper)?,
                work: cstring(&work)?,
                options: CString::new(options).map_err(|_| "overlay options contain a NUL byte")?,
            });
            overlaid.push(dir);
        }
        if !plan.overlays.is_empty() || plan.new_root.is_some() {
            plan.scratch = Some(cstring(scratch)?);
        }
        for (m, missing) in checked {
            let file = !m.source.is_dir();
            plan.binds.push(BindMount {
                source: cstring(&m.source)?,
                destination: cstring(Path::new(&m.destination))?,
                read_only: m.read_only,
                create: missing.map(|x| x.create.iter().map(|p| cstring(p)).collect::<Result<_, _>>()).transpose()?.unwrap_or_default(),
                file,
            });
        }
        Ok(plan)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.binds.is_empty()
    }

    /// Makes the mounts. Runs in the forked child, in its own (private) mount namespace.
    ///
    /// # Safety
    /// Async-signal-safe calls only (mount, mkdir, open, close) on data prepared before the fork.
    pub(crate) unsafe fn apply(&self) -> io::Result<()> {
        let none = std::ptr::null();
        let fail = || Err(io::Error::last_os_error());
        // SAFETY (whole body): the pointers are NUL-terminated strings owned by `self`.
        unsafe {
            if let Some(scratch) = &self.scratch {
                let nosuid = libc::MS_NOSUID | libc::MS_NODEV;
                if libc::mount(c"tmpfs".as_ptr(), scratch.as_ptr(), c"tmpfs".as_ptr(), nosuid, c"mode=0755".as_ptr().cast()) != 0 {
                    return fail();
                }
            }
            // The sources may lie below an overlaid directory, where their paths would lead into
            // the overlay instead of the volume: hold them open from before.
            let mut held = [-1 as libc::c_int; MAX_MOUNTS];
            if self.binds.len() > MAX_MOUNTS {
                return Err(io::Error::other("too many volume mounts"));
            }
            for (i, m) in self.binds.iter().enumerate() {
                held[i] = libc::open(m.source.as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
                if held[i] < 0 {
                    return fail();
                }
            }
            for o in &self.overlays {
                if libc::mkdir(o.upper.as_ptr(), 0o755) != 0 || libc::mkdir(o.work.as_ptr(), 0o700) != 0 {
                    return fail();
                }
                if libc::mount(c"overlay".as_ptr(), o.target.as_ptr(), c"overlay".as_ptr(), 0, o.options.as_ptr().cast()) != 0 {
                    return fail();
                }
            }
            if let Some(root) = &self.new_root {
                root.enter()?;
            }
            for (n, m) in self.binds.iter().enumerate() {
                for (i, p) in m.create.iter().enumerate() {
                    if m.file && i + 1 == m.create.len() {
                        let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644);
                        if fd < 0 {
                            return fail();
                        }
                        libc::close(fd);
                    } else if libc::mkdir(p.as_ptr(), 0o755) != 0 && *libc::__errno_location() != libc::EEXIST {
                        return fail();
                    }
                }
                let mut path = [0u8; 32];
                fd_path(held[n], &mut path);
                let flags = libc::MS_BIND | libc::MS_REC;
                if libc::mount(path.as_ptr().cast(), m.destination.as_ptr(), none, flags, none.cast()) != 0 {
                    return fail();
                }
                libc::close(held[n]);
                // A bind mount takes MS_RDONLY only through a remount of itself.
                let ro = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
                if m.read_only && libc::mount(none, m.destination.as_ptr(), none, ro, none.cast()) != 0 {
                    return fail();
                }
            }
        }
        Ok(())
    }
}

/// The plan of a root mirroring the host's top-level entries, at `dir`.
fn mirror_root(dir: &Path) -> Result<NewRoot, String> {
    let mut entries = Vec::new();
    for e in fs::read_dir("/").map_err(|e| format!("reading /: {e}"))?.flatten() {
        let host = Path::new("/").join(e.file_name());
        let Ok(meta) = fs::symlink_metadata(&host) else { continue };
        let kind = if meta.file_type().is_symlink() {
            let Ok(target) = fs::read_link(&host) else { continue };
            EntryKind::Symlink(cstring(&target)?)
        } else if meta.is_dir() {
            EntryKind::Dir
        } else {
            EntryKind::File
        };
        entries.push(RootEntry { host: cstring(&host)?, inside: cstring(&dir.join(e.file_name()))?, kind });
    }
    Ok(NewRoot { dir: cstring(dir)?, entries })
}

impl NewRoot {
    /// Builds the new root and chroots into it.
    ///
    /// # Safety
    /// Async-signal-safe calls only, on data prepared before the fork.
    unsafe fn enter(&self) -> io::Result<()> {
        let none = std::ptr::null();
        let fail = || Err(io::Error::last_os_error());
        // SAFETY (whole body): NUL-terminated strings owned by `self`.
        unsafe {
            // A tmpfs of its own, left out of the recursive binds below (one of which holds it);
            // an overlay's upper layer cannot lie on such a mount, so it is not the scratch one.
            let nosuid = libc::MS_NOSUID | libc::MS_NODEV;
            if libc::mkdir(self.dir.as_ptr(), 0o755) != 0
                || libc::mount(c"tmpfs".as_ptr(), self.dir.as_ptr(), c"tmpfs".as_ptr(), nosuid, c"mode=0755".as_ptr().cast()) != 0
                || libc::mount(none, self.dir.as_ptr(), none, libc::MS_UNBINDABLE, none.cast()) != 0
            {
                return fail();
            }
            for e in &self.entries {
                let made = match &e.kind {
                    EntryKind::Symlink(target) => {
                        libc::symlink(target.as_ptr(), e.inside.as_ptr());
                        continue;
                    }
                    EntryKind::Dir => libc::mkdir(e.inside.as_ptr(), 0o755) == 0,
                    EntryKind::File => {
                        let fd = libc::open(e.inside.as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644);
                        fd >= 0 && libc::close(fd) == 0
                    }
                };
                let flags = libc::MS_BIND | libc::MS_REC;
                if !made || libc::mount(e.host.as_ptr(), e.inside.as_ptr(), none, flags, none.cast()) != 0 {
                    return fail();
                }
            }
            if libc::chdir(self.dir.as_ptr()) != 0 || libc::chroot(c".".as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                return fail();
            }
        }
        Ok(())
    }
}

/// The most volume mounts one container may have.
const MAX_MOUNTS: usize = 256;

/// Writes `/proc/self/fd/<fd>` and a NUL into `out` without allocating.
fn fd_path(fd: libc::c_int, out: &mut [u8; 32]) {
    let prefix = b"/proc/self/fd/";
    out[..prefix.len()].copy_from_slice(prefix);
    let mut digits = [0u8; 12];
    let text = crate::process::format_code(fd, &mut digits);
    out[prefix.len()..prefix.len() + text.len()].copy_from_slice(text);
    out[prefix.len() + text.len()] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(source: &Path, destination: &Path) -> Mount {
        Mount { source: source.to_path_buf(), destination: destination.to_string_lossy().into_owned(), read_only: false }
    }

    #[test]
    fn a_missing_mount_path_is_planned_as_an_overlay_on_its_nearest_existing_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("vol");
        fs::create_dir(&volume).expect("mkdir");
        let deep = dir.path().join("not/there");
        let checked = check(&[mount(&volume, &deep)]).expect("planned");
        let missing = checked[0].1.clone().expect("missing");
        assert_eq!(missing.overlay_at, dir.path());
        assert_eq!(missing.create, vec![dir.path().join("not"), deep.clone()]);
        assert!(!dir.path().join("not").exists(), "nothing is created on the host while planning");

        let plan = MountPlan::new(&[mount(&volume, &deep), mount(&volume, &dir.path().join("other"))], &dir.path().join("s"))
            .expect("plan");
        assert_eq!(plan.overlays.len(), 1, "one overlay serves every missing path below it: {plan:?}");
        assert!(plan.scratch.is_some());
    }

    #[test]
    fn a_mount_path_in_a_top_level_directory_the_host_lacks_gets_a_root_of_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("vol");
        fs::create_dir(&volume).expect("mkdir");
        let top = PathBuf::from(format!("/shepherd-no-such-dir-{}", std::process::id()));
        let plan = MountPlan::new(&[mount(&volume, &top.join("x"))], &dir.path().join("s")).expect("plan");
        let root = plan.new_root.as_ref().expect("a root of its own");
        assert_eq!(root.dir.as_bytes(), dir.path().join("s/root").as_os_str().as_encoded_bytes());
        assert!(root.entries.iter().any(|e| e.host.as_bytes() == b"/etc" && matches!(e.kind, EntryKind::Dir)));
        assert!(plan.overlays.is_empty(), "{plan:?}");
        assert_eq!(plan.binds[0].create.len(), 2, "the top-level directory and the path are made in the new root");
        assert!(!top.exists());
    }

    #[test]
    fn descriptor_paths_are_written_without_allocating() {
        let mut out = [0u8; 32];
        fd_path(1234, &mut out);
        assert_eq!(std::ffi::CStr::from_bytes_until_nul(&out).ok(), Some(c"/proc/self/fd/1234"));
    }

    #[test]
    fn a_missing_mount_path_below_a_symbolic_link_is_made_where_the_link_leads() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("vol");
        fs::create_dir_all(dir.path().join("real")).expect("mkdir");
        fs::create_dir(&volume).expect("mkdir");
        std::os::unix::fs::symlink(dir.path().join("real"), dir.path().join("link")).expect("symlink");
        let checked = check(&[mount(&volume, &dir.path().join("link/secrets/token"))]).expect("planned");
        let (m, missing) = &checked[0];
        let real = fs::canonicalize(dir.path().join("real")).expect("real");
        assert_eq!(Path::new(&m.destination), real.join("secrets/token"));
        assert_eq!(missing.as_ref().map(|m| m.overlay_at.clone()), Some(real));
    }

    #[test]
    fn mount_paths_that_cannot_be_made_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("vol");
        fs::create_dir(&volume).expect("mkdir");
        let file = dir.path().join("file");
        fs::write(&file, "x").expect("write");

        let err = check(&[mount(&volume, &file)]).err().unwrap_or_default();
        assert!(err.contains("is a file on this host, and the volume is a directory"), "{err}");
        let err = check(&[mount(&volume, &file.join("below"))]).err().unwrap_or_default();
        assert!(err.contains("is not a directory on this host"), "{err}");
        let err = check(&[mount(&volume, Path::new("relative"))]).err().unwrap_or_default();
        assert!(err.contains("not an absolute path"), "{err}");

        let existing = check(&[mount(&volume, &volume), mount(&volume, dir.path())]).expect("existing");
        assert_eq!(existing[0].0.destination, dir.path().to_string_lossy(), "parents are mounted first");
        assert!(existing.iter().all(|(_, m)| m.is_none()));
    }
}
