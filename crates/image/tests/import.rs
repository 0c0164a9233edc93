//! `shepherd_image::import`: OCI archives and `docker save` tarballs into the store, and every bad
//! archive refused with the store left as it was.

use std::io::Read;
use std::path::Path;

use shepherd_image::{Digest, ImageError, ImageStore, import};
use shepherd_registry::testimage::{Image, ImageBuilder};

/// Every file and directory under the store's root but its scratch space, to compare before and after.
fn contents(store: &ImageStore) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let name = path.strip_prefix(root).expect("inside").display().to_string();
            if name == "tmp" {
                continue;
            }
            out.push(name);
            if path.is_dir() && !path.is_symlink() {
                walk(root, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(store.root(), store.root(), &mut out);
    out.sort();
    out
}

/// A tar of the files `(name, bytes)`.
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, name, *data).expect("append");
    }
    builder.into_inner().expect("tar")
}

/// `image` as `skopeo copy ... oci-archive:FILE:NAME` writes it.
fn oci_archive(image: &Image, name: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    image.write_oci_layout(dir.path(), name).expect("layout");
    let mut builder = tar::Builder::new(Vec::new());
    builder.append_dir_all(".", dir.path()).expect("append");
    builder.into_inner().expect("tar")
}

/// `image` as `docker save NAME` writes it: an uncompressed layer, a manifest.json naming it.
fn docker_archive(image: &Image, names: &[&str]) -> Vec<u8> {
    let mut layer = Vec::new();
    flate2::read::GzDecoder::new(image.layer.as_slice()).read_to_end(&mut layer).expect("gunzip");
    let manifest = serde_json::json!([{"Config": "config.json", "RepoTags": names, "Layers": ["0123/layer.tar"]}]);
    tar_of(&[("manifest.json", manifest.to_string().as_bytes()), ("config.json", &image.config), ("0123/layer.tar", &layer)])
}

fn app() -> Image {
    ImageBuilder::new().file("/etc/app", "from an archive\n", 0o644).cmd(["cat", "/etc/app"]).build().expect("image")
}

#[test]
fn oci_and_docker_archives_import_under_their_names_complete_and_unpacked() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(root.path()).expect("store");
    let image = app();
    let records = import(&store, oci_archive(&image, "example.com/app:1").as_slice()).expect("OCI archive");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].reference, "example.com/app:1");
    let digest = |d: &dyn std::fmt::Display| Digest::parse(&d.to_string()).expect("digest");
    assert_eq!(records[0].manifest_digest, digest(&image.manifest_digest));
    let stored = store.image("example.com/app:1").expect("read").expect("recorded");
    assert!(store.is_complete(&stored), "config and unpacked layer present");
    let layer = store.layer_path(&digest(&image.diff_id));
    assert_eq!(std::fs::read_to_string(layer.join("etc/app")).expect("unpacked"), "from an archive\n");

    let records = import(&store, docker_archive(&image, &["app:2"]).as_slice()).expect("docker save archive");
    assert_eq!(records[0].reference, "docker.io/library/app:2", "named as a pod names it");
    assert_eq!(records[0].layers[0].diff_id, digest(&image.diff_id), "the same layer, unpacked once");
    assert!(store.is_complete(&store.image("docker.io/library/app:2").expect("read").expect("recorded")));
    // Again: nothing new, nothing lost.
    let before = contents(&store);
    import(&store, docker_archive(&image, &["app:2"]).as_slice()).expect("again");
    assert_eq!(contents(&store), before);
}

#[test]
fn truncated_corrupted_escaping_or_nameless_archives_are_refused_and_change_nothing() {
    let root = tempfile::tempdir().expect("tempdir");
    let store = ImageStore::open(root.path()).expect("store");
    import(&store, oci_archive(&app(), "example.com/kept:1").as_slice()).expect("a first image");
    let before = contents(&store);
    let refused = |archive: &[u8]| {
        let e = import(&store, archive).expect_err("refused");
        assert_eq!(contents(&store), before, "{e} changed the store");
        e.to_string()
    };

    let other = ImageBuilder::new().file("/etc/other", "x", 0o644).build().expect("image");
    let good = docker_archive(&other, &["other:1"]);
    let e = refused(&good[..good.len() / 2]);
    assert!(e.contains("truncated"), "{e}");

    // A byte of the layer changed: it no longer hashes to the config's diff id.
    let mut corrupt = good.clone();
    let at = corrupt.windows(b"etc/other".len()).rposition(|w| w == b"etc/other").expect("the layer's entry") + 600;
    corrupt[at] ^= 0xff;
    let e = refused(&corrupt);
    assert!(matches!(import(&store, corrupt.as_slice()), Err(ImageError::DigestMismatch { .. })), "{e}");

    let hostile = ImageBuilder::new().hostile_file("../../escaped", "x").build().expect("image");
    let e = refused(&oci_archive(&hostile, "example.com/hostile:1"));
    assert!(e.contains("escape"), "{e}");
    assert!(!root.path().join("escaped").exists() && !root.path().parent().expect("parent").join("escaped").exists());

    let mut link = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Symlink);
    header.set_size(0);
    link.append_link(&mut header, "manifest.json", "../../etc/passwd").expect("link");
    let e = refused(&link.into_inner().expect("tar"));
    assert!(e.contains("outside the archive"), "{e}");

    let e = refused(&tar_of(&[("hello.txt", b"hi")]));
    assert!(e.contains("neither an OCI image layout"), "{e}");

    let nameless = docker_archive(&other, &[]);
    let e = refused(&nameless);
    assert!(e.contains("no name"), "{e}");
    assert!(store.image("example.com/kept:1").expect("read").is_some(), "the first image is still there");
}
