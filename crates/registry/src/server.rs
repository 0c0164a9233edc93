//! The OCI distribution API's push and pull endpoints over HTTP, with a pull counter per blob.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use sha2::Digest as _;
use tokio::io::AsyncWriteExt;

use crate::error::{ErrorCode, RegistryError, Result};
use crate::name::{Digest, RepositoryName, valid_tag};
use crate::storage::Storage;

/// An upload session with no request for this long is abandoned: its bytes are deleted when the
/// next upload starts. Clients that crash mid-push never send the DELETE that would free them.
const UPLOAD_IDLE_LIMIT: Duration = Duration::from_secs(3600);

/// Largest manifest accepted, as the reference implementation's default.
const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

const DIGEST_HEADER: &str = "docker-content-digest";
const UPLOAD_UUID_HEADER: &str = "docker-upload-uuid";

/// A registry over one data directory.
pub struct Registry {
    storage: Storage,
    /// Open upload sessions by id. A session's own lock serialises its chunks: a client sends them
    /// one after the other, and two at once would interleave bytes.
    uploads: Mutex<HashMap<String, (RepositoryName, SharedUpload)>>,
    /// Completed blob GETs per (repository, digest), for `/metrics`.
    blob_pulls: Mutex<BTreeMap<(String, String), u64>>,
    /// Manifest GETs per (repository, reference as asked).
    manifest_pulls: Mutex<BTreeMap<(String, String), u64>>,
}

type SharedUpload = Arc<tokio::sync::Mutex<Upload>>;

struct Upload {
    repository: RepositoryName,
    path: PathBuf,
    /// Bytes received so far; always the length of the file at `path`.
    size: u64,
    /// The digest state of those bytes, so finishing an upload needs no second read.
    hasher: sha2::Sha256,
    /// The last request on the session; sessions idle for [`UPLOAD_IDLE_LIMIT`] are dropped.
    touched: Instant,
    /// Finished or cancelled: the bytes are gone, whoever still holds the session must not use it.
    closed: bool,
}

impl Registry {
    /// Opens the registry's data directory, creating it if absent.
    pub fn open(data_dir: &Path) -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            storage: Storage::open(data_dir)?,
            uploads: Mutex::default(),
            blob_pulls: Mutex::default(),
            manifest_pulls: Mutex::default(),
        }))
    }

    /// The HTTP routes: `/v2/...` and `/metrics`.
    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route("/metrics", axum::routing::get(metrics))
            .fallback(dispatch)
            .layer(middleware::from_fn(access_log))
            .with_state(self)
    }

    /// How many times the blob was downloaded (GET, not HEAD) from the repository.
    pub fn blob_pulls(&self, repository: &str, digest: &str) -> u64 {
        let pulls = self.blob_pulls.lock().unwrap_or_else(|e| e.into_inner());
        pulls.get(&(repository.to_string(), digest.to_string())).copied().unwrap_or(0)
    }

    fn count_pull(counter: &Mutex<BTreeMap<(String, String), u64>>, repository: &RepositoryName, key: &str) {
        let mut pulls = counter.lock().unwrap_or_else(|e| e.into_inner());
        *pulls.entry((repository.to_string(), key.to_string())).or_default() += 1;
    }

    /// The open session `id` of `repository`, locked for one request.
    async fn upload(&self, repository: &RepositoryName, id: &str) -> Result<tokio::sync::OwnedMutexGuard<Upload>> {
        let unknown = || {
            RegistryError::new(
                ErrorCode::BlobUploadUnknown,
                format!("no upload {id} in progress for repository {repository}"),
            )
        };
        let upload = {
            let uploads = self.uploads.lock().unwrap_or_else(|e| e.into_inner());
            match uploads.get(id) {
                // The repository is fixed when the session starts; it is not reachable under another name.
                Some((owner, upload)) if owner == repository => upload.clone(),
                _ => return Err(unknown()),
            }
        };
        let mut upload = upload.lock_owned().await;
        // A request that waited for the lock behind the one that finished or cancelled the session.
        if upload.closed {
            return Err(unknown());
        }
        upload.touched = Instant::now();
        Ok(upload)
    }

    /// Drops sessions idle past [`UPLOAD_IDLE_LIMIT`]; a session busy with a request is not idle.
    fn drop_idle_uploads(&self) {
        let mut abandoned = Vec::new();
        self.uploads.lock().unwrap_or_else(|e| e.into_inner()).retain(|_, (_, upload)| match upload.try_lock() {
            Ok(upload) if upload.touched.elapsed() > UPLOAD_IDLE_LIMIT => {
                abandoned.push(upload.path.clone());
                false
            }
            _ => true,
        });
        for path in abandoned {
            let _ = std::fs::remove_file(path);
        }
    }

    fn forget_upload(&self, id: &str) {
        self.uploads.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

/// Serves the registry on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, registry.router()).with_graceful_shutdown(shutdown).await
}

/// Logs every request (the access log) and marks every answer as the registry API version 2.
async fn access_log(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let mut response = next.run(request).await;
    tracing::info!(target: "shepherd_registry::access", %method, %path, status = response.status().as_u16());
    response.headers_mut().insert("docker-distribution-api-version", HeaderValue::from_static("registry/2.0"));
    response
}

async fn metrics(State(registry): State<Arc<Registry>>) -> Response {
    let mut text = String::from(
        "# HELP registry_blob_pulls_total Blob downloads (GET) by repository and digest.\n\
         # TYPE registry_blob_pulls_total counter\n",
    );
    for ((repository, digest), count) in registry.blob_pulls.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        text.push_str(&format!(
            "registry_blob_pulls_total{{repository=\"{repository}\",digest=\"{digest}\"}} {count}\n"
        ));
    }
    text.push_str(
        "# HELP registry_manifest_pulls_total Manifest downloads (GET) by repository and reference.\n\
         # TYPE registry_manifest_pulls_total counter\n",
    );
    for ((repository, reference), count) in registry.manifest_pulls.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        text.push_str(&format!(
            "registry_manifest_pulls_total{{repository=\"{repository}\",reference=\"{reference}\"}} {count}\n"
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// An endpoint of `/v2/`, with the repository name still unchecked.
enum Route<'a> {
    Base,
    Catalog,
    Tags(&'a str),
    Manifest(&'a str, String),
    Blob(&'a str, String),
    StartUpload(&'a str),
    Upload(&'a str, String),
}

/// Splits a `/v2/` path. Names contain slashes, so the endpoint is found from the right: a
/// reference, digest or upload id never contains one.
fn route(path: &str) -> Option<Route<'_>> {
    let rest = path.strip_prefix("/v2")?;
    if rest.is_empty() || rest == "/" {
        return Some(Route::Base);
    }
    let rest = rest.strip_prefix('/')?;
    if rest == "_catalog" {
        return Some(Route::Catalog);
    }
    if let Some(name) = rest.strip_suffix("/tags/list") {
        return Some(Route::Tags(name));
    }
    if let Some(name) = rest.strip_suffix("/blobs/uploads/").or_else(|| rest.strip_suffix("/blobs/uploads")) {
        return Some(Route::StartUpload(name));
    }
    let (head, last) = rest.rsplit_once('/')?;
    let last = percent_decode_colon(last);
    let (name, kind) = head.rsplit_once('/')?;
    match kind {
        "manifests" => Some(Route::Manifest(name, last)),
        "blobs" => Some(Route::Blob(name, last)),
        "uploads" => name.strip_suffix("/blobs").map(|name| Route::Upload(name, last)),
        _ => None,
    }
}

/// Some clients escape the `:` of a digest in the path.
fn percent_decode_colon(segment: &str) -> String {
    segment.replace("%3A", ":").replace("%3a", ":")
}

fn repository(name: &str) -> Result<RepositoryName> {
    RepositoryName::parse(name).ok_or_else(|| {
        RegistryError::new(
            ErrorCode::NameInvalid,
            format!("invalid repository name {name:?}: components of [a-z0-9] joined by '.', '_', '__' or '-'"),
        )
    })
}

fn digest(value: &str) -> Result<Digest> {
    Digest::parse(value).ok_or_else(|| {
        RegistryError::new(
            ErrorCode::DigestInvalid,
            format!("invalid digest {value:?}: expected sha256:<64 hex digits>"),
        )
    })
}

fn query(uri: &Uri) -> HashMap<String, String> {
    axum::extract::Query::<HashMap<String, String>>::try_from_uri(uri).map(|q| q.0).unwrap_or_default()
}

async fn dispatch(
    State(registry): State<Arc<Registry>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    match handle(&registry, &method, &uri, &headers, body).await {
        Ok(response) => response,
        Err(error) => {
            if let RegistryError::Client { code, message, .. } = &error {
                tracing::debug!(%method, path = uri.path(), code = code.as_str(), %message, "registry request refused");
            }
            error.into_response()
        }
    }
}

async fn handle(registry: &Registry, method: &Method, uri: &Uri, headers: &HeaderMap, body: Body) -> Result<Response> {
    let Some(route) = route(uri.path()) else {
        return Err(RegistryError::with_status(
            ErrorCode::Unsupported,
            StatusCode::NOT_FOUND,
            format!("no registry endpoint at {}", uri.path()),
        ));
    };
    let query = query(uri);
    match (route, method) {
        (Route::Base, &Method::GET | &Method::HEAD) => {
            Ok(([(header::CONTENT_TYPE, "application/json")], "{}").into_response())
        }
        (Route::Catalog, &Method::GET) => {
            let repositories = registry.storage.repositories()?;
            Ok(axum::Json(serde_json::json!({ "repositories": repositories })).into_response())
        }
        (Route::Tags(name), &Method::GET) => tags_list(registry, &repository(name)?, &query),
        (Route::Manifest(name, reference), &Method::GET) => {
            get_manifest(registry, &repository(name)?, &reference, true)
        }
        (Route::Manifest(name, reference), &Method::HEAD) => {
            get_manifest(registry, &repository(name)?, &reference, false)
        }
        (Route::Manifest(name, reference), &Method::PUT) => {
            put_manifest(registry, &repository(name)?, &reference, headers, body).await
        }
        (Route::Manifest(name, reference), &Method::DELETE) => {
            delete_manifest(registry, &repository(name)?, &reference)
        }
        (Route::Blob(name, value), &Method::GET) => {
            get_blob(registry, &repository(name)?, &digest(&value)?, headers, true).await
        }
        (Route::Blob(name, value), &Method::HEAD) => {
            get_blob(registry, &repository(name)?, &digest(&value)?, headers, false).await
        }
        (Route::Blob(name, value), &Method::DELETE) => {
            let (name, digest) = (repository(name)?, digest(&value)?);
            if registry.storage.unlink_blob(&name, &digest)? {
                Ok(StatusCode::ACCEPTED.into_response())
            } else {
                Err(blob_unknown(&name, &digest))
            }
        }
        (Route::StartUpload(name), &Method::POST) => start_upload(registry, repository(name)?, &query, body).await,
        (Route::Upload(name, id), &Method::GET) => {
            let name = repository(name)?;
            let upload = registry.upload(&name, &id).await?;
            Ok(upload_progress(StatusCode::NO_CONTENT, &name, &id, upload.size))
        }
        (Route::Upload(name, id), &Method::PATCH) => {
            patch_upload(registry, &repository(name)?, &id, headers, body).await
        }
        (Route::Upload(name, id), &Method::PUT) => {
            finish_upload(registry, &repository(name)?, &id, &query, headers, body).await
        }
        (Route::Upload(name, id), &Method::DELETE) => {
            let name = repository(name)?;
            let mut upload = registry.upload(&name, &id).await?;
            upload.closed = true;
            registry.forget_upload(&id);
            let _ = tokio::fs::remove_file(&upload.path).await;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        (_, method) => {
            Err(RegistryError::new(ErrorCode::Unsupported, format!("{method} is not supported on {}", uri.path())))
        }
    }
}

fn blob_unknown(name: &RepositoryName, digest: &Digest) -> RegistryError {
    RegistryError::new(ErrorCode::BlobUnknown, format!("blob {digest} is not in repository {name}"))
        .about_digest(digest.as_str())
}

fn tags_list(registry: &Registry, name: &RepositoryName, query: &HashMap<String, String>) -> Result<Response> {
    let Some(mut tags) = registry.storage.tags(name)? else {
        return Err(RegistryError::new(ErrorCode::NameUnknown, format!("repository {name} is not known")));
    };
    if let Some(last) = query.get("last") {
        tags.retain(|tag| tag.as_str() > last.as_str());
    }
    let limit = match query.get("n") {
        Some(n) => Some(n.parse::<usize>().map_err(|_| {
            RegistryError::with_status(
                ErrorCode::Unsupported,
                StatusCode::BAD_REQUEST,
                format!("n={n:?} is not a number of tags"),
            )
        })?),
        None => None,
    };
    let mut response_headers = HeaderMap::new();
    if let Some(limit) = limit
        && tags.len() > limit
    {
        tags.truncate(limit);
        if let Some(last) = tags.last() {
            let link = format!("</v2/{name}/tags/list?n={limit}&last={last}>; rel=\"next\"");
            if let Ok(value) = HeaderValue::from_str(&link) {
                response_headers.insert(header::LINK, value);
            }
        }
    }
    let body = serde_json::json!({ "name": name.as_str(), "tags": tags });
    Ok((response_headers, axum::Json(body)).into_response())
}

/// A manifest reference: a digest, or a tag resolved to one.
fn resolve(registry: &Registry, name: &RepositoryName, reference: &str) -> Result<Digest> {
    if reference.contains(':') {
        return digest(reference);
    }
    if !valid_tag(reference) {
        return Err(RegistryError::new(ErrorCode::ManifestUnknown, invalid_tag(reference)));
    }
    registry.storage.resolve_tag(name, reference)?.ok_or_else(|| manifest_unknown(name, reference))
}

fn invalid_tag(reference: &str) -> String {
    format!("invalid tag {reference:?}: a tag matches [a-zA-Z0-9_][a-zA-Z0-9._-]{{0,127}}")
}

fn manifest_too_large() -> RegistryError {
    RegistryError::with_status(
        ErrorCode::ManifestInvalid,
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("manifest over {MAX_MANIFEST_BYTES} bytes (or its body ended early)"),
    )
}

fn manifest_unknown(name: &RepositoryName, reference: &str) -> RegistryError {
    RegistryError::new(ErrorCode::ManifestUnknown, format!("manifest {name}:{reference} is not known"))
}

fn get_manifest(registry: &Registry, name: &RepositoryName, reference: &str, with_body: bool) -> Result<Response> {
    let digest = resolve(registry, name, reference)?;
    let Some((media_type, bytes)) = registry.storage.manifest(name, &digest)? else {
        return Err(manifest_unknown(name, reference));
    };
    if with_body {
        Registry::count_pull(&registry.manifest_pulls, name, reference);
    }
    let headers = [
        (header::CONTENT_TYPE, media_type),
        (header::CONTENT_LENGTH, bytes.len().to_string()),
        (header::HeaderName::from_static(DIGEST_HEADER), digest.to_string()),
        (header::ETAG, format!("\"{digest}\"")),
    ];
    let body = if with_body { Body::from(bytes) } else { Body::empty() };
    Ok((headers, body).into_response())
}

/// The parts of a manifest or index that name other content.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManifestReferences {
    media_type: Option<String>,
    config: Option<Reference>,
    #[serde(default)]
    layers: Vec<Reference>,
    #[serde(default)]
    manifests: Vec<Reference>,
}

#[derive(Deserialize)]
struct Reference {
    digest: String,
}

async fn put_manifest(
    registry: &Registry,
    name: &RepositoryName,
    reference: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response> {
    let tag = if reference.contains(':') {
        None
    } else if valid_tag(reference) {
        Some(reference)
    } else {
        return Err(RegistryError::new(ErrorCode::ManifestInvalid, invalid_tag(reference)));
    };
    if let Some(length) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        && length > MAX_MANIFEST_BYTES
    {
        return Err(manifest_too_large());
    }
    let bytes = axum::body::to_bytes(body, MAX_MANIFEST_BYTES).await.map_err(|_| manifest_too_large())?;
    let actual = Digest::of(&bytes);
    if tag.is_none() && digest(reference)? != actual {
        return Err(RegistryError::new(
            ErrorCode::DigestInvalid,
            format!("manifest has digest {actual}, not {reference}"),
        ));
    }
    let parsed: ManifestReferences = serde_json::from_slice(&bytes)
        .map_err(|e| RegistryError::new(ErrorCode::ManifestInvalid, format!("manifest is not valid JSON: {e}")))?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or(v).trim().to_string());
    let media_type = match (content_type, parsed.media_type.as_deref()) {
        (Some(header), Some(field)) if header != field => {
            return Err(RegistryError::new(
                ErrorCode::ManifestInvalid,
                format!("Content-Type {header} differs from the manifest's mediaType {field}"),
            ));
        }
        (Some(header), _) => header,
        (None, Some(field)) => field.to_string(),
        (None, None) => {
            return Err(RegistryError::new(
                ErrorCode::ManifestInvalid,
                "manifest has no Content-Type and no mediaType",
            ));
        }
    };
    match media_type.as_str() {
        OCI_MANIFEST | DOCKER_MANIFEST => {
            let config = parsed
                .config
                .as_ref()
                .ok_or_else(|| RegistryError::new(ErrorCode::ManifestInvalid, "image manifest has no config"))?;
            for (what, reference) in
                std::iter::once(("config", config)).chain(parsed.layers.iter().map(|l| ("layer", l)))
            {
                let blob = digest(&reference.digest)?;
                if registry.storage.blob_in_repository(name, &blob).is_none() {
                    return Err(RegistryError::new(
                        ErrorCode::ManifestBlobUnknown,
                        format!("{what} blob {blob} is not in repository {name}; push it before the manifest"),
                    )
                    .about_digest(blob.as_str()));
                }
            }
        }
        OCI_INDEX | DOCKER_MANIFEST_LIST => {
            for reference in &parsed.manifests {
                let manifest = digest(&reference.digest)?;
                if !registry.storage.has_manifest(name, &manifest) {
                    return Err(RegistryError::new(
                        ErrorCode::ManifestBlobUnknown,
                        format!("manifest {manifest} listed in the index is not in repository {name}"),
                    )
                    .about_digest(manifest.as_str()));
                }
            }
        }
        other => {
            return Err(RegistryError::new(
                ErrorCode::ManifestInvalid,
                format!(
                    "unsupported manifest media type {other:?}; expected {OCI_MANIFEST}, {OCI_INDEX}, {DOCKER_MANIFEST} or {DOCKER_MANIFEST_LIST}"
                ),
            ));
        }
    }
    registry.storage.put_manifest(name, &actual, &media_type, &bytes, tag)?;
    let headers = [
        (header::LOCATION, format!("/v2/{name}/manifests/{actual}")),
        (header::HeaderName::from_static(DIGEST_HEADER), actual.to_string()),
    ];
    Ok((StatusCode::CREATED, headers).into_response())
}

fn delete_manifest(registry: &Registry, name: &RepositoryName, reference: &str) -> Result<Response> {
    let deleted = if reference.contains(':') {
        registry.storage.delete_manifest(name, &digest(reference)?)?
    } else if valid_tag(reference) {
        registry.storage.delete_tag(name, reference)?
    } else {
        return Err(RegistryError::new(ErrorCode::ManifestUnknown, invalid_tag(reference)));
    };
    if deleted { Ok(StatusCode::ACCEPTED.into_response()) } else { Err(manifest_unknown(name, reference)) }
}

async fn get_blob(
    registry: &Registry,
    name: &RepositoryName,
    digest: &Digest,
    headers: &HeaderMap,
    with_body: bool,
) -> Result<Response> {
    let Some((path, size)) = registry.storage.blob_in_repository(name, digest) else {
        return Err(blob_unknown(name, digest));
    };
    let mut response_headers = HeaderMap::new();
    response_headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    response_headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    for (key, value) in
        [(header::HeaderName::from_static(DIGEST_HEADER), digest.to_string()), (header::ETAG, format!("\"{digest}\""))]
    {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response_headers.insert(key, value);
        }
    }
    let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        None => None,
        Some(range) => match byte_range(range, size) {
            Some(range) => Some(range),
            None => {
                let mut refused = StatusCode::RANGE_NOT_SATISFIABLE.into_response();
                if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    refused.headers_mut().insert(header::CONTENT_RANGE, value);
                }
                return Ok(refused);
            }
        },
    };
    let (status, start, length) = match range {
        Some((start, end)) => {
            if let Ok(value) = HeaderValue::from_str(&format!("bytes {start}-{end}/{size}")) {
                response_headers.insert(header::CONTENT_RANGE, value);
            }
            (StatusCode::PARTIAL_CONTENT, start, end - start + 1)
        }
        None => (StatusCode::OK, 0, size),
    };
    response_headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    if !with_body {
        return Ok((status, response_headers, Body::empty()).into_response());
    }
    let mut file = tokio::fs::File::open(&path).await?;
    if start > 0 {
        tokio::io::AsyncSeekExt::seek(&mut file, std::io::SeekFrom::Start(start)).await?;
    }
    if status == StatusCode::OK {
        // Only whole downloads count as pulls; a resumed one is the same pull continued.
        Registry::count_pull(&registry.blob_pulls, name, digest.as_str());
    }
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(tokio::io::AsyncReadExt::take(file, length)));
    Ok((status, response_headers, body).into_response())
}

/// One `bytes=START-END`, `bytes=START-` or `bytes=-SUFFIX` range within a blob of `size` bytes,
/// as inclusive offsets; `None` when it is malformed, asks for several ranges or lies outside.
fn byte_range(range: &str, size: u64) -> Option<(u64, u64)> {
    let (first, last) = range.strip_prefix("bytes=")?.trim().split_once('-')?;
    let (start, end) = match (first.trim(), last.trim()) {
        ("", suffix) => {
            let suffix: u64 = suffix.parse().ok()?;
            (size.checked_sub(suffix.min(size))?, size.checked_sub(1)?)
        }
        (start, "") => (start.parse().ok()?, size.checked_sub(1)?),
        (start, end) => (start.parse().ok()?, end.parse::<u64>().ok()?.min(size.checked_sub(1)?)),
    };
    (start <= end && end < size).then_some((start, end))
}

/// The response to an upload step: where to send the next chunk and how much has arrived.
fn upload_progress(status: StatusCode, name: &RepositoryName, id: &str, size: u64) -> Response {
    // `Range` is inclusive; an empty upload reports `0-0` as the reference implementation does.
    let range = format!("0-{}", size.saturating_sub(1));
    let headers = [
        (header::LOCATION, format!("/v2/{name}/blobs/uploads/{id}")),
        (header::RANGE, range),
        (header::HeaderName::from_static(UPLOAD_UUID_HEADER), id.to_string()),
        (header::CONTENT_LENGTH, "0".to_string()),
    ];
    (status, headers).into_response()
}

fn blob_created(name: &RepositoryName, digest: &Digest) -> Response {
    let headers = [
        (header::LOCATION, format!("/v2/{name}/blobs/{digest}")),
        (header::HeaderName::from_static(DIGEST_HEADER), digest.to_string()),
    ];
    (StatusCode::CREATED, headers).into_response()
}

async fn start_upload(
    registry: &Registry,
    name: RepositoryName,
    query: &HashMap<String, String>,
    body: Body,
) -> Result<Response> {
    if let Some(mount) = query.get("mount") {
        let blob = digest(mount)?;
        if let Some(from) = query.get("from") {
            let from = repository(from)?;
            if registry.storage.blob_in_repository(&from, &blob).is_some() {
                registry.storage.link_blob(&name, &blob)?;
                return Ok(blob_created(&name, &blob));
            }
        }
        // Not mountable: the spec asks for an ordinary upload session instead.
    }
    registry.drop_idle_uploads();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let path = registry.storage.upload_path(&id);
    tokio::fs::File::create(&path).await?;
    let mut upload = Upload {
        repository: name.clone(),
        path,
        size: 0,
        hasher: sha2::Sha256::new(),
        touched: Instant::now(),
        closed: false,
    };
    if let Some(expected) = query.get("digest") {
        // A monolithic upload: the whole blob is this request's body.
        let result = async {
            let expected = digest(expected)?;
            append(&mut upload, body).await?;
            complete(registry, &mut upload, &expected).await?;
            Ok(blob_created(&name, &expected))
        }
        .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&upload.path).await;
        }
        return result;
    }
    registry
        .uploads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(id.clone(), (name.clone(), Arc::new(tokio::sync::Mutex::new(upload))));
    Ok(upload_progress(StatusCode::ACCEPTED, &name, &id, 0))
}

/// Appends a request body to an upload. A body cut short (the client went away) is taken back
/// out, so the session stays at its last complete chunk and can be resumed or finished cleanly.
async fn append(upload: &mut Upload, body: Body) -> Result<()> {
    let mut file = tokio::fs::OpenOptions::new().append(true).open(&upload.path).await?;
    let (size_before, hasher_before) = (upload.size, upload.hasher.clone());
    let mut stream = body.into_data_stream();
    let mut failure = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                if let Err(e) = file.write_all(&chunk).await {
                    failure = Some(RegistryError::from(e));
                    break;
                }
                upload.hasher.update(&chunk);
                upload.size += chunk.len() as u64;
            }
            Err(e) => {
                failure = Some(RegistryError::new(
                    ErrorCode::BlobUploadInvalid,
                    format!("upload body ended early after {} bytes: {e}", upload.size - size_before),
                ));
                break;
            }
        }
    }
    if failure.is_none()
        && let Err(e) = file.flush().await
    {
        failure = Some(e.into());
    }
    match failure {
        None => Ok(()),
        Some(error) => {
            file.set_len(size_before).await?;
            upload.size = size_before;
            upload.hasher = hasher_before;
            Err(error)
        }
    }
}

/// Checks the received bytes against the digest the client named, then publishes the blob.
async fn complete(registry: &Registry, upload: &mut Upload, expected: &Digest) -> Result<()> {
    let actual = Digest::from_hasher(upload.hasher.clone());
    if &actual != expected {
        return Err(RegistryError::new(
            ErrorCode::DigestInvalid,
            format!("uploaded content has digest {actual}, not {expected}; nothing was stored"),
        )
        .about_digest(expected.as_str()));
    }
    tokio::fs::File::open(&upload.path).await?.sync_all().await?;
    registry.storage.commit_upload(&upload.path, &upload.repository, expected)?;
    Ok(())
}

async fn patch_upload(
    registry: &Registry,
    name: &RepositoryName,
    id: &str,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response> {
    let mut upload = registry.upload(name, id).await?;
    if let Some(refused) = out_of_order(headers, name, id, upload.size) {
        return Ok(refused);
    }
    append(&mut upload, body).await?;
    Ok(upload_progress(StatusCode::ACCEPTED, name, id, upload.size))
}

/// A 416 answer, with the upload's true progress, to a chunk whose `Content-Range` (`<start>-<end>`)
/// does not start where the upload ends.
fn out_of_order(headers: &HeaderMap, name: &RepositoryName, id: &str, size: u64) -> Option<Response> {
    let range = headers.get(header::CONTENT_RANGE)?;
    let text = range.to_str().unwrap_or_default();
    let start = text.trim_start_matches("bytes ").trim_start_matches("bytes=").split_once('-').map(|(start, _)| start);
    if start.and_then(|s| s.trim().parse::<u64>().ok()) == Some(size) {
        return None;
    }
    let mut response = RegistryError::with_status(
        ErrorCode::BlobUploadInvalid,
        StatusCode::RANGE_NOT_SATISFIABLE,
        format!("chunk {text:?} does not start at the upload's end, byte {size}"),
    )
    .into_response();
    let progress = upload_progress(StatusCode::RANGE_NOT_SATISFIABLE, name, id, size);
    for key in [header::LOCATION, header::RANGE, header::HeaderName::from_static(UPLOAD_UUID_HEADER)] {
        if let Some(value) = progress.headers().get(&key) {
            response.headers_mut().insert(key, value.clone());
        }
    }
    Some(response)
}

async fn finish_upload(
    registry: &Registry,
    name: &RepositoryName,
    id: &str,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response> {
    let mut upload = registry.upload(name, id).await?;
    let expected = digest(query.get("digest").map(String::as_str).unwrap_or(""))?;
    if let Some(refused) = out_of_order(headers, name, id, upload.size) {
        return Ok(refused);
    }
    append(&mut upload, body).await?;
    let result = complete(registry, &mut upload, &expected).await;
    // Finished either way: a digest mismatch ends the session as in the reference implementation.
    upload.closed = true;
    registry.forget_upload(id);
    if result.is_err() {
        let _ = tokio::fs::remove_file(&upload.path).await;
    }
    result.map(|()| blob_created(name, &expected))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_ranges_are_clamped_to_the_blob_and_refused_outside_it() {
        assert_eq!(byte_range("bytes=0-9", 100), Some((0, 9)));
        assert_eq!(byte_range("bytes=90-", 100), Some((90, 99)));
        assert_eq!(byte_range("bytes=-10", 100), Some((90, 99)));
        assert_eq!(byte_range("bytes=50-1000", 100), Some((50, 99)));
        assert_eq!(byte_range("bytes=100-", 100), None);
        assert_eq!(byte_range("bytes=5-1", 100), None);
        assert_eq!(byte_range("bytes=0-1,5-6", 100), None);
        assert_eq!(byte_range("items=0-1", 100), None);
        assert_eq!(byte_range("bytes=0-", 0), None);
    }

    #[test]
    fn paths_are_split_from_the_right_so_names_may_contain_endpoint_words() {
        assert!(matches!(route("/v2/"), Some(Route::Base)));
        assert!(matches!(route("/v2/a/manifests/tags/list"), Some(Route::Tags("a/manifests"))));
        assert!(matches!(route("/v2/a/b/manifests/1"), Some(Route::Manifest("a/b", r)) if r == "1"));
        assert!(matches!(route("/v2/blobs/blobs/x"), Some(Route::Blob("blobs", r)) if r == "x"));
        assert!(matches!(route("/v2/a/blobs/uploads/"), Some(Route::StartUpload("a"))));
        assert!(matches!(route("/v2/a/blobs/uploads/123"), Some(Route::Upload("a", r)) if r == "123"));
        assert!(matches!(route("/v2/a/manifests/sha256%3Aab"), Some(Route::Manifest("a", r)) if r == "sha256:ab"));
        assert!(route("/v2/a/other/x").is_none());
        assert!(route("/v3/").is_none());
    }
}
