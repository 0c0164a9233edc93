//! The part of SPDY/3.1 that kubectl speaks for exec, attach, cp and port-forward: frames
//! (SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE, DATA) and
//! header blocks compressed with zlib and SPDY/3's preset dictionary, one compression context per
//! direction for the whole connection.
//!
//! Flow control is not enforced: the Go implementation on the other end neither sends nor honours
//! WINDOW_UPDATE, and the channels above apply back-pressure through the socket.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

const VERSION: u16 = 3;
pub(crate) const FLAG_FIN: u8 = 0x01;
/// Largest frame accepted; kubectl's data frames stay far below it.
const MAX_FRAME: usize = 1024 * 1024;
/// Largest header block after decompression.
const MAX_HEADER_BLOCK: usize = 256 * 1024;
/// Data frames this side sends are cut to this size.
pub(crate) const MAX_DATA_CHUNK: usize = 32 * 1024;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status: the stream was cancelled.
pub(crate) const CANCEL: u32 = 5;

/// One SPDY frame; header blocks decoded into (lower-case name, value) pairs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Frame {
    SynStream { stream_id: u32, flags: u8, headers: Vec<(String, String)> },
    SynReply { stream_id: u32, flags: u8, headers: Vec<(String, String)> },
    RstStream { stream_id: u32, status: u32 },
    Settings,
    Ping { id: u32 },
    GoAway { last_good: u32, status: u32 },
    Headers { stream_id: u32, flags: u8, headers: Vec<(String, String)> },
    WindowUpdate { stream_id: u32, delta: u32 },
    Data { stream_id: u32, flags: u8, data: Bytes },
    /// A control frame of a type this side ignores.
    Other(u16),
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SpdyError {
    #[error("SPDY frame of {0} bytes is larger than allowed")]
    TooLarge(usize),
    #[error("SPDY version {0} is not supported (only 3)")]
    Version(u16),
    #[error("malformed SPDY frame: {0}")]
    Malformed(&'static str),
    #[error("SPDY header compression failed: {0}")]
    Zlib(String),
}

/// SPDY/3's zlib dictionary (draft-mbelshe-httpbis-spdy-00, section 2.6.10.1): length-prefixed
/// header words, then a run of common values.
fn dictionary() -> &'static [u8] {
    static DICT: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DICT.get_or_init(|| {
        const WORDS: [&str; 65] = [
            "options", "head", "post", "put", "delete", "trace", "accept", "accept-charset", "accept-encoding",
            "accept-language", "accept-ranges", "age", "allow", "authorization", "cache-control", "connection",
            "content-base", "content-encoding", "content-language", "content-length", "content-location",
            "content-md5", "content-range", "content-type", "date", "etag", "expect", "expires", "from", "host",
            "if-match", "if-modified-since", "if-none-match", "if-range", "if-unmodified-since", "last-modified",
            "location", "max-forwards", "pragma", "proxy-authenticate", "proxy-authorization", "range", "referer",
            "retry-after", "server", "te", "trailer", "transfer-encoding", "upgrade", "user-agent", "vary", "via",
            "warning", "www-authenticate", "method", "get", "status", "200 OK", "version", "HTTP/1.1", "url",
            "public", "set-cookie", "keep-alive", "origin",
        ];
        const TAIL: &str = concat!(
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
            "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized",
            "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable",
            "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
            "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,",
            "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        );
        let mut d = Vec::with_capacity(1500);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// Decodes frames from a byte stream (one direction of a connection).
pub(crate) struct Decoder {
    inflate: Decompress,
}

/// Encodes frames into a byte stream (the other direction).
pub(crate) struct Encoder {
    deflate: Compress,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder { inflate: Decompress::new(true) }
    }
}

impl Default for Encoder {
    fn default() -> Self {
        let mut deflate = Compress::new(Compression::default(), true);
        // Only fails for a stream already started.
        let _ = deflate.set_dictionary(dictionary());
        Encoder { deflate }
    }
}

fn u31(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff
}

fn u32_at(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl Decoder {
    /// Takes one whole frame off the front of `buf`, or `None` when more bytes are needed.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, SpdyError> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let len = (usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]);
        if len > MAX_FRAME {
            return Err(SpdyError::TooLarge(len));
        }
        if buf.len() < 8 + len {
            buf.reserve(8 + len - buf.len());
            return Ok(None);
        }
        let head = buf.split_to(8);
        let body = buf.split_to(len).freeze();
        let flags = head[4];
        if head[0] & 0x80 == 0 {
            return Ok(Some(Frame::Data { stream_id: u31(&head[..4]), flags, data: body }));
        }
        let version = u16::from_be_bytes([head[0], head[1]]) & 0x7fff;
        if version != VERSION {
            return Err(SpdyError::Version(version));
        }
        let kind = u16::from_be_bytes([head[2], head[3]]);
        let need = |n: usize| if body.len() < n { Err(SpdyError::Malformed("control frame too short")) } else { Ok(()) };
        let frame = match kind {
            SYN_STREAM => {
                need(10)?;
                Frame::SynStream { stream_id: u31(&body), flags, headers: self.headers(&body[10..])? }
            }
            SYN_REPLY => {
                need(4)?;
                Frame::SynReply { stream_id: u31(&body), flags, headers: self.headers(&body[4..])? }
            }
            HEADERS => {
                need(4)?;
                Frame::Headers { stream_id: u31(&body), flags, headers: self.headers(&body[4..])? }
            }
            RST_STREAM => {
                need(8)?;
                Frame::RstStream { stream_id: u31(&body), status: u32_at(&body[4..]) }
            }
            SETTINGS => Frame::Settings,
            PING => {
                need(4)?;
                Frame::Ping { id: u32_at(&body) }
            }
            GOAWAY => {
                need(8)?;
                Frame::GoAway { last_good: u31(&body), status: u32_at(&body[4..]) }
            }
            WINDOW_UPDATE => {
                need(8)?;
                Frame::WindowUpdate { stream_id: u31(&body), delta: u31(&body[4..]) }
            }
            other => Frame::Other(other),
        };
        Ok(Some(frame))
    }

    fn headers(&mut self, compressed: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
        let mut out = Vec::with_capacity(compressed.len() * 4 + 64);
        let mut pos = 0;
        loop {
            if out.len() == out.capacity() {
                if out.len() >= MAX_HEADER_BLOCK {
                    return Err(SpdyError::TooLarge(out.len()));
                }
                out.reserve(4096);
            }
            let before = self.inflate.total_in();
            match self.inflate.decompress_vec(&compressed[pos..], &mut out, FlushDecompress::Sync) {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.inflate.set_dictionary(dictionary()).map_err(|e| SpdyError::Zlib(e.to_string()))?;
                }
                Err(e) => return Err(SpdyError::Zlib(e.to_string())),
            }
            pos += (self.inflate.total_in() - before) as usize;
            if pos >= compressed.len() && out.len() < out.capacity() {
                break;
            }
        }
        parse_header_block(&out)
    }
}

fn parse_header_block(mut b: &[u8]) -> Result<Vec<(String, String)>, SpdyError> {
    let bad = SpdyError::Malformed("header block");
    let take = |b: &mut &[u8]| -> Result<String, SpdyError> {
        if b.len() < 4 {
            return Err(SpdyError::Malformed("header block"));
        }
        let n = u32_at(b) as usize;
        b.advance(4);
        if b.len() < n {
            return Err(SpdyError::Malformed("header block"));
        }
        let s = String::from_utf8_lossy(&b[..n]).into_owned();
        b.advance(n);
        Ok(s)
    };
    if b.len() < 4 {
        return Err(bad);
    }
    let count = u32_at(b);
    b.advance(4);
    let mut out = Vec::new();
    for _ in 0..count {
        let name = take(&mut b)?.to_ascii_lowercase();
        let value = take(&mut b)?;
        for v in value.split('\0') {
            out.push((name.clone(), v.to_string()));
        }
    }
    Ok(out)
}

impl Encoder {
    /// Appends `frame` to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), SpdyError> {
        let control = |out: &mut BytesMut, kind: u16, flags: u8, body: &[u8]| {
            out.put_u16(0x8000 | VERSION);
            out.put_u16(kind);
            out.put_u32((u32::from(flags) << 24) | body.len() as u32);
            out.put_slice(body);
        };
        match frame {
            Frame::Data { stream_id, flags, data } => {
                out.put_u32(stream_id & 0x7fff_ffff);
                out.put_u32((u32::from(*flags) << 24) | data.len() as u32);
                out.put_slice(data);
            }
            Frame::SynStream { stream_id, flags, headers } => {
                let mut body = Vec::new();
                body.extend_from_slice(&stream_id.to_be_bytes());
                body.extend_from_slice(&0u32.to_be_bytes());
                body.extend_from_slice(&[0, 0]);
                body.extend_from_slice(&self.headers(headers)?);
                control(out, SYN_STREAM, *flags, &body);
            }
            Frame::SynReply { stream_id, flags, headers } | Frame::Headers { stream_id, flags, headers } => {
                let kind = if matches!(frame, Frame::SynReply { .. }) { SYN_REPLY } else { HEADERS };
                let mut body = stream_id.to_be_bytes().to_vec();
                body.extend_from_slice(&self.headers(headers)?);
                control(out, kind, *flags, &body);
            }
            Frame::RstStream { stream_id, status } => {
                control(out, RST_STREAM, 0, &[stream_id.to_be_bytes(), status.to_be_bytes()].concat());
            }
            Frame::Settings => control(out, SETTINGS, 0, &0u32.to_be_bytes()),
            Frame::Ping { id } => control(out, PING, 0, &id.to_be_bytes()),
            Frame::GoAway { last_good, status } => {
                control(out, GOAWAY, 0, &[last_good.to_be_bytes(), status.to_be_bytes()].concat());
            }
            Frame::WindowUpdate { stream_id, delta } => {
                control(out, WINDOW_UPDATE, 0, &[stream_id.to_be_bytes(), delta.to_be_bytes()].concat());
            }
            Frame::Other(_) => {}
        }
        Ok(())
    }

    fn headers(&mut self, headers: &[(String, String)]) -> Result<Vec<u8>, SpdyError> {
        let mut block = Vec::new();
        block.extend_from_slice(&(headers.len() as u32).to_be_bytes());
        for (k, v) in headers {
            block.extend_from_slice(&(k.len() as u32).to_be_bytes());
            block.extend_from_slice(k.to_ascii_lowercase().as_bytes());
            block.extend_from_slice(&(v.len() as u32).to_be_bytes());
            block.extend_from_slice(v.as_bytes());
        }
        let mut out = Vec::with_capacity(block.len() + 64);
        let mut pos = 0;
        loop {
            if out.len() == out.capacity() {
                out.reserve(1024);
            }
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&block[pos..], &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Zlib(e.to_string()))?;
            pos += (self.deflate.total_in() - before) as usize;
            if pos >= block.len() && out.len() < out.capacity() {
                break;
            }
        }
        Ok(out)
    }
}

/// The value of header `name` in a decoded header block.
pub(crate) fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(frames: &[Frame]) -> Vec<Frame> {
        let mut enc = Encoder::default();
        let mut dec = Decoder::default();
        let mut wire = BytesMut::new();
        for f in frames {
            enc.encode(f, &mut wire).expect("encodes");
        }
        let mut out = Vec::new();
        // Feed the bytes in small pieces, as a socket would.
        let mut buf = BytesMut::new();
        for chunk in wire.chunks(7) {
            buf.extend_from_slice(chunk);
            while let Some(f) = dec.decode(&mut buf).expect("decodes") {
                out.push(f);
            }
        }
        out
    }

    #[test]
    fn frames_survive_encoding_and_decoding_across_one_compression_context() {
        let h = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let frames = vec![
            Frame::SynStream { stream_id: 1, flags: 0, headers: h(&[("streamtype", "error")]) },
            Frame::SynStream { stream_id: 3, flags: FLAG_FIN, headers: h(&[("streamtype", "stdout"), ("port", "8080")]) },
            Frame::SynReply { stream_id: 1, flags: 0, headers: vec![] },
            Frame::Data { stream_id: 3, flags: FLAG_FIN, data: Bytes::from_static(b"hello") },
            Frame::Headers { stream_id: 3, flags: 0, headers: h(&[("a", "b")]) },
            Frame::RstStream { stream_id: 5, status: CANCEL },
            Frame::Ping { id: 7 },
            Frame::GoAway { last_good: 3, status: 0 },
            Frame::WindowUpdate { stream_id: 0, delta: 65536 },
        ];
        assert_eq!(roundtrip(&frames), frames);
    }

    #[test]
    fn header_blocks_use_the_spdy3_dictionary() {
        // A block compressed by a peer using the dictionary cannot be read without it.
        let mut enc = Encoder::default();
        let mut wire = BytesMut::new();
        enc.encode(&Frame::SynReply { stream_id: 1, flags: 0, headers: vec![("content-type".into(), "text/plain".into())] }, &mut wire)
            .expect("encodes");
        let compressed = &wire[12..];
        let mut plain = Decompress::new(true);
        let mut out = Vec::with_capacity(256);
        let err = plain.decompress_vec(compressed, &mut out, FlushDecompress::Sync).expect_err("needs the dictionary");
        let id = err.needs_dictionary().expect("asks for a dictionary");
        // The dictionary id is the Adler-32 of SPDY/3's dictionary.
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in dictionary() {
            a = (a + u32::from(byte)) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!(id, (b << 16) | a);
        assert_eq!(dictionary().len(), 1423);
    }

    #[test]
    fn an_oversized_or_foreign_version_frame_is_refused() {
        let mut dec = Decoder::default();
        let mut buf = BytesMut::from(&[0x80, 0x02, 0x00, 0x06, 0x00, 0x00, 0x00, 0x04, 0, 0, 0, 1][..]);
        assert!(matches!(dec.decode(&mut buf), Err(SpdyError::Version(2))));
        let mut buf = BytesMut::from(&[0x00, 0x00, 0x00, 0x01, 0x00, 0xff, 0xff, 0xff][..]);
        assert!(matches!(dec.decode(&mut buf), Err(SpdyError::TooLarge(_))));
    }
}
