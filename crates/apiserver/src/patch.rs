//! Applying merge, strategic-merge and JSON patches to a copy of an object, with every result
//! checked to be an object of bounded size and depth before anything else reads it.

use serde_json::{Value, json};
use shepherd_api::{ApiError, JsonPath};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    /// Accepted for kubectl: applied as a merge patch in which lists of named objects
    /// (containers, ports, env) merge by `name`.
    StrategicMerge,
}

/// Kubernetes' limit on the operations of one JSON patch.
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// How much a JSON patch may duplicate with `copy`, in serialized bytes: without a bound, a
/// handful of `copy` operations that each double the document exhaust memory. Kubernetes bounds
/// it by its request-size limit, as here.
const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// How deep a patched object may nest. Request bodies cannot nest deeper than the JSON parser's
/// limit (128), but a JSON patch can build depth one `add` at a time, and a value nested deep
/// enough overflows the stack of whatever walks it recursively (validation, drop).
const MAX_DEPTH: usize = 100;

/// Applies `patch` to a copy of `old`; the result is always a JSON object.
pub(crate) fn apply_patch(old: &Value, patch_type: PatchType, patch: &Value) -> Result<Value, ApiError> {
    let mut new = old.clone();
    match patch_type {
        PatchType::Merge | PatchType::StrategicMerge => {
            if !patch.is_object() {
                return Err(ApiError::BadRequest("a merge patch must be a JSON object".into()));
            }
            merge_patch(&mut new, patch, patch_type == PatchType::StrategicMerge);
        }
        PatchType::Json => apply_json_patch(&mut new, patch)?,
    }
    if !new.is_object() {
        return Err(ApiError::BadRequest("the patched object must be a JSON object".into()));
    }
    Ok(new)
}

/// Applies a JSON patch (RFC 6902) in place. Callers patch a copy, so a failed operation
/// leaves a half-patched copy that is thrown away; the crate's own undo is not needed (its undo
/// cannot always undo, and panics then).
pub(crate) fn apply_json_patch(doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::BadRequest(format!("invalid JSON patch: {e}")))?;
    if ops.0.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(ApiError::RequestEntityTooLarge(format!(
            "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
            ops.0.len()
        )));
    }
    let mut copied = 0usize;
    for (i, op) in ops.0.iter().enumerate() {
        let (path, added) = match op {
            json_patch::PatchOperation::Add(o) => (&o.path, Some(&o.value)),
            json_patch::PatchOperation::Replace(o) => (&o.path, Some(&o.value)),
            json_patch::PatchOperation::Copy(o) => {
                let source = doc.at(o.from.as_str());
                copied += source.map_or(0, |v| serde_json::to_vec(v).map_or(0, |b| b.len()));
                if copied > MAX_JSON_PATCH_COPY_BYTES {
                    return Err(ApiError::RequestEntityTooLarge(format!(
                        "the JSON patch copies more than {MAX_JSON_PATCH_COPY_BYTES} bytes"
                    )));
                }
                (&o.path, source)
            }
            json_patch::PatchOperation::Move(o) => (&o.path, doc.at(o.from.as_str())),
            json_patch::PatchOperation::Test(t) if t.value.is_null() && tests_absent_member(doc, t.path.as_str()) => {
                continue;
            }
            json_patch::PatchOperation::Remove(_) | json_patch::PatchOperation::Test(_) => {
                apply_one(doc, op)?;
                continue;
            }
        };
        // The document stays within MAX_DEPTH if every value placed keeps within it.
        let depth = path.count() + added.map_or(0, depth_of);
        if depth > MAX_DEPTH {
            return Err(ApiError::BadRequest(format!(
                "the JSON patch nests the object deeper than {MAX_DEPTH} levels (operation {i})"
            )));
        }
        apply_one(doc, op)?;
    }
    Ok(())
}

/// Whether `path` names an absent member of an object that exists. Kubernetes' JSON patch reads
/// such a member as null, so `{"op": "test", "path": "/metadata/finalizers", "value": null}`
/// passes on an object without finalizers (kube-rs's finalizer helper sends exactly that).
fn tests_absent_member(doc: &Value, path: &str) -> bool {
    let Some((parent, _)) = path.rsplit_once('/') else { return false };
    doc.at(path).is_none() && doc.at(parent).is_some_and(Value::is_object)
}

fn apply_one(doc: &mut Value, op: &json_patch::PatchOperation) -> Result<(), ApiError> {
    json_patch::patch_unsafe(doc, std::slice::from_ref(op)).map_err(|e| ApiError::Invalid {
        kind: String::new(),
        name: String::new(),
        message: format!("the JSON patch could not be applied: {e}"),
        causes: vec![],
    })
}

/// Nesting depth of a value (a scalar is 0), without recursion.
fn depth_of(v: &Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(o) => stack.extend(o.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    max
}

/// Merge patch (RFC 7386), with strategic-merge behaviour for lists of named objects when asked.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value, strategic: bool) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let Some(t) = target.as_object_mut() else { return };
    for (k, v) in p {
        if k == "$patch" || k.starts_with("$setElementOrder") || k.starts_with("$retainKeys") {
            continue;
        }
        if v.is_null() {
            t.remove(k);
        } else if strategic && is_named_list(v) && t.get(k).is_some_and(is_named_list) {
            let Some(Value::Array(existing)) = t.get_mut(k) else { continue };
            for item in v.as_array().into_iter().flatten() {
                let name = item.get("name");
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match existing.iter().position(|e| e.get("name") == name) {
                    Some(i) if delete => {
                        existing.remove(i);
                    }
                    Some(i) => merge_patch(&mut existing[i], item, true),
                    None if !delete => existing.push(item.clone()),
                    None => {}
                }
            }
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v, strategic);
        }
    }
}

fn is_named_list(v: &Value) -> bool {
    v.as_array().is_some_and(|a| !a.is_empty() && a.iter().all(|e| e.get("name").is_some_and(Value::is_string)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_json_patch_test_for_null_passes_on_an_absent_member_of_an_existing_object() {
        let old = json!({"metadata": {"name": "a"}});
        let add_first_finalizer = json!([
            {"op": "test", "path": "/metadata/finalizers", "value": null},
            {"op": "add", "path": "/metadata/finalizers", "value": ["f"]},
        ]);
        let new = apply_patch(&old, PatchType::Json, &add_first_finalizer).expect("test for null passes");
        assert_eq!(new["metadata"]["finalizers"], json!(["f"]));
        // Once the member exists, the same patch fails: that is what makes it safe to retry.
        assert!(apply_patch(&new, PatchType::Json, &add_first_finalizer).is_err());
        // A missing parent is still an error, as is a null test against a present value.
        let missing_parent = json!([{"op": "test", "path": "/spec/x", "value": null}]);
        assert!(apply_patch(&old, PatchType::Json, &missing_parent).is_err());
        let present = json!([{"op": "test", "path": "/metadata/name", "value": null}]);
        assert!(apply_patch(&old, PatchType::Json, &present).is_err());
    }

    #[test]
    fn strategic_merge_patches_containers_by_name() {
        let mut obj = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}});
        merge_patch(&mut obj, &json!({"spec": {"containers": [{"name": "b", "image": "z"}]}}), true);
        assert_eq!(obj["spec"]["containers"][0]["image"], "x");
        assert_eq!(obj["spec"]["containers"][1]["image"], "z");
        merge_patch(&mut obj, &json!({"spec": {"containers": [{"name": "b", "image": "q"}]}}), false);
        assert_eq!(obj["spec"]["containers"].as_array().map(Vec::len), Some(1), "plain merge patch replaces lists");
    }

    #[test]
    fn a_patch_that_replaces_the_root_with_a_non_object_is_refused() {
        let old = json!({"kind": "Pod", "metadata": {"name": "p"}});
        for ops in [
            json!([{"op": "add", "path": "", "value": ""}]),
            json!([{"op": "replace", "path": "", "value": [1]}]),
            // The crate's undo of a root `add` after a later failure used to panic.
            json!([{"op": "add", "path": "", "value": 5}, {"op": "remove", "path": "/nope"}]),
            json!([{"op": "add", "path": "", "value": {}}, {"op": "test", "path": "/x", "value": 1}]),
            json!([{"op": "move", "from": "/metadata", "path": ""}, {"op": "remove", "path": "/zz"}]),
        ] {
            let r = apply_patch(&old, PatchType::Json, &ops);
            assert!(matches!(r, Err(ApiError::BadRequest(_) | ApiError::Invalid { .. })), "{ops}: {r:?}");
        }
        let r = apply_patch(&old, PatchType::Merge, &json!([1]));
        assert!(matches!(r, Err(ApiError::BadRequest(_))), "{r:?}");
    }

    #[test]
    fn json_patches_cannot_grow_without_bound() {
        let old = json!({"a": {"b": "x".repeat(1000)}});
        let doubling: Vec<Value> = (0..40).map(|i| json!({"op": "copy", "from": "", "path": format!("/c{i}")})).collect();
        assert!(matches!(apply_patch(&old, PatchType::Json, &json!(doubling)), Err(ApiError::RequestEntityTooLarge(_))));
        let mut deep = vec![json!({"op": "add", "path": "/d", "value": {}})];
        let mut path = "/d".to_string();
        for _ in 0..200 {
            path.push_str("/d");
            deep.push(json!({"op": "add", "path": path, "value": {}}));
        }
        assert!(matches!(apply_patch(&old, PatchType::Json, &json!(deep)), Err(ApiError::BadRequest(_))));
    }
}
