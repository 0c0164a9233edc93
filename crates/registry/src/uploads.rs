//! Blob upload sessions: monolithic, chunked (in order, resumable after a cut chunk) and mounted.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use sha2::Digest as _;
use tokio::io::AsyncWriteExt;

use crate::blobs::blob_created;
use crate::error::{ErrorCode, RegistryError, Result};
use crate::name::{Digest, RepositoryName};
use crate::server::{Registry, UPLOAD_UUID_HEADER, digest, repository};

/// An upload session with no request for this long is abandoned: its bytes are deleted when the
/// next upload starts. Clients that crash mid-push never send the DELETE that would free them.
const UPLOAD_IDLE_LIMIT: Duration = Duration::from_secs(3600);

pub(crate) type SharedUpload = Arc<tokio::sync::Mutex<Upload>>;

pub(crate) struct Upload {
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

/// `GET` on a session: how far the upload has come.
pub(crate) async fn upload_status(registry: &Registry, name: &RepositoryName, id: &str) -> Result<Response> {
    let upload = registry.upload(name, id).await?;
    Ok(upload_progress(StatusCode::NO_CONTENT, name, id, upload.size))
}

/// `DELETE` on a session: the client gives up; its bytes are deleted.
pub(crate) async fn cancel_upload(registry: &Registry, name: &RepositoryName, id: &str) -> Result<Response> {
    let mut upload = registry.upload(name, id).await?;
    upload.closed = true;
    registry.forget_upload(id);
    let _ = tokio::fs::remove_file(&upload.path).await;
    Ok(StatusCode::NO_CONTENT.into_response())
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

pub(crate) async fn start_upload(
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

pub(crate) async fn patch_upload(
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
    // The refused chunk's body is left unread, so the connection cannot carry another request:
    // saying so keeps a client from reusing it and seeing its next request cut off.
    response.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    Some(response)
}

pub(crate) async fn finish_upload(
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
