//! Reads container log files in the CRI format, one record per line: `<RFC 3339 time> <stdout|stderr>
//! <F|P> <text>`, `P` marking a piece of a longer line (the shim writes them, see `shepherd_shim`);
//! plain lines of files written before records had timestamps are read too.

use jiff::Timestamp;

/// One record read back from a log file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Record<'a> {
    /// `None` for a line of a file written before records had timestamps.
    pub time: Option<Timestamp>,
    /// The text, with its newline unless the record is a piece of a longer line.
    pub text: std::borrow::Cow<'a, [u8]>,
    pub partial: bool,
}

/// Parses one line (without its newline) of a log file.
pub(crate) fn parse_line(line: &[u8]) -> Record<'_> {
    let plain = || {
        let mut t = line.to_vec();
        t.push(b'\n');
        Record { time: None, text: t.into(), partial: false }
    };
    let mut parts = line.splitn(4, |b| *b == b' ');
    let (Some(time), Some(stream), Some(tag)) = (parts.next(), parts.next(), parts.next()) else { return plain() };
    let rest = parts.next().unwrap_or(b"");
    if !matches!(stream, b"stdout" | b"stderr") || !matches!(tag, b"F" | b"P") {
        return plain();
    }
    let Some(time) = std::str::from_utf8(time).ok().and_then(|t| t.parse::<Timestamp>().ok()) else { return plain() };
    let partial = tag == b"P";
    let text = if partial {
        rest.into()
    } else {
        let mut t = rest.to_vec();
        t.push(b'\n');
        t.into()
    };
    Record { time: Some(time), text, partial }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_plain_lines_are_read_back() {
        let r = parse_line(b"2026-11-30T16:43:13.000000005Z stdout F hello world");
        assert_eq!(&r.text[..], b"hello world\n");
        assert!(!r.partial && r.time.is_some());
        let p = parse_line(b"2026-11-30T16:43:13.000000005Z stderr P piece");
        assert_eq!(&p.text[..], b"piece");
        assert!(p.partial);
        let old = parse_line(b"written before timestamps");
        assert_eq!(&old.text[..], b"written before timestamps\n");
        assert_eq!(old.time, None);
        let empty = parse_line(b"2026-11-30T16:43:13Z stdout F ");
        assert_eq!(&empty.text[..], b"\n");
    }
}
