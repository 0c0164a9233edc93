//! The registry's files: content-addressed blobs, per-repository links and tags, upload sessions.
//!
//! Layout under the data directory:
//! - `blobs/sha256/<hex>`: every blob and manifest, written once, only after its digest was checked;
//! - `repositories/<name>/_blobs/<hex>`: the blob belongs to the repository (pushed or mounted);
//! - `repositories/<name>/_manifests/<hex>`: the manifest belongs to it; holds its media type;
//! - `repositories/<name>/_tags/<tag>`: holds the digest the tag points at;
//! - `uploads/<id>`: bytes of an unfinished upload; `tmp/`: files being written;
//! - `lock`: held by the one registry serving the directory.
//!
//! A file appears under its final name only by `rename`, after `fsync`, so a push interrupted at any
//! point leaves nothing visible. Names and tags are validated (`name.rs`) before they become paths,
//! and the `_` prefix keeps the layout's own directories apart from nested repository names.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::name::{Digest, RepositoryName};

pub struct Storage {
    root: PathBuf,
    /// Holds an exclusive lock on `<root>/lock` while the registry runs: a second registry on the
    /// same directory would delete this one's uploads when it starts.
    _lock: fs::File,
}

impl Storage {
    /// Opens (creating if absent) the data directory; unfinished uploads of an earlier run are dropped.
    pub fn open(root: &Path) -> io::Result<Self> {
        fs::create_dir_all(root)?;
        let lock = fs::OpenOptions::new().create(true).truncate(false).write(true).open(root.join("lock"))?;
        lock.try_lock().map_err(|e| match e {
            fs::TryLockError::WouldBlock => io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("another registry is using {}; stop it or choose another --data-dir", root.display()),
            ),
            fs::TryLockError::Error(e) => e,
        })?;
        for dir in ["uploads", "tmp"] {
            let path = root.join(dir);
            if path.exists() {
                fs::remove_dir_all(&path)?;
            }
        }
        for dir in ["blobs/sha256", "repositories", "uploads", "tmp"] {
            fs::create_dir_all(root.join(dir))?;
        }
        Ok(Self { root: root.to_path_buf(), _lock: lock })
    }

    fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    fn repository(&self, name: &RepositoryName) -> PathBuf {
        self.root.join("repositories").join(name.as_str())
    }

    pub fn upload_path(&self, id: &str) -> PathBuf {
        self.root.join("uploads").join(id)
    }

    pub fn repository_exists(&self, name: &RepositoryName) -> bool {
        let dir = self.repository(name);
        dir.join("_blobs").is_dir() || dir.join("_manifests").is_dir()
    }

    /// The blob's path and size when the repository holds it.
    pub fn blob_in_repository(&self, name: &RepositoryName, digest: &Digest) -> Option<(PathBuf, u64)> {
        if !self.repository(name).join("_blobs").join(digest.hex()).is_file() {
            return None;
        }
        let path = self.blob_path(digest);
        let size = fs::metadata(&path).ok()?.len();
        Some((path, size))
    }

    pub fn link_blob(&self, name: &RepositoryName, digest: &Digest) -> io::Result<()> {
        let dir = self.repository(name).join("_blobs");
        fs::create_dir_all(&dir)?;
        fs::File::create(dir.join(digest.hex()))?;
        Ok(())
    }

    /// Removes the blob from the repository (the content stays for other repositories).
    pub fn unlink_blob(&self, name: &RepositoryName, digest: &Digest) -> io::Result<bool> {
        remove_if_present(&self.repository(name).join("_blobs").join(digest.hex()))
    }

    /// Moves a finished, verified upload into the blob store and links it to the repository. The
    /// caller has synced the upload's file to disk (off the async workers: a layer can be large).
    pub fn commit_upload(&self, upload: &Path, name: &RepositoryName, digest: &Digest) -> io::Result<()> {
        let target = self.blob_path(digest);
        if target.is_file() {
            fs::remove_file(upload)?;
        } else {
            fs::rename(upload, &target)?;
        }
        self.link_blob(name, digest)
    }

    /// Stores a manifest (already verified against its digest) and, for a tag, points the tag at it.
    pub fn put_manifest(
        &self,
        name: &RepositoryName,
        digest: &Digest,
        media_type: &str,
        body: &[u8],
        tag: Option<&str>,
    ) -> io::Result<()> {
        let blob = self.blob_path(digest);
        if !blob.is_file() {
            self.write_atomically(&blob, body)?;
        }
        let repository = self.repository(name);
        self.write_atomically(&repository.join("_manifests").join(digest.hex()), media_type.as_bytes())?;
        if let Some(tag) = tag {
            self.write_atomically(&repository.join("_tags").join(tag), digest.as_str().as_bytes())?;
        }
        Ok(())
    }

    /// The media type and bytes of a manifest the repository holds.
    pub fn manifest(&self, name: &RepositoryName, digest: &Digest) -> io::Result<Option<(String, Vec<u8>)>> {
        let link = self.repository(name).join("_manifests").join(digest.hex());
        let media_type = match fs::read_to_string(link) {
            Ok(media_type) => media_type,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(Some((media_type, fs::read(self.blob_path(digest))?)))
    }

    pub fn has_manifest(&self, name: &RepositoryName, digest: &Digest) -> bool {
        self.repository(name).join("_manifests").join(digest.hex()).is_file()
    }

    pub fn resolve_tag(&self, name: &RepositoryName, tag: &str) -> io::Result<Option<Digest>> {
        match fs::read_to_string(self.repository(name).join("_tags").join(tag)) {
            Ok(digest) => Ok(Digest::parse(digest.trim())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The repository's tags in lexical order, `None` when the repository is unknown.
    pub fn tags(&self, name: &RepositoryName) -> io::Result<Option<Vec<String>>> {
        if !self.repository_exists(name) {
            return Ok(None);
        }
        let mut tags = Vec::new();
        match fs::read_dir(self.repository(name).join("_tags")) {
            Ok(entries) => {
                for entry in entries {
                    tags.extend(entry?.file_name().to_str().map(str::to_string));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        tags.sort();
        Ok(Some(tags))
    }

    pub fn delete_tag(&self, name: &RepositoryName, tag: &str) -> io::Result<bool> {
        remove_if_present(&self.repository(name).join("_tags").join(tag))
    }

    /// Removes a manifest from the repository together with every tag pointing at it.
    pub fn delete_manifest(&self, name: &RepositoryName, digest: &Digest) -> io::Result<bool> {
        if !remove_if_present(&self.repository(name).join("_manifests").join(digest.hex()))? {
            return Ok(false);
        }
        for tag in self.tags(name)?.unwrap_or_default() {
            if self.resolve_tag(name, &tag)?.as_ref() == Some(digest) {
                self.delete_tag(name, &tag)?;
            }
        }
        Ok(true)
    }

    /// Every repository holding something, in lexical order.
    pub fn repositories(&self) -> io::Result<Vec<String>> {
        let mut found = Vec::new();
        let mut pending = vec![self.root.join("repositories")];
        while let Some(dir) = pending.pop() {
            for entry in fs::read_dir(&dir)? {
                let entry = entry?;
                let file_name = entry.file_name();
                if !entry.file_type()?.is_dir() || file_name.to_string_lossy().starts_with('_') {
                    continue;
                }
                let path = entry.path();
                if (path.join("_manifests").is_dir() || path.join("_blobs").is_dir())
                    && let Ok(relative) = path.strip_prefix(self.root.join("repositories"))
                {
                    found.push(relative.to_string_lossy().into_owned());
                }
                pending.push(path);
            }
        }
        found.sort();
        Ok(found)
    }

    fn write_atomically(&self, target: &Path, data: &[u8]) -> io::Result<()> {
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent)?;
        }
        let temporary = self.root.join("tmp").join(uuid::Uuid::new_v4().simple().to_string());
        let result = (|| {
            let mut file = fs::File::create(&temporary)?;
            file.write_all(data)?;
            file.sync_all()?;
            fs::rename(&temporary, target)
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temporary);
        }
        result
    }
}

fn remove_if_present(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_registry_on_the_same_directory_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _first = Storage::open(dir.path()).expect("first");
        let second = Storage::open(dir.path()).err().expect("a second registry must be refused");
        assert!(second.to_string().contains("another registry is using"), "{second}");
    }
}
