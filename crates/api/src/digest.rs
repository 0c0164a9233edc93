//! Digests of object sets: what a server and an informer cache compare to find lost watch events
//! without listing object bodies (anti-entropy).
//!
//! A set of objects is summarised by the pairs (key, resourceVersion) of its members, the key
//! being `namespace/name` (or `name` for cluster-scoped kinds). Each pair hashes to 64 bits
//! (xxHash3, fixed seed, so every process computes the same value); the set's digest is the
//! wrapping sum of its members' hashes and its size. A sum, unlike a hash of a sorted list, is
//! order-independent and updated in O(1) per change: add the new pair, subtract the old one. The
//! same sums per bucket (a key's bucket comes from a hash of the key alone, so an object stays in
//! its bucket across versions) narrow a mismatch down to a few keys.

use serde::{Deserialize, Serialize};

/// Buckets a digest is split into.
pub const BUCKETS: usize = 256;

/// Seeds of the two hashes; changing them changes every digest, so client and server must agree.
const PAIR_SEED: u64 = 0x5348_4550_4845_5244;
const BUCKET_SEED: u64 = 0x4255_434b_4554_5321;

/// The 64-bit hash of one member.
pub fn pair_hash(key: &str, resource_version: u64) -> u64 {
    let mut bytes = Vec::with_capacity(key.len() + 9);
    bytes.extend_from_slice(key.as_bytes());
    bytes.push(0xff); // not valid UTF-8: no key ends where a version begins
    bytes.extend_from_slice(&resource_version.to_le_bytes());
    twox_hash::XxHash3_64::oneshot_with_seed(PAIR_SEED, &bytes)
}

/// The bucket of a key, the same for every version of the object.
pub fn bucket_of(key: &str) -> usize {
    (twox_hash::XxHash3_64::oneshot_with_seed(BUCKET_SEED, key.as_bytes()) % BUCKETS as u64) as usize
}

/// The digest of a set of (key, resourceVersion) pairs, kept up to date one change at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetDigest {
    count: u64,
    sum: u64,
    buckets: Box<[u64; BUCKETS]>,
}

impl Default for SetDigest {
    fn default() -> Self {
        SetDigest { count: 0, sum: 0, buckets: Box::new([0; BUCKETS]) }
    }
}

impl SetDigest {
    pub fn insert(&mut self, key: &str, resource_version: u64) {
        let h = pair_hash(key, resource_version);
        self.count = self.count.wrapping_add(1);
        self.sum = self.sum.wrapping_add(h);
        let b = &mut self.buckets[bucket_of(key)];
        *b = b.wrapping_add(h);
    }

    pub fn remove(&mut self, key: &str, resource_version: u64) {
        let h = pair_hash(key, resource_version);
        self.count = self.count.wrapping_sub(1);
        self.sum = self.sum.wrapping_sub(h);
        let b = &mut self.buckets[bucket_of(key)];
        *b = b.wrapping_sub(h);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The whole set's digest.
    pub fn sum(&self) -> u64 {
        self.sum
    }

    /// Per-bucket digests, `BUCKETS` of them.
    pub fn buckets(&self) -> &[u64] {
        &self.buckets[..]
    }
}

/// How much of a digest a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DigestDetail {
    /// Count and sum.
    Total,
    /// Count, sum and the per-bucket sums.
    Buckets,
    /// Count and sum, and the (key, resourceVersion) pairs of one bucket.
    Bucket(usize),
}

impl DigestDetail {
    /// The value of the `digest` query parameter: `total`, `buckets` or a bucket number.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "" | "total" | "true" => Ok(DigestDetail::Total),
            "buckets" => Ok(DigestDetail::Buckets),
            n => match n.parse::<usize>() {
                Ok(b) if b < BUCKETS => Ok(DigestDetail::Bucket(b)),
                _ => Err(format!(
                    "invalid value for digest: {s:?}: expected \"total\", \"buckets\" or a bucket number from 0 to {}",
                    BUCKETS - 1
                )),
            },
        }
    }

    /// The bucket whose members are asked for, with `Bucket`.
    pub fn bucket(&self) -> Option<usize> {
        match self {
            DigestDetail::Bucket(b) => Some(*b),
            _ => None,
        }
    }

    pub fn as_query(&self) -> String {
        match self {
            DigestDetail::Total => "total".into(),
            DigestDetail::Buckets => "buckets".into(),
            DigestDetail::Bucket(b) => b.to_string(),
        }
    }
}

/// One member of a bucket as the server lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DigestItem {
    pub key: String,
    #[serde(rename = "resourceVersion")]
    pub resource_version: String,
}

/// A server's digest of a list scope at one revision (the `ListDigest` wire object). Sums travel
/// as 16-digit hex strings, since JSON numbers lose precision beyond 2^53.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListDigest {
    #[serde(rename = "resourceVersion")]
    pub resource_version: String,
    pub count: u64,
    pub digest: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<String>,
    /// With `DigestDetail::Bucket`: the bucket asked for, and its members in key order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<DigestItem>,
}

impl ListDigest {
    /// The wire form of `set` at `revision` with the detail asked for. `members` are the set's
    /// (key, resourceVersion) pairs in key order; only those of the bucket asked for are sent.
    pub fn of(revision: u64, set: &SetDigest, detail: DigestDetail, members: impl IntoIterator<Item = (String, u64)>) -> Self {
        let bucket = detail.bucket();
        ListDigest {
            resource_version: revision.to_string(),
            count: set.count(),
            digest: hex(set.sum()),
            buckets: match detail {
                DigestDetail::Buckets => set.buckets().iter().map(|b| hex(*b)).collect(),
                _ => Vec::new(),
            },
            bucket,
            items: members
                .into_iter()
                .filter(|(key, _)| bucket == Some(bucket_of(key)))
                .map(|(key, rv)| DigestItem { key, resource_version: rv.to_string() })
                .collect(),
        }
    }
}

/// A sum as it travels.
pub fn hex(sum: u64) -> String {
    format!("{sum:016x}")
}

/// Reads a sum written by `hex`.
pub fn parse_hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_does_not_depend_on_the_order_of_changes() {
        let mut a = SetDigest::default();
        let mut b = SetDigest::default();
        a.insert("ns/x", 1);
        a.insert("ns/y", 2);
        a.remove("ns/x", 1);
        a.insert("ns/x", 3);
        b.insert("ns/x", 3);
        b.insert("ns/y", 2);
        assert_eq!(a, b);
        assert_eq!(a.count(), 2);
        b.remove("ns/y", 2);
        b.insert("ns/y", 4);
        assert_ne!(a.sum(), b.sum(), "another version of one object changes the digest");
        assert_eq!(a.buckets().iter().zip(b.buckets()).filter(|(x, y)| x != y).count(), 1, "and only its bucket");
    }

    #[test]
    fn a_key_and_a_version_cannot_trade_bytes() {
        assert_ne!(pair_hash("ns/a1", 23), pair_hash("ns/a12", 3));
        assert_eq!(bucket_of("ns/a"), bucket_of("ns/a"));
        assert!(bucket_of("ns/a") < BUCKETS);
    }

    #[test]
    fn the_query_value_names_one_of_three_details() {
        assert_eq!(DigestDetail::parse("total"), Ok(DigestDetail::Total));
        assert_eq!(DigestDetail::parse("buckets"), Ok(DigestDetail::Buckets));
        assert_eq!(DigestDetail::parse("255"), Ok(DigestDetail::Bucket(255)));
        for bad in ["256", "-1", "x"] {
            assert!(DigestDetail::parse(bad).unwrap_err().contains("bucket number from 0 to 255"), "{bad}");
        }
        assert_eq!(parse_hex(&hex(u64::MAX)), Some(u64::MAX));
    }
}
