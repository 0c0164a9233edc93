//! What a write request asks for besides its body: `dryRun` and `fieldValidation`, and the
//! request-body decoding that notes duplicate fields for them.

use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use shepherd_api::{ApiError, Cause};

/// How a create, update or patch treats fields the schema does not know, and duplicate fields
/// (`fieldValidation`, as in Kubernetes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Unknown or duplicate fields fail the request with 400.
    Strict,
    /// Unknown fields are dropped and each is reported in a `Warning` header; of duplicate fields
    /// the last one wins, also with a warning. Kubernetes' default since 1.27.
    #[default]
    Warn,
    /// Unknown fields are dropped silently.
    Ignore,
}

/// Options of a create, update or patch, passed through the service layer as one value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteOptions {
    /// `dryRun=All`: defaulting, validation and admission run in full, nothing is written, and
    /// the object as it would have been stored is returned.
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// Who makes the write, recorded in `metadata.managedFields`: the `fieldManager` parameter, or
    /// what the client's User-Agent says; `None` for the server's own components.
    pub field_manager: Option<String>,
    /// `force=true` on a server-side apply: take the fields other managers own.
    pub force: bool,
}

/// The manager of writes that name none and come from none of the components below.
pub const DEFAULT_FIELD_MANAGER: &str = "shepherd";
/// The field managers Shepherd's own components write under, in process (where they act as
/// `system:kube-controller-manager`, `system:kube-scheduler` and `system:node:NAME`) and as
/// processes of their own (their User-Agent), as Kubernetes' components each write under their
/// own name: `--show-managed-fields` says which component set a field.
pub const CONTROLLER_MANAGER_FIELD_MANAGER: &str = "shepherd-controller-manager";
pub const SCHEDULER_FIELD_MANAGER: &str = "shepherd-scheduler";
pub const AGENT_FIELD_MANAGER: &str = "shepherd-agent";

impl WriteOptions {
    pub(crate) fn manager(&self) -> &str {
        match &self.field_manager {
            Some(m) => m,
            None => crate::authz::requester_name(component_manager).flatten().unwrap_or(DEFAULT_FIELD_MANAGER),
        }
    }
}

/// The field manager of the in-process component acting as `user`, if it is one.
fn component_manager(user: &str) -> Option<&'static str> {
    match user {
        "system:kube-controller-manager" => Some(CONTROLLER_MANAGER_FIELD_MANAGER),
        "system:kube-scheduler" => Some(SCHEDULER_FIELD_MANAGER),
        u if u.starts_with("system:node:") => Some(AGENT_FIELD_MANAGER),
        _ => None,
    }
}

/// Which options kind a write's query parameters are validated as (`CreateOptions`...), for the
/// `Status` Kubernetes answers on a bad value.
#[derive(Debug, Clone, Copy)]
pub enum OptionsKind {
    Create,
    Update,
    Patch,
    Delete,
}

impl OptionsKind {
    fn name(self) -> &'static str {
        match self {
            OptionsKind::Create => "CreateOptions",
            OptionsKind::Update => "UpdateOptions",
            OptionsKind::Patch => "PatchOptions",
            OptionsKind::Delete => "DeleteOptions",
        }
    }
}

/// Reads `dryRun` (only `All` exists) and, except for deletes, `fieldValidation`. A bad value is
/// a 422 on the options kind, as Kubernetes answers it.
pub fn parse_write_options(
    kind: OptionsKind,
    dry_run: Option<&str>,
    field_validation: Option<&str>,
) -> Result<WriteOptions, ApiError> {
    let mut causes = Vec::new();
    let dry_run = match dry_run {
        None => false,
        Some("All") => true,
        Some(other) => {
            causes.push(Cause::not_supported(
                "dryRun",
                format!("Unsupported value: []string{{{other:?}}}: supported values: \"All\""),
            ));
            false
        }
    };
    let field_validation = match field_validation {
        None | Some("") => FieldValidation::default(),
        Some(_) if matches!(kind, OptionsKind::Delete) => FieldValidation::default(),
        Some("Strict") => FieldValidation::Strict,
        Some("Warn") => FieldValidation::Warn,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            causes.push(Cause::not_supported(
                "fieldValidation",
                format!("Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""),
            ));
            FieldValidation::default()
        }
    };
    if !causes.is_empty() {
        return Err(ApiError::invalid(&format!("{}.meta.k8s.io", kind.name()), "", causes));
    }
    Ok(WriteOptions { dry_run, field_validation, ..Default::default() })
}

/// Reads `fieldManager` and `force` as Kubernetes validates them (a 422 on the options kind): at most
/// 128 printable characters; required for an apply; `force` only on an apply. Without one, the
/// manager is what the client's User-Agent says.
pub fn parse_field_manager(
    kind: OptionsKind,
    field_manager: Option<&str>,
    force: Option<&str>,
    apply: bool,
    user_agent: &str,
) -> Result<(Option<String>, bool), ApiError> {
    let mut causes = Vec::new();
    let given = field_manager.filter(|m| !m.is_empty());
    if apply && given.is_none() {
        causes.push(Cause::new("FieldValueRequired", "fieldManager", "Required value: is required for apply patch"));
    }
    if let Some(m) = given {
        if m.len() > crate::apply::FIELD_MANAGER_MAX_LENGTH {
            causes.push(Cause::new(
                "FieldValueTooLong",
                "fieldManager",
                format!("Too long: may not be more than {} bytes", crate::apply::FIELD_MANAGER_MAX_LENGTH),
            ));
        }
        if m.chars().any(char::is_control) {
            causes.push(Cause::invalid("fieldManager", format!("Invalid value: {m:?}: must only contain printable characters")));
        }
    }
    let force = match force {
        None => false,
        Some(_) if !apply => {
            causes.push(Cause::forbidden("force", "Forbidden: may not be specified for non-apply patch"));
            false
        }
        Some("true" | "1") => true,
        Some("false" | "0" | "") => false,
        Some(other) => {
            causes.push(Cause::invalid("force", format!("Invalid value: {other:?}: must be true or false")));
            false
        }
    };
    if !causes.is_empty() {
        return Err(ApiError::invalid(&format!("{}.meta.k8s.io", kind.name()), "", causes));
    }
    let manager = given.map(str::to_string).unwrap_or_else(|| crate::apply::manager_from_user_agent(user_agent));
    Ok((Some(manager), force))
}

/// The strict-decoding error Kubernetes answers for unknown or duplicate fields under
/// `fieldValidation=Strict`: `Pod in version "v1" cannot be handled as a Pod: strict decoding
/// error: unknown field "spec.foo"`.
pub fn strict_decoding_error(kind: &str, version: &str, problems: &[String]) -> ApiError {
    ApiError::BadRequest(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        problems.join(", ")
    ))
}

/// Parses a JSON request body, returning the value (the last of duplicate fields wins, as with
/// `serde_json`) and the path of every duplicate field (`spec.replicas`, `spec.ports[0].name`).
pub fn parse_noting_duplicates(body: &[u8]) -> Result<(Value, Vec<String>), serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut path = Vec::new();
    let mut duplicates = Vec::new();
    let value = Noting { path: &mut path, duplicates: &mut duplicates }.deserialize(&mut de)?;
    de.end()?;
    Ok((value, duplicates))
}

/// Builds a `Value` like `serde_json` does, keeping the path it is at to name duplicate keys.
struct Noting<'a> {
    path: &'a mut Vec<String>,
    duplicates: &'a mut Vec<String>,
}

fn render_path(path: &[String]) -> String {
    let mut out = String::new();
    for seg in path {
        if !out.is_empty() && !seg.starts_with('[') {
            out.push('.');
        }
        out.push_str(seg);
    }
    out
}

impl<'de> DeserializeSeed<'de> for Noting<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Noting<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    crate::codec::scalar_visits!();
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        loop {
            self.path.push(format!("[{}]", items.len()));
            let next = seq.next_element_seed(Noting { path: self.path, duplicates: self.duplicates });
            self.path.pop();
            match next? {
                Some(v) => items.push(v),
                None => return Ok(Value::Array(items)),
            }
        }
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.path.push(key);
            let value = map.next_value_seed(Noting { path: self.path, duplicates: self.duplicates });
            let key = self.path.pop().unwrap_or_default();
            let value = value?;
            if out.contains_key(&key) {
                let mut p = self.path.clone();
                p.push(key.clone());
                self.duplicates.push(render_path(&p));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn duplicate_fields_are_named_by_their_full_path_and_the_last_wins() {
        let body = br#"{"spec": {"replicas": 1, "replicas": 2, "ports": [{"name": "a", "name": "b"}]}, "x": [1, 2.5, null, true]}"#;
        let (v, dups) = parse_noting_duplicates(body).expect("parse");
        assert_eq!(v, json!({"spec": {"replicas": 2, "ports": [{"name": "b"}]}, "x": [1, 2.5, null, true]}));
        assert_eq!(dups, vec!["spec.replicas".to_string(), "spec.ports[0].name".to_string()]);
    }

    #[test]
    fn bodies_parse_as_serde_json_parses_them() {
        for body in [&b"{\"a\": \"\\u00e9\\n\"}"[..], b"[]", b"12345678901234567890", b"-1.5e3", b"\"s\""] {
            let (v, dups) = parse_noting_duplicates(body).expect("parse");
            assert_eq!(v, serde_json::from_slice::<Value>(body).expect("serde_json"));
            assert!(dups.is_empty());
        }
        for bad in [&b"{\"a\": }"[..], b"{} x", b"1e400", b""] {
            assert!(parse_noting_duplicates(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn only_all_is_a_dry_run_and_bad_values_name_the_parameter() {
        let ok = parse_write_options(OptionsKind::Create, Some("All"), Some("Strict")).expect("valid");
        assert_eq!(ok, WriteOptions { dry_run: true, field_validation: FieldValidation::Strict, ..Default::default() });
        let e = parse_write_options(OptionsKind::Patch, Some("Server"), None).expect_err("invalid");
        assert_eq!(e.code(), 422);
        assert!(e.to_string().starts_with("PatchOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value"), "{e}");
        let e = parse_write_options(OptionsKind::Update, None, Some("Loose")).expect_err("invalid");
        assert!(e.to_string().contains("fieldValidation: Unsupported value: \"Loose\""), "{e}");
    }
}
