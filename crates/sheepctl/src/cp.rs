//! `sheepctl cp`: files and directories to and from a container, as kubectl does it: a `tar` in
//! the container at one end of an exec, and a local `tar` at the other.

use std::path::Path;
use std::process::Stdio;

use k8s_openapi::api::core::v1::Pod;
use kube::api::AttachParams;
use tokio::io::AsyncWriteExt;

use crate::connection::Cluster;

/// One side of a copy: a local path, or a path in a pod.
#[derive(Debug, PartialEq)]
enum Side {
    Local(String),
    Pod { pod: String, path: String },
}

fn side(arg: &str) -> Side {
    match arg.split_once(':') {
        // A leading `/` or `.` is a local path even with a colon in it.
        Some((pod, path)) if !pod.is_empty() && !pod.contains('/') && !arg.starts_with('.') => {
            Side::Pod { pod: pod.to_string(), path: path.to_string() }
        }
        _ => Side::Local(arg.to_string()),
    }
}

/// (directory, last component) of a path; the directory is `.` for a bare name.
fn split(path: &str) -> anyhow::Result<(String, String)> {
    let trimmed = path.trim_end_matches('/');
    let p = Path::new(trimmed);
    let base = p.file_name().and_then(|b| b.to_str()).ok_or_else(|| anyhow::anyhow!("{path:?} names no file"))?;
    let dir = p.parent().and_then(|d| d.to_str()).filter(|d| !d.is_empty()).unwrap_or(if trimmed.starts_with('/') { "/" } else { "." });
    Ok((dir.to_string(), base.to_string()))
}

/// A GNU tar `--transform` renaming the archive's top entry `from` to `to`.
fn rename(from: &str, to: &str) -> String {
    let mut pattern = String::new();
    for c in from.chars() {
        if "\\.[]*^$#".contains(c) {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    format!("s#^{pattern}#{}#", to.replace('\\', "\\\\").replace('#', "\\#").replace('&', "\\&"))
}

pub async fn run(cluster: &Cluster, src: &str, dst: &str, container: Option<String>) -> anyhow::Result<()> {
    let api: kube::Api<Pod> = kube::Api::namespaced(cluster.client(), &cluster.namespace);
    let params = |stdin: bool| {
        let p = AttachParams::default().stdin(stdin).stdout(!stdin).stderr(true);
        match &container {
            Some(c) => p.container(c.clone()),
            None => p,
        }
    };
    match (side(src), side(dst)) {
        (Side::Local(local), Side::Pod { pod, path }) => {
            let (local_dir, local_base) = split(&local)?;
            let (remote_dir, remote_base) = split(&path)?;
            let mut tar = tokio::process::Command::new("tar")
                .args(["cf", "-", "-C", &local_dir, "--transform", &rename(&local_base, &remote_base), &local_base])
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| anyhow::anyhow!("running the local tar: {e}"))?;
            let mut archive = tar.stdout.take().ok_or_else(|| anyhow::anyhow!("no output from the local tar"))?;
            let command = vec!["tar".to_string(), "xmf".into(), "-".into(), "-C".into(), remote_dir];
            let mut remote = api.exec(&pod, command, &params(true)).await.map_err(|e| anyhow::anyhow!("exec in pod \"{pod}\": {e}"))?;
            let mut stdin = remote.stdin().ok_or_else(|| anyhow::anyhow!("no stdin to the container's tar"))?;
            let status = remote.take_status();
            let mut errors = remote.stderr();
            let copy = async {
                tokio::io::copy(&mut archive, &mut stdin).await?;
                stdin.shutdown().await
            };
            copy.await.map_err(|e| anyhow::anyhow!("sending to pod \"{pod}\": {e}"))?;
            finish(status, errors.as_mut()).await?;
            anyhow::ensure!(tar.wait().await?.success(), "the local tar failed");
            Ok(())
        }
        (Side::Pod { pod, path }, Side::Local(local)) => {
            let (remote_dir, remote_base) = split(&path)?;
            let (local_dir, local_base) = split(&local)?;
            let mut tar = tokio::process::Command::new("tar")
                .args(["xf", "-", "-C", &local_dir, "--transform", &rename(&remote_base, &local_base)])
                .stdin(Stdio::piped())
                .spawn()
                .map_err(|e| anyhow::anyhow!("running the local tar: {e}"))?;
            let mut local_in = tar.stdin.take().ok_or_else(|| anyhow::anyhow!("no input to the local tar"))?;
            let command = vec!["tar".to_string(), "cf".into(), "-".into(), "-C".into(), remote_dir, remote_base];
            let mut remote = api.exec(&pod, command, &params(false)).await.map_err(|e| anyhow::anyhow!("exec in pod \"{pod}\": {e}"))?;
            let mut stdout = remote.stdout().ok_or_else(|| anyhow::anyhow!("no output from the container's tar"))?;
            let status = remote.take_status();
            let mut errors = remote.stderr();
            tokio::io::copy(&mut stdout, &mut local_in).await.map_err(|e| anyhow::anyhow!("receiving from pod \"{pod}\": {e}"))?;
            drop(local_in);
            finish(status, errors.as_mut()).await?;
            anyhow::ensure!(tar.wait().await?.success(), "the local tar failed");
            Ok(())
        }
        (Side::Local(_), Side::Local(_)) => anyhow::bail!("one of the paths must be in a pod (POD:PATH)"),
        (Side::Pod { .. }, Side::Pod { .. }) => anyhow::bail!("copying between two pods is not supported; copy through a local path"),
    }
}

/// Waits for the container's tar to end; its complaints become the error.
async fn finish(
    status: Option<impl Future<Output = Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>>>,
    errors: Option<&mut (impl tokio::io::AsyncRead + Unpin)>,
) -> anyhow::Result<()> {
    let mut text = String::new();
    if let Some(e) = errors {
        use tokio::io::AsyncReadExt;
        let _ = e.read_to_string(&mut text).await;
    }
    let status = match status {
        Some(s) => s.await,
        None => None,
    };
    match status {
        Some(s) if s.status.as_deref() != Some("Success") => {
            anyhow::bail!("{}{}", text, s.message.unwrap_or_else(|| "the container's tar failed".into()))
        }
        _ => {
            if !text.is_empty() {
                eprint!("{text}");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_side_is_named_by_pod_colon_path() {
        assert_eq!(side("web-0:/tmp/x"), Side::Pod { pod: "web-0".into(), path: "/tmp/x".into() });
        assert_eq!(side("/tmp/a:b"), Side::Local("/tmp/a:b".into()));
        assert_eq!(side("file.txt"), Side::Local("file.txt".into()));
    }

    #[test]
    fn paths_split_into_directory_and_name() {
        assert_eq!(split("/tmp/x/").expect("ok"), ("/tmp".to_string(), "x".to_string()));
        assert_eq!(split("x").expect("ok"), (".".to_string(), "x".to_string()));
        assert_eq!(split("/x").expect("ok"), ("/".to_string(), "x".to_string()));
        assert_eq!(rename("a.b", "c#d"), "s#^a\\.b#c\\#d#");
    }
}
