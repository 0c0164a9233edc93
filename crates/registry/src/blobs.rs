//! Blob downloads: whole, or one byte range for a resumed download.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::error::{ErrorCode, RegistryError, Result};
use crate::name::{Digest, RepositoryName};
use crate::server::{DIGEST_HEADER, Registry};

fn blob_unknown(name: &RepositoryName, digest: &Digest) -> RegistryError {
    RegistryError::new(ErrorCode::BlobUnknown, format!("blob {digest} is not in repository {name}"))
        .about_digest(digest.as_str())
}

/// `DELETE`: the repository no longer has the blob; the bytes stay while another repository does.
pub(crate) fn delete_blob(registry: &Registry, name: &RepositoryName, digest: &Digest) -> Result<Response> {
    if registry.storage.unlink_blob(name, digest)? {
        Ok(StatusCode::ACCEPTED.into_response())
    } else {
        Err(blob_unknown(name, digest))
    }
}

pub(crate) async fn get_blob(
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

pub(crate) fn blob_created(name: &RepositoryName, digest: &Digest) -> Response {
    let headers = [
        (header::LOCATION, format!("/v2/{name}/blobs/{digest}")),
        (header::HeaderName::from_static(DIGEST_HEADER), digest.to_string()),
    ];
    (StatusCode::CREATED, headers).into_response()
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
}
