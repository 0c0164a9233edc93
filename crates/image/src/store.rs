//! The content-addressed image store: verified blobs, unpacked layers and image records under one directory.
//!
//! Layout under the root:
//! - `blobs/sha256/<hex>`: manifests' config and layer blobs, each verified against its digest as written;
//! - `layers/sha256/<diff-id hex>/`: a layer unpacked once, shared by every image and container using it;
//! - `images/<sha256 of the reference>.json`: what a reference resolved to when it was last pulled;
//! - `containers/<id>/`: a container's overlay root (see `overlay`);
//! - `tmp/`: partial writes, renamed into place when complete, so a crash never leaves a half blob or layer.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::digest::{Digest, Hasher};
use crate::error::{ImageError, Result};
use crate::unpack;

/// What a reference resolved to, with the layers in the manifest's order (base first).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageRecord {
    /// The normalized reference (`docker.io/library/nginx:latest`).
    pub reference: String,
    pub manifest_digest: Digest,
    pub config_digest: Digest,
    pub layers: Vec<LayerRecord>,
    /// Bytes of the blobs as pulled (compressed layers plus config), as kubelet reports an image's size.
    pub size: u64,
    /// Milliseconds since the Unix epoch of the last pull or container start; image GC removes the
    /// least recently used first.
    pub last_used_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerRecord {
    /// The blob as stored in the registry (usually gzip-compressed).
    pub digest: Digest,
    /// The digest of the uncompressed tar, from the image config; names the unpacked layer.
    pub diff_id: Digest,
    pub size: u64,
}

pub struct ImageStore {
    root: PathBuf,
    /// Serializes read-modify-write of image records and garbage collection within the process.
    pub(crate) records: Mutex<()>,
    /// One lock per layer being unpacked, so that two pulls sharing a layer unpack it once.
    unpacking: Mutex<HashMap<Digest, Arc<Mutex<()>>>>,
    /// Digests a pull in progress has fetched or relies on before its record exists; garbage
    /// collection leaves them alone (a count, since pulls of two images may share a layer).
    pinned: Mutex<HashMap<Digest, usize>>,
}

/// Keeps digests from garbage collection while alive.
pub struct Pin<'a> {
    store: &'a ImageStore,
    digests: Vec<Digest>,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let mut pinned = lock(&self.store.pinned);
        for d in &self.digests {
            if let Some(n) = pinned.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    pinned.remove(d);
                }
            }
        }
    }
}

/// Writes a blob to a temporary file while hashing it; `commit` moves it into place only if its
/// digest is the expected one. Dropped uncommitted, it leaves nothing behind.
pub struct BlobWriter {
    expected: Digest,
    tmp: PathBuf,
    dest: PathBuf,
    out: Option<Hasher<BufWriter<File>>>,
}

impl Write for BlobWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.out.as_mut() {
            Some(out) => out.write(buf),
            None => Err(io::Error::other("blob writer already finished")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.as_mut().map_or(Ok(()), |out| out.flush())
    }
}

impl BlobWriter {
    /// Verifies and stores the blob, returning its size.
    pub fn commit(mut self) -> Result<u64> {
        let out = self
            .out
            .take()
            .ok_or_else(|| ImageError::Internal("blob writer already finished".into()))?;
        let len = out.len();
        let (buffered, actual) = out.finish();
        let file = buffered
            .into_inner()
            .map_err(|e| ImageError::io("writing", &self.tmp, e.into_error()))?;
        if actual != self.expected {
            return Err(ImageError::DigestMismatch {
                expected: self.expected.to_string(),
                actual: actual.to_string(),
            });
        }
        file.sync_all().map_err(|e| ImageError::io("syncing", &self.tmp, e))?;
        fs::rename(&self.tmp, &self.dest).map_err(|e| ImageError::io("renaming into place", &self.dest, e))?;
        Ok(len)
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if self.tmp.exists() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

impl ImageStore {
    /// Opens (creating) a store under `root`, discarding partial writes a crash may have left.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        let tmp = root.join("tmp");
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| ImageError::io("clearing", &tmp, e))?;
        }
        for dir in ["blobs/sha256", "layers/sha256", "images", "containers", "tmp"] {
            let path = root.join(dir);
            fs::create_dir_all(&path).map_err(|e| ImageError::io("creating", &path, e))?;
        }
        Ok(ImageStore {
            root,
            records: Mutex::new(()),
            unpacking: Mutex::new(HashMap::new()),
            pinned: Mutex::new(HashMap::new()),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    pub fn has_blob(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    pub fn layer_path(&self, diff_id: &Digest) -> PathBuf {
        self.root.join("layers/sha256").join(diff_id.hex())
    }

    pub(crate) fn temp_path(&self, what: &str) -> PathBuf {
        self.root.join("tmp").join(format!("{what}-{}", uuid::Uuid::new_v4()))
    }

    pub fn blob_writer(&self, expected: &Digest) -> Result<BlobWriter> {
        let tmp = self.temp_path("blob");
        let file = File::create_new(&tmp).map_err(|e| ImageError::io("creating", &tmp, e))?;
        Ok(BlobWriter {
            expected: expected.clone(),
            dest: self.blob_path(expected),
            tmp,
            out: Some(Hasher::new(BufWriter::with_capacity(256 * 1024, file))),
        })
    }

    /// Stores a blob read from `content`, verified against `expected`; a mismatch stores nothing.
    pub fn write_blob(&self, expected: &Digest, mut content: impl Read) -> Result<u64> {
        let mut writer = self.blob_writer(expected)?;
        let tmp = writer.tmp.clone();
        io::copy(&mut content, &mut writer).map_err(|e| ImageError::io("writing", tmp, e))?;
        writer.commit()
    }

    pub fn read_blob(&self, digest: &Digest) -> Result<Vec<u8>> {
        let path = self.blob_path(digest);
        fs::read(&path).map_err(|e| ImageError::io("reading", path, e))
    }

    /// Parsed image config (entrypoint, command, environment, user) of a stored image.
    pub fn config(&self, image: &ImageRecord) -> Result<oci_spec::image::ImageConfiguration> {
        let bytes = self.read_blob(&image.config_digest)?;
        serde_json::from_slice(&bytes).map_err(|e| ImageError::Corrupt {
            path: self.blob_path(&image.config_digest),
            reason: format!("not an image config: {e}"),
        })
    }

    pub fn pin(&self, digests: impl IntoIterator<Item = Digest>) -> Pin<'_> {
        let digests: Vec<Digest> = digests.into_iter().collect();
        let mut pinned = lock(&self.pinned);
        for d in &digests {
            *pinned.entry(d.clone()).or_default() += 1;
        }
        Pin { store: self, digests }
    }

    /// The unpacked root of a stored layer, unpacking its blob first if no one has yet. Blocking.
    pub fn ensure_layer(&self, layer: &LayerRecord) -> Result<PathBuf> {
        let dest = self.layer_path(&layer.diff_id);
        if dest.is_dir() {
            return Ok(dest);
        }
        let gate = lock(&self.unpacking).entry(layer.diff_id.clone()).or_default().clone();
        let _unpacking = lock(&gate);
        let result = if dest.is_dir() {
            Ok(dest.clone())
        } else {
            let tmp = self.temp_path("layer");
            match unpack::unpack_layer(&self.blob_path(&layer.digest), &tmp, &layer.diff_id) {
                Ok(_) => fs::rename(&tmp, &dest).map(|_| dest.clone()).map_err(|e| {
                    let _ = fs::remove_dir_all(&tmp);
                    ImageError::io("renaming into place", &dest, e)
                }),
                Err(e) => {
                    let _ = fs::remove_dir_all(&tmp);
                    Err(match e {
                        ImageError::Unpack { reason, .. } => ImageError::Unpack {
                            layer: layer.digest.to_string(),
                            reason,
                        },
                        other => other,
                    })
                }
            }
        };
        lock(&self.unpacking).remove(&layer.diff_id);
        result
    }

    fn record_path(&self, reference: &str) -> PathBuf {
        self.root
            .join("images")
            .join(format!("{}.json", Digest::of(reference.as_bytes()).hex()))
    }

    /// Records (or replaces) what a reference resolves to. Its blobs must be stored already.
    pub fn put_image(&self, record: &ImageRecord) -> Result<()> {
        let _records = lock(&self.records);
        self.write_record(record)
    }

    fn write_record(&self, record: &ImageRecord) -> Result<()> {
        let path = self.record_path(&record.reference);
        let tmp = self.temp_path("image");
        let bytes = serde_json::to_vec_pretty(record).map_err(|e| ImageError::Internal(e.to_string()))?;
        fs::write(&tmp, bytes).map_err(|e| ImageError::io("writing", &tmp, e))?;
        fs::rename(&tmp, &path).map_err(|e| ImageError::io("renaming into place", &path, e))
    }

    /// The stored image for a normalized reference, if any.
    pub fn image(&self, reference: &str) -> Result<Option<ImageRecord>> {
        read_record(&self.record_path(reference))
    }

    pub fn images(&self) -> Result<Vec<ImageRecord>> {
        let dir = self.root.join("images");
        let entries = fs::read_dir(&dir).map_err(|e| ImageError::io("listing", &dir, e))?;
        let mut images = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io("listing", &dir, e))?;
            if let Some(record) = read_record(&entry.path())? {
                images.push(record);
            }
        }
        Ok(images)
    }

    /// Whether everything a container of the image needs is on disk: its config and unpacked layers.
    pub fn is_complete(&self, image: &ImageRecord) -> bool {
        self.has_blob(&image.config_digest) && image.layers.iter().all(|l| self.layer_path(&l.diff_id).is_dir())
    }

    /// Marks an image used now (a container started from it), protecting it from the next GC.
    pub fn touch(&self, reference: &str) -> Result<()> {
        let _records = lock(&self.records);
        if let Some(mut record) = self.image(reference)? {
            record.last_used_ms = now_ms();
            self.write_record(&record)?;
        }
        Ok(())
    }

    /// Forgets a reference and removes the blobs and layers no other image uses; returns bytes freed.
    pub fn remove_image(&self, reference: &str) -> Result<u64> {
        let _records = lock(&self.records);
        self.remove_locked(reference)
    }

    pub(crate) fn remove_locked(&self, reference: &str) -> Result<u64> {
        let path = self.record_path(reference);
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != io::ErrorKind::NotFound
        {
            return Err(ImageError::io("removing", path, e));
        }
        // Pruned even when the record was already gone: layers a container root held until now
        // may be free.
        self.prune_locked()
    }

    /// Removes blobs and unpacked layers that no image record references and no pull has pinned.
    fn prune_locked(&self) -> Result<u64> {
        let mut keep: HashSet<Digest> = lock(&self.pinned).keys().cloned().collect();
        keep.extend(self.layers_in_use()?);
        for image in self.images()? {
            keep.insert(image.config_digest.clone());
            for layer in image.layers {
                keep.insert(layer.digest);
                keep.insert(layer.diff_id);
            }
        }
        let mut freed = 0;
        for (dir, is_layer) in [("blobs/sha256", false), ("layers/sha256", true)] {
            let dir = self.root.join(dir);
            for entry in fs::read_dir(&dir).map_err(|e| ImageError::io("listing", &dir, e))? {
                let entry = entry.map_err(|e| ImageError::io("listing", &dir, e))?;
                let name = entry.file_name();
                let digest = name
                    .to_str()
                    .and_then(|hex| Digest::parse(&format!("sha256:{hex}")).ok());
                if digest.is_some_and(|d| keep.contains(&d)) {
                    continue;
                }
                let path = entry.path();
                freed += disk_bytes(&path);
                let removed = if is_layer {
                    fs::remove_dir_all(&path)
                } else {
                    fs::remove_file(&path)
                };
                removed.map_err(|e| ImageError::io("removing", &path, e))?;
            }
        }
        Ok(freed)
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn read_record(path: &Path) -> Result<Option<ImageRecord>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| ImageError::Corrupt {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ImageError::io("reading", path, e)),
    }
}

/// Space a file or tree takes on disk (allocated blocks, as `du` counts).
fn disk_bytes(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir()
        && let Ok(entries) = fs::read_dir(path)
    {
        total += entries.flatten().map(|e| disk_bytes(&e.path())).sum::<u64>();
    }
    total
}

/// A poisoned lock only means another thread panicked mid-update of in-memory bookkeeping that
/// every reader re-validates against the disk, so it is safe to continue.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
