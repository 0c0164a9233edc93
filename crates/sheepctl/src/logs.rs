//! `sheepctl logs`: streams a container's output from the pod's `log` subresource.

use futures::AsyncReadExt;
use std::io::Write;

use crate::connection::Cluster;
use crate::resource;

pub struct LogsArgs {
    pub pod: String,
    pub container: Option<String>,
    pub follow: bool,
    pub tail: Option<i64>,
    pub previous: bool,
    /// Only output newer than this (`5s`, `2m`, `1h`).
    pub since: Option<std::time::Duration>,
    /// Only output written at or after this RFC 3339 time.
    pub since_time: Option<String>,
    pub timestamps: bool,
    pub limit_bytes: Option<u64>,
}

pub async fn run(cluster: &Cluster, args: &LogsArgs) -> anyhow::Result<()> {
    let name = &crate::target::pod(cluster, &args.pod).await?;
    let path = format!("{}/log", resource::object_path(&shepherd_api::kinds::POD, &cluster.namespace, name));
    let query = resource::query(&[
        ("container", args.container.clone()),
        ("follow", args.follow.then(|| "true".to_string())),
        ("tailLines", args.tail.filter(|t| *t >= 0).map(|t| t.to_string())),
        ("previous", args.previous.then(|| "true".to_string())),
        // Kubernetes counts whole seconds; a part of one still asks for that second.
        ("sinceSeconds", args.since.map(|d| d.as_secs_f64().ceil().max(1.0).to_string())),
        ("sinceTime", args.since_time.clone()),
        ("timestamps", args.timestamps.then(|| "true".to_string())),
        ("limitBytes", args.limit_bytes.map(|b| b.to_string())),
    ]);
    let mut body = cluster.stream(&format!("{path}{query}"), "text/plain, */*").await?;
    let mut buf = vec![0u8; 8192];
    let mut out = std::io::stdout().lock();
    loop {
        let n = body.read(&mut buf).await.map_err(|e| anyhow::anyhow!("reading logs of pod \"{name}\": {e}"))?;
        if n == 0 {
            return Ok(());
        }
        out.write_all(&buf[..n])?;
        out.flush()?;
    }
}
