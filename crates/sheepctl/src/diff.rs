//! `sheepctl diff`: what `apply` would change, as a unified diff of the live and the would-be
//! object in YAML, the would-be object answered by a server-side dry run of apply's write.

use serde_json::Value;
use similar::TextDiff;

use crate::apply::{self, Record, Write};
use crate::connection::Cluster;
use crate::manifest::{self, Manifest};
use crate::printer;

/// Prints the diff of every object in the files; returns whether any object would change.
/// Nothing is written: creates and patches are sent with `dryRun=All`. The objects are printed
/// in the order of their file names, as kubectl's diff of two directories prints them.
pub async fn run(cluster: &Cluster, files: &[String]) -> anyhow::Result<bool> {
    let manifests = manifest::load(files)?;
    let mut diffs = Vec::new();
    for m in &manifests {
        let write = apply::plan(cluster, m, Record::Nothing).await?;
        let would_be = apply::send(cluster, &write, true).await?;
        let live = match &write {
            Write::Create { .. } => None,
            Write::Patch { live, .. } | Write::Unchanged { live } => Some(live),
        };
        let old = match live {
            Some(v) => printer::yaml(&without_noise(v))?,
            None => String::new(),
        };
        let new = printer::yaml(&without_noise(&would_be))?;
        if old == new {
            continue;
        }
        let name = file_name(m, &cluster.namespace);
        let (a, b) = (format!("LIVE/{name}"), format!("MERGED/{name}"));
        let hunks = TextDiff::from_lines(&old, &new).unified_diff().context_radius(3).header(&a, &b).to_string();
        diffs.push((name, format!("diff -u -N {a} {b}\n{hunks}")));
    }
    diffs.sort();
    for (_, text) in &diffs {
        print!("{text}");
    }
    Ok(!diffs.is_empty())
}

/// The object without what the server manages for its own bookkeeping and kubectl hides too.
fn without_noise(obj: &Value) -> Value {
    let mut obj = obj.clone();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    obj
}

/// `apps.v1.Deployment.default.web`, `v1.Namespace..shop`: the file name kubectl gives an
/// object in its diff.
fn file_name(m: &Manifest, default_ns: &str) -> String {
    let namespace = if m.res.namespaced { m.namespace(default_ns) } else { "" };
    format!("{}.{}.{namespace}.{}", m.res.api_version().replace('/', "."), m.res.kind, m.name())
}
