//! The blob store's guarantees: content is verified as written, and concurrent writers are safe.

mod common;

use std::collections::HashSet;
use std::fs;

use common::{Layer, image, unpacked};
use shepherd_image::{Digest, DiskUsage, GcPolicy, ImageError, ImageStore};

fn store() -> (tempfile::TempDir, ImageStore) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = ImageStore::open(dir.path().join("images")).expect("opening the store");
    (dir, store)
}

fn files_under(path: &std::path::Path) -> usize {
    fs::read_dir(path).unwrap().count()
}

#[test]
fn a_blob_that_does_not_match_its_digest_is_refused_and_leaves_nothing() {
    let (_dir, store) = store();
    let claimed = Digest::of(b"what the manifest promised");
    let err = store.write_blob(&claimed, &b"what the registry sent"[..]).unwrap_err();
    assert!(
        matches!(&err, ImageError::DigestMismatch { expected, actual }
            if *expected == claimed.to_string() && *actual == Digest::of(b"what the registry sent").to_string()),
        "{err}"
    );
    assert!(!store.has_blob(&claimed));
    assert_eq!(files_under(&store.root().join("tmp")), 0);
    assert_eq!(files_under(&store.root().join("blobs/sha256")), 0);
}

#[test]
fn a_verified_blob_is_stored_under_its_digest() {
    let (_dir, store) = store();
    let digest = Digest::of(b"content");
    assert_eq!(store.write_blob(&digest, &b"content"[..]).unwrap(), 7);
    assert_eq!(store.read_blob(&digest).unwrap(), b"content");
    assert!(store.blob_path(&digest).ends_with(digest.hex()));
}

#[test]
fn an_abandoned_blob_write_leaves_nothing() {
    let (_dir, store) = store();
    let digest = Digest::of(b"never finished");
    let mut writer = store.blob_writer(&digest).unwrap();
    std::io::Write::write_all(&mut writer, b"never").unwrap();
    drop(writer);
    assert!(!store.has_blob(&digest));
    assert_eq!(files_under(&store.root().join("tmp")), 0);
}

#[test]
fn concurrent_writers_of_one_blob_all_succeed_and_store_one_copy() {
    let (_dir, store) = store();
    let content = "layer bytes ".repeat(100_000);
    let digest = Digest::of(content.as_bytes());
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..10)
            .map(|_| s.spawn(|| store.write_blob(&digest, content.as_bytes())))
            .collect();
        for writer in writers {
            assert_eq!(writer.join().unwrap().unwrap(), content.len() as u64);
        }
    });
    assert_eq!(store.read_blob(&digest).unwrap(), content.as_bytes());
    assert_eq!(files_under(&store.root().join("blobs/sha256")), 1);
    assert_eq!(files_under(&store.root().join("tmp")), 0);
}

#[test]
fn concurrent_uses_of_images_keep_every_record_readable() {
    let (_dir, store) = store();
    for i in 0..4 {
        image(&store, &format!("example.com/app{i}:1"), vec![], 0);
    }
    std::thread::scope(|s| {
        for i in 0..4 {
            let store = &store;
            s.spawn(move || {
                for _ in 0..50 {
                    store.touch(&format!("example.com/app{i}:1")).unwrap();
                    assert_eq!(store.images().unwrap().len(), 4);
                }
            });
        }
    });
    assert!(store.images().unwrap().iter().all(|i| i.last_used_ms > 0));
}

#[test]
fn reopening_the_store_discards_partial_writes_a_crash_left() {
    let (dir, store) = store();
    let digest = Digest::of(b"half");
    let writer = store.blob_writer(&digest).unwrap();
    std::mem::forget(writer); // as if the process died mid-write
    assert_eq!(files_under(&store.root().join("tmp")), 1);
    drop(store);
    let store = ImageStore::open(dir.path().join("images")).unwrap();
    assert_eq!(files_under(&store.root().join("tmp")), 0);
}

#[test]
fn image_config_is_readable_for_the_runtime() {
    let (_dir, store) = store();
    let record = image(&store, "example.com/app:1", vec![], 0);
    let config = store.config(&record).unwrap();
    assert_eq!(
        config.config().as_ref().and_then(|c| c.cmd().clone()),
        Some(vec!["sh".to_string()])
    );
}

/// GC test layout: A (least recently used, but running) and B share a layer, C has its own.
#[test]
fn image_gc_removes_least_recently_used_unused_images_until_under_the_low_threshold() {
    common::require_root();
    let (_dir, store) = store();
    let shared = unpacked(&store, &Layer::default().file("shared", "base"));
    let only_a = unpacked(&store, &Layer::default().file("a", "a"));
    let only_b = unpacked(&store, &Layer::default().file("b", "b"));
    let only_c = unpacked(&store, &Layer::default().file("c", "c"));
    image(&store, "example.com/a:1", vec![shared.clone(), only_a.clone()], 1);
    image(&store, "example.com/b:1", vec![shared.clone(), only_b.clone()], 2);
    image(&store, "example.com/c:1", vec![only_c.clone()], 3);
    let running: HashSet<String> = ["example.com/a:1".to_string()].into();
    let policy = GcPolicy {
        high_percent: 85,
        low_percent: 80,
    };

    let below_high = DiskUsage {
        capacity: 100_000,
        available: 16_000,
    };
    assert!(
        store
            .collect_garbage(policy, below_high, &running)
            .unwrap()
            .removed_images
            .is_empty()
    );

    // At 85% used the low threshold wants 5,000 bytes back: B alone frees more (its blobs and layer).
    let at_high = DiskUsage {
        capacity: 100_000,
        available: 15_000,
    };
    let collected = store.collect_garbage(policy, at_high, &running).unwrap();
    assert_eq!(collected.removed_images, vec!["example.com/b:1".to_string()]);
    assert!(collected.freed_bytes >= 5_000, "freed {}", collected.freed_bytes);
    assert!(!store.layer_path(&only_b.diff_id).exists() && !store.has_blob(&only_b.digest));
    assert!(
        store.layer_path(&shared.diff_id).exists(),
        "a layer the running image uses stays"
    );
    assert!(store.image("example.com/c:1").unwrap().is_some());

    // A full disk: everything not running goes, the running image stays whole.
    let full = DiskUsage {
        capacity: 100_000,
        available: 0,
    };
    let collected = store.collect_garbage(policy, full, &running).unwrap();
    assert_eq!(collected.removed_images, vec!["example.com/c:1".to_string()]);
    let left: Vec<String> = store.images().unwrap().into_iter().map(|i| i.reference).collect();
    assert_eq!(left, vec!["example.com/a:1".to_string()]);
    for layer in [&shared, &only_a] {
        assert!(store.layer_path(&layer.diff_id).exists() && store.has_blob(&layer.digest));
    }
    assert!(!store.layer_path(&only_c.diff_id).exists());
}

#[test]
fn image_gc_leaves_content_a_pull_in_progress_has_pinned() {
    let (_dir, store) = store();
    let digest = Digest::of(b"fetched, record not yet written");
    store
        .write_blob(&digest, &b"fetched, record not yet written"[..])
        .unwrap();
    let stray = Digest::of(b"stray");
    store.write_blob(&stray, &b"stray"[..]).unwrap();
    image(&store, "example.com/old:1", vec![], 0);
    let pin = store.pin([digest.clone()]);
    let full = DiskUsage {
        capacity: 100,
        available: 0,
    };
    store
        .collect_garbage(GcPolicy::default(), full, &HashSet::new())
        .unwrap();
    assert!(store.has_blob(&digest));
    assert!(!store.has_blob(&stray));
    drop(pin);
}

#[test]
fn disk_usage_reads_the_filesystem_holding_the_store() {
    let (_dir, store) = store();
    let usage = DiskUsage::of(store.root()).unwrap();
    assert!(usage.capacity > 0 && usage.available <= usage.capacity, "{usage:?}");
}
