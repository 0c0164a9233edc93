//! The write-ahead log: numbered segment files of checksummed records, one record per write.
//!
//! A segment starts with a header (magic, then the epoch of the redb file it belongs to); each
//! record is its payload's length and CRC-32, then the payload. A crash can leave the last
//! record half-written (or the file's tail zero-filled): reading stops at the first record that
//! is incomplete or fails its checksum, and nothing after it was ever acknowledged, because a
//! write is answered only after its record's fsync.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::{Event, EventKind, Revision};

const MAGIC: &[u8; 8] = b"SHPWAL01";
pub(crate) const HEADER_LEN: u64 = 16;
/// Revision, time, kind, create revision and key length: the smallest payload.
const MIN_PAYLOAD: usize = 8 + 8 + 1 + 8 + 4;
/// Larger than any object the API accepts; a length beyond it is a damaged header.
const MAX_PAYLOAD: usize = 1 << 30;

/// One write as the log holds it: enough to replay it onto the state before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) revision: Revision,
    /// Milliseconds since the Unix epoch when it was written (the history's age limit).
    pub(crate) unix_ms: u64,
    pub(crate) kind: EventKind,
    pub(crate) create_revision: Revision,
    pub(crate) key: String,
    /// Empty for a delete.
    pub(crate) value: Bytes,
}

/// The log directory beside the redb file: `store.redb` logs into `store.wal/`.
pub(crate) fn dir_of(db_path: &Path) -> PathBuf {
    db_path.with_extension("wal")
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016}.log"))
}

/// The segments in `dir`, oldest first (none when the directory does not exist).
pub(crate) fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let seq = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(seq) = seq {
            out.push((seq, path));
        }
    }
    out.sort();
    Ok(out)
}

/// Appends the record of `event`, written at `unix_ms`, to `out`.
pub(crate) fn encode(out: &mut Vec<u8>, event: &Event, unix_ms: u64) {
    let kv = &event.kv;
    let value: &[u8] = if event.kind == EventKind::Deleted { &[] } else { &kv.value };
    let len = MIN_PAYLOAD + kv.key.len() + value.len();
    let start = out.len();
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&event.revision().to_le_bytes());
    out.extend_from_slice(&unix_ms.to_le_bytes());
    out.push(match event.kind {
        EventKind::Created => 0,
        EventKind::Updated => 1,
        EventKind::Deleted => 2,
    });
    out.extend_from_slice(&kv.create_revision.to_le_bytes());
    out.extend_from_slice(&(kv.key.len() as u32).to_le_bytes());
    out.extend_from_slice(kv.key.as_bytes());
    out.extend_from_slice(value);
    let crc = crc32fast::hash(&out[start + 8..]);
    out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn decode(p: &[u8]) -> Option<Record> {
    let revision = u64_at(p, 0)?;
    let unix_ms = u64_at(p, 8)?;
    let kind = match *p.get(16)? {
        0 => EventKind::Created,
        1 => EventKind::Updated,
        2 => EventKind::Deleted,
        _ => return None,
    };
    let create_revision = u64_at(p, 17)?;
    let key_len = u32_at(p, 25)? as usize;
    let key = std::str::from_utf8(p.get(29..29 + key_len)?).ok()?.to_string();
    let value = Bytes::copy_from_slice(p.get(29 + key_len..)?);
    Some(Record { revision, unix_ms, kind, create_revision, key, value })
}

/// What one segment holds.
#[derive(Debug)]
pub(crate) struct Scan {
    /// `None` when the header itself is incomplete (a crash right after the file was created).
    pub(crate) epoch: Option<u64>,
    pub(crate) records: Vec<Record>,
    /// Bytes up to the end of the last complete record.
    pub(crate) valid_len: u64,
    /// Bytes after `valid_len` that are not a complete record (a torn tail).
    pub(crate) torn_bytes: u64,
}

/// Reads a segment up to its first incomplete or damaged record.
pub(crate) fn scan(path: &Path) -> io::Result<Scan> {
    let data = fs::read(path)?;
    let header_ok = data.len() as u64 >= HEADER_LEN && &data[..8] == MAGIC;
    let Some(epoch) = header_ok.then(|| u64_at(&data, 8)).flatten() else {
        return Ok(Scan { epoch: None, records: Vec::new(), valid_len: 0, torn_bytes: data.len() as u64 });
    };
    let mut at = HEADER_LEN as usize;
    let mut records = Vec::new();
    while let (Some(len), Some(crc)) = (u32_at(&data, at), u32_at(&data, at + 4)) {
        let len = len as usize;
        if !(MIN_PAYLOAD..=MAX_PAYLOAD).contains(&len) {
            break;
        }
        let Some(payload) = data.get(at + 8..at + 8 + len) else { break };
        if crc32fast::hash(payload) != crc {
            break;
        }
        let Some(record) = decode(payload) else { break };
        records.push(record);
        at += 8 + len;
    }
    Ok(Scan { epoch: Some(epoch), records, valid_len: at as u64, torn_bytes: (data.len() - at) as u64 })
}

/// Makes a new entry in `dir` (a created or removed segment) survive a crash.
pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The segment being appended to.
pub(crate) struct Writer {
    dir: PathBuf,
    pub(crate) seq: u64,
    file: File,
    /// Bytes of header and acknowledged records: where the next record goes.
    pub(crate) len: u64,
    epoch: u64,
    /// An append failed and the file could not be cut back to `len` yet.
    broken: bool,
}

impl Writer {
    /// Creates segment `seq` in `dir` (and the directory), with its header on disk.
    pub(crate) fn create(dir: &Path, seq: u64, epoch: u64) -> io::Result<Writer> {
        fs::create_dir_all(dir)?;
        let path = segment_path(dir, seq);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        let mut header = Vec::with_capacity(HEADER_LEN as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&epoch.to_le_bytes());
        file.write_all_at(&header, 0)?;
        file.sync_all()?;
        sync_dir(dir)?;
        Ok(Writer { dir: dir.to_path_buf(), seq, file, len: HEADER_LEN, epoch, broken: false })
    }

    /// Writes `records` after the last acknowledged one and fsyncs them. On failure the file is
    /// cut back before the next append, so a record that was refused never comes back.
    pub(crate) fn append(&mut self, records: &[u8]) -> io::Result<()> {
        if self.broken {
            self.reset()?;
        }
        let written = self.file.write_all_at(records, self.len).and_then(|()| self.file.sync_data());
        match written {
            Ok(()) => {
                self.len += records.len() as u64;
                Ok(())
            }
            Err(e) => {
                self.broken = true;
                Err(e)
            }
        }
    }

    /// Cuts the segment back to its acknowledged records through a fresh handle: after a failed
    /// fsync the old handle's idea of the file cannot be trusted.
    pub(crate) fn reset(&mut self) -> io::Result<()> {
        let file = OpenOptions::new().read(true).write(true).open(segment_path(&self.dir, self.seq))?;
        file.set_len(self.len)?;
        file.sync_all()?;
        self.file = file;
        self.broken = false;
        Ok(())
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken
    }

    /// Whether the segment holds any record.
    pub(crate) fn has_records(&self) -> bool {
        self.len > HEADER_LEN
    }

    /// The next segment; this one is left for the checkpoint to remove.
    pub(crate) fn rotate(&self) -> io::Result<Writer> {
        Writer::create(&self.dir, self.seq + 1, self.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyValue;

    fn event(rev: Revision, key: &str, value: &'static [u8]) -> Event {
        let kv = KeyValue { key: key.into(), value: Bytes::from_static(value), create_revision: rev, mod_revision: rev };
        Event { kind: EventKind::Created, kv, prev: None }
    }

    fn write(dir: &Path, events: &[Event]) -> PathBuf {
        let mut w = Writer::create(dir, 1, 7).expect("create");
        let mut buf = Vec::new();
        for e in events {
            encode(&mut buf, e, 1000);
        }
        w.append(&buf).expect("append");
        segment_path(dir, 1)
    }

    #[test]
    fn a_segment_cut_inside_its_last_record_reads_back_every_complete_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let events: Vec<Event> = (1..=3).map(|r| event(r, &format!("/k{r}"), b"some value")).collect();
        let path = write(dir.path(), &events);
        let full = fs::metadata(&path).expect("meta").len();
        for cut in 1..40 {
            let file = OpenOptions::new().write(true).open(&path).expect("open");
            file.set_len(full - cut).expect("truncate");
            let scan = scan(&path).expect("scan");
            assert_eq!(scan.epoch, Some(7));
            let keys: Vec<&str> = scan.records.iter().map(|r| r.key.as_str()).collect();
            assert_eq!(keys, ["/k1", "/k2"], "cut {cut} bytes from the end");
            assert_eq!(scan.valid_len + scan.torn_bytes, full - cut);
        }
    }

    #[test]
    fn a_damaged_or_zero_filled_tail_is_not_read_as_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write(dir.path(), &[event(1, "/a", b"one"), event(2, "/b", b"two")]);
        let full = fs::metadata(&path).expect("meta").len();
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        // A flipped byte in the last record's value fails its checksum.
        file.write_all_at(b"X", full - 1).expect("corrupt");
        let scan1 = scan(&path).expect("scan");
        assert_eq!(scan1.records.len(), 1);
        assert_eq!(scan1.records[0].value, Bytes::from_static(b"one"));
        // Zeros after the records (a file extended but not written) are a torn tail, not records.
        file.set_len(full + 4096).expect("extend");
        file.write_all_at(b"o", full - 1).expect("repair");
        let scan2 = scan(&path).expect("scan");
        assert_eq!(scan2.records.len(), 2);
        assert_eq!(scan2.torn_bytes, 4096);
    }

    #[test]
    fn records_read_back_as_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kv = KeyValue { key: "/u".into(), value: Bytes::from_static(b"new"), create_revision: 3, mod_revision: 9 };
        let update = Event { kind: EventKind::Updated, kv: kv.clone(), prev: None };
        let delete = Event { kind: EventKind::Deleted, kv: KeyValue { mod_revision: 10, ..kv }, prev: None };
        let path = write(dir.path(), &[update, delete]);
        let records = scan(&path).expect("scan").records;
        assert_eq!(
            records,
            [
                Record {
                    revision: 9,
                    unix_ms: 1000,
                    kind: EventKind::Updated,
                    create_revision: 3,
                    key: "/u".into(),
                    value: Bytes::from_static(b"new")
                },
                Record {
                    revision: 10,
                    unix_ms: 1000,
                    kind: EventKind::Deleted,
                    create_revision: 3,
                    key: "/u".into(),
                    value: Bytes::new()
                },
            ]
        );
    }
}
