//! Layer unpacking against tarballs built here: what a layer may contain and what it may not.

mod common;

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use common::{Layer, require_root, store_layer, unpacked};
use shepherd_image::{ImageError, ImageStore, LayerRecord};

fn store() -> (tempfile::TempDir, ImageStore) {
    require_root();
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = ImageStore::open(dir.path().join("images")).expect("opening the store");
    (dir, store)
}

/// Unpacking must fail with an error naming `what`, and leave neither a layer nor a partial one.
fn refused(store: &ImageStore, layer: &LayerRecord, what: &str) -> String {
    let err = store
        .ensure_layer(layer)
        .expect_err("the layer must be refused")
        .to_string();
    assert!(err.contains(what), "error {err:?} should mention {what:?}");
    assert!(
        !store.layer_path(&layer.diff_id).exists(),
        "a refused layer must not be stored"
    );
    let leftovers = fs::read_dir(store.root().join("tmp")).unwrap().count();
    assert_eq!(leftovers, 0, "a refused layer must leave no temporary files");
    err
}

#[test]
fn a_layer_unpacks_files_directories_symlinks_and_hard_links_with_modes_and_owners() {
    let (_dir, store) = store();
    let layer = Layer::default()
        .dir("bin/")
        .file_owned("bin/tool", "#!/bin/sh\n", 0o4755, 1000, 2000)
        .hard_link("bin/tool-again", "bin/tool")
        .symlink("bin/sh", "/bin/busybox")
        .symlink("etc/relative", "../bin/tool")
        .file("./etc/hostname", "image\n");
    let root = store.layer_path(&unpacked(&store, &layer).diff_id);

    let tool = fs::metadata(root.join("bin/tool")).unwrap();
    assert_eq!(tool.mode() & 0o7777, 0o4755, "set-uid survives the chown");
    assert_eq!((tool.uid(), tool.gid()), (1000, 2000));
    assert_eq!(fs::metadata(root.join("bin/tool-again")).unwrap().ino(), tool.ino());
    assert_eq!(
        fs::read_link(root.join("bin/sh")).unwrap().to_str(),
        Some("/bin/busybox")
    );
    assert_eq!(
        fs::read_link(root.join("etc/relative")).unwrap().to_str(),
        Some("../bin/tool")
    );
    assert_eq!(fs::read_to_string(root.join("etc/hostname")).unwrap(), "image\n");
    assert_eq!(tool.mtime(), 1_700_000_000);
}

#[test]
fn extended_attributes_are_kept_except_ones_that_would_steer_overlayfs() {
    let (_dir, store) = store();
    let layer = Layer::default()
        .xattrs(&[("user.note", "kept"), ("trusted.overlay.redirect", "/elsewhere")])
        .file("noted", "x");
    let root = store.layer_path(&unpacked(&store, &layer).diff_id);
    let mut value = [0u8; 32];
    let n = rustix::fs::lgetxattr(root.join("noted"), "user.note", &mut value).unwrap();
    assert_eq!(&value[..n], b"kept");
    assert!(rustix::fs::lgetxattr(root.join("noted"), "trusted.overlay.redirect", &mut value).is_err());
}

#[test]
fn an_uncompressed_layer_unpacks_too() {
    let (_dir, store) = store();
    let layer = Layer::default().file("hello", "world");
    let record = store_layer(&store, &layer.tar(), &layer.tar());
    let root = store.ensure_layer(&record).unwrap();
    assert_eq!(fs::read_to_string(root.join("hello")).unwrap(), "world");
}

#[test]
fn a_zstd_layer_of_several_frames_unpacks_too() {
    let (_dir, store) = store();
    let layer = Layer::default().file("first", &"1".repeat(5000)).file("second", "2");
    let tar = layer.tar();
    let (head, tail) = tar.split_at(1024);
    let mut blob = ruzstd::encoding::compress_to_vec(head, ruzstd::encoding::CompressionLevel::Fastest);
    blob.extend(ruzstd::encoding::compress_to_vec(
        tail,
        ruzstd::encoding::CompressionLevel::Fastest,
    ));
    let root = store.ensure_layer(&store_layer(&store, &blob, &tar)).unwrap();
    assert_eq!(fs::read_to_string(root.join("first")).unwrap(), "1".repeat(5000));
    assert_eq!(fs::read_to_string(root.join("second")).unwrap(), "2");
}

#[test]
fn whiteouts_become_overlay_whiteout_devices_and_opaque_markers_an_xattr() {
    let (_dir, store) = store();
    let layer = Layer::default()
        .dir("etc/")
        .file("etc/.wh.motd", "")
        .dir("var/cache/")
        .file("var/cache/.wh..wh..opq", "");
    let root = store.layer_path(&unpacked(&store, &layer).diff_id);

    let whiteout = fs::symlink_metadata(root.join("etc/motd")).unwrap();
    assert!(
        whiteout.file_type().is_char_device(),
        "a whiteout is a character device"
    );
    assert_eq!(whiteout.rdev(), 0, "overlayfs whiteouts are device 0/0");
    assert!(
        !root.join("etc/.wh.motd").exists(),
        "the OCI marker itself is not unpacked"
    );
    let mut value = [0u8; 8];
    let n = rustix::fs::lgetxattr(root.join("var/cache"), "trusted.overlay.opaque", &mut value).unwrap();
    assert_eq!(&value[..n], b"y");
    assert!(!root.join("var/cache/.wh..wh..opq").exists());
}

#[test]
fn an_entry_climbing_out_with_dotdot_is_refused() {
    let (dir, store) = store();
    let layer = Layer::default().file("../../escaped", "x");
    let record = store_layer(&store, &layer.gzip(), &layer.tar());
    refused(&store, &record, "`..`");
    assert!(!dir.path().join("escaped").exists());
}

#[test]
fn an_absolute_entry_path_is_refused() {
    let (_dir, store) = store();
    let layer = Layer::default().file("/tmp/shepherd-absolute-escape", "x");
    let record = store_layer(&store, &layer.gzip(), &layer.tar());
    refused(&store, &record, "absolute");
    assert!(!std::path::Path::new("/tmp/shepherd-absolute-escape").exists());
}

#[test]
fn writing_through_an_absolute_symlink_out_of_the_layer_is_refused() {
    let (dir, store) = store();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let layer = Layer::default()
        .symlink("evil", outside.to_str().unwrap())
        .file("evil/planted", "x");
    let record = store_layer(&store, &layer.gzip(), &layer.tar());
    refused(&store, &record, "symlink");
    assert!(
        !outside.join("planted").exists(),
        "nothing may be written through the symlink"
    );
}

#[test]
fn a_hard_link_to_a_file_outside_the_layer_is_refused() {
    let (_dir, store) = store();
    let layer = Layer::default().hard_link("passwd", "../../../../etc/passwd");
    let record = store_layer(&store, &layer.gzip(), &layer.tar());
    refused(&store, &record, "`..`");
    let layer = Layer::default().hard_link("passwd", "/etc/passwd");
    let record = store_layer(&store, &layer.gzip(), &layer.tar());
    refused(&store, &record, "absolute");
}

#[test]
fn device_files_and_fifos_are_refused_with_a_clear_error() {
    let (_dir, store) = store();
    let layer = Layer::default().dir("dev/").char_device("dev/null");
    let err = refused(
        &store,
        &store_layer(&store, &layer.gzip(), &layer.tar()),
        "character device",
    );
    assert!(err.contains("dev/null") && err.contains("not allowed"), "{err}");
    let layer = Layer::default().fifo("pipe");
    refused(&store, &store_layer(&store, &layer.gzip(), &layer.tar()), "FIFO");
}

#[test]
fn a_corrupt_or_truncated_gzip_layer_is_refused() {
    let (_dir, store) = store();
    let layer = Layer::default().file("big", &"shepherd ".repeat(10_000));
    let mut corrupt = layer.gzip();
    let middle = corrupt.len() / 2;
    corrupt[middle..middle + 16].iter_mut().for_each(|b| *b ^= 0x5a);
    refused(
        &store,
        &store_layer(&store, &corrupt, &layer.tar()),
        "not a readable tar stream",
    );
    let truncated = &layer.gzip()[..middle];
    refused(
        &store,
        &store_layer(&store, truncated, &layer.tar()),
        "not a readable tar stream",
    );
}

#[test]
fn a_layer_whose_content_does_not_hash_to_its_diff_id_is_refused() {
    let (_dir, store) = store();
    let layer = Layer::default().file("a", "1");
    let other = Layer::default().file("a", "2");
    let record = store_layer(&store, &layer.gzip(), &other.tar());
    let err = store.ensure_layer(&record).unwrap_err();
    assert!(matches!(err, ImageError::DigestMismatch { ref expected, .. } if *expected == record.diff_id.to_string()));
    assert!(!store.layer_path(&record.diff_id).exists());
}

#[test]
fn a_layer_shared_by_concurrent_unpackers_is_unpacked_once_and_all_get_it() {
    let (_dir, store) = store();
    let layer = Layer::default().file("shared", "yes");
    let record = store_layer(&store, &layer.gzip(), &layer.tar());
    let roots: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8).map(|_| s.spawn(|| store.ensure_layer(&record))).collect();
        handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    assert!(roots.iter().all(|r| *r == store.layer_path(&record.diff_id)));
    assert_eq!(fs::read_to_string(roots[0].join("shared")).unwrap(), "yes");
}
