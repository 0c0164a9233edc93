//! Pulls from the real `shepherd registry` binary on loopback: plain http, verified content, one
//! fetch per blob however many callers ask, and clear errors for what is missing or corrupt.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

mod common;

use common::Layer;
use shepherd_image::{Credentials, Digest, Ensured, ImageError, ImageRef, ImageStore, PullPolicy, Puller};
use shepherd_registry::testimage::{ImageBuilder, MARKER_PATH};

/// `target/debug/shepherd`, built beside this test (`cargo build -p shepherd` when run alone).
fn shepherd_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let binary = exe
        .parent()
        .and_then(Path::parent)
        .map(|debug| debug.join("shepherd"))
        .expect("target/debug");
    assert!(
        binary.is_file(),
        "{} is missing: build it first with `cargo build -p shepherd`",
        binary.display()
    );
    binary
}

struct Registry {
    _child: tokio::process::Child,
    address: String,
    data: tempfile::TempDir,
}

impl Registry {
    /// Starts `shepherd registry` on a free loopback port and waits for the line announcing it.
    async fn start() -> Registry {
        Self::start_on("127.0.0.1:0").await
    }

    async fn start_on(listen: &str) -> Registry {
        let data = tempfile::tempdir().expect("a temp dir");
        let mut child = tokio::process::Command::new(shepherd_binary())
            .args(["registry", "--listen", listen, "--data-dir"])
            .arg(data.path().join("registry"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("starting `shepherd registry`");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let announced = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await.expect("reading the registry's output") {
                if let Some(url) = line.strip_prefix("registry serving on http://") {
                    return url.trim().to_string();
                }
            }
            panic!("`shepherd registry` exited without announcing its address");
        });
        let address = announced.await.expect("`shepherd registry` did not start within 60 s");
        Registry {
            _child: child,
            address,
            data,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    fn data_dir(&self) -> PathBuf {
        self.data.path().join("registry")
    }

    /// Completed blob downloads per digest, from the registry's `/metrics`.
    async fn blob_pulls(&self) -> BTreeMap<String, u64> {
        self.counters("registry_blob_pulls_total", "digest").await
    }

    /// Manifest downloads per reference (tag or digest).
    async fn manifest_pulls(&self) -> BTreeMap<String, u64> {
        self.counters("registry_manifest_pulls_total", "reference").await
    }

    async fn counters(&self, metric: &str, label: &str) -> BTreeMap<String, u64> {
        let text = reqwest::get(format!("{}/metrics", self.url()))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let label = format!("{label}=\"");
        text.lines()
            .filter(|l| l.starts_with(&format!("{metric}{{")))
            .filter_map(|l| {
                let key = l.split(label.as_str()).nth(1)?.split('"').next()?.to_string();
                Some((key, l.rsplit(' ').next()?.parse().ok()?))
            })
            .collect()
    }
}

fn puller() -> (tempfile::TempDir, Arc<Puller>) {
    assert!(
        rustix::process::geteuid().is_root(),
        "pull tests unpack layers with their owners: run them as root"
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let store = Arc::new(ImageStore::open(dir.path().join("images")).expect("opening the store"));
    (dir, Arc::new(Puller::new(store, Vec::new())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_busybox_test_image_pulls_over_plain_http_from_a_loopback_registry_and_unpacks() {
    let registry = Registry::start().await;
    let image = ImageBuilder::busybox().unwrap().cmd(["sh"]).build().unwrap();
    image.push(&registry.url(), "test/busybox", "1").await.unwrap();
    let (_dir, puller) = puller();
    let reference = ImageRef::parse(&format!("{}/test/busybox:1", registry.address)).unwrap();

    let ensured = puller
        .ensure(&reference, PullPolicy::IfNotPresent, &Credentials::Anonymous)
        .await
        .unwrap();
    let Ensured::Pulled { image: record, .. } = ensured else {
        panic!("the first ensure must pull")
    };
    assert_eq!(record.manifest_digest.as_str(), image.manifest_digest.as_str());
    assert_eq!(record.layers.len(), 1);
    let store = puller.store();
    let root = store.layer_path(&record.layers[0].diff_id);
    assert!(
        root.join(MARKER_PATH.trim_start_matches('/')).is_file(),
        "the image's own file is unpacked"
    );
    assert!(root.join("bin/busybox").is_file());
    let config = store.config(&record).unwrap();
    assert_eq!(
        config.config().as_ref().and_then(|c| c.cmd().clone()),
        Some(vec!["sh".to_string()])
    );

    let again = puller
        .ensure(&reference, PullPolicy::IfNotPresent, &Credentials::Anonymous)
        .await
        .unwrap();
    assert!(
        matches!(again, Ensured::AlreadyPresent(_)),
        "IfNotPresent does not pull a present image"
    );
    let always = puller
        .ensure(&reference, PullPolicy::Always, &Credentials::Anonymous)
        .await
        .unwrap();
    assert!(
        matches!(always, Ensured::Pulled { .. }),
        "Always checks the registry again"
    );
    let pulls = registry.blob_pulls().await;
    assert_eq!(
        pulls.get(image.layer_digest.as_str()),
        Some(&1),
        "a stored layer is not fetched again: {pulls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pulled_by_digest_is_not_pulled_again_even_under_always() {
    let registry = Registry::start().await;
    let image = ImageBuilder::busybox().unwrap().build().unwrap();
    image.push(&registry.url(), "test/busybox", "1").await.unwrap();
    let (_dir, puller) = puller();
    let reference = ImageRef::parse(&format!("{}/test/busybox@{}", registry.address, image.manifest_digest)).unwrap();
    assert_eq!(PullPolicy::default_for(&reference), PullPolicy::IfNotPresent);

    let first = puller
        .ensure(&reference, PullPolicy::Always, &Credentials::Anonymous)
        .await
        .unwrap();
    assert!(matches!(first, Ensured::Pulled { .. }));
    let fetched = registry.manifest_pulls().await;
    assert_eq!(fetched.get(image.manifest_digest.as_str()), Some(&1), "{fetched:?}");
    let second = puller
        .ensure(&reference, PullPolicy::Always, &Credentials::Anonymous)
        .await
        .unwrap();
    assert!(
        matches!(second, Ensured::AlreadyPresent(_)),
        "a digest names content that cannot change"
    );
    assert_eq!(
        registry.manifest_pulls().await,
        fetched,
        "the registry is not asked again"
    );

    // A record whose layer vanished is not trusted as present.
    let layer = puller.store().layer_path(&second.image().layers[0].diff_id);
    std::fs::remove_dir_all(&layer).unwrap();
    let third = puller
        .ensure(&reference, PullPolicy::IfNotPresent, &Credentials::Anonymous)
        .await
        .unwrap();
    assert!(matches!(third, Ensured::Pulled { .. }) && layer.join("bin/busybox").is_file());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_concurrent_pulls_of_one_image_fetch_each_blob_once() {
    let registry = Registry::start().await;
    let image = ImageBuilder::busybox().unwrap().build().unwrap();
    image.push(&registry.url(), "test/busybox", "1").await.unwrap();
    let (_dir, puller) = puller();
    let reference = ImageRef::parse(&format!("{}/test/busybox:1", registry.address)).unwrap();

    let pulls: Vec<_> = (0..10)
        .map(|_| {
            let (puller, reference) = (puller.clone(), reference.clone());
            tokio::spawn(async move { puller.pull(&reference, &Credentials::Anonymous).await })
        })
        .collect();
    for pull in pulls {
        let record = pull.await.unwrap().unwrap();
        assert_eq!(record.manifest_digest.as_str(), image.manifest_digest.as_str());
    }
    let fetched = registry.blob_pulls().await;
    assert_eq!(fetched.get(image.layer_digest.as_str()), Some(&1), "{fetched:?}");
    assert_eq!(fetched.get(image.config_digest.as_str()), Some(&1), "{fetched:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_image_is_a_clear_not_found_error_until_it_is_pushed() {
    let registry = Registry::start().await;
    let (_dir, puller) = puller();
    let reference = ImageRef::parse(&format!("{}/test/later:1", registry.address)).unwrap();

    let err = puller.pull(&reference, &Credentials::Anonymous).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&reference.to_string()) && message.contains("not found"),
        "{message}"
    );
    assert!(puller.store().images().unwrap().is_empty());

    let image = ImageBuilder::busybox().unwrap().build().unwrap();
    image.push(&registry.url(), "test/later", "1").await.unwrap();
    let record = puller.pull(&reference, &Credentials::Anonymous).await.unwrap();
    assert_eq!(record.manifest_digest.as_str(), image.manifest_digest.as_str());
    assert!(puller.store().image(&reference.to_string()).unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_corrupted_in_the_registry_fails_verification_and_stores_nothing() {
    let registry = Registry::start().await;
    let image = ImageBuilder::busybox().unwrap().build().unwrap();
    image.push(&registry.url(), "test/busybox", "1").await.unwrap();
    let stored = registry.data_dir().join("blobs/sha256").join(image.layer_digest.hex());
    let good = std::fs::read(&stored).unwrap();
    let mut bad = good.clone();
    let middle = bad.len() / 2;
    bad[middle] ^= 0xff;
    std::fs::write(&stored, &bad).unwrap();
    let (_dir, puller) = puller();
    let reference = ImageRef::parse(&format!("{}/test/busybox:1", registry.address)).unwrap();

    let err = puller.pull(&reference, &Credentials::Anonymous).await.unwrap_err();
    assert!(
        matches!(err, ImageError::DigestMismatch { .. } | ImageError::Registry { .. }),
        "a corrupt blob must fail the pull: {err}"
    );
    let store = puller.store();
    assert!(store.images().unwrap().is_empty());
    assert!(
        !store.has_blob(&Digest::parse(image.layer_digest.as_str()).unwrap()),
        "the corrupt layer is not kept"
    );
    assert_eq!(
        std::fs::read_dir(store.root().join("layers/sha256")).unwrap().count(),
        0
    );
    assert_eq!(std::fs::read_dir(store.root().join("tmp")).unwrap().count(), 0);

    std::fs::write(&stored, &good).unwrap();
    puller.pull(&reference, &Credentials::Anonymous).await.unwrap();
}

/// An address of this host that is not loopback (so not trusted for plain http), from the
/// kernel's table of local addresses.
fn non_loopback_address() -> std::net::IpAddr {
    let table = std::fs::read_to_string("/proc/net/fib_trie").expect("reading /proc/net/fib_trie");
    let lines: Vec<&str> = table.lines().collect();
    lines
        .windows(2)
        .filter(|pair| pair[1].trim() == "/32 host LOCAL")
        .filter_map(|pair| {
            pair[0]
                .trim()
                .trim_start_matches("|-- ")
                .parse::<std::net::IpAddr>()
                .ok()
        })
        .find(|address| !address.is_loopback())
        .expect("this test needs a network interface with a non-loopback IPv4 address")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_off_loopback_is_pulled_over_https_unless_it_is_named_insecure() {
    let registry = Registry::start_on("0.0.0.0:0").await;
    let port = registry
        .address
        .rsplit_once(':')
        .map(|(_, port)| port.to_string())
        .unwrap();
    let host = format!("{}:{port}", non_loopback_address());
    let image = ImageBuilder::busybox().unwrap().build().unwrap();
    image
        .push(&format!("http://{host}"), "test/busybox", "1")
        .await
        .unwrap();
    let reference = ImageRef::parse(&format!("{host}/test/busybox:1")).unwrap();

    let (_dir, strict) = puller();
    let err = strict.pull(&reference, &Credentials::Anonymous).await.unwrap_err();
    assert!(
        matches!(err, ImageError::Registry { .. }),
        "https to a plain-http registry must fail: {err}"
    );
    assert!(
        registry.blob_pulls().await.is_empty(),
        "nothing is fetched over plain http"
    );

    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(ImageStore::open(dir.path().join("images")).unwrap());
    let insecure = Puller::new(store, vec![host.clone()]);
    let record = insecure.pull(&reference, &Credentials::Anonymous).await.unwrap();
    assert_eq!(record.manifest_digest.as_str(), image.manifest_digest.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_whose_layer_escapes_the_root_is_refused_and_a_good_push_then_pulls() {
    let registry = Registry::start().await;
    let (_dir, puller) = puller();
    let reference = ImageRef::parse(&format!("{}/test/evil:1", registry.address)).unwrap();
    let hostile = [
        (
            ImageBuilder::busybox().unwrap().hostile_file("../../escaped", "x"),
            "`..`",
        ),
        (
            ImageBuilder::busybox().unwrap().char_device("dev/kmem"),
            "character device",
        ),
        (
            ImageBuilder::busybox().unwrap().hard_link("passwd", "../../etc/passwd"),
            "`..`",
        ),
    ];
    for (builder, reason) in hostile {
        builder
            .build()
            .unwrap()
            .push(&registry.url(), "test/evil", "1")
            .await
            .unwrap();
        let err = puller.pull(&reference, &Credentials::Anonymous).await.unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, ImageError::Unpack { .. }) && message.contains(reason),
            "{message}"
        );
        let store = puller.store();
        assert!(store.images().unwrap().is_empty(), "a refused image is not recorded");
        assert_eq!(
            std::fs::read_dir(store.root().join("layers/sha256")).unwrap().count(),
            0
        );
        assert_eq!(std::fs::read_dir(store.root().join("tmp")).unwrap().count(), 0);
    }
    assert!(
        !puller.store().root().join("escaped").exists(),
        "nothing is written outside the layer"
    );

    let good = ImageBuilder::busybox().unwrap().build().unwrap();
    good.push(&registry.url(), "test/evil", "1").await.unwrap();
    let record = puller.pull(&reference, &Credentials::Anonymous).await.unwrap();
    assert_eq!(record.manifest_digest.as_str(), good.manifest_digest.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_layer_image_pushed_by_another_client_pulls_and_mounts_with_whiteouts_across_layers() {
    use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
    let registry = Registry::start().await;
    let base = Layer::default()
        .dir("etc/")
        .file("etc/motd", "base\n")
        .dir("var/cache/")
        .file("var/cache/old", "1");
    let middle = Layer::default()
        .dir("etc/")
        .file("etc/.wh.motd", "")
        .file("etc/version", "2\n");
    let top = Layer::default()
        .dir("var/cache/")
        .file("var/cache/.wh..wh..opq", "")
        .file("var/cache/new", "3");
    let zstd = ruzstd::encoding::compress_to_vec(top.tar().as_slice(), ruzstd::encoding::CompressionLevel::Fastest);
    let layers = vec![
        ImageLayer::oci_v1_gzip(base.gzip(), None),
        ImageLayer::oci_v1(middle.tar(), None),
        ImageLayer::new(zstd, "application/vnd.oci.image.layer.v1.tar+zstd".to_string(), None),
    ];
    let diff_ids: Vec<String> = [&base, &middle, &top]
        .iter()
        .map(|l| Digest::of(&l.tar()).to_string())
        .collect();
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/true"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config = Config::oci_v1(serde_json::to_vec(&config).unwrap(), None);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let pushed: oci_client::Reference = format!("{}/test/layered:1", registry.address).parse().unwrap();
    client
        .push(
            &pushed,
            &layers,
            config,
            &oci_client::secrets::RegistryAuth::Anonymous,
            None,
        )
        .await
        .unwrap();

    let (_dir, puller) = puller();
    let reference = ImageRef::parse(&pushed.to_string()).unwrap();
    let record = puller.pull(&reference, &Credentials::Anonymous).await.unwrap();
    assert_eq!(record.layers.len(), 3);
    let root = puller.store().mount_rootfs("layered-0", &record).unwrap();
    let seen = || {
        assert!(
            !root.join("etc/motd").exists(),
            "the middle layer's whiteout hides the base file"
        );
        assert_eq!(std::fs::read_to_string(root.join("etc/version")).unwrap(), "2\n");
        assert!(
            !root.join("var/cache/old").exists(),
            "the top layer's opaque directory hides the base's content"
        );
        assert_eq!(std::fs::read_to_string(root.join("var/cache/new")).unwrap(), "3");
    };
    let outcome = std::panic::catch_unwind(seen);
    puller.store().remove_rootfs("layered-0").unwrap();
    outcome.unwrap();
}
