//! The resource amounts the agent enforces, read with the API's own quantity rules
//! ([`shepherd_api::quantity`]), so every limit the API accepts is enforced exactly as written.

use serde_json::Value;
use shepherd_api::JsonPath;
use shepherd_api::quantity::{milli_value, value};

pub(crate) use shepherd_api::quantity::text;

/// `128Mi`, `1G`, `1e9`, `512`, `1Pi` to bytes, rounded up; `None` when unreadable or negative. A
/// size past `u64` (the API takes `100E` as a volume size) is as good as unlimited and reads as
/// `u64::MAX`.
pub(crate) fn bytes(q: &str) -> Option<u64> {
    value(q).ok().and_then(saturating)
}

/// `500m`, `2`, `0.5`, `1k` to millicores, rounded up; `None` when unreadable or negative.
pub(crate) fn millicores(q: &str) -> Option<u64> {
    milli_value(q).ok().and_then(saturating)
}

fn saturating(v: i128) -> Option<u64> {
    (v >= 0).then(|| u64::try_from(v).unwrap_or(u64::MAX))
}

/// The memory limit (bytes) and CPU limit (millicores) of a container spec. A limit of zero is no
/// limit, as kubelet reads it (the API accepts `0`; a memory cgroup held to 0 bytes could not start
/// anything).
pub(crate) fn limits(container: &Value) -> (Option<u64>, Option<u64>) {
    let of = |name: &str| container.at(&format!("/resources/limits/{name}")).and_then(text);
    let set = |v: u64| (v > 0).then_some(v);
    (of("memory").and_then(|q| bytes(&q)).and_then(set), of("cpu").and_then(|q| millicores(&q)).and_then(set))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_quantities_read_as_bytes() {
        assert_eq!(bytes("128Mi"), Some(128 * 1024 * 1024));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("512"), Some(512));
        assert_eq!(bytes("1e3"), Some(1000));
        assert_eq!(bytes("1Pi"), Some(1 << 50), "suffixes past Ti are limits too");
        assert_eq!(bytes("100E"), Some(u64::MAX));
        assert_eq!(bytes("lots"), None);
        assert_eq!(bytes("-1Mi"), None);
    }

    #[test]
    fn zero_limits_are_no_limits() {
        let limits_of = |l: Value| limits(&serde_json::json!({"resources": {"limits": l}}));
        assert_eq!(limits_of(serde_json::json!({"memory": "0", "cpu": 0})), (None, None));
        assert_eq!(limits_of(serde_json::json!({"memory": "0Mi", "cpu": "0m"})), (None, None));
        assert_eq!(limits_of(serde_json::json!({"memory": 1, "cpu": "1m"})), (Some(1), Some(1)));
        assert_eq!(limits_of(serde_json::json!({})), (None, None));
    }

    #[test]
    fn cpu_quantities_read_as_millicores_exactly() {
        assert_eq!(millicores("500m"), Some(500));
        assert_eq!(millicores("2"), Some(2000));
        assert_eq!(millicores("0.25"), Some(250));
        assert_eq!(millicores("1.1"), Some(1100), "1.1 CPU is 1100m, as the API counts it");
        assert_eq!(millicores("250000u"), Some(250));
        assert_eq!(millicores("1k"), Some(1_000_000));
        assert_eq!(millicores("x"), None);
    }
}
