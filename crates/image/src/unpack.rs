//! Layer unpacking: a tar (plain, gzip or zstd) into a directory overlayfs can stack, with OCI
//! whiteouts turned into overlay whiteouts and every path kept inside the layer's root.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, CWD, FileType, Mode, Timespec, Timestamps, XattrFlags};
use tar::EntryType;

use crate::digest::{Digest, Hasher};
use crate::error::{ImageError, Result};

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_WHITEOUT: &str = ".wh..wh..opq";
const OVERLAY_OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// Unpacks the layer blob at `blob` into `dest` (which must not exist), checking that the
/// uncompressed stream hashes to `diff_id`. Returns the bytes of regular files written. On error
/// `dest` may hold a partial tree: the caller unpacks into a temporary directory and discards it.
pub(crate) fn unpack_layer(blob: &Path, dest: &Path, diff_id: &Digest) -> Result<u64> {
    let fail = |reason: String| ImageError::Unpack {
        layer: blob.display().to_string(),
        reason,
    };
    let file = File::open(blob).map_err(|e| ImageError::io("opening", blob, e))?;
    let mut compressed = BufReader::with_capacity(256 * 1024, file);
    let magic = compressed.fill_buf().map_err(|e| ImageError::io("reading", blob, e))?;
    let tar: Box<dyn Read> = if magic.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::bufread::MultiGzDecoder::new(compressed))
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(ZstdFrames {
            source: Some(compressed),
            frame: None,
        })
    } else {
        Box::new(compressed)
    };
    fs::create_dir(dest).map_err(|e| ImageError::io("creating", dest, e))?;
    // A layer's root is `/` of its containers: 0755 unless the layer has an entry for it, whatever
    // the creating process's umask (the agent's keeps its own files private).
    fs::set_permissions(dest, fs::Permissions::from_mode(0o755)).map_err(|e| ImageError::io("setting the mode of", dest, e))?;
    let mut unpacker = Unpacker {
        root: dest,
        dir_times: Vec::new(),
        bytes: 0,
    };
    let mut archive = tar::Archive::new(Hasher::new(tar));
    let entries = archive.entries().map_err(|e| fail(read_error(&e)))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| fail(read_error(&e)))?;
        let raw = entry
            .path()
            .map_err(|e| fail(format!("entry with an unreadable path: {e}")))?
            .into_owned();
        unpacker
            .entry(&mut entry, &raw)
            .map_err(|reason| fail(format!("entry {:?}: {reason}", raw.display().to_string())))?;
    }
    // The tar's end-of-archive padding is part of the diff id but never reaches the entries.
    let mut hashing = archive.into_inner();
    io::copy(&mut hashing, &mut io::sink()).map_err(|e| fail(read_error(&e)))?;
    let (_, actual) = hashing.finish();
    if &actual != diff_id {
        return Err(ImageError::DigestMismatch {
            expected: diff_id.to_string(),
            actual: actual.to_string(),
        });
    }
    // Directory times last: creating entries inside a directory changes its mtime.
    for (path, mtime) in unpacker.dir_times.iter().rev() {
        set_mtime(path, *mtime).map_err(|e| fail(format!("setting the time of {}: {e}", path.display())))?;
    }
    Ok(unpacker.bytes)
}

/// Decodes every zstd frame of a stream (a layer compressed in parallel has several, back to back).
struct ZstdFrames<R: BufRead> {
    source: Option<R>,
    frame: Option<ruzstd::decoding::StreamingDecoder<R, ruzstd::decoding::FrameDecoder>>,
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if let Some(frame) = self.frame.as_mut() {
                let n = frame.read(buf)?;
                if n > 0 || buf.is_empty() {
                    return Ok(n);
                }
                self.source = self.frame.take().map(|f| f.into_inner());
            }
            let Some(mut source) = self.source.take() else {
                return Ok(0);
            };
            if source.fill_buf()?.is_empty() {
                return Ok(0);
            }
            let frame = ruzstd::decoding::StreamingDecoder::new(source).map_err(io::Error::other)?;
            self.frame = Some(frame);
        }
    }
}

fn read_error(e: &io::Error) -> String {
    format!("the layer is not a readable tar stream (corrupt or truncated compressed data?): {e}")
}

struct Unpacker<'a> {
    root: &'a Path,
    dir_times: Vec<(PathBuf, u64)>,
    bytes: u64,
}

impl Unpacker<'_> {
    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>, raw: &Path) -> Result<(), String> {
        let Some(relative) = contained(raw)? else {
            return Ok(());
        };
        let header = entry.header();
        let kind = header.entry_type();
        let mode = header.mode().map_err(|e| format!("bad mode: {e}"))? & 0o7777;
        let uid = header.uid().map_err(|e| format!("bad uid: {e}"))?;
        let gid = header.gid().map_err(|e| format!("bad gid: {e}"))?;
        let mtime = header.mtime().unwrap_or(0);
        let link_name = entry
            .link_name()
            .map_err(|e| format!("bad link name: {e}"))?
            .map(|l| l.into_owned());

        let name = relative.file_name().unwrap_or_default().to_string_lossy().into_owned();
        let parent = self.ensure_parent(&relative)?;
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            if name == OPAQUE_WHITEOUT {
                // The directory hides whatever lower layers have in it; overlayfs reads this xattr.
                return rustix::fs::lsetxattr(&parent, OVERLAY_OPAQUE_XATTR, b"y", XattrFlags::empty())
                    .map_err(|e| format!("marking the directory opaque: {e}"));
            }
            if hidden.starts_with(WHITEOUT_PREFIX) {
                return Ok(()); // other `.wh..wh.` names are aufs bookkeeping, meaningless here
            }
            let target = parent.join(hidden);
            remove_existing(&target)?;
            rustix::fs::mknodat(CWD, &target, FileType::CharacterDevice, Mode::empty(), 0)
                .map_err(|e| format!("creating the overlay whiteout: {e}"))?;
            return chown(&target, uid, gid);
        }

        let target = self.root.join(&relative);
        match kind {
            EntryType::Directory => {
                match fs::symlink_metadata(&target) {
                    Ok(meta) if meta.is_dir() => {}
                    Ok(_) => {
                        remove_existing(&target)?;
                        fs::create_dir(&target).map_err(|e| format!("creating the directory: {e}"))?;
                    }
                    Err(_) => fs::create_dir(&target).map_err(|e| format!("creating the directory: {e}"))?,
                }
                chown(&target, uid, gid)?;
                fs::set_permissions(&target, fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())?;
                self.dir_times.push((target.clone(), mtime));
            }
            EntryType::Regular | EntryType::Continuous => {
                remove_existing(&target)?;
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .custom_flags(libc_nofollow())
                    .mode(0o600)
                    .open(&target)
                    .map_err(|e| format!("creating the file: {e}"))?;
                self.bytes += io::copy(entry, &mut file).map_err(|e| read_error(&e))?;
                drop(file);
                // chown clears set-id bits, so the mode goes on after it.
                chown(&target, uid, gid)?;
                fs::set_permissions(&target, fs::Permissions::from_mode(mode)).map_err(|e| e.to_string())?;
                set_mtime(&target, mtime).map_err(|e| e.to_string())?;
            }
            EntryType::Symlink => {
                let link = link_name.ok_or("a symlink without a target")?;
                remove_existing(&target)?;
                // The target is read inside the container's root at run time, so an absolute or
                // `..` target is legitimate here; only writing *through* a symlink is refused.
                std::os::unix::fs::symlink(&link, &target).map_err(|e| format!("creating the symlink: {e}"))?;
                chown(&target, uid, gid)?;
                set_mtime(&target, mtime).map_err(|e| e.to_string())?;
            }
            EntryType::Link => {
                let link = link_name.ok_or("a hard link without a target")?;
                let source_rel = contained(&link)?.ok_or("a hard link to the layer's root")?;
                self.ensure_parent(&source_rel)?;
                let source = self.root.join(&source_rel);
                let meta = fs::symlink_metadata(&source)
                    .map_err(|_| format!("hard link to {:?}, which is not earlier in this layer", link.display()))?;
                if meta.is_dir() {
                    return Err(format!("hard link to the directory {:?}", link.display()));
                }
                remove_existing(&target)?;
                fs::hard_link(&source, &target).map_err(|e| format!("creating the hard link: {e}"))?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let what = match kind {
                    EntryType::Char => "a character device",
                    EntryType::Block => "a block device",
                    _ => "a FIFO",
                };
                return Err(format!(
                    "is {what}; device files and FIFOs are not allowed in image layers"
                ));
            }
            EntryType::XGlobalHeader | EntryType::XHeader | EntryType::GNULongName | EntryType::GNULongLink => {
                return Ok(());
            }
            other => return Err(format!("unsupported tar entry type {other:?}")),
        }
        if let Some(extensions) = entry.pax_extensions().map_err(|e| format!("bad PAX header: {e}"))? {
            for ext in extensions {
                let ext = ext.map_err(|e| format!("bad PAX header: {e}"))?;
                if let Some(name) = ext.key_bytes().strip_prefix(b"SCHILY.xattr.") {
                    if name.starts_with(b"trusted.") {
                        // `trusted.overlay.*` would steer overlayfs (redirects, opacity); OCI
                        // layers express those only through whiteout files.
                        tracing::warn!(
                            layer_entry = %relative.display(),
                            xattr = %String::from_utf8_lossy(name),
                            "ignoring a trusted.* extended attribute from an image layer"
                        );
                        continue;
                    }
                    rustix::fs::lsetxattr(&target, OsStr::from_bytes(name), ext.value_bytes(), XattrFlags::empty())
                        .map_err(|e| {
                            format!("setting the extended attribute {}: {e}", String::from_utf8_lossy(name))
                        })?;
                }
            }
        }
        Ok(())
    }

    /// Creates missing parent directories of `relative` and returns its parent's path, refusing a
    /// parent that is a symlink: following it could write outside the layer.
    fn ensure_parent(&mut self, relative: &Path) -> Result<PathBuf, String> {
        let mut dir = self.root.to_path_buf();
        let Some(parent) = relative.parent() else {
            return Ok(dir);
        };
        for component in parent.components() {
            dir.push(component);
            match fs::symlink_metadata(&dir) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(format!(
                        "its parent {:?} is a symlink; writing through it could escape the layer",
                        dir.strip_prefix(self.root).unwrap_or(&dir).display()
                    ));
                }
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => return Err(format!("its parent {:?} is not a directory", dir.display())),
                Err(_) => {
                    fs::create_dir(&dir).map_err(|e| format!("creating the parent directory: {e}"))?;
                    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(dir)
    }
}

/// The entry's path relative to the layer root; `None` for the root itself. Absolute paths and
/// `..` are refused: a layer only ever describes its own tree.
fn contained(raw: &Path) -> Result<Option<PathBuf>, String> {
    let mut out = PathBuf::new();
    for component in raw.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err("the path contains `..` and could escape the layer".into());
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err("the path is absolute; layer paths are relative to the image root".into());
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Later entries replace earlier ones of the same path, as `tar` extraction does.
fn remove_existing(path: &Path) -> Result<(), String> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path).map_err(|e| format!("replacing a directory: {e}")),
        Ok(_) => fs::remove_file(path).map_err(|e| format!("replacing a file: {e}")),
        Err(_) => Ok(()),
    }
}

fn chown(path: &Path, uid: u64, gid: u64) -> Result<(), String> {
    let (Ok(uid), Ok(gid)) = (u32::try_from(uid), u32::try_from(gid)) else {
        return Err(format!("owner {uid}:{gid} is out of range"));
    };
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(|e| {
        if e.kind() == io::ErrorKind::PermissionDenied {
            format!("setting the owner to {uid}:{gid} needs root: {e}")
        } else {
            format!("setting the owner: {e}")
        }
    })
}

fn set_mtime(path: &Path, mtime: u64) -> rustix::io::Result<()> {
    let time = Timespec {
        tv_sec: mtime.min(i64::MAX as u64) as i64,
        tv_nsec: 0,
    };
    rustix::fs::utimensat(
        CWD,
        path,
        &Timestamps {
            last_access: time,
            last_modification: time,
        },
        AtFlags::SYMLINK_NOFOLLOW,
    )
}

fn libc_nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}
