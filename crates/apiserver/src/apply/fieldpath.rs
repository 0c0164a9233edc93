//! Sets of field paths, their algebra, and the `FieldsV1` encoding `metadata.managedFields` stores them in.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

/// One step of a path into an object.
///
/// Keys and values are kept as their canonical JSON text (object keys sorted), so that elements
/// compare, sort and hash without a JSON value type that does.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum PathElement {
    /// A field of a struct or an entry of a map: `f:replicas`.
    Field(String),
    /// An item of a list of type map, by its key fields: `k:{"name":"web"}`.
    Key(String),
    /// An item of a list of type set, by its value: `v:"finalizer.example.com"`.
    Value(String),
    /// An item of a list by position: `i:0`.
    Index(usize),
}

impl PathElement {
    /// The key element of a list item from its key fields.
    pub(crate) fn key(fields: Map<String, Value>) -> Self {
        PathElement::Key(Value::Object(fields).to_string())
    }

    /// The element as written in `fieldsV1`.
    fn encode(&self) -> String {
        match self {
            PathElement::Field(f) => format!("f:{f}"),
            PathElement::Key(k) => format!("k:{k}"),
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    fn decode(s: &str) -> Option<Self> {
        let (kind, rest) = s.split_once(':')?;
        let canonical = |text: &str| serde_json::from_str::<Value>(text).ok().map(|v| v.to_string());
        match kind {
            "f" => Some(PathElement::Field(rest.to_string())),
            "k" => canonical(rest).filter(|k| k.starts_with('{')).map(PathElement::Key),
            "v" => canonical(rest).map(PathElement::Value),
            "i" => rest.parse().ok().map(PathElement::Index),
            _ => None,
        }
    }
}

/// As Kubernetes prints a path in a conflict: `.spec.containers[name="web"].image`.
impl fmt::Display for PathElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(name) => write!(f, ".{name}"),
            PathElement::Key(k) => {
                let fields: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(v) => write!(f, "[={v}]"),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

pub(crate) type Path = Vec<PathElement>;

pub(crate) fn path_string(path: &[PathElement]) -> String {
    path.iter().map(ToString::to_string).collect()
}

/// A set of paths, as a tree: a node's `members` are the paths that end at it, its `children`
/// the sets below each element. Every child is non-empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Set {
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, Set>,
}

impl Set {
    pub(crate) fn new() -> Self {
        Set::default()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.is_empty()
    }

    /// Adds `path`; elements already in the tree are not copied again.
    pub(crate) fn insert(&mut self, path: &[PathElement]) {
        match path {
            [] => {}
            [last] => {
                if !self.members.contains(last) {
                    self.members.insert(last.clone());
                }
            }
            [first, rest @ ..] => match self.children.get_mut(first) {
                Some(c) => c.insert(rest),
                None => {
                    let mut c = Set::new();
                    c.insert(rest);
                    self.children.insert(first.clone(), c);
                }
            },
        }
    }

    #[cfg(test)]
    pub(crate) fn has(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => self.members.contains(last),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.has(rest)),
        }
    }

    /// Whether the path is in the set or, for a field, whether anything below it is: a struct
    /// field is held by whoever holds one of its fields (Kubernetes' "named fields are members").
    pub(crate) fn holds(&self, path: &[PathElement]) -> bool {
        match path {
            [] => false,
            [last] => {
                self.members.contains(last) || (matches!(last, PathElement::Field(_)) && self.children.contains_key(last))
            }
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.holds(rest)),
        }
    }

    /// The part of the set at and below `pe`.
    pub(crate) fn restricted_to(&self, pe: &PathElement) -> Set {
        let mut out = Set::new();
        if self.members.contains(pe) {
            out.members.insert(pe.clone());
        }
        if let Some(c) = self.children.get(pe) {
            out.children.insert(pe.clone(), c.clone());
        }
        out
    }

    /// The set below `pe`, if any.
    pub(crate) fn child(&self, pe: &PathElement) -> Option<&Set> {
        self.children.get(pe)
    }

    pub(crate) fn union(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.absorb(other);
        out
    }

    /// Adds every path of `other`, in place.
    pub(crate) fn absorb(&mut self, other: &Set) {
        for pe in &other.members {
            if !self.members.contains(pe) {
                self.members.insert(pe.clone());
            }
        }
        for (pe, c) in &other.children {
            match self.children.get_mut(pe) {
                Some(mine) => mine.absorb(c),
                None => {
                    self.children.insert(pe.clone(), c.clone());
                }
            }
        }
    }

    pub(crate) fn difference(&self, other: &Set) -> Set {
        let mut out = self.clone();
        out.remove(other);
        out
    }

    /// Takes the paths of `other` out of this set, in place; whether any was in it. A subtree that
    /// `other` does not reach is neither walked nor copied.
    pub(crate) fn remove(&mut self, other: &Set) -> bool {
        self.remove_with(other, false)
    }

    /// Takes the paths of `other` and everything below them out of this set, in place; whether
    /// anything was in it.
    pub(crate) fn remove_recursive(&mut self, other: &Set) -> bool {
        self.remove_with(other, true)
    }

    fn remove_with(&mut self, other: &Set, recursive: bool) -> bool {
        let mut changed = false;
        for pe in &other.members {
            changed |= self.members.remove(pe);
            if recursive {
                changed |= self.children.remove(pe).is_some();
            }
        }
        for (pe, o) in &other.children {
            if let Some(c) = self.children.get_mut(pe) {
                changed |= c.remove_with(o, recursive);
                if c.is_empty() {
                    self.children.remove(pe);
                }
            }
        }
        changed
    }

    pub(crate) fn intersection(&self, other: &Set) -> Set {
        let members = self.members.intersection(&other.members).cloned().collect();
        let children = self
            .children
            .iter()
            .filter_map(|(pe, c)| {
                let both = c.intersection(other.children.get(pe)?);
                (!both.is_empty()).then(|| (pe.clone(), both))
            })
            .collect();
        Set { members, children }
    }

    /// Every path in the set, in order.
    pub(crate) fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Path, out: &mut Vec<Path>) {
        let mut pes: BTreeSet<&PathElement> = self.members.iter().collect();
        pes.extend(self.children.keys());
        for pe in pes {
            prefix.push(pe.clone());
            if self.members.contains(pe) {
                out.push(prefix.clone());
            }
            if let Some(c) = self.children.get(pe) {
                c.collect(prefix, out);
            }
            prefix.pop();
        }
    }

    /// The paths of the set that have nothing of the set below them.
    #[cfg(test)]
    pub(crate) fn leaves(&self) -> Vec<Path> {
        self.paths().into_iter().filter(|p| !self.has_below(p)).collect()
    }

    #[cfg(test)]
    fn has_below(&self, path: &[PathElement]) -> bool {
        match path {
            [] => !self.is_empty(),
            [first, rest @ ..] => self.children.get(first).is_some_and(|c| c.has_below(rest)),
        }
    }

    /// The `fieldsV1` form: `{"f:spec": {"f:replicas": {}}}`, with `"."` marking a path that is
    /// a member and also has children.
    pub(crate) fn to_fields_v1(&self) -> Value {
        let mut out = Map::new();
        for pe in &self.members {
            if !self.children.contains_key(pe) {
                out.insert(pe.encode(), Value::Object(Map::new()));
            }
        }
        for (pe, c) in &self.children {
            let mut inner = match c.to_fields_v1() {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            if self.members.contains(pe) {
                inner.insert(".".into(), Value::Object(Map::new()));
            }
            out.insert(pe.encode(), Value::Object(inner));
        }
        Value::Object(out)
    }

    /// Reads the `fieldsV1` form; what it cannot read it names.
    pub(crate) fn from_fields_v1(v: &Value) -> Result<Set, String> {
        let Value::Object(m) = v else { return Err("fieldsV1 must be an object".into()) };
        let mut set = Set::new();
        for (k, child) in m {
            if k == "." {
                continue;
            }
            let pe = PathElement::decode(k).ok_or_else(|| format!("cannot read path element {k:?}"))?;
            let Value::Object(inner) = child else { return Err(format!("{k:?} must map to an object")) };
            if inner.is_empty() || inner.contains_key(".") {
                set.members.insert(pe.clone());
            }
            let c = Set::from_fields_v1(child)?;
            if !c.is_empty() {
                set.children.insert(pe, c);
            }
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(name: &str) -> PathElement {
        PathElement::Field(name.into())
    }

    fn container(name: &str) -> PathElement {
        PathElement::key([("name".to_string(), json!(name))].into_iter().collect())
    }

    fn set(paths: &[&[PathElement]]) -> Set {
        let mut s = Set::new();
        for p in paths {
            s.insert(p);
        }
        s
    }

    #[test]
    fn fields_v1_round_trips_with_dots_where_a_member_has_children() {
        let s = set(&[
            &[f("metadata"), f("labels"), f("app")],
            &[f("spec"), f("containers"), container("web")],
            &[f("spec"), f("containers"), container("web"), f("image")],
            &[f("spec"), f("replicas")],
        ]);
        let v = s.to_fields_v1();
        assert_eq!(
            v,
            json!({"f:metadata": {"f:labels": {"f:app": {}}}, "f:spec": {
                "f:containers": {"k:{\"name\":\"web\"}": {".": {}, "f:image": {}}}, "f:replicas": {}}})
        );
        assert_eq!(Set::from_fields_v1(&v).expect("decode"), s);
        assert!(Set::from_fields_v1(&json!({"x:y": {}})).is_err());
        assert!(Set::from_fields_v1(&json!({"f:a": 1})).is_err());
    }

    #[test]
    fn keys_are_canonical_whatever_order_a_client_wrote_them_in() {
        let written = json!({"k:{\"protocol\":\"TCP\", \"containerPort\":80}": {}});
        let s = Set::from_fields_v1(&written).expect("decode");
        assert_eq!(s.to_fields_v1(), json!({"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {}}));
        let key = s.paths().remove(0);
        assert_eq!(path_string(&key), "[containerPort=80,protocol=\"TCP\"]");
    }

    #[test]
    fn union_difference_and_intersection_work_path_by_path() {
        let a = set(&[&[f("spec"), f("replicas")], &[f("spec"), f("paused")]]);
        let b = set(&[&[f("spec"), f("replicas")], &[f("metadata"), f("labels"), f("x")]]);
        assert_eq!(a.union(&b).paths().len(), 3);
        assert_eq!(a.difference(&b), set(&[&[f("spec"), f("paused")]]));
        assert_eq!(a.intersection(&b), set(&[&[f("spec"), f("replicas")]]));
        assert!(a.difference(&a).is_empty(), "no empty children are left behind");
        let mut c = a.clone();
        assert!(c.remove(&b), "spec.replicas was in both");
        assert_eq!(c, a.difference(&b));
        assert!(!c.remove(&b), "and is gone");
        c.absorb(&b);
        assert_eq!(c, a.union(&b));
    }

    #[test]
    fn a_recursive_removal_takes_everything_below_a_member() {
        let a = set(&[&[f("status")], &[f("status"), f("replicas")], &[f("spec"), f("replicas")]]);
        let status = set(&[&[f("status")]]);
        let mut r = a.clone();
        assert!(r.remove_recursive(&status));
        assert_eq!(r, set(&[&[f("spec"), f("replicas")]]));
        assert_eq!(a.difference(&status).paths().len(), 2, "a plain difference keeps the children");
        assert!(!r.remove_recursive(&status), "nothing left to remove");
    }

    #[test]
    fn a_field_is_held_by_whoever_holds_something_below_it() {
        let s = set(&[&[f("spec"), f("template"), f("spec"), f("containers"), container("web"), f("image")]]);
        assert!(s.holds(&[f("spec")]));
        assert!(s.holds(&[f("spec"), f("template")]));
        assert!(!s.holds(&[f("spec"), f("template"), f("spec"), f("containers"), container("web")]), "keys are items");
        assert!(!s.has(&[f("spec")]));
        assert_eq!(s.leaves().len(), 1);
    }

    #[test]
    fn paths_print_as_kubernetes_prints_them_in_conflicts() {
        let p = vec![f("spec"), f("containers"), container("web"), f("image")];
        assert_eq!(path_string(&p), ".spec.containers[name=\"web\"].image");
        assert_eq!(path_string(&[f("metadata"), f("finalizers"), PathElement::Value("\"a\"".into())]), ".metadata.finalizers[=\"a\"]");
        assert_eq!(path_string(&[f("args"), PathElement::Index(2)]), ".args[2]");
    }
}
