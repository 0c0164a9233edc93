//! `sheepctl apply`: client-side apply, as kubectl does it without `--server-side`.
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

/// The object as it will be stored: the file's fields plus the annotation recording them.
/// The recorded copy keeps an `annotations: {}` when the file had none, as kubectl's does, so
/// either tool finds the other's record identical.
fn with_last_applied(obj: &Value) -> Value {
    let mut recorded = obj.clone();
    match recorded.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        Some(a) => {
            a.remove(LAST_APPLIED);
        }
        None => recorded["metadata"]["annotations"] = json!({}),
    }
    let mut out = obj.clone();
    let text = recorded.to_string() + "\n";
    match out.pointer_mut("/metadata/annotations").and_then(Value::as_object_mut) {
        Some(a) => {
            a.insert(LAST_APPLIED.into(), json!(text));
        }
        None => out["metadata"]["annotations"] = json!({ LAST_APPLIED: text }),
    }
    out
}

async fn apply_one(cluster: &Cluster, m: &Manifest) -> anyhow::Result<Outcome> {
    let ns = m.namespace(&cluster.namespace).to_string();
    let path = resource::object_path(m.res, &ns, m.name());
    let modified = with_last_applied(&m.object);
    let live = match cluster.get(&path).await {
        Ok(v) => v,
        Err(e) if e.is_not_found() => {
            // Unknown fields are refused rather than dropped, as `kubectl apply` asks.
            let collection = resource::collection_path(m.res, Some(&ns));
            cluster.post(&format!("{collection}?fieldValidation=Strict"), &modified).await?;
            return Ok(Outcome::Created);
        }
        Err(e) => return Err(e.into()),
    };
    let original: Option<Value> = live
        .pointer(&format!("/metadata/annotations/{}", LAST_APPLIED.replace('/', "~1")))
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str(s).ok());
    let patch = merge_patch::three_way(original.as_ref(), &modified, &live);
    if patch.is_empty() {
        return Ok(Outcome::Unchanged);
    }
    cluster.merge_patch(&format!("{path}?fieldValidation=Strict"), &Value::Object(patch)).await?;
    Ok(Outcome::Configured)
}
