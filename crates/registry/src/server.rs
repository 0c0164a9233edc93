//! The registry's HTTP surface: routing of `/v2/` paths, the access log, pull counters on `/metrics`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};

use crate::blobs::{delete_blob, get_blob};
use crate::error::{ErrorCode, RegistryError, Result};
use crate::manifests::{delete_manifest, get_manifest, page, put_manifest, tags_list};
use crate::name::{Digest, RepositoryName};
use crate::storage::Storage;
use crate::uploads::{SharedUpload, cancel_upload, finish_upload, patch_upload, start_upload, upload_status};

pub(crate) const DIGEST_HEADER: &str = "docker-content-digest";
pub(crate) const UPLOAD_UUID_HEADER: &str = "docker-upload-uuid";

/// A registry over one data directory.
pub struct Registry {
    pub(crate) storage: Storage,
    /// Open upload sessions by id. A session's own lock serialises its chunks: a client sends them
    /// one after the other, and two at once would interleave bytes.
    pub(crate) uploads: Mutex<HashMap<String, (RepositoryName, SharedUpload)>>,
    /// Completed blob GETs per (repository, digest), for `/metrics`.
    pub(crate) blob_pulls: Mutex<BTreeMap<(String, String), u64>>,
    /// Manifest GETs per (repository, reference as asked).
    pub(crate) manifest_pulls: Mutex<BTreeMap<(String, String), u64>>,
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

    pub(crate) fn count_pull(counter: &Mutex<BTreeMap<(String, String), u64>>, repository: &RepositoryName, key: &str) {
        let mut pulls = counter.lock().unwrap_or_else(|e| e.into_inner());
        *pulls.entry((repository.to_string(), key.to_string())).or_default() += 1;
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

pub(crate) fn repository(name: &str) -> Result<RepositoryName> {
    RepositoryName::parse(name).ok_or_else(|| {
        RegistryError::new(
            ErrorCode::NameInvalid,
            format!("invalid repository name {name:?}: components of [a-z0-9] joined by '.', '_', '__' or '-'"),
        )
    })
}

pub(crate) fn digest(value: &str) -> Result<Digest> {
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
            let (repositories, link) = page(registry.storage.repositories()?, &query, "/v2/_catalog")?;
            let mut response = axum::Json(serde_json::json!({ "repositories": repositories })).into_response();
            if let Some(link) = link {
                response.headers_mut().insert(header::LINK, link);
            }
            Ok(response)
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
        (Route::Blob(name, value), &Method::DELETE) => delete_blob(registry, &repository(name)?, &digest(&value)?),
        (Route::StartUpload(name), &Method::POST) => start_upload(registry, repository(name)?, &query, body).await,
        (Route::Upload(name, id), &Method::GET) => upload_status(registry, &repository(name)?, &id).await,
        (Route::Upload(name, id), &Method::PATCH) => {
            patch_upload(registry, &repository(name)?, &id, headers, body).await
        }
        (Route::Upload(name, id), &Method::PUT) => {
            finish_upload(registry, &repository(name)?, &id, &query, headers, body).await
        }
        (Route::Upload(name, id), &Method::DELETE) => cancel_upload(registry, &repository(name)?, &id).await,
        (_, method) => {
            Err(RegistryError::new(ErrorCode::Unsupported, format!("{method} is not supported on {}", uri.path())))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
