//! Which server sheepctl talks to, and the raw requests it sends there through the `kube` client.


use anyhow::{Context, anyhow};
use futures::AsyncBufRead;
use http::{HeaderValue, Method, Request, header};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::Value;

/// The address used when nothing else names a server: what `shepherd standalone` listens on.
pub const DEFAULT_SERVER: &str = "https://127.0.0.1:9876";

/// The kubeconfig `shepherd standalone` and `server` write in their default data dir, relative
/// to where they were started.
const DEFAULT_DATA_DIR: &str = "shepherd-data";

const START_HINT: &str = "start Shepherd with: cargo build --release -p shepherd && target/release/shepherd standalone";

const CREDENTIALS_HINT: &str =
    "use the kubeconfig the server wrote (--kubeconfig <data-dir>/admin.kubeconfig, found by itself in ./shepherd-data) or a valid --token";

/// `Accept` header asking the server to print a `Table` (server-side printing, as kubectl does).
pub const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// Flags that choose the server, the credentials and the namespace.
#[derive(Debug, Clone, Default)]
pub struct ConnectionFlags {
    pub server: Option<String>,
    pub kubeconfig: Option<std::path::PathBuf>,
    pub token: Option<String>,
    pub namespace: Option<String>,
}

/// A client bound to one server, plus the namespace commands default to.
pub struct Cluster {
    client: kube::Client,
    /// The server URL as the user would type it, for error messages.
    pub server: String,
    pub namespace: String,
}

/// A failed request, kept apart so callers can treat "not found" as an answer, not an error.
#[derive(Debug)]
pub enum RequestError {
    /// The server answered with a `Status`.
    Api(Box<kube::core::Status>),
    /// The server could not be reached or the answer could not be read.
    Transport(anyhow::Error),
}

impl RequestError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, RequestError::Api(s) if s.code == 404 && s.reason == "NotFound")
    }
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Api(s) => f.write_str(&status_message(s)),
            RequestError::Transport(e) => write!(f, "{e:#}"),
        }
    }
}

impl std::error::Error for RequestError {}

/// The line a user sees for a server rejection: the server's own message (which names the
/// object and, for `Invalid`, each field), with the reason added when the message lacks it.
fn status_message(s: &kube::core::Status) -> String {
    if s.code == 401 {
        return format!("the server did not accept the credentials ({}); {CREDENTIALS_HINT}", s.reason);
    }
    let message = s.message.trim();
    let self_explaining = matches!(s.reason.as_str(), "NotFound" | "AlreadyExists" | "Invalid" | "Conflict");
    match (message.is_empty(), self_explaining || s.reason.is_empty()) {
        (true, _) => format!("the server rejected the request ({}, HTTP {})", s.reason, s.code),
        (false, true) => message.to_string(),
        (false, false) => format!("{message} ({})", s.reason),
    }
}

impl Cluster {
    /// Resolves the server: `--server`, else `SHEPHERD_API`, else the kubeconfig's current
    /// context, else [`DEFAULT_SERVER`]. The kubeconfig is `--kubeconfig`, else `$KUBECONFIG`,
    /// else `~/.kube/config`, else the admin kubeconfig of `./shepherd-data`; an https server
    /// named by flag or environment is reached with its CA and credentials.
    pub async fn connect(flags: &ConnectionFlags) -> anyhow::Result<Cluster> {
        let from_flag_or_env = flags
            .server
            .clone()
            .or_else(|| std::env::var("SHEPHERD_API").ok().filter(|s| !s.trim().is_empty()));
        let (mut config, server) = match from_flag_or_env {
            Some(url) if url.starts_with("https:") => match kubeconfig_config(flags.kubeconfig.as_deref()).await? {
                Some(mut config) => {
                    config.cluster_url = plain_config(&url)?.cluster_url;
                    (config, url)
                }
                None => (plain_config(&url)?, url),
            },
            Some(url) => (plain_config(&url)?, url),
            None => match kubeconfig_config(flags.kubeconfig.as_deref()).await? {
                Some(config) => {
                    let url = config.cluster_url.to_string().trim_end_matches('/').to_string();
                    (config, url)
                }
                None => (plain_config(DEFAULT_SERVER)?, DEFAULT_SERVER.to_string()),
            },
        };
        if let Some(token) = &flags.token {
            // --token replaces whatever credentials the kubeconfig context carries.
            config.auth_info = Default::default();
            let value = HeaderValue::from_str(&format!("Bearer {token}")).context("the token contains characters not allowed in an HTTP header")?;
            config.headers.push((header::AUTHORIZATION, value));
        }
        // A 503 (for example "no logs in this server") should be reported, not retried.
        config.default_retry = false;
        let namespace = flags.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
        let client = kube::Client::try_from(config).map_err(|e| anyhow!("cannot build a client for {server}: {e}"))?;
        Ok(Cluster { client, server, namespace })
    }

    fn build(&self, method: Method, path: &str, accept: Option<&str>, content_type: Option<&str>, body: Vec<u8>) -> Result<Request<Vec<u8>>, RequestError> {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(a) = accept {
            req = req.header(header::ACCEPT, a);
        }
        if let Some(c) = content_type {
            req = req.header(header::CONTENT_TYPE, c);
        }
        req.body(body).map_err(|e| RequestError::Transport(anyhow!("invalid request path {path}: {e}")))
    }

    fn translate(&self, e: kube::Error) -> RequestError {
        match e {
            kube::Error::Api(status) => RequestError::Api(status),
            other => RequestError::Transport(self.transport_error(&other)),
        }
    }

    /// Explains a failure to reach the server: which address, and how to start one.
    fn transport_error(&self, e: &kube::Error) -> anyhow::Error {
        let mut root: &dyn std::error::Error = e;
        let mut refused = false;
        let mut chain = Some(e as &dyn std::error::Error);
        while let Some(err) = chain {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                refused |= matches!(io.kind(), std::io::ErrorKind::ConnectionRefused);
            }
            refused |= err.to_string().contains("Connection refused");
            root = err;
            chain = err.source();
        }
        if refused {
            anyhow!("cannot connect to the Shepherd API at {} (connection refused); {START_HINT}", self.server)
        } else if root.to_string().contains("certificate") {
            anyhow!("cannot verify the TLS certificate of the Shepherd API at {}: {root}; {CREDENTIALS_HINT}", self.server)
        } else {
            anyhow!("cannot talk to the Shepherd API at {}: {root}; is Shepherd running there? {START_HINT}", self.server)
        }
    }

    async fn text(&self, req: Request<Vec<u8>>) -> Result<String, RequestError> {
        self.client.request_text(req).await.map_err(|e| self.translate(e))
    }

    async fn json(&self, req: Request<Vec<u8>>) -> Result<Value, RequestError> {
        let text = self.text(req).await?;
        serde_json::from_str(&text).map_err(|e| RequestError::Transport(anyhow!("the server at {} sent a response that is not JSON: {e}", self.server)))
    }

    /// Learns the custom resources the server serves from its CustomResourceDefinitions, so
    /// that they resolve like built-in kinds. A server that cannot answer is reported by the
    /// command's own request, not here.
    /// The underlying client, for the streaming subresources (exec, attach, port-forward).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    pub async fn learn_custom_resources(&self) {
        let Ok(list) = self.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions").await else { return };
        for def in list.get("items").and_then(Value::as_array).into_iter().flatten() {
            let name = def.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
            shepherd_api::kinds::register_custom(name, shepherd_api::kinds::custom_resources_of(def));
        }
    }

    pub async fn get(&self, path: &str) -> Result<Value, RequestError> {
        self.json(self.build(Method::GET, path, Some("application/json"), None, Vec::new())?).await
    }

    /// GET asking for the server-side printed `Table`.
    pub async fn get_table(&self, path: &str) -> Result<Value, RequestError> {
        self.json(self.build(Method::GET, path, Some(TABLE_ACCEPT), None, Vec::new())?).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, RequestError> {
        let req = self.build(Method::POST, path, Some("application/json"), Some("application/json"), body.to_string().into_bytes())?;
        self.json(req).await
    }

    pub async fn merge_patch(&self, path: &str, patch: &Value) -> Result<Value, RequestError> {
        let req = self.build(Method::PATCH, path, Some("application/json"), Some("application/merge-patch+json"), patch.to_string().into_bytes())?;
        self.json(req).await
    }

    /// A server-side apply: the configuration is the body (JSON is YAML).
    pub async fn apply_patch(&self, path: &str, config: &Value) -> Result<Value, RequestError> {
        let req = self.build(Method::PATCH, path, Some("application/json"), Some("application/apply-patch+yaml"), config.to_string().into_bytes())?;
        self.json(req).await
    }

    pub async fn delete(&self, path: &str) -> Result<Value, RequestError> {
        self.json(self.build(Method::DELETE, path, Some("application/json"), None, Vec::new())?).await
    }

    /// A streamed response (watch events, logs), read as it arrives.
    pub async fn stream(&self, path: &str, accept: &str) -> Result<impl AsyncBufRead + Unpin + use<>, RequestError> {
        let req = self.build(Method::GET, path, Some(accept), None, Vec::new())?;
        let body = self.client.request_stream(req).await.map_err(|e| self.translate(e))?;
        Ok(Box::pin(body))
    }
}

fn plain_config(url: &str) -> anyhow::Result<kube::Config> {
    let uri: http::Uri = url.parse().with_context(|| format!("{url:?} is not a valid server URL (expected something like {DEFAULT_SERVER})"))?;
    if uri.scheme().is_none() || uri.host().is_none() {
        anyhow::bail!("{url:?} is not a valid server URL (expected something like {DEFAULT_SERVER})");
    }
    Ok(kube::Config::new(uri))
}

/// The current context of the first kubeconfig there is: `path` (which must exist), the files
/// of `KUBECONFIG`, `~/.kube/config`, `./shepherd-data/admin.kubeconfig` (the data dir of
/// `$SHEPHERD_DATA_DIR` when set).
async fn kubeconfig_config(path: Option<&std::path::Path>) -> anyhow::Result<Option<kube::Config>> {
    use std::path::PathBuf;
    let read = |p: &std::path::Path| Kubeconfig::read_from(p).with_context(|| format!("reading the kubeconfig {}", p.display()));
    let kubeconfig = if let Some(p) = path {
        Some(read(p)?)
    } else if std::env::var_os("KUBECONFIG")
        .is_some_and(|v| std::env::split_paths(&v).any(|p| !p.as_os_str().is_empty() && p.is_file()))
    {
        Some(Kubeconfig::from_env().context("reading the kubeconfigs of $KUBECONFIG")?.unwrap_or_default())
    } else {
        let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube").join("config"));
        let data_dir = std::env::var_os("SHEPHERD_DATA_DIR").map(PathBuf::from).unwrap_or_else(|| DEFAULT_DATA_DIR.into());
        match [home, Some(data_dir.join("admin.kubeconfig"))].into_iter().flatten().find(|p| p.is_file()) {
            Some(p) => Some(read(&p)?),
            None => None,
        }
    };
    let Some(kubeconfig) = kubeconfig else { return Ok(None) };
    if kubeconfig.current_context.is_none() && kubeconfig.clusters.is_empty() {
        return Ok(None);
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .context("the kubeconfig's current context cannot be used")?;
    Ok(Some(config))
}
