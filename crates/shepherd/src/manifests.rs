//! Add-ons by files, as k3s's auto-deploying manifests: every `*.yaml`, `*.yml` and `*.json` file
//! in `<data-dir>/manifests/` is applied at start and again whenever its content changes, by
//! server-side apply under the field manager `shepherd-manifests`, forced (the file is the source
//! of truth for the fields it names; a user's edits to other fields stay). Files are taken in name
//! order, and the documents of a file in their order, so `00-namespace.yaml` comes before what goes
//! into that namespace.
//!
//! A file that cannot be read, parsed or applied is reported in the log and as a Warning Event
//! (`ManifestFailed`) about the `kube-system` Namespace (listed in `default`, as Events about
//! cluster-scoped objects are: `kubectl get events` shows it), once per content; the other files and the
//! file's other documents still apply, and a failed file is tried again (an object may wait for
//! a namespace or a custom resource definition another file brings). Removing a file leaves its
//! objects in place, unless an object carries the annotation
//! `manifests.shepherd.io/delete-with-file: "true"`: then it is deleted with its file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_api::{ApiError, JsonPath, str_at};
use shepherd_apiserver::{ApiService, DeleteOptions, Part, WriteOptions};
use shepherd_controllers::events::{EventRecorder, EventType};
use shepherd_runtime::Client;

pub const FIELD_MANAGER: &str = "shepherd-manifests";
pub const DELETE_WITH_FILE: &str = "manifests.shepherd.io/delete-with-file";
/// How often the directory is looked at.
const POLL: Duration = Duration::from_secs(1);
/// A failed file is tried again this often (its content unchanged).
const RETRY: Duration = Duration::from_secs(5);

/// The manifests directory of a data directory.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("manifests")
}

/// One object a file applied.
#[derive(Debug, Clone, PartialEq)]
struct Applied {
    res: &'static ResourceInfo,
    namespace: Option<String>,
    name: String,
    delete_with_file: bool,
}

/// What is known of one file.
struct FileState {
    content: Vec<u8>,
    objects: Vec<Applied>,
    /// When a failed file is tried again; `None` once it applied in full.
    retry_at: Option<tokio::time::Instant>,
}

/// The documents of a manifest file, `List`s expanded, empty documents skipped.
fn documents(text: &str) -> Result<Vec<Value>, String> {
    // The error's first line says where and what; the rest quotes the file.
    let docs: Vec<Value> = serde_saphyr::from_multiple::<Value>(text)
        .map_err(|e| format!("malformed YAML: {}", one_line(e.to_string().lines().next().unwrap_or_default())))?;
    let mut out = Vec::new();
    for doc in docs {
        match doc {
            Value::Null => {}
            Value::Object(_) if str_at(&doc, "/kind").ends_with("List") && doc.at("/items").is_some_and(Value::is_array) => {
                out.extend(doc["items"].as_array().into_iter().flatten().cloned());
            }
            Value::Object(_) => out.push(doc),
            other => return Err(format!("a document is not an object: {}", one_line(&other.to_string()))),
        }
    }
    Ok(out)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The kind, namespace and name a document applies to.
fn target(doc: &Value) -> Result<Applied, String> {
    let (api_version, kind) = (str_at(doc, "/apiVersion"), str_at(doc, "/kind"));
    if api_version.is_empty() || kind.is_empty() {
        return Err("a document without apiVersion or kind".into());
    }
    let res = kinds::by_api_version_kind(api_version, kind).ok_or_else(|| format!("{api_version} {kind}: no such kind is served"))?;
    let name = str_at(doc, "/metadata/name");
    if name.is_empty() {
        return Err(format!("a {kind} without metadata.name"));
    }
    let namespace = res.namespaced.then(|| match str_at(doc, "/metadata/namespace") {
        "" => "default".to_string(),
        ns => ns.to_string(),
    });
    let delete_with_file = doc.at(&format!("/metadata/annotations/{}", DELETE_WITH_FILE.replace('/', "~1"))).and_then(Value::as_str) == Some("true");
    Ok(Applied { res, namespace, name: name.to_string(), delete_with_file })
}

fn describe(a: &Applied) -> String {
    match &a.namespace {
        Some(ns) => format!("{} {ns}/{}", a.res.kind, a.name),
        None => format!("{} {}", a.res.kind, a.name),
    }
}

/// Applies the manifests in `dir` until `stop` says true.
pub async fn run(service: ApiService, client: Arc<dyn Client>, dir: PathBuf, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut files: BTreeMap<PathBuf, FileState> = BTreeMap::new();
    let reporter = Reporter { recorder: EventRecorder::new(client.clone(), "shepherd-manifests"), client };
    loop {
        sync(&service, &reporter, &dir, &mut files).await;
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

struct Reporter {
    recorder: EventRecorder,
    client: Arc<dyn Client>,
}

impl Reporter {
    async fn failed(&self, file: &Path, why: &str) {
        let message = format!("{}: {why}", file.display());
        tracing::warn!(file = %file.display(), error = %why, "manifest not applied");
        if let Ok(ns) = self.client.get(&kinds::NAMESPACE, None, "kube-system").await {
            self.recorder.record(&ns, EventType::Warning, "ManifestFailed", &message).await;
        }
    }
}

/// The manifest files in `dir`, in name order (hidden files and other extensions aside).
fn manifest_files(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or(".");
            !name.starts_with('.') && [".yaml", ".yml", ".json"].iter().any(|ext| name.ends_with(ext)) && p.is_file()
        })
        .collect();
    found.sort();
    found
}

async fn sync(service: &ApiService, reporter: &Reporter, dir: &Path, files: &mut BTreeMap<PathBuf, FileState>) {
    let present = manifest_files(dir);
    let now = tokio::time::Instant::now();
    for path in &present {
        let content = match std::fs::read(path) {
            Ok(c) => c,
            // Gone between the listing and the read: the next look sees it gone.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                if !files.contains_key(path) {
                    reporter.failed(path, &format!("cannot read: {e}")).await;
                    files.insert(path.clone(), FileState { content: Vec::new(), objects: Vec::new(), retry_at: None });
                }
                continue;
            }
        };
        let changed = files.get(path).is_none_or(|f| f.content != content);
        let due = files.get(path).and_then(|f| f.retry_at).is_some_and(|at| at <= now);
        if !changed && !due {
            continue;
        }
        let (objects, errors) = apply_file(service, &content).await;
        // Objects a new version of the file no longer names are left alone, as on removal.
        let retry_at = (!errors.is_empty()).then(|| now + RETRY);
        if changed {
            for why in &errors {
                reporter.failed(path, why).await;
            }
            if errors.is_empty() {
                tracing::info!(file = %path.display(), objects = objects.len(), "manifest applied");
            }
        } else if errors.is_empty() {
            tracing::info!(file = %path.display(), objects = objects.len(), "manifest applied after an earlier failure");
        }
        let mut kept = files.remove(path).map(|f| f.objects).unwrap_or_default();
        for o in objects {
            if !kept.contains(&o) {
                kept.retain(|k| (k.res.kind, &k.namespace, &k.name) != (o.res.kind, &o.namespace, &o.name));
                kept.push(o);
            }
        }
        files.insert(path.clone(), FileState { content, objects: kept, retry_at });
    }
    let removed: Vec<PathBuf> = files.keys().filter(|p| !present.contains(p)).cloned().collect();
    for path in removed {
        let Some(state) = files.remove(&path) else { continue };
        for o in state.objects.iter().filter(|o| o.delete_with_file) {
            match service.delete(o.res, o.namespace.as_deref(), &o.name, &DeleteOptions::default()).await {
                Ok(_) => tracing::info!(file = %path.display(), object = %describe(o), "deleted with its manifest file"),
                Err(e) if e.is_not_found() => {}
                Err(e) => reporter.failed(&path, &format!("removed, but {} was not deleted: {e}", describe(o))).await,
            }
        }
    }
}

/// Applies every document of a file; returns what applied and why the rest did not.
async fn apply_file(service: &ApiService, content: &[u8]) -> (Vec<Applied>, Vec<String>) {
    let text = match std::str::from_utf8(content) {
        Ok(t) => t,
        Err(_) => return (Vec::new(), vec!["not UTF-8 text".into()]),
    };
    let docs = match documents(text) {
        Ok(d) => d,
        Err(why) => return (Vec::new(), vec![why]),
    };
    let opts = WriteOptions { field_manager: Some(FIELD_MANAGER.into()), force: true, ..Default::default() };
    let (mut applied, mut errors) = (Vec::new(), Vec::new());
    for doc in docs {
        let target = match target(&doc) {
            Ok(t) => t,
            Err(why) => {
                errors.push(why);
                continue;
            }
        };
        let result: Result<_, ApiError> =
            service.apply_with(target.res, target.namespace.as_deref(), &target.name, &doc, Part::Main, &opts).await;
        match result {
            Ok(_) => applied.push(target),
            Err(e) => errors.push(format!("{}: {e}", describe(&target))),
        }
    }
    (applied, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_expand_lists_and_skip_empty_ones_and_a_yaml_error_is_one_line() {
        let docs = documents("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n---\nkind: List\napiVersion: v1\nitems:\n- {apiVersion: v1, kind: Secret, metadata: {name: b}}\n").expect("parses");
        let kinds: Vec<&str> = docs.iter().map(|d| str_at(d, "/kind")).collect();
        assert_eq!(kinds, ["ConfigMap", "Secret"]);
        let err = documents("apiVersion: v1\nkind: [ConfigMap\n").expect_err("malformed");
        assert!(err.starts_with("malformed YAML") && !err.contains('\n'), "{err}");
        assert!(documents("- 1\n- 2\n").expect_err("a list is no object").contains("not an object"));
    }

    #[test]
    fn a_target_names_its_kind_namespace_and_name_and_the_deletion_annotation() {
        let doc = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "annotations": {DELETE_WITH_FILE: "true"}}});
        let t = target(&doc).expect("a target");
        assert_eq!((t.res.kind, t.namespace.as_deref(), t.name.as_str(), t.delete_with_file), ("Deployment", Some("default"), "web", true));
        let ns = target(&serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "tools"}})).expect("a target");
        assert_eq!((ns.namespace, ns.delete_with_file), (None, false));
        assert!(target(&serde_json::json!({"apiVersion": "v9", "kind": "Nope", "metadata": {"name": "x"}})).expect_err("unknown").contains("no such kind"));
        assert!(target(&serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap"})).expect_err("no name").contains("metadata.name"));
    }
}
