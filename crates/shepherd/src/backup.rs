//! `shepherd backup` and `shepherd restore`: snapshots of the store taken online or offline.
//!
//! A running server holds its redb file locked, so an online backup comes from the server itself:
//! `GET /backup` (behind the API token) answers with the in-memory state at one revision, which
//! holds exactly the committed writes up to it (writes reach memory only after their fsync, under
//! the lock the snapshot is read with). Reading it costs one pass over the objects under a read
//! lock and never blocks on disk, which a redb read transaction would not improve on.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use clap::Args;
use shepherd_store::{LocalStore, Snapshot};

/// The store's file inside a data directory.
pub fn store_file(data_dir: &Path) -> PathBuf {
    data_dir.join("store.redb")
}

#[derive(Args, Clone)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["server", "data_dir"]))]
pub struct BackupArgs {
    /// Take the backup from this running API server.
    #[arg(long)]
    server: Option<String>,
    /// Bearer token for the API server.
    #[arg(long, env = "SHEPHERD_TOKEN")]
    token: Option<String>,
    /// The CA (PEM) that signed an https server's certificate (its <data-dir>/pki/ca.crt).
    #[arg(long, value_name = "FILE")]
    certificate_authority: Option<PathBuf>,
    /// Take the backup from this data directory (no server may be running on it).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The backup file to write (replaced atomically, mode 0600).
    #[arg(long)]
    to: PathBuf,
}

#[derive(Args, Clone)]
pub struct RestoreArgs {
    /// The backup file to restore.
    #[arg(long)]
    from: PathBuf,
    /// The data directory to restore into; it must be empty or absent unless --force.
    #[arg(long)]
    data_dir: PathBuf,
    /// Replace the store of a non-empty data directory.
    #[arg(long)]
    force: bool,
}

/// `GET /backup` of a server whose objects are in etcd: etcd's own snapshot is the backup.
pub fn not_embedded() -> Response {
    let message = "this server keeps its objects in etcd: back them up with `etcdctl snapshot save FILE`";
    (StatusCode::NOT_IMPLEMENTED, message).into_response()
}

/// `GET /backup`: the store's objects at one revision, in the snapshot format. Encoded off the
/// async workers: it is a pass over every object.
pub async fn serve(store: LocalStore) -> Response {
    let encoded = tokio::task::spawn_blocking(move || store.snapshot().map(|s| (s.revision, s.encode()))).await;
    match encoded {
        Ok(Ok((revision, bytes))) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream".to_string()),
                (header::HeaderName::from_static("x-shepherd-revision"), revision.to_string()),
            ],
            bytes,
        )
            .into_response(),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("snapshot: {e}")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("snapshot: {e}")).into_response(),
    }
}

pub async fn backup(args: BackupArgs) -> anyhow::Result<()> {
    let bytes = match (&args.server, &args.data_dir) {
        (Some(server), _) => fetch(server, args.token.as_deref(), args.certificate_authority.as_deref()).await?,
        (None, Some(dir)) => {
            let path = store_file(dir);
            LocalStore::read_redb_snapshot(&path).with_context(|| format!("reading {}", path.display()))?.encode()
        }
        (None, None) => bail!("give --server URL or --data-dir DIR"),
    };
    // Verified before it is kept: a backup nobody can restore is worse than none.
    let snapshot = Snapshot::decode(&bytes).context("the server sent a snapshot that does not verify")?;
    write_atomically(&args.to, &bytes)?;
    println!(
        "backup of {} objects at revision {} written to {}",
        snapshot.items.len(),
        snapshot.revision,
        args.to.display()
    );
    Ok(())
}

async fn fetch(server: &str, token: Option<&str>, ca: Option<&Path>) -> anyhow::Result<Vec<u8>> {
    let url = format!("{}/backup", server.trim_end_matches('/'));
    let mut client = reqwest::Client::builder();
    if let Some(path) = ca {
        let pem = std::fs::read(path).with_context(|| format!("reading --certificate-authority {}", path.display()))?;
        let cert = reqwest::Certificate::from_pem(&pem).with_context(|| format!("--certificate-authority {}", path.display()))?;
        client = client.tls_built_in_root_certs(false).add_root_certificate(cert);
    }
    let mut req = client.build().context("building the HTTP client")?.get(&url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.with_context(|| format!("requesting {url}"))?;
    let status = resp.status();
    let body = resp.bytes().await.with_context(|| format!("reading {url}"))?;
    if !status.is_success() {
        bail!("{url} answered {status}: {}", String::from_utf8_lossy(&body).trim());
    }
    Ok(body.to_vec())
}

/// Writes `bytes` to `path` through a temporary file in the same directory, fsync'd before and
/// after the rename, so `path` is either the old file or the whole new one, even after a crash.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().with_context(|| format!("{} is not a file name", path.display()))?;
    let tmp = dir.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)?;
        fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.with_context(|| format!("writing {}", path.display()))
}

pub fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let bytes = fs::read(&args.from).with_context(|| format!("reading {}", args.from.display()))?;
    let snapshot = Snapshot::decode(&bytes)
        .with_context(|| format!("{} is not a usable backup; nothing was restored", args.from.display()))?;
    let non_empty = fs::read_dir(&args.data_dir).map(|mut d| d.next().is_some()).unwrap_or(false);
    if non_empty && !args.force {
        bail!(
            "{} is not empty; restore into an empty directory, or give --force to replace its store",
            args.data_dir.display()
        );
    }
    let target = store_file(&args.data_dir);
    if LocalStore::redb_is_held(&target) {
        bail!("{} is held by a running Shepherd process; stop it before restoring", target.display());
    }
    crate::private_dir::secure(&args.data_dir)?;
    let tmp = args.data_dir.join(format!(".store.redb.restoring-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    if let Err(e) = LocalStore::write_redb_snapshot(&tmp, &snapshot) {
        let _ = fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", tmp.display()));
    }
    // Kept rather than overwritten: the store and its log may hold writes newer than the backup.
    move_aside(&target, "store")?;
    move_aside(&LocalStore::log_dir(&target), "store's write-ahead log")?;
    fs::rename(&tmp, &target).with_context(|| format!("replacing {}", target.display()))?;
    // The snapshots belong to the history being replaced; a later start compares against them.
    move_aside(&crate::snapshots::dir(&args.data_dir), "snapshots")?;
    fs::File::open(&args.data_dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", args.data_dir.display()))?;
    println!("restored {} objects at revision {} into {}", snapshot.items.len(), snapshot.revision, target.display());
    Ok(())
}

/// Renames `path`, if it exists, to `<path>.replaced-<unix seconds>` beside it, and says so.
fn move_aside(path: &Path, what: &str) -> anyhow::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".replaced-{secs}"));
    let aside = path.with_file_name(name);
    fs::rename(path, &aside).with_context(|| format!("moving {} aside", path.display()))?;
    println!("moved the previous {what} aside to {}", aside.display());
    Ok(())
}
