//! The server's TLS and authentication settings: the cluster CA and serving certificate kept in
//! the data dir, the authenticators, kubeconfig files for users, and `shepherd kubeconfig`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use base64::Engine;
use clap::Args;
use serde_json::json;
use shepherd_apiserver::auth::MASTERS_GROUP;
use shepherd_apiserver::authn::{self, Authenticator, certificates_from_pem};
use shepherd_apiserver::pki::{CertifiedKey, ClusterCa};

/// TLS and authentication flags of `server` and `standalone`.
#[derive(Args, Clone, Debug)]
pub struct TlsArgs {
    /// Serve plain HTTP without authentication: only on a loopback address, for tests and
    /// benchmarks that measure something else. Without it the API is served over TLS and every
    /// request but health and version checks must authenticate.
    #[arg(long)]
    pub insecure_loopback: bool,
    /// The serving certificate (PEM, with its chain) instead of one signed by the cluster CA.
    #[arg(long, requires = "tls_key", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, requires = "tls_cert", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// The CA bundle (PEM) that verifies the serving certificate, published to pods as the ConfigMap
    /// `kube-root-ca.crt` (key `ca.crt`) in every namespace, as Kubernetes' --root-ca-file. Default:
    /// the cluster CA when the server serves the certificate it generated; with --tls-cert, the last
    /// certificate of that chain (a warning at start says so: give the bundle when clients should
    /// trust another root).
    #[arg(long, value_name = "FILE")]
    pub root_ca_file: Option<PathBuf>,
    /// More CA certificates (PEM) whose client certificates authenticate users, beside the
    /// cluster CA's.
    #[arg(long, value_name = "FILE")]
    pub client_ca: Option<PathBuf>,
    /// A further DNS name or IP address for the generated serving certificate; repeatable.
    #[arg(long = "tls-san", value_name = "NAME")]
    pub tls_sans: Vec<String>,
    /// Static bearer tokens, in Kubernetes' CSV format: token,user,uid[,"group1,group2"].
    #[arg(long, value_name = "FILE")]
    pub token_auth_file: Option<PathBuf>,
}

/// The user the admin kubeconfig authenticates as, and its group.
pub const ADMIN_USER: &str = authn::ADMIN_USER;

/// The files of the cluster CA and serving certificate in a data dir.
fn pki_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("pki")
}

pub fn admin_kubeconfig_path(data_dir: &Path) -> PathBuf {
    data_dir.join("admin.kubeconfig")
}

/// Refuses `--insecure-loopback` anywhere but on loopback, before anything is bound.
pub fn check_insecure_listen(args: &TlsArgs, listen: SocketAddr) -> anyhow::Result<()> {
    if args.insecure_loopback && !listen.ip().is_loopback() {
        bail!(
            "--insecure-loopback serves the API without TLS or authentication and is allowed only on a loopback \
             address, not {listen}; drop it to serve TLS, or listen on 127.0.0.1"
        );
    }
    Ok(())
}

/// What a TLS server needs: its rustls config, the authenticator, the CA for kubeconfigs.
pub struct Secured {
    pub tls: Arc<rustls::ServerConfig>,
    pub authenticator: Arc<Authenticator>,
    pub ca: ClusterCa,
    /// Whether clients verify the server with the cluster CA (false with --tls-cert).
    pub serving_by_cluster_ca: bool,
    /// The CA bundle (PEM) pods get to verify the server with, in `kube-root-ca.crt`.
    pub root_ca_pem: String,
    /// The administrator's sign-in token of `<data-dir>/admin.token`, when no `--token` was given.
    pub sign_in_token: Option<String>,
}

pub(crate) fn write_private(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(contents.as_bytes()).and_then(|()| f.sync_all()).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The cluster CA of `data_dir`, made on first use.
pub fn cluster_ca(data_dir: &Path) -> anyhow::Result<ClusterCa> {
    let dir = pki_dir(data_dir);
    let (cert, key) = (dir.join("ca.crt"), dir.join("ca.key"));
    if cert.exists() || key.exists() {
        return ClusterCa::from_pem(&read(&cert)?, &read(&key)?).with_context(|| format!("the cluster CA in {}", dir.display()));
    }
    crate::private_dir::secure(&dir)?;
    let ca = ClusterCa::generate()?;
    write_private(&key, ca.key_pem())?;
    write_private(&cert, ca.cert_pem())?;
    tracing::info!(dir = %dir.display(), "generated the cluster CA");
    Ok(ca)
}

/// The names the generated serving certificate covers: the listen address (every local address
/// and the host name when it is a wildcard), localhost, loopback, and --tls-san.
fn serving_names(listen: SocketAddr, extra: &[String]) -> Vec<String> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
    if listen.ip().is_unspecified() {
        names.push(crate::node_agent::hostname());
    } else {
        names.push(listen.ip().to_string());
    }
    names.extend(extra.iter().cloned());
    let mut seen = std::collections::BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

/// The serving certificate in `data_dir`, made again when it lacks one of `names`.
fn serving_cert(data_dir: &Path, ca: &ClusterCa, names: &[String]) -> anyhow::Result<CertifiedKey> {
    let dir = pki_dir(data_dir);
    let (cert, key, sans) = (dir.join("apiserver.crt"), dir.join("apiserver.key"), dir.join("apiserver.names"));
    if let Ok(known) = std::fs::read_to_string(&sans) {
        let known: Vec<&str> = known.lines().collect();
        if names.iter().all(|n| known.contains(&n.as_str())) && cert.exists() && key.exists() {
            return Ok(CertifiedKey { cert_pem: read(&cert)?, key_pem: read(&key)? });
        }
    }
    let made = ca.serving_cert(names)?;
    write_private(&key, &made.key_pem)?;
    write_private(&cert, &made.cert_pem)?;
    write_private(&sans, &(names.join("\n") + "\n"))?;
    tracing::info!(names = ?names, "generated the API server's serving certificate");
    Ok(made)
}

/// TLS and authentication for a server listening on `listen`, with `token` (--token) as one more
/// static token of an administrator.
pub fn secure(args: &TlsArgs, data_dir: &Path, listen: SocketAddr, token: Option<&str>) -> anyhow::Result<Secured> {
    crate::private_dir::secure(data_dir)?;
    let ca = cluster_ca(data_dir)?;
    let mut client_cas = certificates_from_pem(ca.cert_pem().as_bytes())?;
    if let Some(path) = &args.client_ca {
        client_cas.extend(certificates_from_pem(read(path)?.as_bytes()).with_context(|| format!("--client-ca {}", path.display()))?);
    }
    let (serving, by_cluster_ca) = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => (CertifiedKey { cert_pem: read(cert)?, key_pem: read(key)? }, false),
        _ => (serving_cert(data_dir, &ca, &serving_names(listen, &args.tls_sans))?, true),
    };
    let tls = authn::server_config(serving.cert_pem.as_bytes(), serving.key_pem.as_bytes(), &client_cas)
        .context("the serving certificate (--tls-cert/--tls-key)")?;
    let mut tokens = match &args.token_auth_file {
        Some(path) => authn::parse_token_file(&read(path)?).with_context(|| format!("--token-auth-file {}", path.display()))?,
        None => Vec::new(),
    };
    let sign_in_token = match token {
        Some(_) => None,
        None => Some(sign_in_token(data_dir)?),
    };
    if let Some(t) = token.or(sign_in_token.as_deref()) {
        tokens.push(authn::admin_token(t));
    }
    let authenticator = Arc::new(Authenticator::new(&client_cas, tokens)?);
    let root_ca_pem = root_ca_bundle(args, &ca, &serving, by_cluster_ca)?;
    Ok(Secured { tls, authenticator, ca, serving_by_cluster_ca: by_cluster_ca, root_ca_pem, sign_in_token })
}

/// Where the administrator's sign-in token is kept (mode 0600, beside `admin.kubeconfig`).
pub fn sign_in_token_path(data_dir: &Path) -> PathBuf {
    data_dir.join("admin.token")
}

/// The administrator's bearer token for a browser, which holds no client certificate: made at the
/// first start without `--token` and kept, so the dashboard link printed at start stays good
/// across restarts. Anyone who can read the data directory is the administrator anyway (the CA
/// key and `admin.kubeconfig` are there); delete the file to have a new token made.
fn sign_in_token(data_dir: &Path) -> anyhow::Result<String> {
    let path = sign_in_token_path(data_dir);
    match std::fs::read_to_string(&path) {
        Ok(t) if t.trim().len() >= 32 => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let token = crate::node_agent::random_token()?;
    write_private(&path, &format!("{token}\n"))?;
    Ok(token)
}

/// What verifies the serving certificate, for pods: --root-ca-file, else the cluster CA that signed
/// the generated certificate, else the root end of the --tls-cert chain.
fn root_ca_bundle(args: &TlsArgs, ca: &ClusterCa, serving: &CertifiedKey, by_cluster_ca: bool) -> anyhow::Result<String> {
    if let Some(path) = &args.root_ca_file {
        let pem = read(path)?;
        certificates_from_pem(pem.as_bytes()).with_context(|| format!("--root-ca-file {}", path.display()))?;
        return Ok(pem);
    }
    if by_cluster_ca {
        return Ok(ca.cert_pem().to_string());
    }
    let chain = certificates_from_pem(serving.cert_pem.as_bytes()).context("the serving certificate (--tls-cert)")?;
    let last = chain.last().map(|c| c.to_vec()).unwrap_or_default();
    tracing::warn!(
        certificates_in_chain = chain.len(),
        "--tls-cert without --root-ca-file: pods get the last certificate of the served chain in kube-root-ca.crt; \
         pass --root-ca-file with the CA bundle clients should trust if that is not it"
    );
    Ok(crate::service_accounts::pem_bundle(&[last]))
}

/// The URL clients use for a server on `addr`: a wildcard address is reached on loopback.
pub fn client_url(scheme: &str, addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("{scheme}://{}", SocketAddr::new(ip, addr.port()))
}

/// A kubeconfig for `user` in `groups` at `server`, with a client certificate from `ca`
/// (`ca_data`: whether clients verify the server with that CA).
pub fn kubeconfig(ca: &ClusterCa, ca_data: bool, server: &str, user: &str, groups: &[String]) -> anyhow::Result<String> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let cert = ca.client_cert(user, groups)?;
    let mut cluster = json!({"server": server});
    if ca_data {
        cluster["certificate-authority-data"] = json!(b64(ca.cert_pem()));
    }
    let context = format!("{user}@shepherd");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "shepherd", "cluster": cluster}],
        "users": [{"name": user, "user": {
            "client-certificate-data": b64(&cert.cert_pem),
            "client-key-data": b64(&cert.key_pem),
        }}],
        "contexts": [{"name": context, "context": {"cluster": "shepherd", "user": user, "namespace": "default"}}],
        "current-context": context,
        "preferences": {},
    });
    serde_saphyr::to_string(&config).context("writing the kubeconfig")
}

/// Writes `<data-dir>/admin.kubeconfig` (CN=shepherd-admin, O=system:masters) unless one for
/// `server` is there already.
pub fn write_admin_kubeconfig(data_dir: &Path, secured: &Secured, server: &str) -> anyhow::Result<PathBuf> {
    let path = admin_kubeconfig_path(data_dir);
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current.lines().any(|l| l.trim() == format!("server: {server}")) {
        return Ok(path);
    }
    let text = kubeconfig(&secured.ca, secured.serving_by_cluster_ca, server, ADMIN_USER, &[MASTERS_GROUP.to_string()])?;
    write_private(&path, &text)?;
    Ok(path)
}

/// `shepherd kubeconfig`: prints a kubeconfig for a user, signed by a data dir's cluster CA.
#[derive(Args, Clone, Debug)]
pub struct KubeconfigArgs {
    /// The server's data directory (its cluster CA is in pki/).
    #[arg(long, env = "SHEPHERD_DATA_DIR", default_value = "shepherd-data")]
    data_dir: PathBuf,
    /// The user name (the certificate's CN).
    #[arg(long)]
    user: String,
    /// A group of the user (the certificate's O); repeatable.
    #[arg(long = "group")]
    groups: Vec<String>,
    /// The server URL. Default: the one in <data-dir>/admin.kubeconfig, else https://127.0.0.1:9876.
    #[arg(long)]
    server: Option<String>,
}

pub fn print_kubeconfig(args: KubeconfigArgs) -> anyhow::Result<()> {
    let dir = pki_dir(&args.data_dir);
    if !dir.join("ca.crt").exists() {
        bail!("no cluster CA in {}: start `shepherd server` or `standalone` with --data-dir {} first", dir.display(), args.data_dir.display());
    }
    let ca = cluster_ca(&args.data_dir)?;
    let server = args.server.clone().unwrap_or_else(|| {
        std::fs::read_to_string(admin_kubeconfig_path(&args.data_dir))
            .ok()
            .and_then(|t| t.lines().find_map(|l| l.trim().strip_prefix("server: ").map(str::to_string)))
            .unwrap_or_else(|| "https://127.0.0.1:9876".to_string())
    });
    let ca_data = !std::fs::read_to_string(admin_kubeconfig_path(&args.data_dir))
        .is_ok_and(|t| !t.contains("certificate-authority-data"));
    print!("{}", kubeconfig(&ca, ca_data, &server, &args.user, &args.groups)?);
    Ok(())
}

/// The kube client config of a remote agent: a kubeconfig, or a server URL with a token and
/// the CA that signed the server's certificate.
pub async fn agent_client_config(
    server: &str,
    kubeconfig: Option<&Path>,
    token: Option<&str>,
    certificate_authority: Option<&Path>,
) -> anyhow::Result<kube::Config> {
    let mut config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("--kubeconfig {}", path.display()))?
        }
        None => {
            let uri: http::Uri = server.parse().with_context(|| format!("--server {server:?} is not a URL"))?;
            kube::Config::new(uri)
        }
    };
    if let Some(t) = token {
        config.auth_info.token = Some(t.to_string().into());
    }
    if let Some(path) = certificate_authority {
        let certs = certificates_from_pem(read(path)?.as_bytes()).with_context(|| format!("--certificate-authority {}", path.display()))?;
        config.root_cert = Some(certs.iter().map(|c| c.to_vec()).collect());
    }
    config.default_namespace = "default".into();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insecure_loopback_is_refused_off_loopback_with_one_line() {
        let args = TlsArgs {
            insecure_loopback: true,
            tls_cert: None,
            tls_key: None,
            root_ca_file: None,
            client_ca: None,
            tls_sans: vec![],
            token_auth_file: None,
        };
        assert!(check_insecure_listen(&args, "127.0.0.1:0".parse().unwrap()).is_ok());
        assert!(check_insecure_listen(&args, "[::1]:0".parse().unwrap()).is_ok());
        let err = check_insecure_listen(&args, "0.0.0.0:9876".parse().unwrap()).unwrap_err().to_string();
        assert!(err.contains("loopback") && !err.contains('\n'), "{err}");
    }

    #[test]
    fn a_wildcard_listen_address_is_reached_on_loopback() {
        assert_eq!(client_url("https", "0.0.0.0:9876".parse().unwrap()), "https://127.0.0.1:9876");
        assert_eq!(client_url("https", "[::]:1".parse().unwrap()), "https://[::1]:1");
    }
}
