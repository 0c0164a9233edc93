//! Content digests (`sha256:<hex>`), validated so that a digest is always safe to use as a file name.

use std::fmt;
use std::io::{self, Write};

use sha2::{Digest as _, Sha256};

use crate::error::{ImageError, Result};

/// A validated `sha256:` digest: 64 lowercase hex digits, so `hex()` never contains a path separator.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    pub fn parse(s: &str) -> Result<Self> {
        let invalid = |reason: &str| ImageError::InvalidDigest {
            digest: s.to_string(),
            reason: reason.to_string(),
        };
        let Some((algorithm, hex)) = s.split_once(':') else {
            return Err(invalid("expected ALGORITHM:HEX"));
        };
        if algorithm != "sha256" {
            return Err(invalid("only sha256 digests are supported"));
        }
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(invalid("a sha256 digest has 64 lowercase hex digits"));
        }
        Ok(Digest(s.to_string()))
    }

    pub fn of(bytes: &[u8]) -> Self {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = ImageError;
    fn try_from(s: String) -> Result<Self> {
        Digest::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

/// Hashes what passes through it, for verifying content while it streams.
pub(crate) struct Hasher<W> {
    inner: W,
    sha: Sha256,
    len: u64,
}

impl<W> Hasher<W> {
    pub(crate) fn new(inner: W) -> Self {
        Hasher {
            inner,
            sha: Sha256::new(),
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn finish(self) -> (W, Digest) {
        (
            self.inner,
            Digest(format!("sha256:{}", hex::encode(self.sha.finalize()))),
        )
    }
}

impl<W: Write> Write for Hasher<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<R: io::Read> io::Read for Hasher<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.sha.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_that_could_name_another_path_is_refused() {
        assert!(Digest::parse("sha256:../../etc/passwd").is_err());
        assert!(Digest::parse(&format!("sha512:{}", "a".repeat(64))).is_err());
        assert!(Digest::parse(&format!("sha256:{}", "A".repeat(64))).is_err());
        let good = Digest::of(b"hello");
        assert_eq!(Digest::parse(good.as_str()).unwrap(), good);
    }
}
