//! `imagePullPolicy`: Kubernetes' defaults by tag and the decision whether a container start pulls.

use crate::error::{ImageError, Result};
use crate::reference::ImageRef;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

/// What a container start does about its image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullDecision {
    Pull,
    UsePresent,
}

impl PullPolicy {
    /// The policy a container gets when its spec names none: `Always` for `:latest` or no tag,
    /// `IfNotPresent` otherwise (a digest-only reference included), as the API server defaults it.
    pub fn default_for(image: &ImageRef) -> Self {
        if image.tag() == Some("latest") && (image.has_explicit_tag() || image.digest().is_none()) {
            PullPolicy::Always
        } else {
            PullPolicy::IfNotPresent
        }
    }

    /// The policy of a container spec's `imagePullPolicy` field, defaulted when absent.
    pub fn from_spec(field: Option<&str>, image: &ImageRef) -> Result<Self, String> {
        match field {
            None | Some("") => Ok(Self::default_for(image)),
            Some("Always") => Ok(PullPolicy::Always),
            Some("IfNotPresent") => Ok(PullPolicy::IfNotPresent),
            Some("Never") => Ok(PullPolicy::Never),
            Some(other) => Err(format!(
                "unsupported value {other:?}: supported values: \"Always\", \"IfNotPresent\", \"Never\""
            )),
        }
    }

    /// Whether to pull, given whether the image is already in the store. A digest names immutable
    /// content, so a present digest reference is never pulled again, even under `Always`.
    pub fn decide(self, image: &ImageRef, present: bool) -> Result<PullDecision> {
        match (self, present) {
            (_, true) if image.digest().is_some() => Ok(PullDecision::UsePresent),
            (PullPolicy::Always, _) => Ok(PullDecision::Pull),
            (_, true) => Ok(PullDecision::UsePresent),
            (PullPolicy::IfNotPresent, false) => Ok(PullDecision::Pull),
            (PullPolicy::Never, false) => Err(ImageError::NeverPull {
                reference: image.to_string(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(s: &str) -> ImageRef {
        ImageRef::parse(s).unwrap()
    }

    #[test]
    fn latest_or_no_tag_defaults_to_always_and_other_tags_to_if_not_present() {
        let digest = format!("sha256:{}", "b".repeat(64));
        assert_eq!(PullPolicy::default_for(&image("nginx")), PullPolicy::Always);
        assert_eq!(PullPolicy::default_for(&image("nginx:latest")), PullPolicy::Always);
        assert_eq!(PullPolicy::default_for(&image("nginx:1.27")), PullPolicy::IfNotPresent);
        assert_eq!(
            PullPolicy::default_for(&image(&format!("nginx@{digest}"))),
            PullPolicy::IfNotPresent
        );
        assert_eq!(
            PullPolicy::default_for(&image(&format!("nginx:latest@{digest}"))),
            PullPolicy::Always
        );
        assert_eq!(
            PullPolicy::from_spec(Some("Never"), &image("nginx")),
            Ok(PullPolicy::Never)
        );
        assert!(
            PullPolicy::from_spec(Some("always"), &image("nginx"))
                .unwrap_err()
                .contains("\"always\"")
        );
    }

    #[test]
    fn each_policy_pulls_only_when_kubernetes_would() {
        let tagged = image("nginx:1.27");
        let pinned = image(&format!("nginx:latest@sha256:{}", "c".repeat(64)));
        assert_eq!(PullPolicy::Always.decide(&tagged, true).unwrap(), PullDecision::Pull);
        assert_eq!(
            PullPolicy::Always.decide(&pinned, true).unwrap(),
            PullDecision::UsePresent
        );
        assert_eq!(PullPolicy::Always.decide(&pinned, false).unwrap(), PullDecision::Pull);
        assert_eq!(
            PullPolicy::IfNotPresent.decide(&tagged, true).unwrap(),
            PullDecision::UsePresent
        );
        assert_eq!(
            PullPolicy::IfNotPresent.decide(&tagged, false).unwrap(),
            PullDecision::Pull
        );
        assert_eq!(
            PullPolicy::Never.decide(&tagged, true).unwrap(),
            PullDecision::UsePresent
        );
        let err = PullPolicy::Never.decide(&tagged, false).unwrap_err().to_string();
        assert!(
            err.contains("docker.io/library/nginx:1.27") && err.contains("Never"),
            "{err}"
        );
    }
}
