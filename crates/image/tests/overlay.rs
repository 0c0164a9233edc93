//! A container's overlay root: writes go to its own layer, and removal leaves nothing behind.

mod common;

use std::fs;

use common::{Layer, image, require_root, unpacked};
use shepherd_image::ImageStore;

fn mounted(path: &std::path::Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mountinfo").expect("reading /proc/self/mountinfo");
    let path = path.to_str().expect("a UTF-8 temp path");
    mounts.lines().any(|line| line.split(' ').nth(4) == Some(path))
}

#[test]
fn a_write_in_the_container_root_changes_neither_the_image_layers_nor_another_container() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path().join("images")).unwrap();
    let base = unpacked(
        &store,
        &Layer::default()
            .dir("etc/")
            .file("etc/motd", "base\n")
            .file("etc/issue", "issue\n"),
    );
    let top = unpacked(
        &store,
        &Layer::default()
            .dir("etc/")
            .file("etc/.wh.issue", "")
            .file("etc/version", "2\n"),
    );
    let record = image(&store, "example.com/app:2", vec![base.clone(), top.clone()], 0);

    let root = store.mount_rootfs("web-0_app", &record).unwrap();
    let other = store.mount_rootfs("web-1_app", &record).unwrap();
    assert!(mounted(&root));
    assert_eq!(fs::read_to_string(root.join("etc/motd")).unwrap(), "base\n");
    assert_eq!(
        fs::read_to_string(root.join("etc/version")).unwrap(),
        "2\n",
        "the upper layer is on top"
    );
    assert!(
        !root.join("etc/issue").exists(),
        "the upper layer's whiteout hides the lower file"
    );

    fs::write(root.join("etc/motd"), "changed\n").unwrap();
    fs::write(root.join("new-file"), "x").unwrap();
    assert_eq!(
        fs::read_to_string(store.layer_path(&base.diff_id).join("etc/motd")).unwrap(),
        "base\n"
    );
    assert!(!store.layer_path(&top.diff_id).join("new-file").exists());
    assert_eq!(fs::read_to_string(other.join("etc/motd")).unwrap(), "base\n");
    assert_eq!(
        store.mount_rootfs("web-0_app", &record).unwrap(),
        root,
        "mounting again adopts the mount"
    );
    assert_eq!(fs::read_to_string(root.join("etc/motd")).unwrap(), "changed\n");

    store.remove_rootfs("web-0_app").unwrap();
    assert!(!mounted(&root));
    assert!(
        !store.root().join("containers/web-0_app").exists(),
        "no overlay directory is left"
    );
    store.remove_rootfs("web-0_app").unwrap();
    store.remove_rootfs("web-1_app").unwrap();
    assert_eq!(fs::read_dir(store.root().join("containers")).unwrap().count(), 0);
    assert!(
        store.layer_path(&base.diff_id).join("etc/motd").exists(),
        "the image layers stay"
    );
}

#[test]
fn a_container_id_that_could_name_another_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path().join("images")).unwrap();
    let record = image(&store, "example.com/app:1", vec![], 0);
    for bad in ["", "..", "../x", "a/b", ".hidden"] {
        let err = store.mount_rootfs(bad, &record).unwrap_err().to_string();
        assert!(err.contains("invalid container id"), "{bad}: {err}");
    }
}

#[test]
fn an_image_with_more_layers_than_one_page_of_mount_options_still_mounts() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path().join("images")).unwrap();
    // Each lower layer costs about 100 bytes of options here, so 60 layers exceed the 4 KiB page.
    let layers: Vec<_> = (0..60)
        .map(|i| unpacked(&store, &Layer::default().file(&format!("layer-{i}"), &i.to_string())))
        .collect();
    let record = image(&store, "example.com/tall:1", layers, 0);
    let root = store.mount_rootfs("tall", &record).unwrap();
    let seen = std::panic::catch_unwind(|| {
        assert_eq!(fs::read_to_string(root.join("layer-0")).unwrap(), "0");
        assert_eq!(fs::read_to_string(root.join("layer-59")).unwrap(), "59");
    });
    store.remove_rootfs("tall").unwrap();
    seen.unwrap();
    assert!(!mounted(&root));
}

#[test]
fn a_running_root_keeps_its_layers_when_its_tag_moves_to_another_image_and_gc_runs() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path().join("images")).unwrap();
    let v1 = unpacked(&store, &Layer::default().file("version", "1\n"));
    let old = image(&store, "example.com/app:live", vec![v1.clone()], 0);
    let root = store.mount_rootfs("web-0_app", &old).unwrap();
    // The tag is pulled again and now names other content; the old image has no record left.
    let v2 = unpacked(&store, &Layer::default().file("version", "2\n"));
    image(&store, "example.com/app:live", vec![v2.clone()], 1);
    let full = shepherd_image::DiskUsage { capacity: 100, available: 0 };
    store
        .collect_garbage(shepherd_image::GcPolicy::default(), full, &Default::default())
        .unwrap();
    assert_eq!(
        fs::read_to_string(root.join("version")).unwrap(),
        "1\n",
        "the running root still reads its own image"
    );
    assert!(store.layer_path(&v1.diff_id).is_dir(), "a layer under a mounted root stays");

    store.remove_rootfs("web-0_app").unwrap();
    store.remove_image("example.com/app:live").unwrap();
    assert!(!store.layer_path(&v1.diff_id).exists(), "unused once the root is gone");
    assert!(!store.layer_path(&v2.diff_id).exists());
}
