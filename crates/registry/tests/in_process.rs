//! The registry as a library, as other crates' tests use it: served on a loopback port in the test's
//! own process, with a test image pushed over HTTP and its pulls counted.

use std::sync::Arc;

use shepherd_registry::Registry;
use shepherd_registry::testimage::ImageBuilder;

async fn serve_on_loopback(data: &std::path::Path) -> (String, Arc<Registry>) {
    let registry = Registry::open(data).expect("open");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(shepherd_registry::serve(listener, registry.clone(), std::future::pending()));
    (url, registry)
}

#[tokio::test]
async fn a_pushed_image_is_pulled_back_and_each_blob_download_is_counted() {
    let data = tempfile::tempdir().expect("tempdir");
    let (url, registry) = serve_on_loopback(data.path()).await;
    let image = ImageBuilder::busybox().expect("busybox-static").file("/etc/variant", "in-process", 0o644).build();
    let image = image.expect("build");
    image.push(&url, "lib/busybox", "1").await.expect("push");

    let client = reqwest::Client::new();
    let manifest = client
        .get(format!("{url}/v2/lib/busybox/manifests/1"))
        .send()
        .await
        .expect("manifest")
        .bytes()
        .await
        .expect("body");
    assert_eq!(manifest.as_ref(), image.manifest.as_slice());
    assert_eq!(registry.blob_pulls("lib/busybox", image.layer_digest.as_str()), 0);
    for _ in 0..3 {
        let layer = client
            .get(format!("{url}/v2/lib/busybox/blobs/{}", image.layer_digest))
            .send()
            .await
            .expect("layer")
            .bytes()
            .await
            .expect("body");
        assert_eq!(layer.as_ref(), image.layer.as_slice());
    }
    assert_eq!(registry.blob_pulls("lib/busybox", image.layer_digest.as_str()), 3);
    assert_eq!(registry.blob_pulls("other", image.layer_digest.as_str()), 0);

    // A second tag for the same manifest.
    image.push(&url, "lib/busybox", "2").await.expect("second push");
    let tags: serde_json::Value =
        client.get(format!("{url}/v2/lib/busybox/tags/list")).send().await.expect("tags").json().await.expect("JSON");
    assert_eq!(tags["tags"], serde_json::json!(["1", "2"]));
}
