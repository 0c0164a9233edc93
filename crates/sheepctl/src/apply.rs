//! `sheepctl apply`: client-side apply, as kubectl does it without `--server-side`, and server-side
//! apply with `--server-side`.
//!
//! The applied configuration is stored on the object in the
//! `kubectl.kubernetes.io/last-applied-configuration` annotation, so the next apply knows which
//! fields it set and may remove; kubectl and sheepctl therefore apply over each other's objects.

use serde_json::{Value, json};

use crate::connection::Cluster;
use crate::manifest::{self, Manifest};
use crate::merge_patch;
use crate::resource;

pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// kubectl's manager names: client-side apply writes as the first, server-side apply as the second,
/// so that either tool continues what the other started (and the server moves client-side fields
/// to the server-side manager as it does for kubectl).
const CLIENT_SIDE_MANAGER: &str = "kubectl-client-side-apply";
pub const SERVER_SIDE_MANAGER: &str = "kubectl";

/// Applies every object on the server as `manager`; reports each failure (a conflict names the
/// fields and their managers) and keeps going. Returns whether every object applied.
pub async fn run_server_side(cluster: &Cluster, files: &[String], manager: &str, force: bool) -> anyhow::Result<bool> {
    let manifests = manifest::load(files)?;
    let mut ok = true;
    for m in &manifests {
        let ns = m.namespace(&cluster.namespace).to_string();
        let path = resource::object_path(m.res, &ns, m.name());
        let mut query = format!("?fieldManager={}&fieldValidation=Strict", urlencode(manager));
        if force {
            query.push_str("&force=true");
        }
        match cluster.apply_patch(&format!("{path}{query}"), &m.object).await {
            Ok(_) => println!("{} serverside-applied", resource::object_ref(m.res, m.name())),
            Err(e) => {
                let conflict = e.to_string().contains("Apply failed with");
                eprintln!("Error: {e:#}");
                if conflict && !force {
                    eprintln!("Either take these fields with --force-conflicts, or leave them out of the file to keep their current managers.");
                }
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// A query parameter value, percent-encoded.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// What apply did to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    Configured,
    Unchanged,
}

impl Outcome {
    fn word(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        }
    }
}

/// Applies every object of the files; reports each failure and keeps going, like kubectl.
/// Returns whether every object applied.
pub async fn run(cluster: &Cluster, files: &[String]) -> anyhow::Result<bool> {
    let manifests = manifest::load(files)?;
    let mut ok = true;
    for m in &manifests {
        match apply_one(cluster, m).await {
            Ok(outcome) => println!("{} {}", resource::object_ref(m.res, m.name()), outcome.word()),
            Err(e) => {
                eprintln!("Error: {e:#}");
                ok = false;
            }
        }
    }
    Ok(ok)
}

/// The copy of the file's object recorded in the annotation (and what `diff` compares): the
/// file's fields, keeping an `annotations: {}` when the file had none, as kubectl's does, so
/// either tool finds the other's record identical.
fn recorded(obj: &Value) -> Value {
    let mut recorded = obj.clone();
    match recorded.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        Some(a) => {
            a.remove(LAST_APPLIED);
        }
        None => recorded["metadata"]["annotations"] = json!({}),
    }
    recorded
}

/// The object as it will be stored: the file's fields plus the annotation recording them.
fn with_last_applied(obj: &Value) -> Value {
    let mut out = obj.clone();
    let text = recorded(obj).to_string() + "\n";
    match out.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        Some(a) => {
            a.insert(LAST_APPLIED.into(), json!(text));
        }
        None => out["metadata"]["annotations"] = json!({ LAST_APPLIED: text }),
    }
    out
}

/// The write apply sends for one object, decided from the live object.
pub enum Write {
    /// The object does not exist: POST the body to the collection.
    Create { collection: String, body: Value },
    /// PATCH the object with a merge patch.
    Patch { path: String, live: Value, patch: Value },
    /// The live object already says everything the file says.
    Unchanged { live: Value },
}

/// Whether the write records the file in the last-applied annotation. `diff` leaves it out, as
/// `kubectl diff` does, so that only changes of the object itself show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    LastApplied,
    Nothing,
}

/// Reads the live object and computes the write that makes it what the manifest asks for.
pub async fn plan(cluster: &Cluster, m: &Manifest, record: Record) -> anyhow::Result<Write> {
    let ns = m.namespace(&cluster.namespace).to_string();
    let path = resource::object_path(m.res, &ns, m.name());
    let live = match cluster.get(&path).await {
        Ok(v) => v,
        Err(e) if e.is_not_found() => {
            let body = match record {
                Record::LastApplied => with_last_applied(&m.object),
                Record::Nothing => m.object.clone(),
            };
            return Ok(Write::Create { collection: resource::collection_path(m.res, Some(&ns)), body });
        }
        Err(e) => return Err(e.into()),
    };
    let modified = match record {
        Record::LastApplied => with_last_applied(&m.object),
        Record::Nothing => recorded(&m.object),
    };
    let original: Option<Value> = live
        .pointer(&format!("/metadata/annotations/{}", LAST_APPLIED.replace('/', "~1")))
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str(s).ok());
    let patch = merge_patch::three_way(original.as_ref(), &modified, &live);
    if patch.is_empty() {
        return Ok(Write::Unchanged { live });
    }
    Ok(Write::Patch { path, live, patch: Value::Object(patch) })
}

/// Sends the write; with `dry_run` the server validates and answers the would-be object but
/// stores nothing. Returns the object the server answered, or the live one when unchanged.
pub async fn send(cluster: &Cluster, write: &Write, dry_run: bool) -> anyhow::Result<Value> {
    // Unknown fields are refused rather than dropped, as `kubectl apply` asks.
    let query = format!(
        "?fieldValidation=Strict&fieldManager={CLIENT_SIDE_MANAGER}{}",
        if dry_run { "&dryRun=All" } else { "" }
    );
    Ok(match write {
        Write::Create { collection, body } => cluster.post(&format!("{collection}{query}"), body).await?,
        Write::Patch { path, patch, .. } => cluster.merge_patch(&format!("{path}{query}"), patch).await?,
        Write::Unchanged { live } => live.clone(),
    })
}

async fn apply_one(cluster: &Cluster, m: &Manifest) -> anyhow::Result<Outcome> {
    let write = plan(cluster, m, Record::LastApplied).await?;
    send(cluster, &write, false).await?;
    Ok(match write {
        Write::Create { .. } => Outcome::Created,
        Write::Patch { .. } => Outcome::Configured,
        Write::Unchanged { .. } => Outcome::Unchanged,
    })
}
