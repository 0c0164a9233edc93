//! Reads the resource quantities the agent needs: memory in bytes, cpu in millicores.

/// `128Mi`, `1G`, `1e9`, `512` to bytes; `None` when unreadable.
pub(crate) fn bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| c.is_ascii_alphabetic() && c != 'e').unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match suffix {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "m" => 1e-3,
        _ => return None,
    };
    let v = n * mult;
    (v.is_finite() && v >= 0.0).then_some(v.ceil() as u64)
}

/// `500m`, `2`, `0.5` to millicores.
pub(crate) fn millicores(q: &str) -> Option<u64> {
    let q = q.trim();
    let v = match q.strip_suffix('m') {
        Some(m) => m.parse::<f64>().ok()?,
        None => q.parse::<f64>().ok()? * 1000.0,
    };
    (v.is_finite() && v >= 0.0).then_some(v.ceil() as u64)
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
        assert_eq!(bytes("lots"), None);
    }

    #[test]
    fn cpu_quantities_read_as_millicores() {
        assert_eq!(millicores("500m"), Some(500));
        assert_eq!(millicores("2"), Some(2000));
        assert_eq!(millicores("0.25"), Some(250));
        assert_eq!(millicores("x"), None);
    }
}
