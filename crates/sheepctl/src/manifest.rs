//! Reading manifests (`-f FILE|DIR|-`): JSON or YAML, several documents, `List`s, and the seed's
//! shorthand (no `apiVersion`, a plain label map as `spec.selector`).

use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use shepherd_api::kinds::{self, ResourceInfo};

/// One object read from a manifest, with where it came from.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub res: &'static ResourceInfo,
    pub object: Value,
}

/// Where an object was read from, for error messages: the file and the document (1-based).
#[derive(Debug, Clone)]
pub struct Source {
    pub file: String,
    pub document: usize,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (document {})", self.file, self.document)
    }
}

impl Manifest {
    pub fn name(&self) -> &str {
        self.object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("")
    }

    /// The namespace written in the manifest, else `default_ns`.
    pub fn namespace<'a>(&'a self, default_ns: &'a str) -> &'a str {
        self.object.pointer("/metadata/namespace").and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or(default_ns)
    }
}

/// Reads every object from files, directories (their `.json`, `.yaml`, `.yml` files, sorted by
/// name) or `-` (standard input).
pub fn load(paths: &[String]) -> anyhow::Result<Vec<Manifest>> {
    if paths.is_empty() {
        bail!("must specify one of -f or -k: sheepctl apply -f FILE|DIR|-");
    }
    let mut out = Vec::new();
    for p in paths {
        if p == "-" {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("reading manifests from standard input")?;
            out.extend(parse("<stdin>", &text)?);
            continue;
        }
        let path = Path::new(p);
        if path.is_dir() {
            let mut files: Vec<_> = std::fs::read_dir(path)
                .with_context(|| format!("reading directory {p}"))?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|f| f.extension().and_then(|x| x.to_str()).is_some_and(|x| matches!(x, "json" | "yaml" | "yml")))
                .collect();
            files.sort();
            for f in files {
                let text = std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
                out.extend(parse(&f.display().to_string(), &text)?);
            }
        } else {
            let text = std::fs::read_to_string(path).with_context(|| format!("the path \"{p}\" cannot be read"))?;
            out.extend(parse(p, &text)?);
        }
    }
    Ok(out)
}

/// Parses one file's text: JSON (one or several concatenated values) or YAML documents.
pub fn parse(file: &str, text: &str) -> anyhow::Result<Vec<Manifest>> {
    let trimmed = text.trim_start();
    let documents: Vec<Value> = if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let mut docs = Vec::new();
        for (i, v) in serde_json::Deserializer::from_str(text).into_iter::<Value>().enumerate() {
            let v = v.map_err(|e| anyhow::anyhow!("invalid manifest {file} (document {}): malformed JSON: {e}", i + 1))?;
            docs.push(v);
        }
        docs
    } else {
        serde_saphyr::from_multiple::<Value>(text).map_err(|e| anyhow::anyhow!("invalid manifest {file}: malformed YAML: {}", one_line(&e.to_string())))?
    };
    let mut out = Vec::new();
    for (i, doc) in documents.into_iter().enumerate() {
        let source = Source { file: file.to_string(), document: i + 1 };
        if doc.is_null() {
            continue; // an empty YAML document (`---` at the end)
        }
        let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
        if kind.ends_with("List") && doc.get("items").is_some() {
            let items = doc["items"].as_array().cloned().ok_or_else(|| invalid(&source, "items", "must be a list of objects"))?;
            for (j, item) in items.into_iter().enumerate() {
                out.push(check(item, &source, &format!("items[{j}]."))?);
            }
        } else {
            out.push(check(doc, &source, "")?);
        }
    }
    Ok(out)
}

fn one_line(s: &str) -> String {
    s.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

fn invalid(source: &Source, field: &str, why: &str) -> anyhow::Error {
    anyhow::anyhow!("invalid manifest {source}: {field}: {why}")
}

/// Fills the shorthand in, then checks the object against its Kubernetes type so a wrong field
/// is reported with its path before anything is sent.
fn check(mut obj: Value, source: &Source, prefix: &str) -> anyhow::Result<Manifest> {
    if !obj.is_object() {
        return Err(invalid(source, prefix.trim_end_matches('.'), "must be an object with kind, metadata and spec"));
    }
    let kind = match obj.get("kind") {
        Some(Value::String(k)) if !k.is_empty() => k.clone(),
        Some(_) => return Err(invalid(source, &format!("{prefix}kind"), "must be a string")),
        None => return Err(invalid(source, &format!("{prefix}kind"), "Required value: every object needs a kind")),
    };
    let res = match obj.get("apiVersion").and_then(Value::as_str) {
        Some(av) => kinds::by_api_version_kind(av, &kind).ok_or_else(|| {
            invalid(source, &format!("{prefix}kind"), &format!("no matches for kind \"{kind}\" in version \"{av}\""))
        })?,
        None => {
            let res = kinds::by_kind(&kind).ok_or_else(|| invalid(source, &format!("{prefix}kind"), &format!("unknown kind \"{kind}\"")))?;
            obj["apiVersion"] = json!(res.api_version());
            res
        }
    };
    if matches!(res.kind, "Deployment" | "ReplicaSet")
        && let Some(sel) = obj.pointer_mut("/spec/selector")
    {
        let is_plain_map = sel.as_object().is_some_and(|m| !m.contains_key("matchLabels") && !m.contains_key("matchExpressions"));
        if is_plain_map {
            *sel = json!({"matchLabels": sel.clone()});
        }
    }
    match obj.pointer("/metadata/name") {
        Some(Value::String(n)) if !n.is_empty() => {}
        _ => return Err(invalid(source, &format!("{prefix}metadata.name"), "Required value: name is required")),
    }
    let typed = match res.kind {
        "Pod" => type_check::<k8s_openapi::api::core::v1::Pod>(&obj),
        "Service" => type_check::<k8s_openapi::api::core::v1::Service>(&obj),
        "Namespace" => type_check::<k8s_openapi::api::core::v1::Namespace>(&obj),
        "Node" => type_check::<k8s_openapi::api::core::v1::Node>(&obj),
        "Endpoints" => type_check::<k8s_openapi::api::core::v1::Endpoints>(&obj),
        "Event" => type_check::<k8s_openapi::api::core::v1::Event>(&obj),
        "Deployment" => type_check::<k8s_openapi::api::apps::v1::Deployment>(&obj),
        "ReplicaSet" => type_check::<k8s_openapi::api::apps::v1::ReplicaSet>(&obj),
        "Lease" => type_check::<k8s_openapi::api::coordination::v1::Lease>(&obj),
        "ConfigMap" => type_check::<k8s_openapi::api::core::v1::ConfigMap>(&obj),
        "Secret" => type_check::<k8s_openapi::api::core::v1::Secret>(&obj),
        "ServiceAccount" => type_check::<k8s_openapi::api::core::v1::ServiceAccount>(&obj),
        _ => Ok(()),
    };
    if let Err((field, why)) = typed {
        return Err(invalid(source, &format!("{prefix}{field}"), &why));
    }
    Ok(Manifest { res, object: obj })
}

/// Deserializes into the typed object to find the first field of the wrong type.
fn type_check<T: DeserializeOwned>(obj: &Value) -> Result<(), (String, String)> {
    let text = obj.to_string();
    let mut de = serde_json::Deserializer::from_str(&text);
    match serde_path_to_error::deserialize::<_, T>(&mut de) {
        Ok(_) => Ok(()),
        Err(e) => {
            let field = e.path().to_string();
            let why = e.into_inner().to_string();
            // serde_json appends "at line 1 column N", meaningless for the user's file.
            let why = why.split(" at line ").next().unwrap_or(&why).to_string();
            Err((field, format!("Invalid value: {why}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = r#"{"kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":3,"selector":{"app":"web"},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"web","image":"minimal"}]}}}}"#;

    #[test]
    fn seed_shorthand_gets_an_api_version_and_match_labels() {
        let m = parse("-", SEED).expect("seed parses");
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].object["apiVersion"], "apps/v1");
        assert_eq!(m[0].object["spec"]["selector"], json!({"matchLabels": {"app": "web"}}));
    }

    #[test]
    fn yaml_documents_and_lists_are_flattened_in_order() {
        let text = "kind: Namespace\napiVersion: v1\nmetadata: {name: a}\n---\napiVersion: v1\nkind: List\nitems:\n- {kind: Namespace, apiVersion: v1, metadata: {name: b}}\n- {kind: Namespace, apiVersion: v1, metadata: {name: c}}\n---\n";
        let names: Vec<String> = parse("x.yaml", text).expect("parses").iter().map(|m| m.name().to_string()).collect();
        assert_eq!(names, ["a", "b", "c"]);
    }

    #[test]
    fn empty_yaml_documents_are_skipped_wherever_they_are() {
        let ns = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n";
        for text in [format!("{ns}---\n"), format!("{ns}--- \n---\n"), format!("---\n{ns}---\n---\n"),
            format!("---\n---\n{ns}"), format!("{ns}---\n# only a comment\n---\n")] {
            let got = parse("f.yaml", &text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(got.iter().map(|m| m.name().to_string()).collect::<Vec<_>>(), ["a"], "{text:?}");
        }
        assert!(parse("f.yaml", "---\n---\n").expect("only empty documents").is_empty());
    }

    #[test]
    fn a_wrong_field_type_names_file_document_and_field() {
        let text = "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec: {replicas: three}\n";
        let err = parse("bad.yaml", text).expect_err("must fail").to_string();
        assert_eq!(err, "invalid manifest bad.yaml (document 2): spec.replicas: Invalid value: invalid type: string \"three\", expected i32");
    }
}
