//! The process runtime's volume mounts: planned before the container starts, made by the
//! `shepherd-shim` program in the container's own mount namespace before its exec.
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
use std::path::{Component, Path, PathBuf};

pub(crate) use shepherd_shim::start::MountPlan;
use shepherd_shim::start::{BindMount, EntryKind, NewRoot, Overlay, RootEntry};

use crate::runtime::Mount;

/// The most volume mounts one container may have.
const MAX_MOUNTS: usize = 256;

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

/// The plan for `mounts`, with the overlays' scratch space under `scratch` (which the caller
/// creates; it lies in the agent's data directory, not in the host's real filesystem).
pub(crate) fn plan(mounts: &[Mount], scratch: &Path) -> Result<MountPlan, String> {
    if mounts.len() > MAX_MOUNTS {
        return Err(format!("{} volume mounts: a container may have at most {MAX_MOUNTS}", mounts.len()));
    }
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

        let plan = super::plan(&[mount(&volume, &deep), mount(&volume, &dir.path().join("other"))], &dir.path().join("s"))
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
        let plan = super::plan(&[mount(&volume, &top.join("x"))], &dir.path().join("s")).expect("plan");
        let root = plan.new_root.as_ref().expect("a root of its own");
        assert_eq!(root.dir.as_bytes(), dir.path().join("s/root").as_os_str().as_encoded_bytes());
        assert!(root.entries.iter().any(|e| e.host.as_bytes() == b"/etc" && matches!(e.kind, EntryKind::Dir)));
        assert!(plan.overlays.is_empty(), "{plan:?}");
        assert_eq!(plan.binds[0].create.len(), 2, "the top-level directory and the path are made in the new root");
        assert!(!top.exists());
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
