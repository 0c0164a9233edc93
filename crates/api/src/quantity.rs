//! Kubernetes resource quantities (`100m`, `0.5`, `128Mi`, `1e3`), parsed exactly.
//!
//! The one reading of quantities for every crate: what validation accepts is what the scheduler
//! counts, what the autoscaler averages and what the agent writes into cgroup limits.

use std::borrow::Cow;

use serde_json::Value;

/// A quantity as `mantissa * 10^exp10 * 2^exp2`, so `0.1` CPU is exactly 100 millicores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    negative: bool,
    mantissa: u128,
    exp10: i32,
    exp2: u32,
}

/// More significant digits than this cannot be scaled without overflowing `i128`.
const MAX_DIGITS: usize = 30;

impl Quantity {
    pub fn parse(s: &str) -> Result<Quantity, String> {
        let bad = || format!("quantity \"{s}\" must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'");
        let (negative, body) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let num_len = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
        let (number, suffix) = body.split_at(num_len);
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(bad());
        }
        let (exp10, exp2): (i32, u32) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 10),
            "Mi" => (0, 20),
            "Gi" => (0, 30),
            "Ti" => (0, 40),
            "Pi" => (0, 50),
            "Ei" => (0, 60),
            _ => {
                let exp = suffix.strip_prefix(['e', 'E']).ok_or_else(bad)?;
                let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 4 {
                    return Err(bad());
                }
                (exp.parse::<i32>().map_err(|_| bad())?, 0)
            }
        };
        let digits = format!("{int_part}{frac_part}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > MAX_DIGITS {
            return Err(format!("quantity \"{s}\" has too many significant digits"));
        }
        let mantissa = if digits.is_empty() { 0 } else { digits.parse::<u128>().map_err(|_| bad())? };
        let frac_len = i32::try_from(frac_part.len()).map_err(|_| bad())?;
        Ok(Quantity { negative, mantissa, exp10: exp10 - frac_len, exp2 })
    }

    pub fn is_negative(&self) -> bool {
        self.negative && self.mantissa != 0
    }

    pub fn is_positive(&self) -> bool {
        !self.negative && self.mantissa != 0
    }

    /// The value in units of `10^-scale`, rounded up (Kubernetes rounds `0.0001` CPU up to `1m`).
    pub fn scaled_ceil(self, scale: i32) -> Result<i128, String> {
        let too_large = || "quantity is too large".to_string();
        if self.mantissa == 0 {
            return Ok(0);
        }
        let mut n = i128::try_from(self.mantissa).map_err(|_| too_large())?;
        n = n.checked_mul(1i128.checked_shl(self.exp2).ok_or_else(too_large)?).ok_or_else(too_large)?;
        let exp = self.exp10 + scale;
        let magnitude = if exp >= 0 {
            let factor = 10i128.checked_pow(u32::try_from(exp).map_err(|_| too_large())?).ok_or_else(too_large)?;
            n.checked_mul(factor).ok_or_else(too_large)?
        } else {
            match 10i128.checked_pow(exp.unsigned_abs()) {
                // The divisor exceeds any representable mantissa: a positive remainder rounds up to 1.
                None => 1,
                Some(div) => n / div + i128::from(n % div != 0),
            }
        };
        Ok(if self.negative { -magnitude } else { magnitude })
    }
}

/// The text of a quantity given as a JSON string or number (`"500m"`, `2`, `0.5`).
pub fn text(v: &Value) -> Option<Cow<'_, str>> {
    match v {
        Value::String(s) => Some(Cow::Borrowed(s)),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        _ => None,
    }
}

/// A CPU quantity in millicores, rounded up (`0.5` and `500m` are 500); negatives are an error.
pub fn cpu_millis(s: &str) -> Result<i64, String> {
    non_negative_scaled(s, 3)
}

/// A memory quantity (or any count) in whole units, rounded up (`128Mi` is 134217728, `1G` is 10^9);
/// negatives are an error, and so is a value beyond `i64`, as Kubernetes stores it.
pub fn memory_bytes(s: &str) -> Result<i64, String> {
    non_negative_scaled(s, 0)
}

fn non_negative_scaled(s: &str, scale: i32) -> Result<i64, String> {
    let q = Quantity::parse(s)?;
    if q.is_negative() {
        return Err("must be greater than or equal to 0".into());
    }
    let v = q.scaled_ceil(scale)?;
    i64::try_from(v).map_err(|_| format!("quantity \"{s}\" is too large"))
}

/// A quantity in thousandths of its unit, rounded up: `250m` CPU is 250, `1Ki` bytes is 1,024,000.
pub fn milli_value(s: &str) -> Result<i128, String> {
    Quantity::parse(s.trim())?.scaled_ceil(3)
}

/// A quantity in whole units, rounded up: `128Mi` is 134,217,728, `1500m` is 2.
pub fn value(s: &str) -> Result<i128, String> {
    Quantity::parse(s.trim())?.scaled_ceil(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_scale_exactly_without_float_rounding() {
        let q = Quantity::parse("0.1").unwrap();
        assert_eq!(q.scaled_ceil(3), Ok(100));
        assert_eq!(Quantity::parse("1.1").unwrap().scaled_ceil(3), Ok(1100));
    }

    #[test]
    fn whole_values_round_up_and_read_every_suffix() {
        assert_eq!(value("128Mi"), Ok(128 << 20));
        assert_eq!(value("1Pi"), Ok(1 << 50));
        assert_eq!(value("2E"), Ok(2_000_000_000_000_000_000));
        assert_eq!(value("1500m"), Ok(2));
        assert_eq!(value("1.5e3"), Ok(1500));
        assert_eq!(milli_value("1.1"), Ok(1100), "no float rounding: 1.1 CPU is 1100m, not 1101m");
        assert_eq!(milli_value("500000u"), Ok(500));
    }

    #[test]
    fn garbage_is_rejected() {
        for s in ["", ".", "1..2", "abc", "1K", "1 Mi", "1e", "1e+", "Mi", "1.2.3", "--1", "1e99999"] {
            assert!(Quantity::parse(s).is_err(), "{s:?}");
        }
    }

    #[test]
    fn quantities_convert_the_way_the_scheduler_counts_them() {
        assert_eq!(cpu_millis("100m"), Ok(100));
        assert_eq!(cpu_millis("0.5"), Ok(500));
        assert_eq!(cpu_millis("0.1"), Ok(100));
        assert_eq!(cpu_millis("2"), Ok(2000));
        assert_eq!(cpu_millis("0.0001"), Ok(1), "rounded up like Kubernetes");
        assert_eq!(cpu_millis("1k"), Ok(1_000_000));
        assert_eq!(memory_bytes("128Mi"), Ok(128 * 1024 * 1024));
        assert_eq!(memory_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(memory_bytes("1e3"), Ok(1000));
        assert_eq!(memory_bytes("1.5Ki"), Ok(1536));
        assert_eq!(memory_bytes("4096"), Ok(4096));
        assert_eq!(memory_bytes("1Ei"), Ok(1 << 60));
        assert!(memory_bytes("16Ei").is_err(), "does not fit in i64");
        assert!(cpu_millis("-1").is_err());
        assert!(memory_bytes("1MB").is_err());
    }
}
