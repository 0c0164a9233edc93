//! Images one already has, brought in without a registry: a `docker save` tarball or an OCI image
//! layout in a tar (`skopeo copy ... oci-archive:FILE:NAME`), stored as a pull stores them, under
//! the names the archive gives them.
//!
//! Every blob is checked against its digest and every layer against its config's diff id as it is
//! stored, and layers are unpacked with the pull's rules (nothing outside the layer's root). If any
//! of that fails, what this import added to the store is removed again: the store is as it was.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use crate::digest::{Digest, Hasher};
use crate::error::{ImageError, Result};
use crate::reference::ImageRef;
use crate::store::{ImageRecord, ImageStore, LayerRecord, now_ms};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// Imports every image of the archive read from `archive`; returns their records, one per name.
pub fn import(store: &ImageStore, archive: impl Read) -> Result<Vec<ImageRecord>> {
    let dir = store.temp_path("import");
    fs::create_dir_all(&dir).map_err(|e| ImageError::io("creating", &dir, e))?;
    let mut added = Added::default();
    // Every image's content first, the names last: a failure half-way names nothing.
    let stored = || -> Result<Vec<ImageRecord>> {
        let files = extract(archive, &dir)?;
        let mut records = Vec::new();
        for image in images_in(&files)? {
            records.extend(store_image(store, &files, &image, &mut added)?);
        }
        for record in &records {
            store.put_image(record)?;
        }
        Ok(records)
    };
    let result = stored();
    if result.is_err() {
        added.remove(store);
    }
    let _ = fs::remove_dir_all(&dir);
    result
}

fn invalid(reason: impl Into<String>) -> ImageError {
    ImageError::Archive(reason.into())
}

/// The archive's files, by their path inside it; a link inside the archive stands for its target.
struct Files {
    dir: PathBuf,
    links: HashMap<PathBuf, PathBuf>,
}

fn files_of(dir: &Path) -> Files {
    Files { dir: dir.to_path_buf(), links: HashMap::new() }
}

impl Files {
    fn path(&self, name: &str) -> Result<PathBuf> {
        let mut inside = inside(Path::new(name)).ok_or_else(|| invalid(format!("{name:?} points outside the archive")))?;
        for _ in 0..8 {
            match self.links.get(&inside) {
                Some(target) => inside = target.clone(),
                None => break,
            }
        }
        let path = self.dir.join(&inside);
        if !path.is_file() {
            return Err(invalid(format!("it names {name:?}, which it does not hold")));
        }
        Ok(path)
    }

    fn read(&self, name: &str) -> Result<Vec<u8>> {
        let path = self.path(name)?;
        fs::read(&path).map_err(|e| ImageError::io("reading", path, e))
    }
}

/// `path` as a relative path with no `..`, or None if it would leave the archive's root.
fn inside(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Writes the archive's regular files under `dir`; links between its own files are remembered,
/// anything else (devices, links out of it) refuses the archive.
fn extract(archive: impl Read, dir: &Path) -> Result<Files> {
    let read_error = |e: io::Error| invalid(format!("cannot read it as a tar (truncated or not an image archive): {e}"));
    let mut files = files_of(dir);
    let mut tar = tar::Archive::new(archive);
    for entry in tar.entries().map_err(read_error)? {
        let mut entry = entry.map_err(read_error)?;
        let raw = entry.path().map_err(read_error)?.into_owned();
        let name = inside(&raw).ok_or_else(|| invalid(format!("entry {:?} points outside the archive", raw.display())))?;
        if name.as_os_str().is_empty() {
            continue;
        }
        let dest = dir.join(&name);
        match entry.header().entry_type() {
            tar::EntryType::Directory => fs::create_dir_all(&dest).map_err(|e| ImageError::io("creating", &dest, e))?,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if let Some(parent) = dest.parent() {
                    fs::create_dir_all(parent).map_err(|e| ImageError::io("creating", parent, e))?;
                }
                let mut out = File::create(&dest).map_err(|e| ImageError::io("creating", &dest, e))?;
                io::copy(&mut entry, &mut out).map_err(read_error)?;
            }
            tar::EntryType::Symlink | tar::EntryType::Link => {
                let target = entry.link_name().map_err(read_error)?.unwrap_or_default().into_owned();
                // A symlink is relative to its own directory, a hard link to the archive's root.
                let base = match entry.header().entry_type() {
                    tar::EntryType::Symlink => name.parent().map(Path::to_path_buf).unwrap_or_default(),
                    _ => PathBuf::new(),
                };
                let resolved = inside(&base.join(&target))
                    .filter(|_| !target.is_absolute())
                    .ok_or_else(|| invalid(format!("link {:?} points outside the archive", raw.display())))?;
                files.links.insert(name, resolved);
            }
            other => return Err(invalid(format!("entry {:?} is a {other:?}, not a file", raw.display()))),
        }
    }
    Ok(files)
}

/// One image of the archive: its names, its manifest as stored (OCI) or none (docker save), its
/// config and its layers' files.
struct Image {
    names: Vec<String>,
    manifest: Option<(Digest, Vec<u8>)>,
    config: String,
    layers: Vec<String>,
}

fn images_in(files: &Files) -> Result<Vec<Image>> {
    let images = if files.dir.join("index.json").is_file() {
        oci_images(files)?
    } else if files.dir.join("manifest.json").is_file() {
        docker_images(files)?
    } else {
        return Err(invalid("it is neither an OCI image layout (no index.json) nor a `docker save` archive (no manifest.json)"));
    };
    if images.is_empty() {
        return Err(invalid("it holds no image"));
    }
    Ok(images)
}

fn json(files: &Files, name: &str) -> Result<serde_json::Value> {
    serde_json::from_slice(&files.read(name)?).map_err(|e| invalid(format!("{name} is not JSON: {e}")))
}

fn blob_name(digest: &str) -> Result<String> {
    let d = Digest::parse(digest)?;
    Ok(format!("blobs/sha256/{}", d.hex()))
}

fn oci_images(files: &Files) -> Result<Vec<Image>> {
    let index = json(files, "index.json")?;
    let mut out = Vec::new();
    let mut pending: Vec<(serde_json::Value, Vec<String>)> =
        index["manifests"].as_array().cloned().unwrap_or_default().into_iter().map(|d| (d, Vec::new())).collect();
    while let Some((descriptor, inherited)) = pending.pop() {
        let annotations = &descriptor["annotations"];
        let mut names = inherited;
        for key in ["io.containerd.image.name", "org.opencontainers.image.ref.name"] {
            if let Some(name) = annotations[key].as_str().filter(|n| n.contains(':') || n.contains('/')) {
                names.push(name.to_string());
            }
        }
        let digest = descriptor["digest"].as_str().ok_or_else(|| invalid("index.json has a manifest without a digest"))?;
        let bytes = files.read(&blob_name(digest)?)?;
        let manifest: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| invalid(format!("manifest {digest} is not JSON: {e}")))?;
        let media_type = manifest["mediaType"].as_str().or(descriptor["mediaType"].as_str()).unwrap_or(OCI_MANIFEST);
        if media_type == OCI_INDEX || media_type.ends_with("manifest.list.v2+json") {
            // A nested index (one platform per manifest): the one for this machine's architecture.
            let arch = match std::env::consts::ARCH {
                "x86_64" => "amd64",
                "aarch64" => "arm64",
                other => other,
            };
            let chosen = manifest["manifests"].as_array().into_iter().flatten().find(|m| m["platform"]["architecture"] == arch);
            let chosen = chosen.ok_or_else(|| invalid(format!("index {digest} has no image for {arch}")))?;
            pending.push((chosen.clone(), names));
            continue;
        }
        let config = manifest["config"]["digest"].as_str().ok_or_else(|| invalid(format!("manifest {digest} has no config")))?;
        let layers = manifest["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|l| l["digest"].as_str().ok_or_else(|| invalid(format!("manifest {digest} has a layer without a digest"))).and_then(blob_name))
            .collect::<Result<Vec<_>>>()?;
        out.push(Image { names, manifest: Some((Digest::parse(digest)?, bytes)), config: blob_name(config)?, layers });
    }
    Ok(out)
}

fn docker_images(files: &Files) -> Result<Vec<Image>> {
    let manifest = json(files, "manifest.json")?;
    let entries = manifest.as_array().ok_or_else(|| invalid("manifest.json is not a list"))?;
    entries
        .iter()
        .map(|e| {
            let strings = |key: &str| e[key].as_array().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_string)).collect();
            let config = e["Config"].as_str().ok_or_else(|| invalid("manifest.json has an image without Config"))?;
            Ok(Image { names: strings("RepoTags"), manifest: None, config: config.to_string(), layers: strings("Layers") })
        })
        .collect()
}

/// What this import wrote into the store, removed again if it fails.
#[derive(Default)]
struct Added {
    blobs: Vec<Digest>,
    layers: Vec<Digest>,
}

impl Added {
    fn remove(&self, store: &ImageStore) {
        for d in &self.layers {
            let _ = fs::remove_dir_all(store.layer_path(d));
        }
        for d in &self.blobs {
            let _ = fs::remove_file(store.blob_path(d));
        }
    }
}

/// Stores a file as a blob (its digest computed, or checked against `expected`); returns its
/// digest and size.
fn put_blob(store: &ImageStore, path: &Path, expected: Option<&Digest>, added: &mut Added) -> Result<(Digest, u64)> {
    let digest = match expected {
        Some(d) => d.clone(),
        None => {
            let file = File::open(path).map_err(|e| ImageError::io("opening", path, e))?;
            let mut hashing = Hasher::new(file);
            io::copy(&mut hashing, &mut io::sink()).map_err(|e| ImageError::io("reading", path, e))?;
            hashing.finish().1
        }
    };
    let size = fs::metadata(path).map_err(|e| ImageError::io("reading", path, e))?.len();
    if !store.has_blob(&digest) {
        let file = File::open(path).map_err(|e| ImageError::io("opening", path, e))?;
        store.write_blob(&digest, file)?;
        added.blobs.push(digest.clone());
    }
    Ok((digest, size))
}

fn store_image(store: &ImageStore, files: &Files, image: &Image, added: &mut Added) -> Result<Vec<ImageRecord>> {
    if image.names.is_empty() {
        return Err(invalid("an image in it has no name (save it with one: `docker save NAME:TAG`, `oci-archive:FILE:NAME:TAG`)"));
    }
    let references = image.names.iter().map(|n| ImageRef::parse(n).map(|r| r.to_string())).collect::<Result<Vec<_>>>()?;
    let config_path = files.path(&image.config)?;
    let expected_config = image.manifest.as_ref().map(|_| Digest::parse(&format!("sha256:{}", file_name(&config_path)))).transpose()?;
    let (config_digest, config_size) = put_blob(store, &config_path, expected_config.as_ref(), added)?;
    let config = store.read_blob(&config_digest)?;
    let diff_ids = crate::pull::diff_ids(&references[0], &config)?;
    if diff_ids.len() != image.layers.len() {
        return Err(invalid(format!("its config lists {} layers and its manifest {}", diff_ids.len(), image.layers.len())));
    }
    let mut layers = Vec::new();
    for (name, diff_id) in image.layers.iter().zip(diff_ids) {
        let path = files.path(name)?;
        let expected = image.manifest.as_ref().map(|_| Digest::parse(&format!("sha256:{}", file_name(&path)))).transpose()?;
        let (digest, size) = put_blob(store, &path, expected.as_ref(), added)?;
        let layer = LayerRecord { digest, diff_id, size };
        if !store.layer_path(&layer.diff_id).is_dir() {
            store.ensure_layer(&layer)?;
            added.layers.push(layer.diff_id.clone());
        }
        layers.push(layer);
    }
    let manifest_digest = match &image.manifest {
        Some((digest, bytes)) => {
            if !store.has_blob(digest) {
                store.write_blob(digest, bytes.as_slice())?;
                added.blobs.push(digest.clone());
            }
            digest.clone()
        }
        None => {
            // A docker save archive has no manifest: the one a registry would serve for it.
            let descriptor = |media_type: &str, digest: &Digest, size: u64| serde_json::json!({"mediaType": media_type, "digest": digest.as_str(), "size": size});
            let manifest = serde_json::json!({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                "config": descriptor("application/vnd.oci.image.config.v1+json", &config_digest, config_size),
                "layers": layers.iter().map(|l| descriptor("application/vnd.oci.image.layer.v1.tar", &l.digest, l.size)).collect::<Vec<_>>()});
            let bytes = serde_json::to_vec(&manifest).map_err(|e| ImageError::Internal(e.to_string()))?;
            let digest = Digest::of(&bytes);
            if !store.has_blob(&digest) {
                store.write_blob(&digest, bytes.as_slice())?;
                added.blobs.push(digest.clone());
            }
            digest
        }
    };
    let size = config_size + layers.iter().map(|l| l.size).sum::<u64>();
    let records = references
        .into_iter()
        .map(|reference| ImageRecord {
            reference,
            manifest_digest: manifest_digest.clone(),
            config_digest: config_digest.clone(),
            layers: layers.clone(),
            size,
            last_used_ms: now_ms(),
        })
        .collect();
    Ok(records)
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}
