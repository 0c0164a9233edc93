//! The operations of server-side apply on objects read through their schema: the set of fields an
//! applied configuration sets, the comparison of two objects, the merge of a configuration into an
//! object, and the removal of fields no one owns any more.

use serde_json::{Map, Value};

use super::fieldpath::{Path, PathElement, Set};
use super::schema::{ListKind, Schema, Type, TypeRef};

static UNTYPED_REF: TypeRef = TypeRef::Named(String::new());

/// What changed between two objects, path by path.
#[derive(Debug, Default)]
pub(crate) struct Comparison {
    pub(crate) added: Set,
    pub(crate) removed: Set,
    pub(crate) modified: Set,
}

/// How a value is walked: as one leaf, or item by item.
enum Shape<'a> {
    Leaf,
    Fields { fields: Option<&'a std::collections::HashMap<String, TypeRef>>, elem: Option<&'a TypeRef> },
    Items { elem: &'a TypeRef, kind: &'a ListKind },
}

fn shape<'a>(ty: &'a Type, v: &Value) -> Shape<'a> {
    match (ty, v) {
        (Type::Struct { atomic: false, fields }, Value::Object(_)) => Shape::Fields { fields: Some(fields), elem: None },
        (Type::Map { atomic: false, elem }, Value::Object(_)) => Shape::Fields { fields: None, elem: Some(elem) },
        (Type::Untyped, Value::Object(_)) => Shape::Fields { fields: None, elem: Some(&UNTYPED_REF) },
        (Type::List { elem, kind }, Value::Array(_)) if *kind != ListKind::Atomic => Shape::Items { elem, kind },
        _ => Shape::Leaf,
    }
}

/// The type of field `k` of an object walked field by field; `None` for a field the schema does not
/// declare, which no one owns (validation drops or refuses it).
fn field_type<'a>(
    fields: Option<&'a std::collections::HashMap<String, TypeRef>>,
    elem: Option<&'a TypeRef>,
    k: &str,
) -> Option<&'a TypeRef> {
    match fields {
        Some(f) => f.get(k),
        None => elem,
    }
}

/// Key fields that Kubernetes defaults, so that an item that leaves them out is the same item as
/// the stored, defaulted one (a container port without `protocol` is the TCP port).
fn key_default(field: &str) -> Option<Value> {
    (field == "protocol").then(|| Value::String("TCP".into()))
}

/// The path element of list item `i`.
fn item_element(kind: &ListKind, item: &Value, i: usize) -> PathElement {
    match kind {
        ListKind::Set => PathElement::Value(item.to_string()),
        ListKind::Map(keys) => {
            let mut fields = Map::new();
            for k in keys {
                if let Some(v) = item.get(k).filter(|v| !v.is_null()).cloned().or_else(|| key_default(k)) {
                    fields.insert(k.clone(), v);
                }
            }
            if fields.is_empty() { PathElement::Index(i) } else { PathElement::key(fields) }
        }
        ListKind::Atomic => PathElement::Index(i),
    }
}

fn keyed<'v>(kind: &ListKind, items: &'v [Value]) -> Vec<(PathElement, &'v Value)> {
    items.iter().enumerate().map(|(i, v)| (item_element(kind, v, i), v)).collect()
}

fn is_empty_object(v: &Value) -> bool {
    v.as_object().is_some_and(Map::is_empty)
}

/// The fields an applied configuration sets: every leaf, every list item, every map entry, and every
/// struct field given an empty object (Kubernetes' `ToFieldSet`).
pub(crate) fn field_set(schema: &Schema, ty: &TypeRef, v: &Value) -> Set {
    let mut out = Set::new();
    walk_set(schema, schema.resolve(ty), v, &mut Vec::new(), &mut out);
    out
}

fn walk_set(schema: &Schema, ty: &Type, v: &Value, path: &mut Path, out: &mut Set) {
    match shape(ty, v) {
        Shape::Leaf => out.insert(path),
        Shape::Fields { fields, elem } => {
            for (k, child) in v.as_object().into_iter().flatten() {
                if child.is_null() {
                    continue;
                }
                let Some(cty) = field_type(fields, elem, k) else { continue };
                path.push(PathElement::Field(k.clone()));
                walk_set(schema, schema.resolve(cty), child, path, out);
                if fields.is_none() || is_empty_object(child) {
                    out.insert(path);
                }
                path.pop();
            }
        }
        Shape::Items { elem, kind } => {
            let ety = schema.resolve(elem);
            for (pe, item) in keyed(kind, v.as_array().map_or(&[][..], Vec::as_slice)) {
                path.push(pe);
                walk_set(schema, ety, item, path, out);
                out.insert(path);
                path.pop();
            }
        }
    }
}

/// What differs between `old` and `new`: leaves added, removed or changed, and map entries and list
/// items added or removed. `metadata.managedFields` is not a field anybody owns: it is skipped.
pub(crate) fn compare(schema: &Schema, ty: &TypeRef, old: &Value, new: &Value) -> Comparison {
    let mut c = Comparison::default();
    walk_compare(schema, schema.resolve(ty), Some(old), Some(new), false, &mut Vec::new(), &mut c);
    c
}

fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

fn walk_compare(
    schema: &Schema,
    ty: &Type,
    old: Option<&Value>,
    new: Option<&Value>,
    is_item: bool,
    path: &mut Path,
    c: &mut Comparison,
) {
    let (old, new) = (present(old), present(new));
    if let (Some(o), Some(n)) = (old, new)
        && o == n
    {
        // Nothing below differs: a write that changes one field of a pod walks that branch only.
        return;
    }
    let (o_shape, n_shape) = (old.map(|o| shape(ty, o)), new.map(|n| shape(ty, n)));
    let leaf = matches!(o_shape, Some(Shape::Leaf)) || matches!(n_shape, Some(Shape::Leaf));
    if leaf {
        match (old, new) {
            (None, Some(_)) => c.added.insert(path),
            (Some(_), None) => c.removed.insert(path),
            (Some(o), Some(n)) if o != n => c.modified.insert(path),
            _ => {}
        }
        return;
    }
    // A struct field is not an item of its own, except when it is an empty object: then nothing
    // below it would say it is there.
    let own_item = is_item || new.or(old).is_some_and(is_empty_object);
    if own_item {
        match (old, new) {
            (None, Some(_)) => c.added.insert(path),
            (Some(_), None) => c.removed.insert(path),
            _ => {}
        }
    }
    match n_shape.or(o_shape) {
        Some(Shape::Fields { fields, elem }) => {
            let empty = Map::new();
            let om = old.and_then(Value::as_object).unwrap_or(&empty);
            let nm = new.and_then(Value::as_object).unwrap_or(&empty);
            for k in sorted_union(om, nm) {
                let Some(cty) = field_type(fields, elem, k) else { continue };
                if k == "managedFields" && matches!(path.as_slice(), [PathElement::Field(m)] if m == "metadata") {
                    continue;
                }
                path.push(PathElement::Field(k.clone()));
                walk_compare(schema, schema.resolve(cty), om.get(k), nm.get(k), fields.is_none(), path, c);
                path.pop();
            }
        }
        Some(Shape::Items { elem, kind }) => {
            let ety = schema.resolve(elem);
            let ol = keyed(kind, old.and_then(Value::as_array).map_or(&[][..], Vec::as_slice));
            let nl = keyed(kind, new.and_then(Value::as_array).map_or(&[][..], Vec::as_slice));
            for (pe, o) in &ol {
                let n = nl.iter().find(|(p, _)| p == pe).map(|(_, n)| *n);
                path.push(pe.clone());
                walk_compare(schema, ety, Some(o), n, true, path, c);
                path.pop();
            }
            for (pe, n) in nl.iter().filter(|(p, _)| !ol.iter().any(|(q, _)| q == p)) {
                path.push(pe.clone());
                walk_compare(schema, ety, None, Some(n), true, path, c);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The keys of both maps, each once, in order: the maps keep their keys sorted, so one pass
/// through both gives them.
fn sorted_union<'a>(a: &'a Map<String, Value>, b: &'a Map<String, Value>) -> impl Iterator<Item = &'a String> {
    let (mut a, mut b) = (a.keys().peekable(), b.keys().peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) => match x.cmp(y) {
            std::cmp::Ordering::Less => a.next(),
            std::cmp::Ordering::Greater => b.next(),
            std::cmp::Ordering::Equal => {
                b.next();
                a.next()
            }
        },
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

/// `config` merged into `live`: fields and keyed items merge, everything else `config` replaces.
pub(crate) fn merge(schema: &Schema, ty: &TypeRef, live: &Value, config: &Value) -> Value {
    merge_value(schema, schema.resolve(ty), Some(live), config)
}

fn merge_value(schema: &Schema, ty: &Type, live: Option<&Value>, config: &Value) -> Value {
    let Some(live) = present(live) else { return config.clone() };
    match (shape(ty, live), shape(ty, config)) {
        (Shape::Fields { fields, elem }, Shape::Fields { .. }) => {
            let mut out = live.as_object().cloned().unwrap_or_default();
            for (k, cv) in config.as_object().into_iter().flatten() {
                if cv.is_null() {
                    continue;
                }
                let merged = match field_type(fields, elem, k) {
                    Some(cty) => merge_value(schema, schema.resolve(cty), out.get(k), cv),
                    None => cv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Shape::Items { elem, kind }, Shape::Items { .. }) => {
            let ety = schema.resolve(elem);
            let ll = keyed(kind, live.as_array().map_or(&[][..], Vec::as_slice));
            let cl = keyed(kind, config.as_array().map_or(&[][..], Vec::as_slice));
            let merged_item = |pe: &PathElement, cv: &Value| {
                let lv = ll.iter().find(|(p, _)| p == pe).map(|(_, v)| *v);
                merge_value(schema, ety, lv, cv)
            };
            // Items only in the live list keep their places; the configuration's items come in its
            // order, where the first of them that the live list has was.
            let mut out = Vec::with_capacity(ll.len() + cl.len());
            let mut next = 0;
            for (pe, lv) in &ll {
                match cl.iter().position(|(p, _)| p == pe) {
                    None => out.push((*lv).clone()),
                    Some(at) => {
                        while next <= at {
                            out.push(merged_item(&cl[next].0, cl[next].1));
                            next += 1;
                        }
                    }
                }
            }
            for (pe, cv) in &cl[next.min(cl.len())..] {
                out.push(merged_item(pe, cv));
            }
            Value::Array(out)
        }
        _ => config.clone(),
    }
}

/// Removes every field, map entry and list item that `last` held and `now` does not, with what is
/// below it: what an applier stopped applying and no one else owns.
pub(crate) fn prune(schema: &Schema, ty: &TypeRef, obj: &mut Value, last: &Set, now: &Set) {
    prune_value(schema, schema.resolve(ty), obj, last, Some(now));
}

fn prune_value(schema: &Schema, ty: &Type, v: &mut Value, last: &Set, now: Option<&Set>) {
    let gone = |pe: &PathElement| last.holds(std::slice::from_ref(pe)) && !now.is_some_and(|n| n.holds(std::slice::from_ref(pe)));
    match shape(ty, v) {
        Shape::Leaf => {}
        Shape::Fields { fields, elem } => {
            let Some(m) = v.as_object_mut() else { return };
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let pe = PathElement::Field(k.clone());
                if gone(&pe) {
                    m.remove(&k);
                    continue;
                }
                if let (Some(l), Some(cty), Some(child)) = (last.child(&pe), field_type(fields, elem, &k), m.get_mut(&k)) {
                    prune_value(schema, schema.resolve(cty), child, l, now.and_then(|n| n.child(&pe)));
                }
            }
        }
        Shape::Items { elem, kind } => {
            let ety = schema.resolve(elem);
            let kind = kind.clone();
            let Some(items) = v.as_array_mut() else { return };
            let mut position = 0;
            items.retain_mut(|item| {
                let pe = item_element(&kind, item, position);
                position += 1;
                if gone(&pe) {
                    return false;
                }
                if let Some(l) = last.child(&pe) {
                    prune_value(schema, ety, item, l, now.and_then(|n| n.child(&pe)));
                }
                true
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_keys_of_two_objects_come_once_each_in_order() {
        let a = json!({"z": 1, "b": 1, "m": 1});
        let b = json!({"a": 1, "m": 2, "zz": 1, "b": 0});
        let keys: Vec<&String> = sorted_union(a.as_object().expect("a"), b.as_object().expect("b")).collect();
        assert_eq!(keys, ["a", "b", "m", "z", "zz"]);
        assert_eq!(sorted_union(&Map::new(), b.as_object().expect("b")).count(), 4);
    }

    fn deployment() -> TypeRef {
        TypeRef::Named("io.k8s.api.apps.v1.Deployment".into())
    }

    fn fields_v1(s: &Set) -> Value {
        s.to_fields_v1()
    }

    #[test]
    fn an_applied_configuration_owns_its_leaves_items_and_map_entries() {
        let schema = Schema::get();
        let config = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"spec": {"containers": [{"name": "web", "image": "nginx",
                    "ports": [{"containerPort": 80}], "args": ["a", "b"]}]}}}});
        let set = field_set(schema, &deployment(), &config);
        assert_eq!(
            fields_v1(&set),
            json!({"f:apiVersion": {}, "f:kind": {}, "f:metadata": {"f:name": {}, "f:labels": {"f:app": {}}},
                "f:spec": {"f:replicas": {}, "f:selector": {}, "f:template": {"f:spec": {"f:containers": {
                    "k:{\"name\":\"web\"}": {".": {}, "f:name": {}, "f:image": {}, "f:args": {},
                        "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}}}}}}}}})
        );
    }

    #[test]
    fn a_comparison_names_added_removed_and_modified_fields() {
        let schema = Schema::get();
        let old = json!({"metadata": {"labels": {"a": "1", "b": "2"}},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "x", "image": "i"}]}}}});
        let new = json!({"metadata": {"labels": {"a": "1", "c": "3"}},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "y", "image": "i"}]}}}});
        let c = compare(schema, &deployment(), &old, &new);
        assert_eq!(fields_v1(&c.modified), json!({"f:spec": {"f:replicas": {}}}));
        assert_eq!(
            fields_v1(&c.added),
            json!({"f:metadata": {"f:labels": {"f:c": {}}}, "f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"y\"}": {".": {}, "f:name": {}, "f:image": {}}}}}}})
        );
        assert_eq!(
            fields_v1(&c.removed),
            json!({"f:metadata": {"f:labels": {"f:b": {}}}, "f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"x\"}": {".": {}, "f:name": {}, "f:image": {}}}}}}})
        );
    }

    #[test]
    fn merging_keeps_live_items_and_replaces_atomic_lists() {
        let schema = Schema::get();
        let live = json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [
            {"name": "sidecar", "image": "s"}, {"name": "web", "image": "old", "args": ["x"]}]}}}});
        let config = json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "new", "args": ["y"]},
            {"name": "extra", "image": "e"}]}}}});
        let merged = merge(schema, &deployment(), &live, &config);
        assert_eq!(
            merged,
            json!({"spec": {"replicas": 1, "template": {"spec": {"containers": [
                {"name": "sidecar", "image": "s"}, {"name": "web", "image": "new", "args": ["y"]},
                {"name": "extra", "image": "e"}]}}}})
        );
    }

    #[test]
    fn pruning_removes_what_was_held_before_and_is_held_by_no_one_now() {
        let schema = Schema::get();
        let mut obj = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"replicas": 3, "paused": true}});
        let last = field_set(schema, &deployment(), &json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"replicas": 3}}));
        let mut now = field_set(schema, &deployment(), &json!({"metadata": {"labels": {"a": "1"}}}));
        now = now.union(&field_set(schema, &deployment(), &json!({"spec": {"replicas": 3}})));
        prune(schema, &deployment(), &mut obj, &last, &now);
        assert_eq!(obj, json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 3, "paused": true}}));
        let now = field_set(schema, &deployment(), &json!({"metadata": {"labels": {"a": "1"}}}));
        prune(schema, &deployment(), &mut obj, &last, &now);
        assert_eq!(obj, json!({"metadata": {"labels": {"a": "1"}}}), "spec went with its last owned field");
    }

    #[test]
    fn kinds_without_a_schema_merge_objects_by_key_and_replace_lists() {
        let schema = Schema::get();
        let untyped = TypeRef::Inline(Box::new(Type::Untyped));
        let live = json!({"spec": {"a": 1, "list": [1, 2], "m": {"x": 1}}});
        let config = json!({"spec": {"list": [3], "m": {"y": 2}}});
        assert_eq!(merge(schema, &untyped, &live, &config), json!({"spec": {"a": 1, "list": [3], "m": {"x": 1, "y": 2}}}));
        let set = field_set(schema, &untyped, &config);
        assert_eq!(fields_v1(&set), json!({"f:spec": {".": {}, "f:list": {}, "f:m": {".": {}, "f:y": {}}}}));
    }
}
