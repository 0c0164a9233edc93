//! Repository names, tags and digests as the OCI distribution spec's grammar allows them.
//!
//! Every accepted value is also a safe path below the data directory: no component can be empty,
//! `.`, `..` or start with `_` (which the storage layout keeps for itself).

use std::fmt;

/// Longest repository name accepted (the reference implementation's limit).
const MAX_NAME_LEN: usize = 255;
/// Longest tag the spec's grammar allows.
const MAX_TAG_LEN: usize = 128;

/// A repository name matching `[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(\/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepositoryName(String);

impl RepositoryName {
    pub fn parse(name: &str) -> Option<Self> {
        if name.is_empty() || name.len() > MAX_NAME_LEN {
            return None;
        }
        name.split('/').all(valid_component).then(|| Self(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RepositoryName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One path component: alphanumeric runs joined by a single `.`, one or two `_`, or any number of `-`.
fn valid_component(component: &str) -> bool {
    let bytes = component.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let mut i = 0;
    loop {
        let start = i;
        while i < bytes.len() && alnum(bytes[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == bytes.len() {
            return true;
        }
        match bytes[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < bytes.len() && bytes[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < bytes.len() && bytes[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

/// A tag matching `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`.
pub fn valid_tag(tag: &str) -> bool {
    let bytes = tag.as_bytes();
    let Some(&first) = bytes.first() else { return false };
    bytes.len() <= MAX_TAG_LEN
        && (first.is_ascii_alphanumeric() || first == b'_')
        && bytes.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A sha256 content digest, the only algorithm this registry stores: `sha256:` and 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    pub fn parse(digest: &str) -> Option<Self> {
        let hex = digest.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
            .then(|| Self(digest.to_string()))
    }

    /// The digest of `data`.
    pub fn of(data: &[u8]) -> Self {
        use sha2::Digest as _;
        Self::from_hasher(sha2::Sha256::new_with_prefix(data))
    }

    pub fn from_hasher(hasher: sha2::Sha256) -> Self {
        use sha2::Digest as _;
        Self(format!("sha256:{}", hex::encode(hasher.finalize())))
    }

    /// The 64 hex digits, used as the file name of the blob.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_the_spec_grammar_are_accepted() {
        for name in ["busybox", "library/busybox", "a/b/c", "my-app", "my--app", "a.b", "a_b", "a__b", "x1/2y"] {
            assert!(RepositoryName::parse(name).is_some(), "{name} should be valid");
        }
    }

    #[test]
    fn names_that_could_escape_or_break_the_layout_are_refused() {
        for name in [
            "", "..", "../etc", "a/../b", "a/./b", "/a", "a/", "a//b", "A", "a___b", "a.", ".a", "-a", "a-", "_a",
            "a/_tags", "a b", "a%2f..", "a\\b",
        ] {
            assert!(RepositoryName::parse(name).is_none(), "{name} should be invalid");
        }
        assert!(RepositoryName::parse(&"a".repeat(256)).is_none());
    }

    #[test]
    fn tags_follow_the_spec_grammar() {
        assert!(valid_tag("1") && valid_tag("latest") && valid_tag("_x") && valid_tag("v1.2-rc_3"));
        assert!(!valid_tag("") && !valid_tag(".hidden") && !valid_tag("-x") && !valid_tag("a/b"));
        assert!(!valid_tag("..") && !valid_tag(&"a".repeat(129)) && valid_tag(&"a".repeat(128)));
    }

    #[test]
    fn only_well_formed_sha256_digests_parse() {
        let good = format!("sha256:{}", "a".repeat(64));
        assert!(Digest::parse(&good).is_some());
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_none());
        assert!(Digest::parse(&format!("sha512:{}", "a".repeat(128))).is_none());
        assert!(Digest::parse("sha256:../../etc").is_none());
        assert_eq!(Digest::of(b"").as_str(), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
