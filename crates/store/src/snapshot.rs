//! Snapshots: every object of a store at one revision, in a versioned, checksummed file format.
//!
//! Layout (integers little-endian): magic `SHEPSNAP`, format version (u32), revision (u64), object
//! count (u64), then per object in key order: key length (u32), key, create revision (u64), mod
//! revision (u64), value length (u32), value; last, the CRC-32 of every byte before it (u32). The
//! checksum is verified before anything else is read, so a damaged file is refused as a whole.

use bytes::Bytes;

use crate::{KeyValue, Revision};

const MAGIC: &[u8; 8] = b"SHEPSNAP";
const VERSION: u32 = 1;
const HEADER: usize = 8 + 4 + 8 + 8;
const TRAILER: usize = 4;

/// Every object of a store as of `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub revision: Revision,
    /// In key order.
    pub items: Vec<KeyValue>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    #[error("not a Shepherd snapshot (no SHEPSNAP header)")]
    NotASnapshot,
    #[error("checksum mismatch (stored {stored:08x}, computed {computed:08x}): the file is damaged or truncated")]
    Checksum { stored: u32, computed: u32 },
    #[error("snapshot format version {0} is not supported (this Shepherd reads version {VERSION})")]
    Version(u32),
    #[error("malformed snapshot: {0}")]
    Malformed(String),
}

impl Snapshot {
    pub fn encode(&self) -> Vec<u8> {
        let size: usize = self.items.iter().map(|kv| 4 + kv.key.len() + 16 + 4 + kv.value.len()).sum();
        let mut out = Vec::with_capacity(HEADER + size + TRAILER);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.revision.to_le_bytes());
        out.extend_from_slice(&(self.items.len() as u64).to_le_bytes());
        for kv in &self.items {
            out.extend_from_slice(&(kv.key.len() as u32).to_le_bytes());
            out.extend_from_slice(kv.key.as_bytes());
            out.extend_from_slice(&kv.create_revision.to_le_bytes());
            out.extend_from_slice(&kv.mod_revision.to_le_bytes());
            out.extend_from_slice(&(kv.value.len() as u32).to_le_bytes());
            out.extend_from_slice(&kv.value);
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses and verifies a snapshot: checksum, format version, and that its records are
    /// consistent (keys unique and in order, no revision after the snapshot's).
    pub fn decode(data: &[u8]) -> Result<Snapshot, SnapshotError> {
        if data.len() < 8 || &data[..8] != MAGIC {
            return Err(SnapshotError::NotASnapshot);
        }
        if data.len() < HEADER + TRAILER {
            return Err(SnapshotError::Malformed(format!("{} bytes is shorter than the header", data.len())));
        }
        let (body, trailer) = data.split_at(data.len() - TRAILER);
        let stored = u32::from_le_bytes(trailer.try_into().map_err(|_| SnapshotError::NotASnapshot)?);
        let computed = crc32fast::hash(body);
        if stored != computed {
            return Err(SnapshotError::Checksum { stored, computed });
        }
        let mut r = Reader { data: body, at: 8 };
        let version = r.u32()?;
        if version != VERSION {
            return Err(SnapshotError::Version(version));
        }
        let revision = r.u64()?;
        let count = r.u64()?;
        let mut items = Vec::new();
        for i in 0..count {
            let key_len = r.u32()? as usize;
            let key = std::str::from_utf8(r.bytes(key_len)?)
                .map_err(|_| SnapshotError::Malformed(format!("key of record {i} is not UTF-8")))?
                .to_string();
            let create_revision = r.u64()?;
            let mod_revision = r.u64()?;
            let value_len = r.u32()? as usize;
            let value = Bytes::copy_from_slice(r.bytes(value_len)?);
            if create_revision > mod_revision || mod_revision > revision {
                return Err(SnapshotError::Malformed(format!(
                    "{key}: revisions {create_revision}/{mod_revision} do not fit snapshot revision {revision}"
                )));
            }
            if items.last().is_some_and(|prev: &KeyValue| prev.key >= key) {
                return Err(SnapshotError::Malformed(format!("{key}: keys out of order")));
            }
            items.push(KeyValue { key, value, create_revision, mod_revision });
        }
        if r.at != body.len() {
            return Err(SnapshotError::Malformed(format!("{} bytes after the last record", body.len() - r.at)));
        }
        Ok(Snapshot { revision, items })
    }
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], SnapshotError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.data.len()).ok_or_else(|| {
            SnapshotError::Malformed(format!("record at byte {} runs past the end of the file", self.at))
        })?;
        let b = &self.data[self.at..end];
        self.at = end;
        Ok(b)
    }
    fn u32(&mut self) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().unwrap_or([0; 4])))
    }
    fn u64(&mut self) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().unwrap_or([0; 8])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        let kv = |k: &str, c, m| KeyValue {
            key: k.into(),
            value: Bytes::from(format!("{{\"k\":\"{k}\"}}")),
            create_revision: c,
            mod_revision: m,
        };
        Snapshot { revision: 9, items: vec![kv("/a", 1, 4), kv("/b", 2, 2), kv("/c", 7, 9)] }
    }

    #[test]
    fn a_snapshot_decodes_to_what_was_encoded() {
        let s = sample();
        assert_eq!(Snapshot::decode(&s.encode()), Ok(s));
        let empty = Snapshot { revision: 0, items: vec![] };
        assert_eq!(Snapshot::decode(&empty.encode()), Ok(empty));
    }

    #[test]
    fn any_flipped_byte_or_truncation_is_refused() {
        let bytes = sample().encode();
        for i in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[i] ^= 0x40;
            assert!(Snapshot::decode(&damaged).is_err(), "byte {i} flipped was accepted");
        }
        for n in 0..bytes.len() {
            assert!(Snapshot::decode(&bytes[..n]).is_err(), "truncation to {n} bytes was accepted");
        }
    }
}
