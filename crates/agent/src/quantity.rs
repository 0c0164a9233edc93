//! Reads the resource quantities the agent needs (memory in bytes, cpu in millicores) with the
//! API's own parser, so every quantity the API accepts is enforced exactly as written.

use shepherd_api::{milli_value, quantity_value};

/// `128Mi`, `1G`, `1e9`, `512`, `1Pi` to bytes, rounded up; `None` when unreadable or negative.
pub(crate) fn bytes(q: &str) -> Option<u64> {
    quantity_value(q).ok().and_then(|v| u64::try_from(v).ok())
}

/// `500m`, `2`, `0.5`, `1k` to millicores, rounded up; `None` when unreadable or negative.
pub(crate) fn millicores(q: &str) -> Option<u64> {
    milli_value(q).ok().and_then(|v| u64::try_from(v).ok())
}

/// A quantity given as a JSON string or number.
pub(crate) fn text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
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
        assert_eq!(bytes("lots"), None);
        assert_eq!(bytes("-1Mi"), None);
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
