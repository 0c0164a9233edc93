//! CustomResourceDefinitions themselves: their defaults and server-owned status, their names,
//! and Kubernetes' validation of them.

use serde_json::{Value, json};
use shepherd_api::kinds::{self, ResourceInfo};
use shepherd_api::{ApiError, Cause, JsonPath};

use super::{CLEANUP_FINALIZER, schema, simple_path, str_at, strings, versions};


/// Completes a definition about to be written, as Kubernetes' defaulting and its establishing
/// controller would: defaults, the cleanup finalizer, and a status the server owns.
pub(crate) fn prepare(old: Option<&Value>, def: &mut Value) {
    let kind = str_at(def, "/spec/names/kind").to_string();
    if let Some(names) = def.get_mut("spec").and_then(|s| s.get_mut("names")).and_then(Value::as_object_mut) {
        if names.get("singular").and_then(Value::as_str).is_none_or(str::is_empty) {
            names.insert("singular".into(), json!(kind.to_ascii_lowercase()));
        }
        if names.get("listKind").and_then(Value::as_str).is_none_or(str::is_empty) {
            names.insert("listKind".into(), json!(format!("{kind}List")));
        }
    }
    if let Some(spec) = def.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("conversion").or_insert_with(|| json!({"strategy": "None"}));
    }
    let deleting = def.at("/metadata/deletionTimestamp").is_some();
    if old.is_none() && let Some(m) = def.get_mut("metadata").and_then(Value::as_object_mut) {
        let list = m.entry("finalizers").or_insert_with(|| json!([]));
        if let Some(a) = list.as_array_mut()
            && !a.iter().any(|f| f == CLEANUP_FINALIZER)
        {
            a.push(json!(CLEANUP_FINALIZER));
        }
    }
    let now = crate::service::now_rfc3339();
    let previous = |t: &str| {
        old.and_then(|o| o.at("/status/conditions")).and_then(Value::as_array).into_iter().flatten()
            .find(|c| c["type"] == t).cloned()
    };
    let condition = |t: &str, status: &str, reason: &str, message: &str| {
        let since = previous(t)
            .filter(|c| c["status"] == status)
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or_else(|| json!(now));
        json!({"type": t, "status": status, "reason": reason, "message": message, "lastTransitionTime": since})
    };
    let mut conditions = match name_conflict(def) {
        None => vec![
            condition("NamesAccepted", "True", "NoConflicts", "no conflicts found"),
            condition("Established", "True", "InitialNamesAccepted", "the initial names have been accepted"),
        ],
        Some(conflict) => vec![
            condition("NamesAccepted", "False", "NameConflict", &conflict),
            condition("Established", "False", "NotAccepted", "not all names are accepted"),
        ],
    };
    if deleting {
        conditions.push(condition("Terminating", "True", "InstanceDeletionInProgress", "CustomResource deletion is in progress"));
    }
    let mut stored = strings(old.and_then(|o| o.at("/status/storedVersions")));
    if let Some(storage) = versions(def).iter().find(|v| v["storage"] == true).map(|v| str_at(v, "/name").to_string())
        && !stored.contains(&storage)
    {
        stored.push(storage);
    }
    let accepted = def.at("/spec/names").cloned().unwrap_or(json!({}));
    def["status"] = json!({"conditions": conditions, "acceptedNames": accepted, "storedVersions": stored});
}

/// A name of `def` another definition of the same group already uses, as Kubernetes' naming
/// controller words it; such a definition is not served.
fn name_conflict(def: &Value) -> Option<String> {
    let me = str_at(def, "/metadata/name");
    let group = str_at(def, "/spec/group");
    let names = def.at("/spec/names")?;
    let others: Vec<&'static ResourceInfo> = kinds::all()
        .into_iter()
        .filter(|r| r.group == group && kinds::custom(r).is_some_and(|c| c.definition != me))
        .collect();
    let plural = str_at(names, "/plural");
    let singular = str_at(names, "/singular");
    let kind = str_at(names, "/kind");
    for r in &others {
        if r.plural == plural || r.singular == plural {
            return Some(format!("\"{plural}\" is already in use"));
        }
        if !singular.is_empty() && (r.plural == singular || r.singular == singular) {
            return Some(format!("\"{singular}\" is already in use"));
        }
        if r.kind == kind {
            return Some(format!("\"{kind}\" is already in use"));
        }
        if let Some(short) = strings(names.get("shortNames")).into_iter().find(|s| r.short_names.contains(&s.as_str())) {
            return Some(format!("\"{short}\" is already in use"));
        }
    }
    None
}

/// Checks a definition as Kubernetes' validation does; `old` is the stored one on an update.
pub(crate) fn validate(old: Option<&Value>, def: &Value) -> Result<(), ApiError> {
    let mut c = Vec::new();
    let name = str_at(def, "/metadata/name");
    let group = str_at(def, "/spec/group");
    let plural = str_at(def, "/spec/names/plural");
    let kind = str_at(def, "/spec/names/kind");
    if group.is_empty() {
        c.push(Cause::required("spec.group"));
    } else if !group.contains('.') || !shepherd_api::validation::is_dns1123_subdomain(group) {
        c.push(Cause::invalid("spec.group", format!("Invalid value: {group:?}: should be a domain with at least one dot")));
    } else if kinds::GROUPS.contains(&group) || group.ends_with(".k8s.io") || group.ends_with(".kubernetes.io") {
        c.push(Cause::invalid("spec.group", format!(
            "Invalid value: {group:?}: is a group served by Shepherd itself; choose a group of your own"
        )));
    }
    if plural.is_empty() {
        c.push(Cause::required("spec.names.plural"));
    } else if !shepherd_api::validation::is_dns1123_label(plural) {
        c.push(Cause::invalid("spec.names.plural", format!("Invalid value: {plural:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")));
    }
    let singular = str_at(def, "/spec/names/singular");
    if !singular.is_empty() && !shepherd_api::validation::is_dns1123_label(singular) {
        c.push(Cause::invalid("spec.names.singular", format!("Invalid value: {singular:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")));
    }
    if kind.is_empty() {
        c.push(Cause::required("spec.names.kind"));
    } else if !kind.chars().next().is_some_and(|ch| ch.is_ascii_alphabetic()) || !kind.chars().all(|ch| ch.is_ascii_alphanumeric()) {
        c.push(Cause::invalid("spec.names.kind", format!("Invalid value: {kind:?}: must be a valid kind name")));
    }
    for (i, s) in strings(def.at("/spec/names/shortNames")).iter().enumerate() {
        if !shepherd_api::validation::is_dns1123_label(s) {
            c.push(Cause::invalid(format!("spec.names.shortNames[{i}]"), format!("Invalid value: {s:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'")));
        }
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        c.push(Cause::invalid("metadata.name", format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group")));
    }
    match str_at(def, "/spec/scope") {
        "Namespaced" | "Cluster" => {}
        "" => c.push(Cause::required("spec.scope")),
        other => c.push(Cause::not_supported("spec.scope", format!("Unsupported value: {other:?}: supported values: \"Cluster\", \"Namespaced\""))),
    }
    match str_at(def, "/spec/conversion/strategy") {
        "" | "None" => {}
        "Webhook" => c.push(Cause::not_supported("spec.conversion.strategy", "Unsupported value: \"Webhook\": supported values: \"None\" (Shepherd does not call conversion webhooks)")),
        other => c.push(Cause::not_supported("spec.conversion.strategy", format!("Unsupported value: {other:?}: supported values: \"None\", \"Webhook\""))),
    }
    validate_versions(def, &mut c);
    if let Some(old) = old {
        for (field, ptr) in [("spec.scope", "/spec/scope"), ("spec.group", "/spec/group"), ("spec.names.plural", "/spec/names/plural")] {
            let (was, now) = (str_at(old, ptr), str_at(def, ptr));
            if was != now {
                c.push(Cause::invalid(field, format!("Invalid value: {now:?}: field is immutable")));
            }
        }
    }
    if c.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid("CustomResourceDefinition.apiextensions.k8s.io", name, c))
}

fn validate_versions(def: &Value, c: &mut Vec<Cause>) {
    let vs = versions(def);
    if vs.is_empty() {
        c.push(Cause::invalid("spec.versions", "Invalid value: []: must have exactly one version marked as storage version"));
        return;
    }
    let storage = vs.iter().filter(|v| v["storage"] == true).count();
    if storage != 1 {
        c.push(Cause::invalid("spec.versions", format!(
            "Invalid value: {storage} storage versions: must have exactly one version marked as storage version"
        )));
    }
    let mut seen = Vec::new();
    for (i, v) in vs.iter().enumerate() {
        let path = format!("spec.versions[{i}]");
        let name = str_at(v, "/name");
        if name.is_empty() {
            c.push(Cause::required(format!("{path}.name")));
        } else if !shepherd_api::validation::is_dns1123_label(name) {
            c.push(Cause::invalid(format!("{path}.name"), format!("Invalid value: {name:?}: a DNS-1035 label must consist of lower case alphanumeric characters or '-'")));
        } else if seen.contains(&name) {
            c.push(Cause::new("FieldValueDuplicate", "spec.versions", format!("Duplicate value: {name:?}")));
        }
        seen.push(name);
        match v.at("/schema/openAPIV3Schema") {
            Some(s) if !s.is_null() => schema::check_structural(s, &format!("{path}.schema.openAPIV3Schema"), c),
            _ => c.push(Cause::required(format!("{path}.schema.openAPIV3Schema")).with("Required value: schemas are required")),
        }
        if let Some(scale) = v.at("/subresources/scale").filter(|s| !s.is_null()) {
            for (field, required) in [("specReplicasPath", true), ("statusReplicasPath", true), ("labelSelectorPath", false)] {
                let p = str_at(scale, &format!("/{field}"));
                let full = format!("{path}.subresources.scale.{field}");
                if p.is_empty() {
                    if required {
                        c.push(Cause::required(full));
                    }
                } else if simple_path(p).is_none() {
                    c.push(Cause::invalid(full, format!("Invalid value: {p:?}: should be a json path under either .spec or .status")));
                }
            }
        }
        for (j, col) in v.get("additionalPrinterColumns").and_then(Value::as_array).into_iter().flatten().enumerate() {
            let cp = format!("{path}.additionalPrinterColumns[{j}]");
            if str_at(col, "/name").is_empty() {
                c.push(Cause::required(format!("{cp}.name")));
            }
            match str_at(col, "/type") {
                "integer" | "number" | "string" | "boolean" | "date" => {}
                "" => c.push(Cause::required(format!("{cp}.type"))),
                other => c.push(Cause::not_supported(format!("{cp}.type"), format!("Unsupported value: {other:?}: supported values: \"boolean\", \"date\", \"integer\", \"number\", \"string\""))),
            }
            let jp = str_at(col, "/jsonPath");
            if jp.is_empty() {
                c.push(Cause::required(format!("{cp}.jsonPath")));
            } else if simple_path(jp).is_none() {
                c.push(Cause::invalid(format!("{cp}.jsonPath"), format!("Invalid value: {jp:?}: must be a simple json path")));
            }
        }
    }
}

trait WithMessage {
    fn with(self, message: &str) -> Self;
}

impl WithMessage for Cause {
    fn with(mut self, message: &str) -> Self {
        self.message = message.to_string();
        self
    }
}
