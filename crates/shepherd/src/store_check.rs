//! `shepherd store check`: reads every record of an idle store and reports what does not fit.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::bail;
use clap::{Args, Subcommand};
use serde_json::Value;
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_store::{KeyValue, LocalStore, Snapshot};

#[derive(Subcommand, Clone)]
pub enum StoreCommand {
    /// Read every record of a store no server holds, its log, and every page of its file
    /// against its checksum; report counts, the revision, and every record that is not a JSON
    /// object or does not fit its key. Exits 1 on any problem.
    Check(CheckArgs),
}

#[derive(Args, Clone)]
pub struct CheckArgs {
    /// The data directory whose store to check.
    #[arg(long, env = "SHEPHERD_DATA_DIR", default_value = "shepherd-data")]
    data_dir: PathBuf,
}

pub fn run(command: StoreCommand) -> anyhow::Result<()> {
    match command {
        StoreCommand::Check(args) => check(args),
    }
}

fn check(args: CheckArgs) -> anyhow::Result<()> {
    let path = crate::backup::store_file(&args.data_dir);
    // Every object and the log (this also refuses a store a server holds)...
    let snapshot = LocalStore::read_redb_snapshot(&path).map_err(|e| {
        anyhow::anyhow!("cannot read {}: {e}; {}", path.display(), crate::snapshots::recovery_hint(&args.data_dir))
    })?;
    // ... then every page of the file against its checksum: a damaged page may hold nothing the
    // read above came to (free space, another table, an index page).
    LocalStore::check_redb_integrity(&path).map_err(|e| {
        anyhow::anyhow!("{e}; {}", crate::snapshots::recovery_hint(&args.data_dir))
    })?;
    let report = Report::of(&snapshot);
    let counts: Vec<String> = report.counts.iter().map(|(plural, n)| format!("{plural} {n}")).collect();
    println!(
        "{}: revision {}, {} objects ({})",
        path.display(),
        snapshot.revision,
        snapshot.items.len(),
        if counts.is_empty() { "none".to_string() } else { counts.join(", ") }
    );
    for p in &report.problems {
        println!("problem: {p}");
    }
    if !report.problems.is_empty() {
        bail!("{} of {} records have problems", report.problems.len(), snapshot.items.len());
    }
    println!("no problems found");
    Ok(())
}

#[derive(Debug, Default)]
struct Report {
    /// Objects per resource (`pods`, `deployments.apps`).
    counts: BTreeMap<String, usize>,
    problems: Vec<String>,
}

impl Report {
    fn of(snapshot: &Snapshot) -> Report {
        let mut report = Report::default();
        // Custom objects are checked against the definitions stored beside them.
        let definitions = kinds::CUSTOMRESOURCEDEFINITION.key_prefix();
        for kv in snapshot.items.iter().filter(|kv| kv.key.starts_with(&definitions)) {
            if let Ok(def) = serde_json::from_slice::<Value>(&kv.value) {
                let name = def.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
                kinds::register_custom(name, kinds::custom_resources_of(&def));
            }
        }
        for kv in &snapshot.items {
            if kv.create_revision > kv.mod_revision || kv.mod_revision > snapshot.revision {
                report.problems.push(format!(
                    "{}: revisions {}/{} do not fit the store's revision {}",
                    kv.key, kv.create_revision, kv.mod_revision, snapshot.revision
                ));
            }
            match check_record(kv) {
                Ok(res) => *report.counts.entry(res.qualified_plural()).or_default() += 1,
                Err(problem) => report.problems.push(format!("{}: {problem}", kv.key)),
            }
        }
        report
    }
}

/// The resource a record belongs to, if its key follows `/registry/<group>/<plural>/[<ns>/]<name>`
/// and its value is that object.
fn check_record(kv: &KeyValue) -> Result<&'static ResourceInfo, String> {
    let res = kinds::all()
        .into_iter()
        .filter(|r| kinds::custom(r).is_none_or(|c| c.storage))
        .find(|r| kv.key.starts_with(&r.key_prefix()))
        .ok_or("the key is not under any resource's /registry/<group>/<plural>/ prefix")?;
    let rest = &kv.key[res.key_prefix().len()..];
    let (namespace, name) = match (res.namespaced, rest.split_once('/')) {
        (true, Some((ns, name))) => (Some(ns), name),
        (false, None) => (None, rest),
        _ => {
            return Err(format!("the key does not have the layout of {} (namespaced: {})", res.plural, res.namespaced));
        }
    };
    if name.is_empty() || namespace.is_some_and(str::is_empty) || name.contains('/') {
        return Err("the key has an empty or malformed name".into());
    }
    let obj: Value = serde_json::from_slice(&kv.value).map_err(|e| format!("the value is not valid JSON: {e}"))?;
    let meta = obj.get("metadata").and_then(Value::as_object).ok_or("the value has no metadata object")?;
    if meta.get("name").and_then(Value::as_str) != Some(name) {
        return Err(format!("metadata.name is {:?}, the key says {name:?}", meta.get("name")));
    }
    if let Some(ns) = namespace
        && meta.get("namespace").and_then(Value::as_str) != Some(ns)
    {
        return Err(format!("metadata.namespace is {:?}, the key says {ns:?}", meta.get("namespace")));
    }
    if obj.get("kind").and_then(Value::as_str) != Some(res.kind) {
        return Err(format!("kind is {:?}, the key says {}", obj.get("kind"), res.kind));
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, value: &str) -> KeyValue {
        KeyValue { key: key.into(), value: value.as_bytes().to_vec().into(), create_revision: 1, mod_revision: 2 }
    }

    #[test]
    fn records_that_fit_their_keys_are_counted_and_others_are_named() {
        let pod = r#"{"metadata":{"resourceVersion":"","name":"web","namespace":"default"},"kind":"Pod"}"#;
        let ns = r#"{"metadata":{"resourceVersion":"","name":"default"},"kind":"Namespace"}"#;
        let snapshot = Snapshot {
            revision: 5,
            items: vec![
                kv("/registry/core/pods/default/web", pod),
                kv("/registry/core/namespaces/default", ns),
                kv("/registry/core/pods/default/broken", "{\"metadata\":"),
                kv("/registry/core/pods/other/web", pod),
                kv("/registry/core/pods/web", pod),
                kv("/elsewhere/x", pod),
                kv("/registry/apps/deployments/default/web", pod),
            ],
        };
        let report = Report::of(&snapshot);
        assert_eq!(report.counts, BTreeMap::from([("namespaces".into(), 1), ("pods".into(), 1)]));
        let named: Vec<&str> = report.problems.iter().map(|p| p.split(": ").next().unwrap_or("")).collect();
        assert_eq!(
            named,
            [
                "/registry/core/pods/default/broken",
                "/registry/core/pods/other/web",
                "/registry/core/pods/web",
                "/elsewhere/x",
                "/registry/apps/deployments/default/web"
            ],
            "{:#?}",
            report.problems
        );
        assert!(report.problems[0].contains("not valid JSON"), "{}", report.problems[0]);
    }

    #[test]
    fn custom_objects_are_checked_against_the_definitions_stored_beside_them() {
        let crd = r#"{"metadata":{"name":"gadgets.check.example.com"},"kind":"CustomResourceDefinition",
            "spec":{"group":"check.example.com","scope":"Namespaced","names":{"plural":"gadgets","kind":"Gadget"},
            "versions":[{"name":"v1","served":true,"storage":true}]}}"#;
        let gadget = r#"{"metadata":{"name":"g","namespace":"default"},"kind":"Gadget"}"#;
        let snapshot = Snapshot {
            revision: 5,
            items: vec![
                kv("/registry/apiextensions.k8s.io/customresourcedefinitions/gadgets.check.example.com", crd),
                kv("/registry/check.example.com/gadgets/default/g", gadget),
                kv("/registry/check.example.com/gizmos/default/g", gadget),
            ],
        };
        let report = Report::of(&snapshot);
        assert_eq!(report.counts.get("gadgets.check.example.com"), Some(&1), "{:?}", report.problems);
        assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
        assert!(report.problems[0].starts_with("/registry/check.example.com/gizmos/"), "{:?}", report.problems);
    }
}
