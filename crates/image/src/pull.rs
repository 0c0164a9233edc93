//! Pulls from OCI distribution registries into the store, one pull per image at a time.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, Once};
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use oci_client::Client;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol, linux_amd64_resolver};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;

use crate::digest::Digest;
use crate::error::{ImageError, Result};
use crate::mirrors::{Endpoint, RegistriesConfig};
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
        /// How it came, when not from its own registry at the first try: which mirror answered
        /// and which endpoints failed before.
        via: Option<String>,
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
    /// Mirrors and per-registry credentials and TLS (`registries.yaml`).
    registries: RegistriesConfig,
    /// One client per (registry, protocol): each keeps the bearer tokens of its registry.
    clients: Mutex<HashMap<String, Client>>,
    flights: SingleFlight<String, (ImageRecord, Option<String>)>,
}

impl Puller {
    /// `insecure_registries` (`HOST:PORT`, as written in references) are pulled over plain `http`,
    /// as loopback registries always are.
    pub fn new(store: Arc<ImageStore>, insecure_registries: Vec<String>) -> Self {
        install_crypto_provider();
        Puller {
            store,
            insecure_registries,
            registries: RegistriesConfig::default(),
            clients: Mutex::new(HashMap::new()),
            flights: SingleFlight::new(),
        }
    }

    /// Pulls through the mirrors of `registries`, with its credentials and TLS settings.
    pub fn with_registries(mut self, registries: RegistriesConfig) -> Self {
        self.registries = registries;
        self
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
                let (record, via) = self.pull_via(image, credentials).await?;
                Ensured::Pulled {
                    image: record,
                    duration: started.elapsed(),
                    via,
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
        Ok(self.pull_via(image, credentials).await?.0)
    }

    /// As `pull`, saying how the image came when that was not its registry at the first try. Each
    /// endpoint (the registry's mirrors, then the registry) is tried in turn; an endpoint that
    /// fails is logged and the next one tried, and the last one's error is the pull's.
    pub async fn pull_via(&self, image: &ImageRef, credentials: &Credentials) -> Result<(ImageRecord, Option<String>)> {
        let plain = image.uses_plain_http(&self.insecure_registries);
        let mut sources = Vec::new();
        for endpoint in self.registries.endpoints(image.registry(), plain) {
            let source = image.on_registry(&endpoint.host)?;
            let client = self.client_for(&endpoint)?;
            let auth = match self.registries.host(&endpoint.host).and_then(|h| h.auth.as_ref()) {
                Some(a) => Credentials::Basic { username: a.username.clone(), password: a.password.clone() },
                None if endpoint.host == image.registry() => credentials.clone(),
                // A pod's pull secrets are for the registry it names, not for a mirror.
                None => Credentials::Anonymous,
            };
            sources.push((endpoint, source, client, auth));
        }
        let store = Arc::clone(&self.store);
        let image = image.clone();
        self.flights
            .run(image.to_string(), move || async move {
                let count = sources.len();
                let own = image.registry().to_string();
                let (mut failed, mut failures) = (None, Vec::new());
                for (i, (endpoint, source, client, auth)) in sources.into_iter().enumerate() {
                    match pull_image(client, Arc::clone(&store), &source, image.clone(), auth).await {
                        Ok(record) => {
                            let mirror = endpoint.host != own;
                            let via = match (mirror, failures.is_empty()) {
                                (false, true) => None,
                                (true, true) => Some(format!("from mirror {endpoint}")),
                                (true, false) => Some(format!("from mirror {endpoint} after {}", failures.join("; "))),
                                (false, false) => Some(format!("from {endpoint} after {}", failures.join("; "))),
                            };
                            if let Some(via) = &via {
                                tracing::info!(image = %image, "pulled {via}");
                            }
                            return Ok((record, via));
                        }
                        Err(e) if i + 1 < count => {
                            tracing::warn!(image = %image, endpoint = %endpoint, error = %e, "registry endpoint failed; trying the next one");
                            failures.push(format!("{endpoint} failed ({e})"));
                        }
                        Err(e) => failed = Some(e),
                    }
                }
                Err(failed.unwrap_or_else(|| ImageError::Registry { reference: image.to_string(), detail: "no endpoint to pull from".into() }))
            })
            .await
    }

    fn client_for(&self, endpoint: &Endpoint) -> Result<Client> {
        let key = endpoint.to_string();
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let tls = self.registries.host(&endpoint.host).and_then(|h| h.tls.clone()).unwrap_or_default();
        let mut extra_root_certificates = Vec::new();
        if let Some(ca) = &tls.ca_file {
            let data = std::fs::read(ca).map_err(|e| ImageError::Registry {
                reference: endpoint.to_string(),
                detail: format!("cannot read the CA file {} of registries.yaml: {e}", ca.display()),
            })?;
            extra_root_certificates.push(Certificate { encoding: CertificateEncoding::Pem, data });
        }
        let client = Client::new(ClientConfig {
            protocol: if endpoint.plain_http { ClientProtocol::Http } else { ClientProtocol::Https },
            // The host's platform; other architectures' images could not run here anyway.
            platform_resolver: Some(Box::new(linux_amd64_resolver)),
            accept_invalid_certificates: tls.insecure_skip_verify,
            extra_root_certificates,
            // A mirror that does not answer costs this long before the next endpoint is tried.
            connect_timeout: Some(std::time::Duration::from_secs(5)),
            ..Default::default()
        });
        clients.insert(key, client.clone());
        Ok(client)
    }
}

/// Pulls `image` from `source` (itself, or the same image on a mirror) and stores it as `image`.
async fn pull_image(
    client: Client,
    store: Arc<ImageStore>,
    source: &ImageRef,
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
        .pull_manifest_and_config(source.oci(), &auth)
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
            let (client, store, image) = (client.clone(), Arc::clone(&store), source.clone());
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
