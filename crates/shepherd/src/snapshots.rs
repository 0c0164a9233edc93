//! Periodic snapshots of the store into `<data-dir>/snapshots/`, and finding the newest good one
//! when the store itself cannot be opened.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use shepherd_store::{LocalStore, Revision, Snapshot};

pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshots")
}

/// Snapshot files, oldest first: their names start with the zero-padded time they were taken.
fn list(data_dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir(data_dir)) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("snapshot-") && n.ends_with(".snap"))
        })
        .collect();
    files.sort();
    files
}

/// Writes a snapshot of `store` unless nothing changed since `last`, then keeps only the newest
/// `keep` files. Returns the revision written (or `last`).
pub fn take(store: &LocalStore, data_dir: &Path, keep: usize, last: Option<Revision>) -> anyhow::Result<Revision> {
    let snapshot = store.snapshot()?;
    if last == Some(snapshot.revision) {
        return Ok(snapshot.revision);
    }
    let dir = dir(data_dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
    let path = dir.join(format!("snapshot-{millis:015}-rev{:020}.snap", snapshot.revision));
    crate::backup::write_atomically(&path, &snapshot.encode())?;
    tracing::info!(path = %path.display(), revision = snapshot.revision, objects = snapshot.items.len(), "store snapshot written");
    let files = list(data_dir);
    for old in files.iter().take(files.len().saturating_sub(keep.max(1))) {
        if let Err(e) = fs::remove_file(old) {
            tracing::warn!(path = %old.display(), error = %e, "cannot remove an old snapshot");
        }
    }
    Ok(snapshot.revision)
}

/// Takes a snapshot every `interval` until the process ends. Runs off the async workers: a
/// snapshot of a large store is a pass over every object and a file write.
pub async fn run_periodic(store: LocalStore, data_dir: PathBuf, interval: Duration, keep: usize) {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = None;
    loop {
        ticker.tick().await;
        let (store, data_dir) = (store.clone(), data_dir.clone());
        match tokio::task::spawn_blocking(move || take(&store, &data_dir, keep, last)).await {
            Ok(Ok(revision)) => last = Some(revision),
            Ok(Err(e)) => tracing::error!(error = format!("{e:#}"), "store snapshot failed"),
            Err(e) => tracing::error!(error = %e, "store snapshot task failed"),
        }
    }
}

/// The newest snapshot in `data_dir` that verifies, with its revision.
pub fn newest_good(data_dir: &Path) -> Option<(PathBuf, Revision)> {
    list(data_dir).into_iter().rev().find_map(|path| {
        let snapshot = fs::read(&path).ok().and_then(|b| Snapshot::decode(&b).ok())?;
        Some((path, snapshot.revision))
    })
}

/// What to tell the operator when the store at `data_dir` cannot be opened.
pub fn recovery_hint(data_dir: &Path) -> String {
    match newest_good(data_dir) {
        Some((path, revision)) => format!(
            "the newest good snapshot is {} (revision {revision}); restore it with: shepherd restore --from {} \
             --data-dir {} --force (the damaged store is kept beside it)",
            path.display(),
            path.display(),
            data_dir.display()
        ),
        None => format!(
            "no good snapshot in {}; restore a backup with: shepherd restore --from FILE --data-dir {} --force",
            dir(data_dir).display(),
            data_dir.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_store::{HistoryLimits, Store};

    #[tokio::test]
    async fn only_the_newest_snapshots_are_kept_and_an_unchanged_store_is_not_written_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::in_memory(HistoryLimits::default());
        let mut last = None;
        for i in 0..5 {
            store.create(&format!("/k{i}"), b"{}".to_vec().into()).await.expect("create");
            last = Some(take(&store, dir.path(), 2, last).expect("snapshot"));
        }
        assert_eq!(take(&store, dir.path(), 2, last).expect("snapshot"), 5);
        let revisions: Vec<Revision> = list(dir.path())
            .iter()
            .map(|p| Snapshot::decode(&fs::read(p).expect("read")).expect("decode").revision)
            .collect();
        assert_eq!(revisions, [4, 5]);
        assert_eq!(newest_good(dir.path()).map(|(_, r)| r), Some(5));

        // A damaged newest snapshot is passed over for the one before it.
        let newest = list(dir.path()).pop().expect("a snapshot");
        fs::write(&newest, b"SHEPSNAP damaged").expect("write");
        assert_eq!(newest_good(dir.path()).map(|(_, r)| r), Some(4));
    }
}
