//! `sheepctl port-forward POD [LOCAL:]REMOTE...`: local ports whose every connection is carried
//! to the pod's port over the pod's `portforward` subresource (one WebSocket per connection).

use k8s_openapi::api::core::v1::Pod;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use crate::connection::Cluster;

/// Parses `LOCAL:REMOTE`, `:REMOTE` (a free local port) or `PORT` (the same on both sides).
fn parse_mapping(spec: &str) -> anyhow::Result<(u16, u16)> {
    let port = |p: &str| p.parse::<u16>().map_err(|_| anyhow::anyhow!("invalid port {p:?} in {spec:?}"));
    match spec.split_once(':') {
        Some((local, remote)) => Ok((if local.is_empty() { 0 } else { port(local)? }, port(remote)?)),
        None => Ok((port(spec)?, port(spec)?)),
    }
}

pub async fn run(cluster: &Cluster, pod: &str, mappings: &[String], address: &str) -> anyhow::Result<()> {
    let name = pod.strip_prefix("pod/").or_else(|| pod.strip_prefix("pods/")).unwrap_or(pod).to_string();
    let api: kube::Api<Pod> = kube::Api::namespaced(cluster.client(), &cluster.namespace);
    // The pod must exist before anything listens.
    api.get(&name).await.map_err(|e| anyhow::anyhow!("pod \"{name}\": {e}"))?;
    let mut tasks = tokio::task::JoinSet::new();
    for m in mappings {
        let (local, remote) = parse_mapping(m)?;
        let listener = TcpListener::bind((address, local)).await.map_err(|e| anyhow::anyhow!("listening on {address}:{local}: {e}"))?;
        println!("Forwarding from {} -> {remote}", listener.local_addr()?);
        let (api, name) = (api.clone(), name.clone());
        tasks.spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else { continue };
                println!("Handling connection for {}", listener.local_addr().map(|a| a.port()).unwrap_or(local));
                let (api, name) = (api.clone(), name.clone());
                tokio::spawn(async move {
                    let mut forwarder = match api.portforward(&name, &[remote]).await {
                        Ok(f) => f,
                        Err(e) => {
                            eprintln!("error forwarding port {remote} to pod {name}: {e}");
                            return;
                        }
                    };
                    let Some(upstream) = forwarder.take_stream(remote) else { return };
                    let (mut from_client, mut to_client) = conn.split();
                    let (mut from_pod, mut to_pod) = tokio::io::split(upstream);
                    let up = async {
                        let _ = tokio::io::copy(&mut from_client, &mut to_pod).await;
                        let _ = to_pod.shutdown().await;
                    };
                    let down = async {
                        let _ = tokio::io::copy(&mut from_pod, &mut to_client).await;
                        let _ = to_client.shutdown().await;
                    };
                    tokio::pin!(up);
                    tokio::pin!(down);
                    tokio::select! {
                        () = &mut up => down.await,
                        // The pod is done: give the client a moment to finish reading and close.
                        () = &mut down => { let _ = tokio::time::timeout(std::time::Duration::from_secs(5), up).await; }
                    }
                    forwarder.abort();
                });
            }
        });
    }
    tokio::signal::ctrl_c().await?;
    tasks.abort_all();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_mappings_read_like_kubectls() {
        assert_eq!(parse_mapping("8080").expect("valid"), (8080, 8080));
        assert_eq!(parse_mapping("18080:80").expect("valid"), (18080, 80));
        assert_eq!(parse_mapping(":80").expect("valid"), (0, 80));
        assert!(parse_mapping("x:80").is_err());
    }
}
