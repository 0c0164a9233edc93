//! Layer tarballs built in the test, stored as a registry pull would store them.
#![allow(dead_code)]

use std::io::Write;

use shepherd_image::{Digest, ImageRecord, ImageStore, LayerRecord};

/// A tar built entry by entry with raw names, so that tests can write what a hostile image would
/// (`../`, absolute paths) and what `tar::Builder` itself refuses to write.
#[derive(Default)]
pub struct Layer {
    entries: Vec<(tar::Header, Vec<u8>)>,
}

impl Layer {
    fn push(mut self, kind: tar::EntryType, name: &str, link: Option<&str>, data: &[u8], mode: u32) -> Self {
        let mut header = tar::Header::new_gnu();
        let old = header.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        if let Some(link) = link {
            old.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(1_700_000_000);
        header.set_cksum();
        self.entries.push((header, data.to_vec()));
        self
    }

    pub fn dir(self, name: &str) -> Self {
        self.push(tar::EntryType::Directory, name, None, b"", 0o755)
    }

    pub fn file(self, name: &str, data: &str) -> Self {
        self.push(tar::EntryType::Regular, name, None, data.as_bytes(), 0o644)
    }

    pub fn file_owned(self, name: &str, data: &str, mode: u32, uid: u64, gid: u64) -> Self {
        let mut layer = self.push(tar::EntryType::Regular, name, None, data.as_bytes(), mode);
        let header = &mut layer.entries.last_mut().expect("just pushed").0;
        header.set_uid(uid);
        header.set_gid(gid);
        header.set_cksum();
        layer
    }

    pub fn symlink(self, name: &str, target: &str) -> Self {
        self.push(tar::EntryType::Symlink, name, Some(target), b"", 0o777)
    }

    pub fn hard_link(self, name: &str, target: &str) -> Self {
        self.push(tar::EntryType::Link, name, Some(target), b"", 0o644)
    }

    /// PAX extended attributes for the entry that follows.
    pub fn xattrs(self, attributes: &[(&str, &str)]) -> Self {
        let mut records = Vec::new();
        for (name, value) in attributes {
            let body = format!(" SCHILY.xattr.{name}={value}\n");
            // A record's length counts its own digits.
            let mut len = body.len() + 1;
            while format!("{len}{body}").len() != len {
                len += 1;
            }
            records.extend(format!("{len}{body}").into_bytes());
        }
        self.push(tar::EntryType::XHeader, "PaxHeader", None, &records, 0o644)
    }

    pub fn char_device(self, name: &str) -> Self {
        self.push(tar::EntryType::Char, name, None, b"", 0o666)
    }

    pub fn fifo(self, name: &str) -> Self {
        self.push(tar::EntryType::Fifo, name, None, b"", 0o644)
    }

    pub fn tar(&self) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (header, data) in &self.entries {
            builder
                .append(header, data.as_slice())
                .expect("appending to an in-memory tar");
        }
        builder.into_inner().expect("finishing an in-memory tar")
    }

    pub fn gzip(&self) -> Vec<u8> {
        gzip(&self.tar())
    }
}

pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).expect("compressing in memory");
    encoder.finish().expect("compressing in memory")
}

/// Stores `blob` as a layer whose uncompressed form is `tar` (its diff id).
pub fn store_layer(store: &ImageStore, blob: &[u8], tar: &[u8]) -> LayerRecord {
    let digest = Digest::of(blob);
    store
        .write_blob(&digest, blob)
        .expect("storing a blob with its own digest");
    LayerRecord {
        digest,
        diff_id: Digest::of(tar),
        size: blob.len() as u64,
    }
}

/// Stores a gzip layer and unpacks it.
pub fn unpacked(store: &ImageStore, layer: &Layer) -> LayerRecord {
    let record = store_layer(store, &layer.gzip(), &layer.tar());
    store.ensure_layer(&record).expect("unpacking a well-formed layer");
    record
}

/// Stores an image record over unpacked layers, with a config blob of its own.
pub fn image(store: &ImageStore, reference: &str, layers: Vec<LayerRecord>, last_used_ms: u64) -> ImageRecord {
    let diff_ids: Vec<String> = layers.iter().map(|l| l.diff_id.to_string()).collect();
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["sh"], "Labels": {"ref": reference}},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config = serde_json::to_vec(&config).expect("serializing json");
    let config_digest = Digest::of(&config);
    store
        .write_blob(&config_digest, config.as_slice())
        .expect("storing a config blob");
    let record = ImageRecord {
        reference: reference.to_string(),
        manifest_digest: Digest::of(reference.as_bytes()),
        config_digest,
        size: layers.iter().map(|l| l.size).sum(),
        layers,
        last_used_ms,
    };
    store.put_image(&record).expect("storing an image record");
    record
}

pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test needs root (unpacking sets owners and device whiteouts, overlay mounts need CAP_SYS_ADMIN): run it as root"
    );
}
