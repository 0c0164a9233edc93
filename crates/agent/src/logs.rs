//! Container logs as the API serves them (`GET .../pods/{name}/log`): `container`, `follow`,
//! `tailLines`, `previous`, `sinceSeconds`, `sinceTime`, `timestamps` and `limitBytes`, read from
//! the CRI-format files the process runtime writes (see `crilog`).

use std::collections::HashMap;
use std::io::SeekFrom;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use shepherd_api::ApiError;
use jiff::Timestamp;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::crilog;

use crate::pods::PodManager;
use crate::runtime::ContainerId;

/// A stream of log bytes.
pub type LogStream = BoxStream<'static, Result<Bytes, std::io::Error>>;

/// Serves the logs of the pods run by one agent. Cheap to clone.
#[derive(Clone)]
pub struct PodLogs {
    pub(crate) managers: Vec<Weak<PodManager>>,
}

/// The query parameters of a log request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogQuery {
    pub container: Option<String>,
    pub follow: bool,
    pub tail_lines: Option<usize>,
    pub previous: bool,
    /// Only records written at or after this time.
    pub since: Option<Timestamp>,
    /// Each line starts with the time it was written.
    pub timestamps: bool,
    /// The response ends after this many bytes.
    pub limit_bytes: Option<u64>,
}

impl LogQuery {
    /// Reads `container`, `follow`, `tailLines` and `previous` from a request's query string.
    pub fn from_query(q: &HashMap<String, String>) -> Result<Self, ApiError> {
        let flag = |name: &str| -> Result<bool, ApiError> {
            match q.get(name).map(String::as_str) {
                None | Some("false") | Some("0") => Ok(false),
                Some("true") | Some("1") | Some("") => Ok(true),
                Some(other) => Err(ApiError::BadRequest(format!("{name} must be true or false, not {other:?}"))),
            }
        };
        let tail_lines = match q.get("tailLines") {
            None => None,
            Some(t) => Some(t.parse::<usize>().map_err(|_| ApiError::BadRequest(format!("tailLines must be a whole number, not {t:?}")))?),
        };
        let positive = |name: &str| -> Result<Option<u64>, ApiError> {
            match q.get(name) {
                None => Ok(None),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Some(n)),
                    _ => Err(ApiError::BadRequest(format!("{name} must be a positive whole number, not {v:?}"))),
                },
            }
        };
        let since = match (positive("sinceSeconds")?, q.get("sinceTime")) {
            (Some(_), Some(_)) => {
                return Err(ApiError::BadRequest("at most one of sinceTime or sinceSeconds may be specified".into()));
            }
            (Some(secs), None) => {
                let back = jiff::SignedDuration::from_secs(i64::try_from(secs).unwrap_or(i64::MAX));
                Some(Timestamp::now().checked_sub(back).unwrap_or(Timestamp::MIN))
            }
            (None, Some(t)) => Some(
                t.parse::<Timestamp>()
                    .map_err(|_| ApiError::BadRequest(format!("sinceTime must be an RFC 3339 time, not {t:?}")))?,
            ),
            (None, None) => None,
        };
        Ok(LogQuery {
            container: q.get("container").filter(|c| !c.is_empty()).cloned(),
            follow: flag("follow")?,
            tail_lines,
            previous: flag("previous")?,
            since,
            timestamps: flag("timestamps")?,
            limit_bytes: positive("limitBytes")?,
        })
    }
}

fn last_lines(data: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let mut count = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            count += 1;
            if count == n {
                return &data[i + 1..];
            }
        }
    }
    data
}

impl PodLogs {
    /// The logs of one container of `namespace/pod`.
    pub async fn logs(&self, namespace: &str, pod: &str, query: &LogQuery) -> Result<LogStream, ApiError> {
        let key = format!("{namespace}/{pod}");
        let not_found = || ApiError::NotFound {
            kind: "pods".into(),
            name: pod.into(),
            message: format!("pods \"{pod}\" not found on this agent (or not started yet)"),
        };
        let mut found = None;
        for m in self.managers.iter().filter_map(Weak::upgrade) {
            if let Some(c) = m.containers_of(&key).await {
                found = Some((m, c));
                break;
            }
        }
        let (manager, (uid, names)) = found.ok_or_else(not_found)?;
        let name = match (&query.container, names.as_slice()) {
            (Some(c), _) if names.contains(c) => c.clone(),
            (Some(c), _) => {
                return Err(ApiError::BadRequest(format!("container {c} is not valid for pod {pod}; choose one of: [{}]", names.join(" "))));
            }
            (None, [only]) => only.clone(),
            (None, _) => {
                return Err(ApiError::BadRequest(format!(
                    "a container name must be specified for pod {pod}, choose one of: [{}]",
                    names.join(" ")
                )));
            }
        };
        let id = ContainerId { pod_key: key.clone(), pod_uid: uid, name: name.clone() };
        let files = manager
            .runtime()
            .log_files(&id)
            .ok_or_else(|| ApiError::BadRequest("this node's runtime keeps no container logs (simulated)".into()))?;
        let mut render = Renderer::new(query);
        if query.previous {
            let data = tokio::fs::read(&files.previous).await.map_err(|_| {
                ApiError::BadRequest(format!("previous terminated container \"{name}\" in pod \"{pod}\" not found"))
            })?;
            let data = match query.tail_lines {
                Some(n) => last_lines(&data, n),
                None => &data,
            };
            let out = render.all(data);
            return Ok(stream::once(async move { Ok(Bytes::from(out)) }).boxed());
        }
        let mut data = tokio::fs::read(&files.rotated).await.unwrap_or_default();
        let current = tokio::fs::read(&files.current).await.unwrap_or_default();
        data.extend_from_slice(&current);
        // A record still being written stays for the follower to finish.
        let complete = if query.follow { data.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1) } else { data.len() };
        let offset = (current.len() as u64).saturating_sub((data.len() - complete) as u64);
        let shown = match query.tail_lines {
            Some(n) => last_lines(&data[..complete], n),
            None => &data[..complete],
        };
        let out = render.all(shown);
        let done = render.exhausted();
        let first = stream::once(async move { Ok(Bytes::from(out)) });
        if !query.follow || done {
            return Ok(first.boxed());
        }
        // Follow: poll the file for growth while the pod is still on this agent.
        let weak = Arc::downgrade(&manager);
        let path = files.current.clone();
        let rest = stream::unfold((offset, weak, key, render), move |(mut offset, weak, key, mut render)| {
            let path = path.clone();
            async move {
                loop {
                    if render.exhausted() {
                        return None;
                    }
                    let m = weak.upgrade()?;
                    m.containers_of(&key).await?;
                    drop(m);
                    let len = tokio::fs::metadata(&path).await.map(|m| m.len()).unwrap_or(0);
                    if len < offset {
                        offset = 0; // rotated: the file was truncated
                    }
                    if len > offset {
                        let mut buf = Vec::new();
                        let read = async {
                            let mut f = tokio::fs::File::open(&path).await?;
                            f.seek(SeekFrom::Start(offset)).await?;
                            (&mut f).take(len - offset).read_to_end(&mut buf).await
                        };
                        match read.await {
                            Ok(_) => {
                                // Whole records only; a partly written one is read again next time.
                                let whole = buf.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
                                offset += whole as u64;
                                let out = render.all(&buf[..whole]);
                                if !out.is_empty() {
                                    return Some((Ok(Bytes::from(out)), (offset, weak, key, render)));
                                }
                            }
                            Err(e) => return Some((Err(e), (offset, weak, key, render))),
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        Ok(first.chain(rest).boxed())
    }
}

/// Turns log file records into what the client asked for: the text, with or without times, from
/// a point in time, up to a byte limit.
pub(crate) struct Renderer {
    since: Option<Timestamp>,
    timestamps: bool,
    /// Bytes still allowed; `None` for no limit.
    left: Option<u64>,
    /// The next record starts a line (the previous one was not a piece of a longer line).
    line_start: bool,
}

impl Renderer {
    pub(crate) fn new(q: &LogQuery) -> Self {
        Renderer { since: q.since, timestamps: q.timestamps, left: q.limit_bytes, line_start: true }
    }

    /// The byte limit has been reached: nothing more will be written.
    pub(crate) fn exhausted(&self) -> bool {
        self.left == Some(0)
    }

    /// Renders the records in `data` (whole lines; a last line without a newline counts as one).
    pub(crate) fn all(&mut self, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len());
        let body = data.strip_suffix(b"\n").unwrap_or(data);
        if data.is_empty() {
            return out;
        }
        for line in body.split(|b| *b == b'\n') {
            let rec = crilog::parse_line(line);
            if let (Some(since), Some(t)) = (self.since, rec.time)
                && t < since
            {
                continue;
            }
            if self.timestamps
                && self.line_start
                && let Some(t) = rec.time
            {
                out.extend_from_slice(t.to_string().as_bytes());
                out.push(b' ');
            }
            let mut text: &[u8] = &rec.text;
            if !data.ends_with(b"\n") && rec.time.is_none() && std::ptr::eq(line.as_ptr_range().end, body.as_ptr_range().end) {
                // A plain last line without its newline stays without one.
                text = &text[..text.len() - 1];
            }
            out.extend_from_slice(text);
            self.line_start = !rec.partial;
        }
        if let Some(left) = &mut self.left {
            let keep = out.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
            out.truncate(keep);
            *left -= keep as u64;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_lines_keeps_the_last_lines_with_or_without_a_final_newline() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(last_lines(b"a\n", 0), b"");
    }

    #[test]
    fn log_queries_read_kubernetes_parameters() {
        let q: HashMap<String, String> =
            [("container", "web"), ("follow", "true"), ("tailLines", "10")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        let parsed = LogQuery::from_query(&q).expect("valid query");
        assert_eq!(
            parsed,
            LogQuery { container: Some("web".into()), follow: true, tail_lines: Some(10), ..Default::default() }
        );
        for bad in [("tailLines", "x"), ("limitBytes", "0"), ("sinceSeconds", "-1"), ("sinceTime", "yesterday")] {
            let q: HashMap<String, String> = [(bad.0.to_string(), bad.1.to_string())].into();
            let err = LogQuery::from_query(&q).expect_err("refused");
            assert!(err.to_string().contains(bad.0), "{err}");
        }
        let both: HashMap<String, String> =
            [("sinceSeconds", "5"), ("sinceTime", "2026-01-01T00:00:00Z")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        assert!(LogQuery::from_query(&both).is_err());
    }

    const FILE: &[u8] = b"plain line from an older agent\n\
        2026-11-30T10:00:00.5Z stdout F early\n\
        2026-11-30T11:00:00Z stderr P half \n\
        2026-11-30T11:00:01Z stderr F and the rest\n\
        2026-11-30T12:00:00Z stdout F late\n";

    #[test]
    fn records_render_as_text_joining_pieces_of_long_lines() {
        let out = Renderer::new(&LogQuery::default()).all(FILE);
        assert_eq!(String::from_utf8_lossy(&out), "plain line from an older agent\nearly\nhalf and the rest\nlate\n");
    }

    #[test]
    fn timestamps_start_each_line_with_the_time_it_was_written() {
        let out = Renderer::new(&LogQuery { timestamps: true, ..Default::default() }).all(FILE);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "plain line from an older agent\n2026-11-30T10:00:00.5Z early\n2026-11-30T11:00:00Z half and the rest\n\
             2026-11-30T12:00:00Z late\n"
        );
    }

    #[test]
    fn since_drops_older_records_and_limit_bytes_cuts_the_output() {
        let since = "2026-11-30T10:30:00Z".parse().expect("time");
        let out = Renderer::new(&LogQuery { since: Some(since), ..Default::default() }).all(FILE);
        assert_eq!(String::from_utf8_lossy(&out), "plain line from an older agent\nhalf and the rest\nlate\n");
        let mut r = Renderer::new(&LogQuery { limit_bytes: Some(12), ..Default::default() });
        assert_eq!(r.all(FILE), b"plain line f");
        assert!(r.exhausted());
        assert_eq!(r.all(FILE), b"");
    }
}
