//! Container logs as the API serves them (`GET .../pods/{name}/log`): `container`, `follow`,
//! `tailLines` and `previous`, read from the files the process runtime writes.

use std::collections::HashMap;
use std::io::SeekFrom;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use shepherd_api::ApiError;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

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
        Ok(LogQuery {
            container: q.get("container").filter(|c| !c.is_empty()).cloned(),
            follow: flag("follow")?,
            tail_lines,
            previous: flag("previous")?,
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
        if query.previous {
            let data = tokio::fs::read(&files.previous).await.map_err(|_| {
                ApiError::BadRequest(format!("previous terminated container \"{name}\" in pod \"{pod}\" not found"))
            })?;
            let out = match query.tail_lines {
                Some(n) => last_lines(&data, n).to_vec(),
                None => data,
            };
            return Ok(stream::once(async move { Ok(Bytes::from(out)) }).boxed());
        }
        let mut data = tokio::fs::read(&files.rotated).await.unwrap_or_default();
        let current = tokio::fs::read(&files.current).await.unwrap_or_default();
        let offset = current.len() as u64;
        data.extend_from_slice(&current);
        let out = match query.tail_lines {
            Some(n) => last_lines(&data, n).to_vec(),
            None => data,
        };
        let first = stream::once(async move { Ok(Bytes::from(out)) });
        if !query.follow {
            return Ok(first.boxed());
        }
        // Follow: poll the file for growth while the pod is still on this agent.
        let weak = Arc::downgrade(&manager);
        let path = files.current.clone();
        let rest = stream::unfold((offset, weak, key), move |(mut offset, weak, key)| {
            let path = path.clone();
            async move {
                loop {
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
                            f.read_to_end(&mut buf).await
                        };
                        match read.await {
                            Ok(n) => {
                                offset += n as u64;
                                return Some((Ok(Bytes::from(buf)), (offset, weak, key)));
                            }
                            Err(e) => return Some((Err(e), (offset, weak, key))),
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        Ok(first.chain(rest).boxed())
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
        assert_eq!(parsed, LogQuery { container: Some("web".into()), follow: true, tail_lines: Some(10), previous: false });
        let bad: HashMap<String, String> = [("tailLines".to_string(), "x".to_string())].into();
        assert!(LogQuery::from_query(&bad).is_err());
    }
}
