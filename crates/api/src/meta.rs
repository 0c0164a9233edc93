//! Reading the `metadata` every object carries: identity, deletion, finalizers, labels and owner
//! references.

use serde_json::{Map, Value};

use crate::json::{JsonPath, array_at, int_at, opt_str_at, str_at, strings_at};

pub fn name(obj: &Value) -> &str {
    str_at(obj, "/metadata/name")
}

pub fn namespace(obj: &Value) -> Option<&str> {
    opt_str_at(obj, "/metadata/namespace").filter(|ns| !ns.is_empty())
}

pub fn uid(obj: &Value) -> &str {
    str_at(obj, "/metadata/uid")
}

pub fn generation(obj: &Value) -> i64 {
    int_at(obj, "/metadata/generation")
}

pub fn resource_version(obj: &Value) -> &str {
    str_at(obj, "/metadata/resourceVersion")
}

/// Marked for deletion (`deletionTimestamp` set): on its way out, whatever still holds it.
pub fn is_deleting(obj: &Value) -> bool {
    obj.at("/metadata/deletionTimestamp").is_some_and(|v| !v.is_null())
}

pub fn has_finalizer(obj: &Value, finalizer: &str) -> bool {
    strings_at(obj, "/metadata/finalizers").any(|f| f == finalizer)
}

pub fn finalizers(obj: &Value) -> Vec<&str> {
    strings_at(obj, "/metadata/finalizers").collect()
}

/// Labels of `obj` as a map of strings.
pub fn labels(obj: &Value) -> Map<String, Value> {
    obj.at("/metadata/labels").and_then(Value::as_object).cloned().unwrap_or_default()
}

pub fn owner_references(obj: &Value) -> &[Value] {
    array_at(obj, "/metadata/ownerReferences")
}

/// The owner reference marked `controller: true`.
pub fn controller_ref(obj: &Value) -> Option<&Value> {
    owner_references(obj).iter().find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
}

/// The uid of the controlling owner, if any.
pub fn controller_uid(obj: &Value) -> Option<&str> {
    controller_ref(obj).and_then(|r| r.get("uid")).and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metadata_reads_defaults_for_absent_fields_and_finds_the_controlling_owner() {
        let obj = json!({"metadata": {"name": "web", "namespace": "", "generation": 3, "finalizers": ["a", 1, "b"],
            "ownerReferences": [{"uid": "u1"}, {"uid": "u2", "controller": true}], "deletionTimestamp": null}});
        assert_eq!((name(&obj), namespace(&obj), uid(&obj), generation(&obj)), ("web", None, "", 3));
        assert_eq!(finalizers(&obj), ["a", "b"]);
        assert!(has_finalizer(&obj, "b") && !has_finalizer(&obj, "c"));
        assert!(!is_deleting(&obj), "a null deletionTimestamp is not a deletion");
        assert_eq!(controller_uid(&obj), Some("u2"));
        assert_eq!(owner_references(&json!({})).len(), 0);
    }
}
