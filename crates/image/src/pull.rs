//! Pulls from OCI distribution registries into the store, one pull per image at a time.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, Once};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use oci_client::Client;
use oci_client::client::{ClientConfig, ClientProtocol, linux_amd64_resolver};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::policy::{PullDecision, PullPolicy};
use crate::reference::ImageRef;
use crate::singleflight::SingleFlight;
use crate::store::{ImageRecord, ImageStore, LayerRecord, now_ms};

/// Registry credentials for one pull (from an `imagePullSecrets` docker config, later).
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// Anonymous access; registries that want a bearer token (Docker Hub) hand out an anonymous one.
    #[default]
    Anonymous,
    Basic {
        username: String,
        password: String,
    },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { username, .. } => write!(f, "Basic({username}, ***)"),
        }
    }
}

/// What `Puller::ensure` did, for kubelet's `Pulled` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ensured {
    AlreadyPresent(ImageRecord),
    Pulled {
        image: ImageRecord,
        duration: std::time::Duration,
    },
}

impl Ensured {
    pub fn image(&self) -> &ImageRecord {
        match self {
            Ensured::AlreadyPresent(image) | Ensured::Pulled { image, .. } => image,
        }
    }
}

pub struct Puller {
    store: Arc<ImageStore>,
    insecure_registries: Vec<String>,
    /// One client per (registry, protocol): each keeps the bearer tokens of its registry.
    clients: Mutex<HashMap<String, Client>>,
    flights: SingleFlight<String, ImageRecord>,
}

impl Puller {
    /// `insecure_registries` (`HOST:PORT`, as written in references) are pulled over plain `http`,
    /// as loopback registries always are.
    pub fn new(store: Arc<ImageStore>, insecure_registries: Vec<String>) -> Self {
        install_crypto_provider();
        Puller {
            store,
            insecure_registries,
            clients: Mutex::new(HashMap::new()),
            flights: SingleFlight::new(),
        }
    }

    pub fn store(&self) -> &Arc<ImageStore> {
        &self.store
    }

    /// Makes the image available by its pull policy: pulls when the policy says so, else uses the
    /// stored image. Marks the image used either way.
    pub async fn ensure(&self, image: &ImageRef, policy: PullPolicy, credentials: &Credentials) -> Result<Ensured> {
        // A record whose layers were removed from under it (by hand, or a crash mid-GC) is not present.
        let present = self
            .store
            .image(&image.to_string())?
            .filter(|record| self.store.is_complete(record));
        let ensured = match (policy.decide(image, present.is_some())?, present) {
            (PullDecision::UsePresent, Some(record)) => Ensured::AlreadyPresent(record),
            _ => {
                let started = Instant::now();
                let record = self.pull(image, credentials).await?;
                Ensured::Pulled {
                    image: record,
                    duration: started.elapsed(),
                }
            }
        };
        self.store.touch(&ensured.image().reference)?;
        Ok(ensured)
    }

    /// Pulls an image: its manifest (for an index, the linux/amd64 one), config and the layers the
    /// store lacks, each verified, then unpacks the layers. Concurrent pulls of one reference share
    /// one pull and its result.
    pub async fn pull(&self, image: &ImageRef, credentials: &Credentials) -> Result<ImageRecord> {
        let client = self.client_for(image);
        let store = Arc::clone(&self.store);
        let (image, credentials) = (image.clone(), credentials.clone());
        self.flights
            .run(image.to_string(), move || pull_image(client, store, image, credentials))
            .await
    }

    fn client_for(&self, image: &ImageRef) -> Client {
        let plain = image.uses_plain_http(&self.insecure_registries);
        let key = format!("{}|{}", if plain { "http" } else { "https" }, image.registry());
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .entry(key)
            .or_insert_with(|| {
                Client::new(ClientConfig {
                    protocol: if plain {
                        ClientProtocol::Http
                    } else {
                        ClientProtocol::Https
                    },
                    // The host's platform; other architectures' images could not run here anyway.
                    platform_resolver: Some(Box::new(linux_amd64_resolver)),
                    ..Default::default()
                })
            })
            .clone()
    }
}

async fn pull_image(
    client: Client,
    store: Arc<ImageStore>,
    image: ImageRef,
    credentials: Credentials,
) -> Result<ImageRecord> {
    let reference = image.to_string();
    let auth = match &credentials {
        Credentials::Anonymous => RegistryAuth::Anonymous,
        Credentials::Basic { username, password } => RegistryAuth::Basic(username.clone(), password.clone()),
    };
    tracing::info!(image = %reference, "pulling image");
    let (manifest, manifest_digest, config) = client
        .pull_manifest_and_config(image.oci(), &auth)
        .await
        .map_err(|e| registry_error(&reference, e))?;
    let manifest_digest = Digest::parse(&manifest_digest)?;
    let config_digest = Digest::parse(&manifest.config.digest)?;
    let diff_ids = diff_ids(&reference, config.as_bytes())?;
    if diff_ids.len() != manifest.layers.len() {
        return Err(ImageError::Unsupported {
            reference,
            reason: format!(
                "the manifest has {} layers but the config {} diff ids",
                manifest.layers.len(),
                diff_ids.len()
            ),
        });
    }
    let mut layers = Vec::with_capacity(diff_ids.len());
    for (descriptor, diff_id) in manifest.layers.iter().zip(diff_ids) {
        check_layer_media_type(&reference, descriptor)?;
        let size = u64::try_from(descriptor.size).unwrap_or(0);
        layers.push(LayerRecord {
            digest: Digest::parse(&descriptor.digest)?,
            diff_id,
            size,
        });
    }
    let _pin = store.pin(
        [config_digest.clone()]
            .into_iter()
            .chain(layers.iter().flat_map(|l| [l.digest.clone(), l.diff_id.clone()])),
    );

    let config_size = store.write_blob(&config_digest, config.as_bytes())?;
    // Layers download and unpack a few at a time, as containerd does; each is fetched only if
    // neither its blob nor its unpacked form is stored yet.
    let work: Vec<_> = layers.iter().cloned().zip(manifest.layers.iter().cloned()).collect();
    futures::stream::iter(work)
        .map(|(layer, descriptor)| {
            let (client, store, image) = (client.clone(), Arc::clone(&store), image.clone());
            async move {
                if !store.has_blob(&layer.digest) && !store.layer_path(&layer.diff_id).is_dir() {
                    fetch_blob(&client, &store, &image, &descriptor, &layer.digest).await?;
                }
                tokio::task::spawn_blocking(move || store.ensure_layer(&layer))
                    .await
                    .map_err(|e| ImageError::Internal(format!("unpacking task failed: {e}")))?
            }
        })
        .buffer_unordered(3)
        .try_collect::<Vec<_>>()
        .await?;
    let record = ImageRecord {
        size: config_size + layers.iter().map(|l| l.size).sum::<u64>(),
        reference: reference.clone(),
        manifest_digest,
        config_digest,
        layers,
        last_used_ms: now_ms(),
    };
    store.put_image(&record)?;
    tracing::info!(image = %reference, size = record.size, "pulled image");
    Ok(record)
}

/// Streams a blob into the store: the network side stays async, the hashing file writer runs on
/// the blocking pool.
async fn fetch_blob(
    client: &Client,
    store: &Arc<ImageStore>,
    image: &ImageRef,
    descriptor: &OciDescriptor,
    digest: &Digest,
) -> Result<()> {
    let reference = image.to_string();
    let mut stream = client
        .pull_blob_stream(image.oci(), descriptor)
        .await
        .map_err(|e| registry_error(&reference, e))?;
    let mut writer = store.blob_writer(digest)?;
    let (chunks, mut received) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
    let blob = digest.to_string();
    let writing = tokio::task::spawn_blocking(move || -> Result<u64> {
        while let Some(chunk) = received.blocking_recv() {
            writer
                .write_all(&chunk)
                .map_err(|e| ImageError::io("writing blob", &blob, e))?;
        }
        writer.commit()
    });
    let mut failure = None;
    while let Some(chunk) = stream.stream.next().await {
        match chunk {
            Ok(chunk) => {
                if chunks.send(chunk).await.is_err() {
                    break; // the writer failed; its error is the one to report
                }
            }
            Err(e) => {
                failure = Some(ImageError::Registry {
                    reference: reference.clone(),
                    detail: format!("reading blob {digest}: {e}"),
                });
                break;
            }
        }
    }
    drop(chunks);
    let written = writing
        .await
        .map_err(|e| ImageError::Internal(format!("blob writer failed: {e}")))?;
    match failure {
        Some(e) => Err(e),
        None => written.map(|_| ()),
    }
}

pub(crate) fn diff_ids(reference: &str, config: &[u8]) -> Result<Vec<Digest>> {
    #[derive(serde::Deserialize)]
    struct Config {
        rootfs: RootFs,
    }
    #[derive(serde::Deserialize)]
    struct RootFs {
        diff_ids: Vec<String>,
    }
    let config: Config = serde_json::from_slice(config).map_err(|e| ImageError::Unsupported {
        reference: reference.to_string(),
        reason: format!("its config is not a container image config: {e}"),
    })?;
    config.rootfs.diff_ids.iter().map(|d| Digest::parse(d)).collect()
}

fn check_layer_media_type(reference: &str, layer: &OciDescriptor) -> Result<()> {
    let media_type = layer.media_type.as_str();
    let container_layer = media_type.starts_with("application/vnd.oci.image.layer.v1.tar")
        || media_type.starts_with("application/vnd.docker.image.rootfs.diff.tar");
    if !container_layer || media_type.contains("nondistributable") || media_type.contains("foreign") {
        return Err(ImageError::Unsupported {
            reference: reference.to_string(),
            reason: format!(
                "layer {} has media type {media_type:?}, not a container image layer",
                layer.digest
            ),
        });
    }
    Ok(())
}

fn registry_error(reference: &str, error: OciDistributionError) -> ImageError {
    let reference = reference.to_string();
    match error {
        OciDistributionError::ImageManifestNotFoundError(detail) => ImageError::NotFound { reference, detail },
        OciDistributionError::ServerError { code: 404, message, .. } => ImageError::NotFound {
            reference,
            detail: format!("the registry answered 404 {}", message.trim()),
        },
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            let detail = envelope.to_string();
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown | OciErrorCode::BlobUnknown
                )
            }) {
                ImageError::NotFound { reference, detail }
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                ImageError::Unauthorized { reference, detail }
            } else {
                ImageError::Registry { reference, detail }
            }
        }
        OciDistributionError::UnauthorizedError { url } => ImageError::Unauthorized { reference, detail: url },
        OciDistributionError::AuthenticationFailure(detail) => ImageError::Unauthorized { reference, detail },
        OciDistributionError::DigestError(e) => ImageError::Registry {
            reference,
            detail: format!("content failed verification: {e}"),
        },
        OciDistributionError::RequestError(e) => {
            let mut detail = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                detail.push_str(": ");
                detail.push_str(&cause.to_string());
                source = cause.source();
            }
            ImageError::Registry { reference, detail }
        }
        other => ImageError::Registry {
            reference,
            detail: other.to_string(),
        },
    }
}

/// TLS through rustls with the `ring` provider, installed once for the process (a provider someone
/// else installed first is kept).
fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
