//! Manifests and indexes by tag or digest, and the tags list.

use std::collections::HashMap;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::error::{ErrorCode, RegistryError, Result};
use crate::name::{Digest, RepositoryName, valid_tag};
use crate::server::{DIGEST_HEADER, Registry, digest};

/// Largest manifest accepted, as the reference implementation's default.
const MAX_MANIFEST_BYTES: usize = 4 * 1024 * 1024;

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// One page of a sorted list, as `n` and `last` ask (`last` excluded), and the `Link` header to the
/// next page when the list goes on past it. `n=0` is an empty page with no link, as the spec says.
pub(crate) fn page(
    mut items: Vec<String>,
    query: &HashMap<String, String>,
    path: &str,
) -> Result<(Vec<String>, Option<HeaderValue>)> {
    if let Some(last) = query.get("last") {
        items.retain(|item| item.as_str() > last.as_str());
    }
    let Some(n) = query.get("n") else { return Ok((items, None)) };
    let limit = n.parse::<usize>().map_err(|_| {
        RegistryError::with_status(ErrorCode::Unsupported, StatusCode::BAD_REQUEST, format!("n={n:?} is not a count"))
    })?;
    if items.len() <= limit {
        return Ok((items, None));
    }
    items.truncate(limit);
    let link = items
        .last()
        .and_then(|last| HeaderValue::from_str(&format!("<{path}?n={limit}&last={last}>; rel=\"next\"")).ok());
    Ok((items, link))
}

pub(crate) fn tags_list(
    registry: &Registry,
    name: &RepositoryName,
    query: &HashMap<String, String>,
) -> Result<Response> {
    let Some(tags) = registry.storage.tags(name)? else {
        return Err(RegistryError::new(ErrorCode::NameUnknown, format!("repository {name} is not known")));
    };
    let (tags, link) = page(tags, query, &format!("/v2/{name}/tags/list"))?;
    let mut response_headers = HeaderMap::new();
    if let Some(link) = link {
        response_headers.insert(header::LINK, link);
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

pub(crate) fn get_manifest(
    registry: &Registry,
    name: &RepositoryName,
    reference: &str,
    with_body: bool,
) -> Result<Response> {
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

pub(crate) async fn put_manifest(
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

pub(crate) fn delete_manifest(registry: &Registry, name: &RepositoryName, reference: &str) -> Result<Response> {
    let deleted = if reference.contains(':') {
        registry.storage.delete_manifest(name, &digest(reference)?)?
    } else if valid_tag(reference) {
        registry.storage.delete_tag(name, reference)?
    } else {
        return Err(RegistryError::new(ErrorCode::ManifestUnknown, invalid_tag(reference)));
    };
    if deleted { Ok(StatusCode::ACCEPTED.into_response()) } else { Err(manifest_unknown(name, reference)) }
}
