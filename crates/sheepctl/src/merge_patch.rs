//! The three-way merge patch of client-side apply: from the configuration applied last time
//! (`original`), the file now (`modified`) and the server's object (`live`).
//!
//! Fields the file sets are sent when the live object differs; fields the previous apply set and
//! the file no longer has are removed (`null`). Lists are replaced whole (merge-patch semantics),
//! but only when the file's list changed since the last apply or the live list no longer carries
//! it: the server adds defaults to list elements (`imagePullPolicy`, ...), so a list is "the same"
//! when every value the file sets is present in the live one.

use serde_json::{Map, Value};

/// The merge patch turning `live` into what `modified` asks for; empty when nothing changes.
pub fn three_way(original: Option<&Value>, modified: &Value, live: &Value) -> Map<String, Value> {
    let mut patch = Map::new();
    let Some(m) = modified.as_object() else { return patch };
    let live_map = live.as_object();
    for (key, mv) in m {
        let lv = live_map.and_then(|l| l.get(key));
        let ov = original.and_then(|o| o.get(key));
        match (mv, lv) {
            (Value::Null, Some(l)) if !l.is_null() => {
                patch.insert(key.clone(), Value::Null);
            }
            (Value::Null, _) => {}
            (Value::Object(_), Some(l @ Value::Object(_))) => {
                let sub = three_way(ov, mv, l);
                if !sub.is_empty() {
                    patch.insert(key.clone(), Value::Object(sub));
                }
            }
            (Value::Array(_), Some(l)) => {
                if ov != Some(mv) || !contains(l, mv) {
                    patch.insert(key.clone(), mv.clone());
                }
            }
            (_, Some(l)) if l == mv => {}
            _ => {
                patch.insert(key.clone(), mv.clone());
            }
        }
    }
    if let Some(o) = original.and_then(Value::as_object) {
        for key in o.keys() {
            if !m.contains_key(key) && live_map.is_some_and(|l| l.get(key).is_some_and(|v| !v.is_null())) {
                patch.insert(key.clone(), Value::Null);
            }
        }
    }
    patch
}

/// Whether `live` carries every value `wanted` sets (extra live fields are defaults).
fn contains(live: &Value, wanted: &Value) -> bool {
    match (live, wanted) {
        (Value::Object(l), Value::Object(w)) => w.iter().all(|(k, wv)| match l.get(k) {
            Some(lv) => contains(lv, wv),
            None => wv.is_null(),
        }),
        (Value::Array(l), Value::Array(w)) => l.len() == w.len() && l.iter().zip(w).all(|(a, b)| contains(a, b)),
        _ => live == wanted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unchanged_file_over_defaulted_live_object_needs_no_patch() {
        let file = json!({"spec": {"replicas": 3, "template": {"spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
        let live = json!({"spec": {"replicas": 3, "revisionHistoryLimit": 10, "template": {"spec": {"containers": [
            {"name": "web", "image": "minimal", "imagePullPolicy": "Always"}]}}}, "status": {"replicas": 3}});
        assert!(three_way(Some(&file), &file, &live).is_empty());
    }

    #[test]
    fn changed_and_removed_fields_are_patched_and_nothing_else() {
        let before = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"replicas": 3, "paused": false}});
        let after = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 5}});
        let live = json!({"metadata": {"labels": {"a": "1", "b": "2", "c": "mine"}}, "spec": {"replicas": 3, "paused": false, "x": 1}});
        let patch = three_way(Some(&before), &after, &live);
        assert_eq!(Value::Object(patch), json!({"metadata": {"labels": {"b": null}}, "spec": {"replicas": 5, "paused": null}}));
    }

    #[test]
    fn an_edited_list_is_sent_whole() {
        let before = json!({"c": [{"name": "web", "image": "v1"}]});
        let after = json!({"c": [{"name": "web", "image": "v2"}]});
        let live = json!({"c": [{"name": "web", "image": "v1", "pull": "Always"}]});
        assert_eq!(Value::Object(three_way(Some(&before), &after, &live)), after);
    }
}
