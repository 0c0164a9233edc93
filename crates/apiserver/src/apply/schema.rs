//! How server-side apply merges each field of a kind: struct, map, scalar, or a list that is atomic,
//! a set, or a map keyed by some of its items' fields, read from the OpenAPI definitions and their
//! Kubernetes extensions.

use std::collections::HashMap;
use std::sync::OnceLock;

use serde_json::Value;
use shepherd_api::kinds::ResourceInfo;

/// How the items of a list are told apart, and so merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// Replaced as a whole: the default for a list the schema says nothing about, as in Kubernetes.
    Atomic,
    /// Items are scalars, each owned by itself.
    Set,
    /// Items are objects told apart by these fields (`name`; `containerPort`, `protocol`).
    Map(Vec<String>),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Type {
    Scalar,
    /// An object with declared fields, merged field by field unless atomic.
    Struct { fields: HashMap<String, TypeRef>, atomic: bool },
    /// An object of arbitrary keys (labels), merged key by key unless atomic.
    Map { elem: TypeRef, atomic: bool },
    List { elem: TypeRef, kind: ListKind },
    /// Nothing known: objects merge by key, lists are atomic (Kubernetes' deduced type, used for kinds
    /// without a schema here).
    Untyped,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TypeRef {
    Named(String),
    Inline(Box<Type>),
}

/// The types of every definition, by name.
pub(crate) struct Schema {
    types: HashMap<String, Type>,
}

static UNTYPED: Type = Type::Untyped;
static SCHEMA: OnceLock<Schema> = OnceLock::new();

const DEFINITION_REF: &str = "#/definitions/";

impl Schema {
    /// The schema of the served kinds, built once from the OpenAPI definitions.
    pub(crate) fn get() -> &'static Schema {
        SCHEMA.get_or_init(|| Schema::from_definitions(crate::openapi::annotated_definitions()))
    }

    pub(crate) fn from_definitions(defs: &serde_json::Map<String, Value>) -> Schema {
        let types = defs.iter().map(|(name, d)| (name.clone(), convert(d))).collect();
        Schema { types }
    }

    /// The type of a whole object of `res`; untyped for kinds without a definition (custom resources).
    pub(crate) fn root(res: &ResourceInfo) -> TypeRef {
        match crate::openapi::definition_of(res) {
            Some(name) => TypeRef::Named(name),
            None => TypeRef::Inline(Box::new(Type::Untyped)),
        }
    }

    pub(crate) fn resolve<'a>(&'a self, t: &'a TypeRef) -> &'a Type {
        match t {
            TypeRef::Inline(t) => t,
            TypeRef::Named(n) => self.named(n),
        }
    }

    pub(crate) fn named(&self, name: &str) -> &Type {
        self.types.get(name).unwrap_or(&UNTYPED)
    }
}

fn ext<'a>(s: &'a Value, name: &str) -> Option<&'a str> {
    s.get(name).and_then(Value::as_str)
}

fn convert_ref(s: &Value) -> TypeRef {
    let reference = s.get("$ref").and_then(Value::as_str).or_else(|| {
        s.get("allOf").and_then(Value::as_array).and_then(|a| a.first()).and_then(|r| r.get("$ref")).and_then(Value::as_str)
    });
    match reference.and_then(|r| r.strip_prefix(DEFINITION_REF)) {
        Some(name) => TypeRef::Named(name.to_string()),
        None => TypeRef::Inline(Box::new(convert(s))),
    }
}

/// The type a JSON schema describes.
pub(crate) fn convert(s: &Value) -> Type {
    if s.get("x-kubernetes-int-or-string").is_some_and(|v| v == true) {
        return Type::Scalar;
    }
    let atomic_map = ext(s, "x-kubernetes-map-type") == Some("atomic");
    match s.get("type").and_then(Value::as_str) {
        Some("array") => {
            let elem = s.get("items").map_or(TypeRef::Inline(Box::new(Type::Untyped)), convert_ref);
            let keys = || -> Vec<String> {
                s.get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
                    .unwrap_or_default()
            };
            let kind = match ext(s, "x-kubernetes-list-type") {
                Some("set") => ListKind::Set,
                Some("map") if !keys().is_empty() => ListKind::Map(keys()),
                Some(_) => ListKind::Atomic,
                // Lists declared only with a strategic-merge strategy are associative, as Kubernetes
                // reads its older types.
                None => match (ext(s, "x-kubernetes-patch-strategy"), ext(s, "x-kubernetes-patch-merge-key")) {
                    (Some(st), Some(key)) if st.contains("merge") => ListKind::Map(vec![key.to_string()]),
                    (Some(st), None) if st.contains("merge") => ListKind::Set,
                    _ => ListKind::Atomic,
                },
            };
            Type::List { elem, kind }
        }
        Some("string" | "integer" | "number" | "boolean") => Type::Scalar,
        _ => match (s.get("properties").and_then(Value::as_object), s.get("additionalProperties")) {
            (Some(props), _) => Type::Struct {
                fields: props.iter().map(|(k, v)| (k.clone(), convert_ref(v))).collect(),
                atomic: atomic_map,
            },
            (None, Some(ap)) if ap.is_object() => Type::Map { elem: convert_ref(ap), atomic: atomic_map },
            _ => Type::Untyped,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_served_kinds_read_their_list_types_from_the_field_extensions() {
        let schema = Schema::get();
        let Type::Struct { fields, .. } = schema.named("io.k8s.api.core.v1.Container") else {
            panic!("Container is a struct")
        };
        let Type::List { kind, .. } = schema.resolve(&fields["ports"]) else { panic!("ports is a list") };
        assert_eq!(*kind, ListKind::Map(vec!["containerPort".into(), "protocol".into()]));
        let Type::List { kind, .. } = schema.resolve(&fields["args"]) else { panic!("args is a list") };
        assert_eq!(*kind, ListKind::Atomic);
        let Type::Struct { fields, .. } =
            schema.named("io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta")
        else {
            panic!("ObjectMeta is a struct")
        };
        assert!(matches!(schema.resolve(&fields["labels"]), Type::Map { atomic: false, .. }));
        assert!(matches!(schema.resolve(&fields["finalizers"]), Type::List { kind: ListKind::Set, .. }));
        let selector = schema.named("io.k8s.apimachinery.pkg.apis.meta.v1.LabelSelector");
        assert!(matches!(selector, Type::Struct { atomic: true, .. }), "{selector:?}");
    }

    #[test]
    fn a_list_without_a_list_type_is_atomic() {
        assert_eq!(
            convert(&json!({"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}})),
            Type::List {
                elem: TypeRef::Inline(Box::new(Type::Struct {
                    fields: HashMap::from([("name".to_string(), TypeRef::Inline(Box::new(Type::Scalar)))]),
                    atomic: false
                })),
                kind: ListKind::Atomic
            }
        );
    }
}
