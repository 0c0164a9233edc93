//! The write-ahead log: numbered segment files of checksummed records, one record per write.
//!
//! A segment starts with a header (magic, then the epoch of the redb file it belongs to); each
//! record is its payload's length and CRC-32, then the payload. A crash can leave the last
//! record half-written (or the file's tail zero-filled): reading stops at the first record that
//! is incomplete or fails its checksum, and nothing after it was ever acknowledged, because a
//! write is answered only after its record's fsync.
//!
//! Starting a segment costs three fsyncs (the new file, its header, the directory), so the next
//! segment is prepared ahead of need on a thread of its own ([`NextSegment`]) and the committer
//! only switches to it. A crash can therefore leave, after the segment being written, one more
//! that holds no record: only its header, or a header cut short. Neither was ever written to, so
//! recovery reads past it; damage is a torn record or header before a segment that holds records.
//!
//! A prepared segment is also filled with zeros (twice what the last one took) and synced: an
//! append inside that space changes neither the file's size nor its allocation, so its
//! `fdatasync` writes the data alone instead of waiting for a filesystem journal commit as well
//! (BENCHMARKS.md, section 6). Zeros after the last record are that space, not a tear.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use bytes::Bytes;

use crate::{Event, EventKind, Revision};

const MAGIC: &[u8; 8] = b"SHPWAL01";
pub(crate) const HEADER_LEN: u64 = 16;
/// Revision, time, kind, create revision and key length: the smallest payload.
const MIN_PAYLOAD: usize = 8 + 8 + 1 + 8 + 4;
/// Larger than any object the API accepts; a length beyond it is a damaged header.
const MAX_PAYLOAD: usize = 1 << 30;
/// Bounds of the zeroed space a prepared segment gets (twice what the last one took, at most the
/// segment size), and what it gets before any segment was written.
const MIN_PREALLOCATE: u64 = 64 * 1024;
pub(crate) const FIRST_PREALLOCATE: u64 = 1024 * 1024;

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
    /// Bytes after `valid_len` that are not a complete record.
    pub(crate) torn_bytes: u64,
    /// Some of them are not zero: a record cut short or damaged (zeros alone are space made
    /// ahead for records, or a tail whose size reached the disk before its bytes).
    pub(crate) torn: bool,
    /// A whole record with a later revision stands after the damage: the damage is not a crash's
    /// torn tail (a crash tears only the record being written, the last) but corruption in the
    /// middle of the log, and what follows it was acknowledged.
    pub(crate) records_after_damage: bool,
}

/// Reads a segment up to its first incomplete or damaged record.
pub(crate) fn scan(path: &Path) -> io::Result<Scan> {
    let data = fs::read(path)?;
    let header_ok = data.len() as u64 >= HEADER_LEN && &data[..8] == MAGIC;
    let Some(epoch) = header_ok.then(|| u64_at(&data, 8)).flatten() else {
        let torn = data.iter().any(|b| *b != 0);
        let records_after_damage = torn && record_after(&data, HEADER_LEN as usize, 0);
        return Ok(Scan { epoch: None, records: Vec::new(), valid_len: 0, torn_bytes: data.len() as u64, torn, records_after_damage });
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
    let torn = data[at..].iter().any(|b| *b != 0);
    let last = records.last().map_or(0, |r: &Record| r.revision);
    let records_after_damage = torn && record_after(&data, at + 1, last);
    Ok(Scan { epoch: Some(epoch), records, valid_len: at as u64, torn_bytes: (data.len() - at) as u64, torn, records_after_damage })
}

/// Whether a whole, checksummed record of a revision after `last` starts anywhere from `from` on.
/// Only looked for once a segment is known to be damaged; the revision and length are checked
/// before the checksum, so a search through a large segment costs little.
fn record_after(data: &[u8], from: usize, last: u64) -> bool {
    (from..data.len().saturating_sub(8 + MIN_PAYLOAD)).any(|at| {
        let (Some(len), Some(crc)) = (u32_at(data, at), u32_at(data, at + 4)) else { return false };
        let len = len as usize;
        if !(MIN_PAYLOAD..=MAX_PAYLOAD).contains(&len) {
            return false;
        }
        let Some(payload) = data.get(at + 8..at + 8 + len) else { return false };
        let revision = u64_at(payload, 0).unwrap_or(0);
        revision > last && crc32fast::hash(payload) == crc && decode(payload).is_some()
    })
}

/// One segment of the log as recovery reads it.
pub(crate) struct Segment {
    pub(crate) seq: u64,
    pub(crate) path: PathBuf,
    pub(crate) scan: Scan,
    /// No later segment holds a record, so a crash may have torn this one (its last record, or
    /// its header while it was being prepared); before a segment with records, a tear is damage.
    pub(crate) at_end: bool,
}

/// Reads every segment of the log in `dir`, oldest first.
pub(crate) fn read_log(dir: &Path) -> io::Result<Vec<Segment>> {
    let mut out = Vec::new();
    for (seq, path) in segments(dir)? {
        let scan = scan(&path).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        out.push(Segment { seq, path, scan, at_end: true });
    }
    let mut later_records = false;
    for segment in out.iter_mut().rev() {
        segment.at_end = !later_records;
        later_records |= !segment.scan.records.is_empty();
    }
    Ok(out)
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
    /// An append failed and the file could not be cut back to `len` yet.
    broken: bool,
}

impl Writer {
    /// Creates segment `seq` in `dir` (and the directory), with its header and `preallocate`
    /// bytes of zeros after it on disk (fewer if the disk has no room: the file then grows as it
    /// is written).
    pub(crate) fn create(dir: &Path, seq: u64, epoch: u64, preallocate: u64) -> io::Result<Writer> {
        fs::create_dir_all(dir)?;
        let path = segment_path(dir, seq);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        let mut header = Vec::with_capacity(HEADER_LEN as usize);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&epoch.to_le_bytes());
        file.write_all_at(&header, 0)?;
        if let Err(e) = zero_fill(&file, HEADER_LEN, preallocate) {
            tracing::debug!(segment = %path.display(), error = %e, "log segment not preallocated");
            file.set_len(HEADER_LEN)?;
        }
        file.sync_all()?;
        sync_dir(dir)?;
        Ok(Writer { dir: dir.to_path_buf(), seq, file, len: HEADER_LEN, broken: false })
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
}

/// Writes `len` bytes of zeros at `from`.
fn zero_fill(file: &File, from: u64, len: u64) -> io::Result<()> {
    const CHUNK: usize = 256 * 1024;
    let zeros = vec![0u8; CHUNK.min(len as usize)];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(CHUNK as u64) as usize;
        file.write_all_at(&zeros[..n], from + at)?;
        at += n as u64;
    }
    Ok(())
}

/// Prepares the log's next segment (created, header and zeroed space written, file and directory
/// fsynced) on its own thread, before the committer needs it.
///
/// The hand-over is a rendezvous: the thread creates segment `seq`, then waits until the
/// committer takes it before it creates `seq + 1`. So at most one prepared segment waits on disk,
/// and segments are numbered in the order the committer writes them.
pub(crate) struct NextSegment {
    /// Dropped first on shutdown, which ends the thread's wait to hand a segment over.
    ready: Option<mpsc::Receiver<Writer>>,
    /// Bytes the last segment switched away from took: the next one is zeroed for twice that.
    last_used: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

/// What the preparing thread reports: `Err` when a segment could not be prepared (it tries again
/// after the retry interval), `Ok` when one is ready after such a failure.
pub(crate) type PrepareReport = Box<dyn Fn(Result<(), &io::Error>) + Send>;

impl NextSegment {
    /// Starts preparing segments `first`, `first + 1`, ... of `dir`, zeroing at most
    /// `segment_bytes` of each.
    pub(crate) fn start(
        dir: &Path,
        first: u64,
        epoch: u64,
        segment_bytes: u64,
        retry: Duration,
        report: PrepareReport,
    ) -> io::Result<NextSegment> {
        let (tx, rx) = mpsc::sync_channel(0);
        let stop = Arc::new(AtomicBool::new(false));
        let last_used = Arc::new(AtomicU64::new(FIRST_PREALLOCATE / 2));
        let preparer = Preparer {
            dir: dir.to_path_buf(),
            epoch,
            segment_bytes,
            retry,
            ready: tx,
            last_used: last_used.clone(),
            stop: stop.clone(),
            report,
        };
        let thread = thread::Builder::new().name("store-wal-prepare".into()).spawn(move || preparer.run(first))?;
        Ok(NextSegment { ready: Some(rx), last_used, stop, thread: Some(thread) })
    }

    /// The prepared segment, if it is ready; never waits. `used`: the bytes the segment being
    /// left took, which sizes the zeroed space of the next.
    pub(crate) fn take(&self, used: u64) -> Option<Writer> {
        // Before the hand-over, which sets the thread on to the next segment.
        self.last_used.store(used, Ordering::Relaxed);
        self.ready.as_ref()?.try_recv().ok()
    }
}

impl Drop for NextSegment {
    /// Stops the thread and waits for it, so no segment is created after the store let go of its
    /// files (a segment it was preparing is finished and stays, holding no record).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.ready = None;
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

struct Preparer {
    dir: PathBuf,
    epoch: u64,
    segment_bytes: u64,
    retry: Duration,
    ready: mpsc::SyncSender<Writer>,
    last_used: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    report: PrepareReport,
}

impl Preparer {
    fn run(self, mut seq: u64) {
        let mut failing = false;
        while !self.stop.load(Ordering::SeqCst) {
            let used = self.last_used.load(Ordering::Relaxed);
            let preallocate = used.saturating_mul(2).clamp(MIN_PREALLOCATE, self.segment_bytes.max(MIN_PREALLOCATE));
            match Writer::create(&self.dir, seq, self.epoch, preallocate) {
                Ok(writer) => {
                    if failing {
                        failing = false;
                        (self.report)(Ok(()));
                    }
                    if self.ready.send(writer).is_err() {
                        return;
                    }
                    seq += 1;
                }
                Err(e) => {
                    // A file half made would stop the retry (segments are created, never reused).
                    let _ = fs::remove_file(segment_path(&self.dir, seq));
                    failing = true;
                    (self.report)(Err(&e));
                    thread::park_timeout(self.retry);
                }
            }
        }
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
        let mut w = Writer::create(dir, 1, 7, 0).expect("create");
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
        assert!(scan1.torn);
        assert_eq!(scan1.records[0].value, Bytes::from_static(b"one"));
        // Zeros after the records (a file extended but not written) are a torn tail, not records.
        file.set_len(full + 4096).expect("extend");
        file.write_all_at(b"o", full - 1).expect("repair");
        let scan2 = scan(&path).expect("scan");
        assert_eq!(scan2.records.len(), 2);
        assert_eq!(scan2.torn_bytes, 4096);
        assert!(!scan2.torn, "zeros are not a tear");
    }

    #[test]
    fn damage_with_whole_records_after_it_is_corruption_not_a_torn_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let events: Vec<Event> = (1..=5).map(|r| event(r, &format!("/key-{r}"), b"a value of some length")).collect();
        let path = write(dir.path(), &events);
        let mut one = Vec::new();
        encode(&mut one, &events[0], 1000);
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        // 16 bytes overwritten inside the second record: records 3 to 5 stand after the damage.
        file.write_all_at(&[0xAB; 16], HEADER_LEN + one.len() as u64 + 20).expect("corrupt");
        let s = scan(&path).expect("scan");
        assert_eq!((s.records.len(), s.torn, s.records_after_damage), (1, true, true));
        // The last record damaged: nothing after it, a tail a crash could have torn.
        let other = tempfile::tempdir().expect("tempdir");
        let path = write(other.path(), &events);
        let full = fs::metadata(&path).expect("meta").len();
        OpenOptions::new().write(true).open(&path).expect("open").write_all_at(&[0xAB; 4], full - 6).expect("corrupt");
        let s = scan(&path).expect("scan");
        assert_eq!((s.records.len(), s.torn, s.records_after_damage), (4, true, false));
    }

    #[test]
    fn zeros_after_the_last_record_are_space_made_ahead_but_a_record_half_written_into_them_is_torn() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut w = Writer::create(dir.path(), 1, 7, 4096).expect("create");
        let (mut first, mut both) = (Vec::new(), Vec::new());
        encode(&mut first, &event(1, "/a", b"one"), 1000);
        encode(&mut both, &event(1, "/a", b"one"), 1000);
        encode(&mut both, &event(2, "/b", b"two"), 1000);
        w.append(&both).expect("append");
        let path = segment_path(dir.path(), 1);
        assert_eq!(fs::metadata(&path).expect("meta").len(), HEADER_LEN + 4096, "appends inside it do not grow the file");
        let whole = scan(&path).expect("scan");
        assert_eq!((whole.records.len(), whole.torn), (2, false));

        // Only the first bytes of the second record reached the disk.
        let file = OpenOptions::new().write(true).open(&path).expect("open");
        let from = HEADER_LEN + first.len() as u64 + 10;
        file.write_all_at(&vec![0; both.len() - first.len() - 10], from).expect("zero");
        let torn = scan(&path).expect("scan");
        assert_eq!((torn.records.len(), torn.torn), (1, true));
    }

    /// Waits up to 10 s for the prepared segment.
    fn take(next: &NextSegment) -> Writer {
        for _ in 0..2000 {
            if let Some(w) = next.take(100 * 1024) {
                return w;
            }
            thread::sleep(Duration::from_millis(5));
        }
        panic!("no segment was prepared");
    }

    #[test]
    fn segments_are_prepared_one_ahead_and_handed_over_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let next = NextSegment::start(dir.path(), 4, 7, 1 << 20, Duration::from_millis(10), Box::new(|_| {}))
            .expect("start");
        let mut first = take(&next);
        assert_eq!(first.seq, 4);
        assert!(!first.has_records());
        first.append(b"ready to take records").expect("append");
        let second = take(&next);
        assert_eq!(second.seq, 5);
        let prepared = scan(&segment_path(dir.path(), 5)).expect("scan");
        assert_eq!((prepared.epoch, prepared.records.len(), prepared.torn), (Some(7), 0, false));
        assert_eq!(prepared.torn_bytes, 200 * 1024, "zeroed for twice what the segment before it took");
        // The drop waits for the thread: at most the one segment it was preparing after the last
        // one taken remains, and nothing is made later.
        drop(next);
        let seqs: Vec<u64> = segments(dir.path()).expect("segments").into_iter().map(|(s, _)| s).collect();
        assert!(seqs == [4, 5] || seqs == [4, 5, 6], "{seqs:?}");
    }

    #[test]
    fn a_tear_is_read_as_a_crash_only_where_no_later_segment_holds_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let torn = write(dir.path(), &[event(1, "/a", b"one"), event(2, "/b", b"two")]);
        let len = fs::metadata(&torn).expect("meta").len();
        OpenOptions::new().write(true).open(&torn).expect("open").set_len(len - 2).expect("cut");
        Writer::create(dir.path(), 2, 7, 4096).expect("prepared");
        fs::write(segment_path(dir.path(), 3), &MAGIC[..5]).expect("half a header");
        let at_end: Vec<bool> = read_log(dir.path()).expect("read").iter().map(|s| s.at_end).collect();
        assert_eq!(at_end, [true, true, true]);

        let mut w = Writer::create(dir.path(), 4, 7, 4096).expect("create");
        let mut buf = Vec::new();
        encode(&mut buf, &event(3, "/c", b"three"), 1000);
        w.append(&buf).expect("append");
        let at_end: Vec<bool> = read_log(dir.path()).expect("read").iter().map(|s| s.at_end).collect();
        assert_eq!(at_end, [false, false, false, true]);
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
