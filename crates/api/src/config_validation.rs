//! Validation of ConfigMaps and Secrets: key names, sizes, the typed Secrets' required keys, and
//! the `immutable` rule, with Kubernetes' field paths and messages.

use base64::Engine;
use serde_json::{Map, Value};

use crate::error::Cause;
use crate::json::map_at;

/// Kubernetes' bound on the data of one ConfigMap or Secret (`MaxSecretSize`, 1 MiB): objects
/// bigger than this would not fit etcd's request limit.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

const KEY_RULE: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' \
(e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";

/// The Secret types whose keys Kubernetes checks, and the keys each requires.
const TYPED_SECRETS: &[(&str, &[&str])] = &[
    ("kubernetes.io/dockerconfigjson", &[".dockerconfigjson"]),
    ("kubernetes.io/dockercfg", &[".dockercfg"]),
    ("kubernetes.io/tls", &["tls.crt", "tls.key"]),
    ("kubernetes.io/basic-auth", &[]),
    ("kubernetes.io/ssh-auth", &["ssh-privatekey"]),
];

fn check_key(field: &str, key: &str, c: &mut Vec<Cause>) {
    let path = format!("{field}[{key}]");
    let shown = Value::from(key);
    if key.is_empty() || key.len() > 253 || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b)) {
        c.push(Cause::invalid(path, format!("Invalid value: {shown}: {KEY_RULE}")));
    } else if key == "." || key == ".." || key.starts_with("..") {
        let why = if key == "." { "must not be '.'" } else if key == ".." { "must not be '..'" } else { "must not start with '..'" };
        c.push(Cause::invalid(path, format!("Invalid value: {shown}: a valid config key {why}")));
    }
}

/// Bytes of a Secret's `data` value (base64 in JSON); a value that is not base64 was refused by
/// the schema check already and counts by its text.
fn decoded_len(v: &Value) -> usize {
    let s = v.as_str().unwrap_or_default();
    base64::engine::general_purpose::STANDARD.decode(s).map_or(s.len(), |b| b.len())
}

pub(crate) fn validate_config_map(obj: &Value, c: &mut Vec<Cause>) {
    let data = map_at(obj, "/data");
    let binary = map_at(obj, "/binaryData");
    let mut total = 0;
    for (k, v) in data.into_iter().flatten() {
        check_key("data", k, c);
        total += k.len() + v.as_str().map_or(0, str::len);
    }
    for (k, v) in binary.into_iter().flatten() {
        check_key("binaryData", k, c);
        if data.is_some_and(|d| d.contains_key(k)) {
            c.push(Cause::invalid(format!("data[{k}]"), format!("Invalid value: {}: duplicate of key present in binaryData", Value::from(k.as_str()))));
        }
        total += k.len() + decoded_len(v);
    }
    if total > MAX_CONFIG_BYTES {
        c.push(Cause::new("FieldValueTooLong", "", format!("Too long: must have at most {MAX_CONFIG_BYTES} bytes")));
    }
}

pub(crate) fn validate_secret(obj: &Value, c: &mut Vec<Cause>) {
    let data = map_at(obj, "/data");
    let mut total = 0;
    for (k, v) in data.into_iter().flatten() {
        check_key("data", k, c);
        total += decoded_len(v);
    }
    if total > MAX_CONFIG_BYTES {
        c.push(Cause::new("FieldValueTooLong", "data", format!("Too long: must have at most {MAX_CONFIG_BYTES} bytes")));
    }
    let ty = obj.get("type").and_then(Value::as_str).unwrap_or("Opaque");
    let has = |k: &str| data.is_some_and(|d| d.contains_key(k));
    if let Some((_, required)) = TYPED_SECRETS.iter().find(|(t, _)| *t == ty) {
        for key in *required {
            if !has(key) {
                c.push(Cause::required(format!("data[{key}]")));
            }
        }
    }
    match ty {
        "kubernetes.io/dockerconfigjson" if has(".dockerconfigjson") => {
            let raw = data.and_then(|d| d.get(".dockerconfigjson")).and_then(Value::as_str).unwrap_or_default();
            let decoded = base64::engine::general_purpose::STANDARD.decode(raw).unwrap_or_default();
            if let Err(e) = serde_json::from_slice::<Map<String, Value>>(&decoded) {
                c.push(Cause::invalid("data[.dockerconfigjson]", format!("Invalid value: \"<secret contents redacted>\": {e}")));
            }
        }
        "kubernetes.io/service-account-token" => {
            let named = obj
                .pointer("/metadata/annotations/kubernetes.io~1service-account.name")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if !named {
                c.push(Cause::required("metadata.annotations[kubernetes.io/service-account.name]"));
            }
        }
        _ => {}
    }
}

/// The update rules of ConfigMaps and Secrets: once `immutable` is true, neither the data nor the
/// flag may change; a Secret's type never changes.
pub(crate) fn validate_config_update(kind: &str, old: &Value, new: &Value, c: &mut Vec<Cause>) {
    if kind == "Secret" {
        let (was, now) = (old.get("type").and_then(Value::as_str), new.get("type").and_then(Value::as_str));
        if was.is_some() && now != was {
            c.push(Cause::invalid("type", format!("Invalid value: \"{}\": field is immutable", now.unwrap_or(""))));
        }
    }
    if old.get("immutable") != Some(&Value::Bool(true)) {
        return;
    }
    const RULE: &str = "Forbidden: field is immutable when `immutable` is set";
    if new.get("immutable") != Some(&Value::Bool(true)) {
        c.push(Cause::forbidden("immutable", RULE));
    }
    let fields: &[&str] = if kind == "Secret" { &["data"] } else { &["data", "binaryData"] };
    for field in fields {
        let empty = Value::Object(Map::new());
        let (was, now) = (old.get(*field).unwrap_or(&empty), new.get(*field).unwrap_or(&empty));
        if was != now {
            c.push(Cause::forbidden(*field, RULE));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields(f: impl Fn(&mut Vec<Cause>)) -> Vec<String> {
        let mut c = Vec::new();
        f(&mut c);
        c.into_iter().map(|c| c.field).collect()
    }

    #[test]
    fn config_map_keys_are_checked_and_one_mebibyte_is_the_limit() {
        let ok = json!({"data": {"a.conf": "x", "B_2-c": "y"}, "binaryData": {"bin": "AAEC"}});
        assert!(fields(|c| validate_config_map(&ok, c)).is_empty());
        let bad = json!({"data": {"a b": "x", "..x": "y", "dup": "z"}, "binaryData": {"dup": "AAEC"}});
        assert_eq!(fields(|c| validate_config_map(&bad, c)), ["data[..x]", "data[a b]", "data[dup]"]);
        let big = json!({"data": {"k": "x".repeat(MAX_CONFIG_BYTES)}});
        assert_eq!(fields(|c| validate_config_map(&big, c)), [""]);
    }

    #[test]
    fn typed_secrets_need_their_keys() {
        let tls = json!({"type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}});
        assert_eq!(fields(|c| validate_secret(&tls, c)), ["data[tls.key]"]);
        let docker = json!({"type": "kubernetes.io/dockerconfigjson", "data": {".dockerconfigjson": "bm90IGpzb24="}});
        assert_eq!(fields(|c| validate_secret(&docker, c)), ["data[.dockerconfigjson]"]);
        let token = json!({"type": "kubernetes.io/service-account-token"});
        assert_eq!(fields(|c| validate_secret(&token, c)), ["metadata.annotations[kubernetes.io/service-account.name]"]);
        let big = json!({"data": {"k": base64::engine::general_purpose::STANDARD.encode(vec![0u8; MAX_CONFIG_BYTES + 1])}});
        assert_eq!(fields(|c| validate_secret(&big, c)), ["data"]);
    }

    #[test]
    fn immutable_objects_keep_their_data_and_secrets_their_type() {
        let old = json!({"immutable": true, "data": {"a": "1"}});
        assert!(fields(|c| validate_config_update("ConfigMap", &old, &old, c)).is_empty());
        let changed = json!({"immutable": true, "data": {"a": "2"}});
        assert_eq!(fields(|c| validate_config_update("ConfigMap", &old, &changed, c)), ["data"]);
        let unset = json!({"immutable": false, "data": {"a": "1"}});
        assert_eq!(fields(|c| validate_config_update("ConfigMap", &old, &unset, c)), ["immutable"]);
        let retyped = json!({"type": "kubernetes.io/tls"});
        assert_eq!(fields(|c| validate_config_update("Secret", &json!({"type": "Opaque"}), &retyped, c)), ["type"]);
    }
}
