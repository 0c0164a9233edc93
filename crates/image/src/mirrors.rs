//! Registry mirrors and per-registry settings in one file, in the shape of k3s's
//! `registries.yaml`:
//!
//! ```yaml
//! mirrors:
//!   docker.io:                     # a registry as written in image references, or "*" for all
//!     endpoint:                    # tried in order; the registry itself is tried last
//!       - http://mirror.lan:5000   # plain HTTP for this endpoint
//!       - https://mirror2.lan
//! configs:
//!   mirror2.lan:                   # a registry or endpoint host
//!     auth: {username: puller, password: secret}
//!     tls: {ca_file: /etc/ssl/mirror-ca.pem, insecure_skip_verify: false}
//! ```
//!
//! An image `docker.io/library/busybox:1` is pulled from each endpoint in turn as
//! `mirror.lan:5000/library/busybox:1`, then from `docker.io` itself, and stored under its own
//! name. An endpoint that fails (does not answer, refuses, lacks the image) is logged and the next
//! one tried. A `configs` entry's credentials win over a pod's pull secrets for that host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistriesConfig {
    #[serde(default)]
    pub mirrors: BTreeMap<String, MirrorConfig>,
    #[serde(default)]
    pub configs: BTreeMap<String, HostConfig>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorConfig {
    #[serde(default)]
    pub endpoint: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub auth: Option<AuthConfig>,
    pub tls: Option<TlsConfig>,
}

#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthConfig({}, ***)", self.username)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// One place an image is pulled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `HOST[:PORT]`, as in image references.
    pub host: String,
    pub plain_http: bool,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", if self.plain_http { "http" } else { "https" }, self.host)
    }
}

/// `http://host:port` or `https://host[/]` as an endpoint; anything else is refused.
fn parse_endpoint(url: &str) -> Result<Endpoint, String> {
    let (plain_http, rest) = match url.split_once("://") {
        Some(("http", rest)) => (true, rest),
        Some(("https", rest)) => (false, rest),
        _ => return Err(format!("endpoint {url:?} must start with http:// or https://")),
    };
    let host = rest.trim_end_matches('/');
    if host.is_empty() || host.contains('/') || host.contains(char::is_whitespace) || host.contains('@') {
        return Err(format!("endpoint {url:?} must be a scheme and HOST[:PORT], without a path"));
    }
    Ok(Endpoint { host: host.to_string(), plain_http })
}

impl RegistriesConfig {
    /// Parses and checks the file's text.
    pub fn parse(text: &str) -> Result<RegistriesConfig, String> {
        if text.trim().is_empty() {
            return Ok(RegistriesConfig::default());
        }
        let config: RegistriesConfig = serde_saphyr::from_str(text).map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())?;
        for (registry, mirror) in &config.mirrors {
            for url in &mirror.endpoint {
                parse_endpoint(url).map_err(|e| format!("mirrors.{registry}: {e}"))?;
            }
        }
        Ok(config)
    }

    /// Reads `path`; a file that is not there is no configuration.
    pub fn load(path: &Path) -> Result<Option<RegistriesConfig>, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => RegistriesConfig::parse(&text).map(Some).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Where an image of `registry` is pulled from, in order: its mirrors (or those of `*`),
    /// then the registry itself (plain HTTP when `registry_plain_http`).
    pub fn endpoints(&self, registry: &str, registry_plain_http: bool) -> Vec<Endpoint> {
        let mirrors = self.mirrors.get(registry).or_else(|| self.mirrors.get("*"));
        let mut out: Vec<Endpoint> = mirrors.into_iter().flat_map(|m| &m.endpoint).filter_map(|u| parse_endpoint(u).ok()).collect();
        let own = Endpoint { host: registry.to_string(), plain_http: registry_plain_http };
        if !out.contains(&own) {
            out.push(own);
        }
        out
    }

    /// The settings of `host`, if the file has any.
    pub fn host(&self, host: &str) -> Option<&HostConfig> {
        self.configs.get(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "mirrors:\n  docker.io:\n    endpoint:\n      - http://mirror.lan:5000\n      - https://mirror2.lan/\n  \"*\":\n    endpoint: [\"http://catch.all:80\"]\nconfigs:\n  mirror2.lan:\n    auth: {username: puller, password: secret}\n    tls: {insecure_skip_verify: true}\n";

    #[test]
    fn mirrors_come_first_then_the_registry_itself_and_star_covers_the_rest() {
        let c = RegistriesConfig::parse(EXAMPLE).expect("parses");
        let hosts = |r: &str| c.endpoints(r, false).iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(hosts("docker.io"), ["http://mirror.lan:5000", "https://mirror2.lan", "https://docker.io"]);
        assert_eq!(hosts("ghcr.io"), ["http://catch.all:80", "https://ghcr.io"]);
        assert_eq!(c.host("mirror2.lan").and_then(|h| h.auth.as_ref()).map(|a| a.username.as_str()), Some("puller"));
        assert!(format!("{:?}", c.host("mirror2.lan")).contains("***") && !format!("{c:?}").contains("secret"));
        assert_eq!(RegistriesConfig::default().endpoints("127.0.0.1:5000", true), [Endpoint { host: "127.0.0.1:5000".into(), plain_http: true }]);
    }

    #[test]
    fn a_bad_file_is_refused_with_the_reason() {
        let err = RegistriesConfig::parse("mirrors:\n  docker.io:\n    endpoint: [\"mirror.lan:5000\"]\n").expect_err("no scheme");
        assert!(err.contains("mirrors.docker.io") && err.contains("http://"), "{err}");
        let err = RegistriesConfig::parse("mirror:\n  docker.io: {}\n").expect_err("unknown key");
        assert!(err.contains("mirror"), "{err}");
        assert!(RegistriesConfig::parse("mirrors:\n  docker.io:\n    endpoint: [\"https://m/v2/x\"]\n").is_err());
        assert_eq!(RegistriesConfig::parse("").expect("empty"), RegistriesConfig::default());
    }
}
