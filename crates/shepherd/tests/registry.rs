//! `shepherd registry` with real clients: skopeo copies the busybox test image in and out, and
//! corrupt or interrupted pushes, bad names and unknown content get the spec's errors.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use shepherd_registry::testimage::{ImageBuilder, MARKER_PATH};

/// A `shepherd registry` on a loopback port, killed when dropped.
struct RegistryProcess {
    child: Child,
    address: String,
    _data: Option<tempfile::TempDir>,
}

impl RegistryProcess {
    fn start() -> Self {
        let data = tempfile::tempdir().expect("tempdir");
        let mut registry = Self::start_in(data.path());
        registry._data = Some(data);
        registry
    }

    fn start_in(data: &Path) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
            .args(["registry", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .spawn()
            .expect("run shepherd registry");
        // The first line names the bound address once the registry serves.
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        BufReader::new(stdout).read_line(&mut line).expect("read the serving line");
        let address = line.trim().rsplit("http://").next().unwrap_or_default().to_string();
        assert!(address.starts_with("127.0.0.1:"), "unexpected first line {line:?}");
        Self { child, address, _data: None }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }
}

impl Drop for RegistryProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// skopeo with its blob-location cache in a private home, so one test's pushes do not turn into
/// another's cross-repository mounts.
fn skopeo(home: &Path, args: &[&str]) -> Output {
    Command::new("skopeo")
        .arg("--insecure-policy")
        .args(args)
        .env("HOME", home)
        .output()
        .expect("run skopeo (Debian package skopeo)")
}

fn succeeded(output: &Output) -> bool {
    if !output.status.success() {
        eprintln!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    }
    output.status.success()
}

fn error_code(body: &str) -> String {
    let parsed: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("error body {body:?} is not JSON: {e}"));
    parsed["errors"][0]["code"].as_str().unwrap_or_default().to_string()
}

/// Sends `head` and `body` on a fresh connection and returns the status and body of the answer.
fn raw_request(address: &str, head: &str, body: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    stream.write_all(head.as_bytes()).expect("write head");
    stream.write_all(body).expect("write body");
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn digest_of(data: &[u8]) -> String {
    shepherd_registry::name::Digest::of(data).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skopeo_copies_the_busybox_test_image_in_and_out_and_sees_its_config() {
    let registry = RegistryProcess::start();
    let work = tempfile::tempdir().expect("tempdir");
    let image = ImageBuilder::busybox().expect("busybox-static").build().expect("build");
    let layout = work.path().join("layout");
    image.write_oci_layout(&layout, "1").expect("layout");

    let source = format!("oci:{}:1", layout.display());
    let target = format!("docker://{}/library/busybox:1", registry.address);
    assert!(succeeded(&skopeo(work.path(), &["copy", "--dest-tls-verify=false", &source, &target])));

    let inspect = skopeo(work.path(), &["inspect", "--tls-verify=false", &target]);
    assert!(succeeded(&inspect));
    let inspect: Value = serde_json::from_slice(&inspect.stdout).expect("inspect JSON");
    assert_eq!(inspect["Digest"], image.manifest_digest.as_str(), "the manifest went through unchanged");
    assert_eq!(inspect["RepoTags"], serde_json::json!(["1"]));
    let config = skopeo(work.path(), &["inspect", "--config", "--tls-verify=false", &target]);
    assert!(succeeded(&config));
    let config: Value = serde_json::from_slice(&config.stdout).expect("config JSON");
    assert_eq!(config["config"]["Cmd"], serde_json::json!(["sh"]));
    assert_eq!(config["config"]["WorkingDir"], "/");

    let copied = work.path().join("copied");
    let destination = format!("oci:{}:1", copied.display());
    assert!(succeeded(&skopeo(work.path(), &["copy", "--src-tls-verify=false", &target, &destination])));
    let layer = std::fs::read(copied.join("blobs/sha256").join(image.layer_digest.hex())).expect("pulled layer");
    assert_eq!(layer, image.layer, "the layer came back byte for byte");
    let mut found_marker = false;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(layer.as_slice()));
    for entry in archive.entries().expect("tar") {
        let entry = entry.expect("entry");
        found_marker |= entry.path().expect("path").to_string_lossy() == MARKER_PATH.trim_start_matches('/');
    }
    assert!(found_marker, "the pulled layer has the image's marker file");

    let client = reqwest::Client::new();
    let by_digest = client
        .get(registry.url(&format!("/v2/library/busybox/manifests/{}", image.manifest_digest)))
        .header("accept", shepherd_registry::OCI_MANIFEST)
        .send()
        .await
        .expect("manifest by digest");
    assert_eq!(by_digest.status(), 200);
    assert_eq!(by_digest.headers()["docker-content-digest"], image.manifest_digest.as_str());
    assert_eq!(by_digest.headers()["content-type"], shepherd_registry::OCI_MANIFEST);
    assert_eq!(by_digest.bytes().await.expect("body").as_ref(), image.manifest.as_slice());

    let tags: Value = client
        .get(registry.url("/v2/library/busybox/tags/list"))
        .send()
        .await
        .expect("tags")
        .json()
        .await
        .expect("tags JSON");
    assert_eq!(tags, serde_json::json!({"name": "library/busybox", "tags": ["1"]}));

    let metrics = client.get(registry.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let layer_pulls =
        format!("registry_blob_pulls_total{{repository=\"library/busybox\",digest=\"{}\"}} 1\n", image.layer_digest);
    assert!(metrics.contains(&layer_pulls), "one pull of the layer counted in\n{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_whose_bytes_do_not_match_its_digest_is_refused_and_nothing_is_stored() {
    let registry = RegistryProcess::start();
    let client = reqwest::Client::new();
    let claimed = digest_of(b"the real content");

    let monolithic = client
        .post(registry.url(&format!("/v2/corrupt/blobs/uploads/?digest={claimed}")))
        .body("tampered content")
        .send()
        .await
        .expect("post");
    assert_eq!(monolithic.status(), 400);
    let body = monolithic.text().await.expect("body");
    assert_eq!(error_code(&body), "DIGEST_INVALID");
    assert!(body.contains(&claimed), "the error names the digest: {body}");

    let session = client.post(registry.url("/v2/corrupt/blobs/uploads/")).send().await.expect("start");
    assert_eq!(session.status(), 202);
    let location = session.headers()["location"].to_str().expect("location").to_string();
    let patched = client.patch(registry.url(&location)).body("tampered content").send().await.expect("patch");
    assert_eq!(patched.status(), 202);
    let finished =
        client.put(registry.url(&format!("{location}?digest={claimed}"))).send().await.expect("finish upload");
    assert_eq!(finished.status(), 400);
    assert_eq!(error_code(&finished.text().await.expect("body")), "DIGEST_INVALID");

    let head = client.head(registry.url(&format!("/v2/corrupt/blobs/{claimed}"))).send().await.expect("head");
    assert_eq!(head.status(), 404, "no blob is visible under the claimed digest");
    let tampered = digest_of(b"tampered content");
    let head = client.head(registry.url(&format!("/v2/corrupt/blobs/{tampered}"))).send().await.expect("head");
    assert_eq!(head.status(), 404, "nor under the digest of what was sent");

    // The registry is unharmed: a good push and pull of the same repository work.
    let image = ImageBuilder::busybox().expect("busybox-static").build().expect("build");
    image.push(&registry.url(""), "corrupt", "good").await.expect("a later good push succeeds");
    let work = tempfile::tempdir().expect("tempdir");
    let source = format!("docker://{}/corrupt:good", registry.address);
    let destination = format!("oci:{}:good", work.path().join("out").display());
    assert!(succeeded(&skopeo(work.path(), &["copy", "--src-tls-verify=false", &source, &destination])));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skopeo_pushing_a_corrupt_layer_stops_mid_upload_and_leaves_the_registry_ready_for_a_good_push() {
    let registry = RegistryProcess::start();
    let work = tempfile::tempdir().expect("tempdir");
    let image = ImageBuilder::busybox().expect("busybox-static").build().expect("build");
    let layout = work.path().join("layout");
    image.write_oci_layout(&layout, "1").expect("layout");
    let layer = layout.join("blobs/sha256").join(image.layer_digest.hex());
    let mut corrupt = image.layer.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0xff;
    std::fs::write(&layer, &corrupt).expect("corrupt the layer");

    // skopeo checks what it reads against the digest while it streams the upload: the mismatch
    // ends the push with a chunk half sent and the session never finished; or, when the whole
    // chunk went out first, the registry refuses to finish the upload under that digest.
    let source = format!("oci:{}:1", layout.display());
    let target = format!("docker://{}/torn:1", registry.address);
    let push = skopeo(work.path(), &["copy", "--dest-tls-verify=false", &source, &target]);
    assert!(!push.status.success(), "a corrupt layer must not push");
    let stderr = String::from_utf8_lossy(&push.stderr);
    let refused = stderr.contains("Digest did not match") || stderr.contains("digest invalid");
    assert!(refused && stderr.contains(image.layer_digest.as_str()), "{stderr}");
    let client = reqwest::Client::new();
    let head = client.head(registry.url(&format!("/v2/torn/blobs/{}", image.layer_digest))).send().await.expect("head");
    assert_eq!(head.status(), 404, "no blob under the layer's digest");
    let manifest = client.head(registry.url("/v2/torn/manifests/1")).send().await.expect("head");
    assert_eq!(manifest.status(), 404, "no tag for the failed push");

    std::fs::write(&layer, &image.layer).expect("repair the layer");
    assert!(succeeded(&skopeo(work.path(), &["copy", "--dest-tls-verify=false", &source, &target])), "a later good push");
    let out = format!("oci:{}:1", work.path().join("out").display());
    assert!(succeeded(&skopeo(work.path(), &["copy", "--src-tls-verify=false", &target, &out])), "and its pull");
    let pulled = std::fs::read(work.path().join("out/blobs/sha256").join(image.layer_digest.hex())).expect("pulled layer");
    assert_eq!(pulled, image.layer, "the good layer came back byte for byte");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_chunked_upload_keeps_its_last_whole_chunk_and_can_be_finished() {
    let registry = RegistryProcess::start();
    let client = reqwest::Client::new();
    let content: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let digest = digest_of(&content);
    let (first, second) = content.split_at(80_000);

    let session = client.post(registry.url("/v2/chunked/blobs/uploads/")).send().await.expect("start");
    assert_eq!(session.status(), 202);
    let location = session.headers()["location"].to_str().expect("location").to_string();
    let patched = client
        .patch(registry.url(&location))
        .header("content-range", format!("0-{}", first.len() - 1))
        .body(first.to_vec())
        .send()
        .await
        .expect("first chunk");
    assert_eq!(patched.status(), 202);
    assert_eq!(patched.headers()["range"], format!("0-{}", first.len() - 1).as_str());

    // The second chunk's sender stops half-way through the body and closes its side.
    let head = format!(
        "PATCH {location} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        registry.address,
        second.len()
    );
    let mut stream = TcpStream::connect(&registry.address).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    stream.write_all(head.as_bytes()).expect("head");
    stream.write_all(&second[..second.len() / 2]).expect("half a body");
    stream.shutdown(std::net::Shutdown::Write).expect("half-close");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "a cut chunk is refused: {answer}");
    assert!(answer.contains("BLOB_UPLOAD_INVALID"), "{answer}");

    // The partial chunk was taken back out: the session is where the last whole chunk left it.
    let response = client.get(registry.url(&location)).send().await.expect("status");
    assert_eq!(response.status(), 204);
    assert_eq!(response.headers()["range"], format!("0-{}", first.len() - 1).as_str());
    let visible = client.head(registry.url(&format!("/v2/chunked/blobs/{digest}"))).send().await.expect("head");
    assert_eq!(visible.status(), 404, "an unfinished upload is not a blob");

    let out_of_order = client
        .patch(registry.url(&location))
        .header("content-range", format!("{}-{}", first.len() + 10, content.len() - 1))
        .body(second[10..].to_vec())
        .send()
        .await
        .expect("out of order chunk");
    assert_eq!(out_of_order.status(), 416);
    assert_eq!(out_of_order.headers()["range"], format!("0-{}", first.len() - 1).as_str(), "416 tells where to resume");
    assert_eq!(error_code(&out_of_order.text().await.expect("body")), "BLOB_UPLOAD_INVALID");

    let resumed = client
        .patch(registry.url(&location))
        .header("content-range", format!("{}-{}", first.len(), content.len() - 1))
        .body(second.to_vec())
        .send()
        .await
        .expect("resumed chunk");
    assert_eq!(resumed.status(), 202);
    let finished = client.put(registry.url(&format!("{location}?digest={digest}"))).send().await.expect("finish");
    assert_eq!(finished.status(), 201);
    assert_eq!(finished.headers()["location"], format!("/v2/chunked/blobs/{digest}").as_str());
    let pulled = client.get(registry.url(&format!("/v2/chunked/blobs/{digest}"))).send().await.expect("get");
    assert_eq!(pulled.status(), 200);
    assert_eq!(pulled.bytes().await.expect("blob").as_ref(), content.as_slice());

    let gone = client.get(registry.url(&location)).send().await.expect("finished session");
    assert_eq!(gone.status(), 404);
    assert_eq!(error_code(&gone.text().await.expect("body")), "BLOB_UPLOAD_UNKNOWN");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_outside_the_spec_grammar_are_refused_with_name_invalid() {
    let registry = RegistryProcess::start();
    for path in [
        "/v2/UPPER/tags/list",
        "/v2/a/../../etc/manifests/1",
        "/v2/../blobs/uploads/",
        "/v2/a//b/tags/list",
        "/v2/a/_tags/tags/list",
        "/v2/-a/manifests/1",
    ] {
        let method = if path.ends_with("uploads/") { "POST" } else { "GET" };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            registry.address
        );
        let (status, body) = raw_request(&registry.address, &head, b"");
        assert_eq!(status, 400, "{method} {path}: {body}");
        assert_eq!(error_code(&body), "NAME_INVALID", "{method} {path}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_need_their_blobs_and_tags_list_in_pages() {
    let registry = RegistryProcess::start();
    let client = reqwest::Client::new();
    let image = ImageBuilder::new().file("/hello", "hi", 0o644).cmd(["/hello"]).build().expect("build");

    let orphan = client
        .put(registry.url("/v2/pages/manifests/early"))
        .header("content-type", shepherd_registry::OCI_MANIFEST)
        .body(image.manifest.clone())
        .send()
        .await
        .expect("put");
    assert_eq!(orphan.status(), 400);
    let body = orphan.text().await.expect("body");
    assert_eq!(error_code(&body), "MANIFEST_BLOB_UNKNOWN");
    assert!(body.contains(image.config_digest.as_str()), "the error names the missing blob: {body}");
    let unknown = client.get(registry.url("/v2/pages/manifests/early")).send().await.expect("get");
    assert_eq!(unknown.status(), 404);
    assert_eq!(error_code(&unknown.text().await.expect("body")), "MANIFEST_UNKNOWN");

    let wrong_digest = client
        .put(registry.url(&format!("/v2/pages/manifests/{}", digest_of(b"other"))))
        .header("content-type", shepherd_registry::OCI_MANIFEST)
        .body(image.manifest.clone())
        .send()
        .await
        .expect("put by digest");
    assert_eq!(error_code(&wrong_digest.text().await.expect("body")), "DIGEST_INVALID");

    // Refused from its Content-Length alone (a client still sending 5 MiB would see a broken pipe).
    let head = format!(
        "PUT /v2/pages/manifests/huge HTTP/1.1\r\nHost: {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        registry.address,
        shepherd_registry::OCI_MANIFEST,
        5 * 1024 * 1024
    );
    let (status, body) = raw_request(&registry.address, &head, b"");
    assert_eq!(status, 413, "{body}");
    assert_eq!(error_code(&body), "MANIFEST_INVALID");

    for tag in ["e", "a", "d", "b", "c"] {
        image.push(&registry.url(""), "pages", tag).await.expect("push");
    }
    let page = |query: &'static str| {
        let client = client.clone();
        let url = registry.url(&format!("/v2/pages/tags/list{query}"));
        async move {
            let response = client.get(url).send().await.expect("tags");
            let link = response.headers().get("link").map(|l| l.to_str().unwrap_or_default().to_string());
            let body: Value = response.json().await.expect("JSON");
            (body["tags"].clone(), link)
        }
    };
    assert_eq!(page("").await, (serde_json::json!(["a", "b", "c", "d", "e"]), None));
    let (tags, link) = page("?n=2").await;
    assert_eq!(tags, serde_json::json!(["a", "b"]));
    assert_eq!(link.as_deref(), Some("</v2/pages/tags/list?n=2&last=b>; rel=\"next\""));
    assert_eq!(page("?n=2&last=b").await.0, serde_json::json!(["c", "d"]));
    assert_eq!(page("?n=2&last=d").await, (serde_json::json!(["e"]), None));

    let unknown_repository = client.get(registry.url("/v2/nothing/here/tags/list")).send().await.expect("tags");
    assert_eq!(unknown_repository.status(), 404);
    assert_eq!(error_code(&unknown_repository.text().await.expect("body")), "NAME_UNKNOWN");

    // Deleting by digest removes every tag that pointed at the manifest.
    let deleted = client
        .delete(registry.url(&format!("/v2/pages/manifests/{}", image.manifest_digest)))
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 202);
    assert_eq!(page("").await.0, serde_json::json!([]));
    let gone = client.head(registry.url("/v2/pages/manifests/a")).send().await.expect("head");
    assert_eq!(gone.status(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_mounts_from_a_repository_that_has_it_and_only_from_one() {
    let registry = RegistryProcess::start();
    let client = reqwest::Client::new();
    let image = ImageBuilder::new().file("/m", "mounted", 0o644).build().expect("build");
    image.push(&registry.url(""), "source", "1").await.expect("push");
    let layer = &image.layer_digest;

    let mounted = client
        .post(registry.url(&format!("/v2/target/blobs/uploads/?mount={layer}&from=source")))
        .send()
        .await
        .expect("mount");
    assert_eq!(mounted.status(), 201);
    assert_eq!(mounted.headers()["location"], format!("/v2/target/blobs/{layer}").as_str());
    let pulled = client.get(registry.url(&format!("/v2/target/blobs/{layer}"))).send().await.expect("get");
    assert_eq!(pulled.bytes().await.expect("blob").as_ref(), image.layer.as_slice());

    // A repository without the blob cannot lend it: the client gets an upload session instead.
    let not_mounted = client
        .post(registry.url(&format!("/v2/third/blobs/uploads/?mount={layer}&from=elsewhere")))
        .send()
        .await
        .expect("mount");
    assert_eq!(not_mounted.status(), 202);
    assert!(not_mounted.headers()["location"].to_str().expect("location").starts_with("/v2/third/blobs/uploads/"));
    let absent = client.head(registry.url(&format!("/v2/third/blobs/{layer}"))).send().await.expect("head");
    assert_eq!(absent.status(), 404);

    // The catalog pages as the tags list does; "third" holds nothing and is not listed.
    let first = client.get(registry.url("/v2/_catalog?n=1")).send().await.expect("catalog");
    assert_eq!(first.headers()["link"], "</v2/_catalog?n=1&last=source>; rel=\"next\"");
    let first: Value = first.json().await.expect("JSON");
    assert_eq!(first["repositories"], serde_json::json!(["source"]));
    let rest: Value =
        client.get(registry.url("/v2/_catalog?last=source")).send().await.expect("catalog").json().await.expect("JSON");
    assert_eq!(rest["repositories"], serde_json::json!(["target"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_schema2_manifests_and_oci_indexes_keep_their_media_types() {
    let registry = RegistryProcess::start();
    let work = tempfile::tempdir().expect("tempdir");
    let client = reqwest::Client::new();
    let image = ImageBuilder::busybox().expect("busybox-static").build().expect("build");
    let layout = work.path().join("layout");
    image.write_oci_layout(&layout, "1").expect("layout");

    // skopeo converts the image to Docker's schema 2 on the way in.
    let source = format!("oci:{}:1", layout.display());
    let docker = format!("docker://{}/dockerfmt:1", registry.address);
    assert!(succeeded(&skopeo(
        work.path(),
        &["copy", "--format", "v2s2", "--dest-tls-verify=false", &source, &docker]
    )));
    let manifest = client
        .get(registry.url("/v2/dockerfmt/manifests/1"))
        .header("accept", shepherd_registry::DOCKER_MANIFEST)
        .send()
        .await
        .expect("manifest");
    assert_eq!(manifest.headers()["content-type"], shepherd_registry::DOCKER_MANIFEST);
    let config = skopeo(work.path(), &["inspect", "--config", "--tls-verify=false", &docker]);
    assert!(succeeded(&config));
    let config: Value = serde_json::from_slice(&config.stdout).expect("config JSON");
    assert_eq!(config["config"]["Cmd"], serde_json::json!(["sh"]));

    // An index may only list manifests the repository has.
    let index = |digest: &str, size: usize| {
        serde_json::json!({
            "schemaVersion": 2,
            "mediaType": shepherd_registry::OCI_INDEX,
            "manifests": [{"mediaType": shepherd_registry::OCI_MANIFEST, "digest": digest, "size": size,
                "platform": {"architecture": "amd64", "os": "linux"}}],
        })
        .to_string()
    };
    let early = index(image.manifest_digest.as_str(), image.manifest.len());
    let refused = client
        .put(registry.url("/v2/multi/manifests/latest"))
        .header("content-type", shepherd_registry::OCI_INDEX)
        .body(early.clone())
        .send()
        .await
        .expect("put index");
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.expect("error JSON");
    assert_eq!(body["errors"][0]["code"], "MANIFEST_BLOB_UNKNOWN");
    assert_eq!(body["errors"][0]["detail"]["digest"], image.manifest_digest.as_str());

    image.push(&registry.url(""), "multi", "amd64").await.expect("push");
    let stored = client
        .put(registry.url("/v2/multi/manifests/latest"))
        .header("content-type", shepherd_registry::OCI_INDEX)
        .body(early.clone())
        .send()
        .await
        .expect("put index");
    assert_eq!(stored.status(), 201);
    let index_digest = digest_of(early.as_bytes());
    assert_eq!(stored.headers()["docker-content-digest"], index_digest.as_str());

    let target = format!("docker://{}/multi:latest", registry.address);
    let raw = skopeo(work.path(), &["inspect", "--raw", "--tls-verify=false", &target]);
    assert!(succeeded(&raw));
    assert_eq!(String::from_utf8_lossy(&raw.stdout).trim(), early, "the index is served byte for byte");
    let copied = format!("oci:{}:latest", work.path().join("copied").display());
    let arch = ["--override-arch", "amd64", "--override-os", "linux"];
    let mut args = arch.to_vec();
    args.extend(["copy", "--src-tls-verify=false", &target, &copied]);
    assert!(succeeded(&skopeo(work.path(), &args)), "skopeo follows the index to the image");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_killed_mid_push_restarts_with_its_images_and_without_the_half_upload() {
    let data = tempfile::tempdir().expect("tempdir");
    let client = reqwest::Client::new();
    let image = ImageBuilder::busybox().expect("busybox-static").build().expect("build");
    let half = ImageBuilder::new().file("/half", "x".repeat(100_000), 0o644).build().expect("build");
    let location = {
        let registry = RegistryProcess::start_in(data.path());
        image.push(&registry.url(""), "kept", "1").await.expect("push");
        let session = client.post(registry.url("/v2/half/blobs/uploads/")).send().await.expect("start");
        let location = session.headers()["location"].to_str().expect("location").to_string();
        let chunk = client
            .patch(registry.url(&location))
            .body(half.layer[..half.layer.len() / 2].to_vec())
            .send()
            .await
            .expect("chunk");
        assert_eq!(chunk.status(), 202);
        location
        // Dropping the process kills it (SIGKILL) with the upload unfinished.
    };

    let registry = RegistryProcess::start_in(data.path());
    let session = client.get(registry.url(&location)).send().await.expect("status");
    assert_eq!(session.status(), 404, "an upload does not survive a restart");
    let layer = client.head(registry.url(&format!("/v2/half/blobs/{}", half.layer_digest))).send().await.expect("head");
    assert_eq!(layer.status(), 404);
    let leftovers = std::fs::read_dir(data.path().join("uploads")).expect("uploads dir").count();
    assert_eq!(leftovers, 0, "the half upload's bytes are gone");

    let catalog: Value =
        client.get(registry.url("/v2/_catalog")).send().await.expect("catalog").json().await.expect("JSON");
    assert_eq!(catalog["repositories"], serde_json::json!(["kept"]), "the half upload's repository holds nothing");
    let work = tempfile::tempdir().expect("tempdir");
    let source = format!("docker://{}/kept:1", registry.address);
    let destination = format!("oci:{}:1", work.path().join("out").display());
    assert!(succeeded(&skopeo(work.path(), &["copy", "--src-tls-verify=false", &source, &destination])));

    // A download cut short resumes with a range request.
    let tail = client
        .get(registry.url(&format!("/v2/kept/blobs/{}", image.layer_digest)))
        .header("range", "bytes=1000-")
        .send()
        .await
        .expect("range");
    assert_eq!(tail.status(), 206);
    assert_eq!(tail.bytes().await.expect("tail").as_ref(), &image.layer[1000..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_serves_a_registry_beside_the_cluster_when_asked() {
    let data = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("address").port();
    let listen = format!("127.0.0.1:{port}");
    let mut daemon =
        common::Daemon::start("standalone", data.path(), &["--runtime", "simulated", "--registry-listen", &listen]);
    let client = reqwest::Client::new();
    let base = format!("http://{listen}");
    let mut up = false;
    for _ in 0..600 {
        if client.get(format!("{base}/v2/")).send().await.is_ok_and(|r| r.status() == 200) {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the registry answers /v2/ on {listen}");
    let image = ImageBuilder::busybox().expect("busybox-static").build().expect("build");
    image.push(&base, "busybox", "1").await.expect("push");
    let tags: Value =
        client.get(format!("{base}/v2/busybox/tags/list")).send().await.expect("tags").json().await.expect("JSON");
    assert_eq!(tags["tags"], serde_json::json!(["1"]));
    assert!(data.path().join("registry/blobs/sha256").join(image.layer_digest.hex()).is_file());
    assert!(daemon.terminate().success(), "standalone with a registry stops cleanly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_whole_download_of_a_blob_counts_as_one_pull() {
    let registry = RegistryProcess::start();
    let client = reqwest::Client::new();
    let image = ImageBuilder::new().file("/counted", "x", 0o644).build().expect("build");
    image.push(&registry.url(""), "counted", "1").await.expect("push");
    let layer_url = registry.url(&format!("/v2/counted/blobs/{}", image.layer_digest));

    let head = client.head(&layer_url).send().await.expect("head");
    assert_eq!(head.status(), 200);
    let part = client.get(&layer_url).header("range", "bytes=0-9").send().await.expect("range");
    assert_eq!(part.status(), 206);
    let downloads = (0..10).map(|_| {
        let (client, url) = (client.clone(), layer_url.clone());
        async move { client.get(url).send().await.expect("get").bytes().await.expect("body") }
    });
    for body in futures::future::join_all(downloads).await {
        assert_eq!(body.as_ref(), image.layer.as_slice());
    }

    let metrics = client.get(registry.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let line = format!("registry_blob_pulls_total{{repository=\"counted\",digest=\"{}\"}} ", image.layer_digest);
    let count =
        metrics.lines().find_map(|l| l.strip_prefix(&line)).unwrap_or_else(|| panic!("no {line} in\n{metrics}"));
    assert_eq!(count, "10", "ten GETs, not the HEAD or the range request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_image_flag_serves_the_busybox_image_from_the_start() {
    let data = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shepherd"))
        .args(["registry", "--listen", "127.0.0.1:0", "--test-image", "busybox:1", "--test-image", "tools/bb:2"])
        .arg("--data-dir")
        .arg(data.path())
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("run shepherd registry");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("serving line");
    let address = line.trim().rsplit("http://").next().unwrap_or_default().to_string();
    let registry = RegistryProcess { child, address, _data: Some(data) };

    let image = ImageBuilder::busybox().expect("busybox-static").build().expect("build");
    let client = reqwest::Client::new();
    for (repository, tag) in [("busybox", "1"), ("tools/bb", "2")] {
        let manifest =
            client.head(registry.url(&format!("/v2/{repository}/manifests/{tag}"))).send().await.expect("manifest");
        assert_eq!(manifest.status(), 200, "{repository}:{tag} is there once the registry says it serves");
        assert_eq!(
            manifest.headers()["docker-content-digest"],
            image.manifest_digest.as_str(),
            "same image as built here"
        );
    }
}
