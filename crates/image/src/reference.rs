//! Image references with Docker's and Kubernetes' defaults (`nginx` is `docker.io/library/nginx:latest`).

use std::fmt;
use std::net::IpAddr;

use oci_client::Reference;

use crate::error::{ImageError, Result};

/// A parsed, normalized image reference. Its `Display` form is the store's key for the image.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    inner: Reference,
    /// Whether the user wrote a tag: `nginx` and `nginx:latest` both resolve to `:latest`, but a
    /// digest-only reference has no tag at all, which decides the default pull policy.
    explicit_tag: bool,
}

impl ImageRef {
    pub fn parse(image: &str) -> Result<Self> {
        let invalid = |reason: String| ImageError::InvalidReference {
            reference: image.to_string(),
            reason,
        };
        if image.trim().is_empty() {
            return Err(invalid("the image name is empty".into()));
        }
        if image != image.trim() {
            return Err(invalid("the image name has leading or trailing whitespace".into()));
        }
        let inner: Reference = image.parse().map_err(|e| {
            let name = image.split(['@']).next().unwrap_or(image);
            let repository = name
                .rsplit_once(':')
                .filter(|(_, tag)| !tag.contains('/'))
                .map_or(name, |(r, _)| r);
            let path = repository.split_once('/').map_or(repository, |(_, p)| p);
            if path.chars().any(|c| c.is_ascii_uppercase()) {
                invalid("repository name must be lowercase".into())
            } else {
                invalid(format!("{e} (expected [REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST])"))
            }
        })?;
        let last = image.rsplit('/').next().unwrap_or(image);
        let explicit_tag = last.split('@').next().is_some_and(|name| name.contains(':'));
        Ok(ImageRef { inner, explicit_tag })
    }

    /// The registry host as written (`docker.io`, `127.0.0.1:5000`).
    pub fn registry(&self) -> &str {
        self.inner.registry()
    }

    pub fn repository(&self) -> &str {
        self.inner.repository()
    }

    /// The tag, `latest` when neither a tag nor a digest was given.
    pub fn tag(&self) -> Option<&str> {
        self.inner.tag()
    }

    pub fn digest(&self) -> Option<&str> {
        self.inner.digest()
    }

    pub(crate) fn has_explicit_tag(&self) -> bool {
        self.explicit_tag
    }

    /// The same repository, tag and digest on another registry (a mirror's `HOST[:PORT]`).
    pub fn on_registry(&self, host: &str) -> Result<ImageRef> {
        let mut text = format!("{host}/{}", self.repository());
        if let Some(tag) = self.tag() {
            text.push(':');
            text.push_str(tag);
        }
        if let Some(digest) = self.digest() {
            text.push('@');
            text.push_str(digest);
        }
        let mut moved = ImageRef::parse(&text)?;
        moved.explicit_tag = self.explicit_tag;
        Ok(moved)
    }

    pub(crate) fn oci(&self) -> &Reference {
        &self.inner
    }

    /// Whether pulls from this image's registry use plain `http`: containerd's rule for loopback
    /// registries plus the registries the operator named insecure.
    pub fn uses_plain_http(&self, insecure_registries: &[String]) -> bool {
        let registry = self.registry();
        insecure_registries.iter().any(|r| r == registry) || is_loopback_host(registry)
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

/// `localhost`, `127.x.y.z` and `::1`, each with or without a port.
fn is_loopback_host(registry: &str) -> bool {
    let host = if registry.parse::<IpAddr>().is_ok() {
        registry
    } else if let Some(rest) = registry.strip_prefix('[') {
        rest.split_once(']').map_or(rest, |(h, _)| h)
    } else {
        registry.rsplit_once(':').map_or(registry, |(h, _)| h)
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_name_gets_docker_hub_library_and_latest() {
        assert_eq!(
            ImageRef::parse("nginx").unwrap().to_string(),
            "docker.io/library/nginx:latest"
        );
        assert_eq!(
            ImageRef::parse("nginx:1.27").unwrap().to_string(),
            "docker.io/library/nginx:1.27"
        );
        assert_eq!(
            ImageRef::parse("bitnami/redis").unwrap().to_string(),
            "docker.io/bitnami/redis:latest"
        );
        let local = ImageRef::parse("127.0.0.1:5000/test/busybox:1").unwrap();
        assert_eq!(local.registry(), "127.0.0.1:5000");
        assert_eq!(local.repository(), "test/busybox");
        assert_eq!(local.tag(), Some("1"));
    }

    #[test]
    fn a_digest_reference_keeps_its_digest_and_gets_no_tag() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let image = ImageRef::parse(&format!("nginx@{digest}")).unwrap();
        assert_eq!(image.digest(), Some(digest.as_str()));
        assert_eq!(image.tag(), None);
        assert!(!image.has_explicit_tag());
    }

    #[test]
    fn a_malformed_reference_names_the_input_and_the_problem() {
        let err = ImageRef::parse("Nginx:1").unwrap_err().to_string();
        assert!(
            err.contains("\"Nginx:1\"") && err.contains("must be lowercase"),
            "{err}"
        );
        for bad in [
            "",
            "nginx:",
            "nginx::1",
            "ngi nx",
            "nginx@sha256:abc",
            "-nginx",
            "nginx/",
        ] {
            let err = ImageRef::parse(bad).unwrap_err();
            assert!(matches!(err, ImageError::InvalidReference { .. }), "{bad}: {err}");
        }
    }

    #[test]
    fn loopback_and_named_registries_use_plain_http() {
        let insecure = vec!["registry.lan:5000".to_string()];
        for plain in [
            "localhost:5000/a",
            "127.0.0.1:5000/a",
            "127.9.0.1/a",
            "registry.lan:5000/a",
        ] {
            assert!(ImageRef::parse(plain).unwrap().uses_plain_http(&insecure), "{plain}");
        }
        for tls in ["nginx", "registry.lan/a", "10.0.0.1:5000/a", "localhost.example.com/a"] {
            assert!(!ImageRef::parse(tls).unwrap().uses_plain_http(&insecure), "{tls}");
        }
        assert!(is_loopback_host("[::1]:5000") && is_loopback_host("::1") && !is_loopback_host("[::2]:5000"));
    }
}
