//! Durations as Kubernetes writes them (Go's syntax, as in flags and `metav1.Duration`): `90s`, `10m`, `1h30m`.

use std::time::Duration;

/// Parses a Go-style duration: one or more `<number><unit>` with units ns, us, ms, s, m, h.
pub fn parse(text: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {text:?}: expected a number and a unit, e.g. 30s, 10m, 1h or 1h30m");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(invalid());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(invalid)?;
        let value: f64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        rest = &rest[unit_len..];
        total += Duration::try_from_secs_f64(value * seconds).map_err(|_| invalid())?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_kubernetes_flags_write_them() {
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn durations_without_a_known_unit_are_refused_with_an_example() {
        for bad in ["", "5", "5x", "h", "-1s", "1h 30m"] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains("e.g. 30s"), "{e}");
        }
    }
}
