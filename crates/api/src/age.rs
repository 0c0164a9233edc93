//! How long ago something happened, written the way kubectl's AGE column writes it.

/// `5s`, `3m20s`, `50m`, `4h10m`, `20h`, `3d2h`, `400d`.
pub fn human_age(seconds: i64) -> String {
    let s = seconds.max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10800 => format!("{}m", s / 60),
        10800..28800 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        28800..172800 => format!("{}h", s / 3600),
        172800..2592000 => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
        _ => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(human_age(-3), "0s");
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(200), "3m20s");
        assert_eq!(human_age(3000), "50m");
        assert_eq!(human_age(4 * 3600 + 600), "4h10m");
        assert_eq!(human_age(3 * 86400 + 7200), "3d2h");
        assert_eq!(human_age(400 * 86400), "400d");
    }
}
