//! Label and field selectors: parsing the `?labelSelector=` / `?fieldSelector=` syntax and
//! `metav1.LabelSelector` objects, and matching objects against them.

use crate::json::JsonPath;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

use crate::error::ApiError;
use crate::validation::{is_label_value, is_qualified_name};

/// One condition on one label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key=value` (also written `key==value`, or `matchLabels`).
    Equals(String, String),
    /// `key!=value`: true when the label is absent too.
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, BTreeSet<String>),
    /// `key notin (a,b)`: true when the label is absent too.
    NotIn(String, BTreeSet<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
}

impl Requirement {
    pub fn key(&self) -> &str {
        match self {
            Requirement::Equals(k, _)
            | Requirement::NotEquals(k, _)
            | Requirement::In(k, _)
            | Requirement::NotIn(k, _)
            | Requirement::Exists(k)
            | Requirement::DoesNotExist(k) => k,
        }
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.matches_value(labels.get(self.key()).map(String::as_str))
    }

    /// Whether the requirement holds when its label has the value `got` (`None`: absent).
    pub fn matches_value(&self, got: Option<&str>) -> bool {
        match self {
            Requirement::Equals(_, v) => got == Some(v.as_str()),
            Requirement::NotEquals(_, v) => got != Some(v.as_str()),
            Requirement::In(_, set) => got.is_some_and(|g| set.contains(g)),
            Requirement::NotIn(_, set) => !got.is_some_and(|g| set.contains(g)),
            Requirement::Exists(_) => got.is_some(),
            Requirement::DoesNotExist(_) => got.is_none(),
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |set: &BTreeSet<String>| set.iter().map(String::as_str).collect::<Vec<_>>().join(",");
        match self {
            Requirement::Equals(k, v) => write!(f, "{k}={v}"),
            Requirement::NotEquals(k, v) => write!(f, "{k}!={v}"),
            Requirement::In(k, set) => write!(f, "{k} in ({})", join(set)),
            Requirement::NotIn(k, set) => write!(f, "{k} notin ({})", join(set)),
            Requirement::Exists(k) => write!(f, "{k}"),
            Requirement::DoesNotExist(k) => write!(f, "!{k}"),
        }
    }
}

/// A parsed label selector: every requirement must hold. The empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses the string syntax: `app=web,tier!=db,env in (prod,qa),!canary`.
    pub fn parse(s: &str) -> Result<LabelSelector, ApiError> {
        let mut parser = Parser { src: s, pos: 0 };
        let mut requirements = Vec::new();
        parser.skip_ws();
        if parser.at_end() {
            return Ok(LabelSelector::default());
        }
        loop {
            requirements.push(parser.requirement()?);
            parser.skip_ws();
            if parser.at_end() {
                break;
            }
            if !parser.eat(",") {
                return Err(parser.error("expected ',' between requirements"));
            }
        }
        Ok(LabelSelector { requirements })
    }

    /// Reads a `metav1.LabelSelector` (`matchLabels` and `matchExpressions`) in JSON form.
    pub fn from_k8s(sel: &Value) -> Result<LabelSelector, ApiError> {
        let bad = |msg: String| ApiError::BadRequest(format!("invalid label selector: {msg}"));
        let obj = match sel {
            Value::Null => return Ok(LabelSelector::default()),
            Value::Object(o) => o,
            _ => return Err(bad("must be an object with matchLabels and/or matchExpressions".into())),
        };
        if let Some(unknown) = obj.keys().find(|k| *k != "matchLabels" && *k != "matchExpressions") {
            return Err(bad(format!("unknown field \"{unknown}\" (expected matchLabels or matchExpressions)")));
        }
        let mut requirements = Vec::new();
        match obj.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(labels)) => {
                for (k, v) in labels {
                    let v = v.as_str().ok_or_else(|| bad(format!("matchLabels[{k}] must be a string")))?;
                    check_key(k).map_err(bad)?;
                    check_value(k, v).map_err(bad)?;
                    requirements.push(Requirement::Equals(k.clone(), v.to_string()));
                }
            }
            Some(_) => return Err(bad("matchLabels must be a map of strings".into())),
        }
        match obj.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(exprs)) => {
                for (i, e) in exprs.iter().enumerate() {
                    requirements.push(expression(e).map_err(|m| bad(format!("matchExpressions[{i}]: {m}")))?);
                }
            }
            Some(_) => return Err(bad("matchExpressions must be a list".into())),
        }
        Ok(LabelSelector { requirements })
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Matches an object's `metadata.labels` (absent labels are an empty map).
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.matches(&labels_of(obj))
    }

    /// Matches labels read through `label` (key to value, `None` when absent), without building
    /// a map of them.
    pub fn matches_with<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements.iter().all(|r| r.matches_value(label(r.key())))
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

/// The `metadata.labels` of an object as a map; non-string values are skipped.
pub(crate) fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.at("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default()
}

fn check_key(k: &str) -> Result<(), String> {
    if is_qualified_name(k) {
        Ok(())
    } else {
        Err(format!(
            "invalid label key \"{k}\": must be a qualified name (an optional DNS subdomain prefix and '/', then up to \
             63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character)"
        ))
    }
}

fn check_value(k: &str, v: &str) -> Result<(), String> {
    if is_label_value(v) {
        Ok(())
    } else {
        Err(format!(
            "invalid value \"{v}\" for label \"{k}\": must be empty or up to 63 alphanumeric characters, '-', '_' or \
             '.', starting and ending with an alphanumeric character"
        ))
    }
}

fn expression(e: &Value) -> Result<Requirement, String> {
    let key = e.get("key").and_then(Value::as_str).ok_or("key is required")?;
    check_key(key)?;
    let op = e.get("operator").and_then(Value::as_str).ok_or("operator is required")?;
    let values: Vec<&str> = match e.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(vs)) => vs.iter().map(|v| v.as_str().ok_or("values must be strings")).collect::<Result<_, _>>()?,
        Some(_) => return Err("values must be a list of strings".into()),
    };
    for v in &values {
        check_value(key, v)?;
    }
    let set = || values.iter().map(|v| v.to_string()).collect::<BTreeSet<_>>();
    match op {
        "In" | "NotIn" if values.is_empty() => Err(format!("values must be non-empty for operator {op}")),
        "In" => Ok(Requirement::In(key.into(), set())),
        "NotIn" => Ok(Requirement::NotIn(key.into(), set())),
        "Exists" | "DoesNotExist" if !values.is_empty() => Err(format!("values must be empty for operator {op}")),
        "Exists" => Ok(Requirement::Exists(key.into())),
        "DoesNotExist" => Ok(Requirement::DoesNotExist(key.into())),
        other => Err(format!("operator \"{other}\" is not supported (In, NotIn, Exists, DoesNotExist)")),
    }
}

/// A hand-written scanner over the string syntax; positions are byte offsets into `src`.
struct Parser<'a> {
    src: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn rest(&self) -> &str {
        &self.src[self.pos..]
    }
    fn at_end(&self) -> bool {
        self.pos >= self.src.len()
    }
    fn skip_ws(&mut self) {
        let trimmed = self.rest().trim_start();
        self.pos = self.src.len() - trimmed.len();
    }
    fn eat(&mut self, token: &str) -> bool {
        if self.rest().starts_with(token) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }
    fn word(&mut self) -> &str {
        let start = self.pos;
        let len = self
            .rest()
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')))
            .unwrap_or(self.rest().len());
        self.pos += len;
        &self.src[start..self.pos]
    }
    fn error(&self, what: &str) -> ApiError {
        let near = if self.at_end() { "end of input".to_string() } else { format!("\"{}\"", self.rest()) };
        ApiError::BadRequest(format!("unable to parse label selector \"{}\": {what} at {near}", self.src))
    }
    fn key(&mut self) -> Result<String, ApiError> {
        self.skip_ws();
        let key = self.word().to_string();
        if key.is_empty() {
            return Err(self.error("expected a label key"));
        }
        check_key(&key).map_err(|m| ApiError::BadRequest(format!("unable to parse label selector \"{}\": {m}", self.src)))?;
        Ok(key)
    }
    fn value(&mut self, key: &str) -> Result<String, ApiError> {
        self.skip_ws();
        let v = self.word().to_string();
        check_value(key, &v).map_err(|m| ApiError::BadRequest(format!("unable to parse label selector \"{}\": {m}", self.src)))?;
        Ok(v)
    }

    fn requirement(&mut self) -> Result<Requirement, ApiError> {
        self.skip_ws();
        if self.eat("!") {
            let key = self.key()?;
            return Ok(Requirement::DoesNotExist(key));
        }
        let key = self.key()?;
        self.skip_ws();
        if self.at_end() || self.rest().starts_with(',') {
            return Ok(Requirement::Exists(key));
        }
        if self.eat("!=") {
            let v = self.value(&key)?;
            return Ok(Requirement::NotEquals(key, v));
        }
        if self.eat("==") || self.eat("=") {
            let v = self.value(&key)?;
            return Ok(Requirement::Equals(key, v));
        }
        let op = self.word().to_string();
        let negated = match op.as_str() {
            "in" => false,
            "notin" => true,
            _ => return Err(self.error(&format!("expected one of =, ==, !=, in, notin after \"{key}\""))),
        };
        let set = self.value_set(&key)?;
        Ok(if negated { Requirement::NotIn(key, set) } else { Requirement::In(key, set) })
    }

    fn value_set(&mut self, key: &str) -> Result<BTreeSet<String>, ApiError> {
        self.skip_ws();
        if !self.eat("(") {
            return Err(self.error("expected '(' to open a set of values"));
        }
        let mut set = BTreeSet::new();
        loop {
            let v = self.value(key)?;
            if v.is_empty() {
                return Err(self.error("expected a value in the set"));
            }
            set.insert(v);
            self.skip_ws();
            if self.eat(")") {
                return Ok(set);
            }
            if !self.eat(",") {
                return Err(self.error("expected ',' or ')' in the set of values"));
            }
        }
    }
}

/// The fields a field selector may name, for every kind (a missing field reads as "").
/// The fields list and watch requests can select on. The `involvedObject.*`, `reason` and `type`
/// fields are those of Events, which `kubectl describe` selects by.
pub const SELECTABLE_FIELDS: &[&str] = &[
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "status.phase",
    "involvedObject.kind",
    "involvedObject.name",
    "involvedObject.namespace",
    "involvedObject.uid",
    "reason",
    "type",
];

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldTerm {
    field: String,
    negated: bool,
    /// One value for `=`/`!=`; any number for `in`/`notin`.
    values: BTreeSet<String>,
    set: bool,
}

/// A parsed field selector (`spec.nodeName=n1,status.phase!=Running`): every term must hold.
///
/// Beyond Kubernetes' `=`, `==` and `!=`, a term may name a set of values, as label selectors do:
/// `spec.nodeName in (n1,n2)`, `metadata.name notin (a,b)`. A process standing in for many nodes
/// watches only the pods of its own nodes with one such term instead of every bound pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

/// `s` split at the commas outside parentheses.
fn top_level_terms(s: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth <= 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A term naming a set of values: (field, negated, values).
type SetTerm<'a> = (&'a str, bool, BTreeSet<String>);

/// `field in (a,b)` or `field notin (a,b)`; `None` if `part` has no `(` before any `=`, so it
/// is not written as a set at all.
fn set_term(part: &str) -> Option<Result<SetTerm<'_>, ApiError>> {
    let open = part.find('(')?;
    if part[..open].contains('=') {
        return None;
    }
    let bad = |why: &str| {
        Err(ApiError::BadRequest(format!("invalid field selector term \"{}\": {why}", part.trim())))
    };
    let head = part[..open].trim();
    let (field, negated) = if let Some(f) = head.strip_suffix(" notin") {
        (f.trim(), true)
    } else if let Some(f) = head.strip_suffix(" in") {
        (f.trim(), false)
    } else {
        return Some(bad("expected field in (values) or field notin (values)"));
    };
    let Some(inner) = part[open + 1..].trim_end().strip_suffix(')') else {
        return Some(bad("expected ')' to close the set of values"));
    };
    let mut values = BTreeSet::new();
    for v in inner.split(',').map(str::trim) {
        if v.is_empty() || v.contains(['(', ')', '=', '!']) {
            return Some(bad(&format!("\"{v}\" is not a value of a set")));
        }
        values.insert(v.to_string());
    }
    Some(Ok((field, negated, values)))
}

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector, ApiError> {
        let mut terms = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector::default());
        }
        for part in top_level_terms(s) {
            let (field, negated, values, set) = if let Some(term) = set_term(part) {
                let (f, negated, values) = term?;
                (f, negated, values, true)
            } else {
                let (f, negated, v) = if let Some((f, v)) = part.split_once("!=") {
                    (f, true, v)
                } else if let Some((f, v)) = part.split_once("==") {
                    (f, false, v)
                } else if let Some((f, v)) = part.split_once('=') {
                    (f, false, v)
                } else {
                    return Err(ApiError::BadRequest(format!(
                        "invalid field selector term \"{}\": expected field=value, field==value, field!=value or field in (values)",
                        part.trim()
                    )));
                };
                (f, negated, BTreeSet::from([v.trim().to_string()]), false)
            };
            let field = field.trim();
            if !SELECTABLE_FIELDS.contains(&field) {
                return Err(ApiError::BadRequest(format!(
                    "field label \"{field}\" is not supported in field selectors; supported fields: {}",
                    SELECTABLE_FIELDS.join(", ")
                )));
            }
            terms.push(FieldTerm { field: field.to_string(), negated, values, set });
        }
        Ok(FieldSelector { terms })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.matches_lookup(|field| field_value(obj, field))
    }

    /// Matches the field values `get` reads by dotted name ("" for a missing one).
    fn matches_lookup<'s>(&self, get: impl Fn(&str) -> &'s str) -> bool {
        self.terms.iter().all(|t| t.values.contains(get(&t.field)) != t.negated)
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The values of a `field=value` or `field in (...)` term: an object selected has one of
    /// them, so a caller can answer from an index.
    pub fn values_of(&self, field: &str) -> Option<&BTreeSet<String>> {
        self.terms.iter().find(|t| t.field == field && !t.negated).map(|t| &t.values)
    }

    /// The value of a `field=value` term, so a caller can answer from an index.
    pub fn exact_value(&self, field: &str) -> Option<&str> {
        self.terms
            .iter()
            .find(|t| t.field == field && !t.negated && !t.set)
            .and_then(|t| t.values.first())
            .map(String::as_str)
    }
}

impl fmt::Display for FieldSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.terms.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if t.set {
                let values: Vec<&str> = t.values.iter().map(String::as_str).collect();
                write!(f, "{} {} ({})", t.field, if t.negated { "notin" } else { "in" }, values.join(","))?;
            } else {
                let value = t.values.first().map(String::as_str).unwrap_or("");
                write!(f, "{}{}{}", t.field, if t.negated { "!=" } else { "=" }, value)?;
            }
        }
        Ok(())
    }
}

fn field_value<'a>(obj: &'a Value, dotted: &str) -> &'a str {
    dotted.split('.').try_fold(obj, |v, part| v.get(part)).and_then(Value::as_str).unwrap_or("")
}

/// A label selector and a field selector together, as list and watch requests carry them: an
/// object is selected when it matches both (a missing one matches everything).
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub labels: Option<LabelSelector>,
    pub fields: Option<FieldSelector>,
}

impl Selection {
    /// Parses `?labelSelector=` and `?fieldSelector=`.
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Selection, ApiError> {
        Ok(Selection {
            labels: labels.map(LabelSelector::parse).transpose()?,
            fields: fields.map(FieldSelector::parse).transpose()?,
        })
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.labels.as_ref().is_none_or(LabelSelector::is_empty) && self.fields.as_ref().is_none_or(FieldSelector::is_empty)
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.as_ref().is_none_or(|l| l.matches_object(obj)) && self.fields.as_ref().is_none_or(|f| f.matches(obj))
    }

    /// Whether the object written as the JSON text `json` is selected; `None` when the text is not
    /// JSON. Only the selectable fields are read (everything else is skipped without building a
    /// value), so a watch filtering every pod event by `spec.nodeName` costs a scan of the text, not
    /// a parse of the pod; text of an unusual shape (escaped strings, a field of another type) is
    /// read in full, with the same answer as [`Self::matches`].
    pub fn matches_json(&self, json: &[u8]) -> Option<bool> {
        if self.is_empty() {
            return Some(true);
        }
        match serde_json::from_slice::<Selectable>(json) {
            Ok(obj) if json.trim_ascii_start().starts_with(b"{") => Some(
                self.labels.as_ref().is_none_or(|l| l.matches_with(|k| obj.label(k)))
                    && self.fields.as_ref().is_none_or(|f| f.matches_lookup(|field| obj.field(field))),
            ),
            _ => serde_json::from_slice::<Value>(json).ok().map(|obj| self.matches(&obj)),
        }
    }
}

/// The value of the selectable field `dotted` (one of [`SELECTABLE_FIELDS`]) of the object written
/// as the JSON text `json`, "" when it has none; `None` when the text is not JSON. Reads as
/// [`Selection::matches_json`] does.
pub fn selectable_field(json: &[u8], dotted: &str) -> Option<String> {
    match serde_json::from_slice::<Selectable>(json) {
        Ok(obj) if json.trim_ascii_start().starts_with(b"{") => Some(obj.field(dotted).to_string()),
        _ => serde_json::from_slice::<Value>(json).ok().map(|obj| field_value(&obj, dotted).to_string()),
    }
}

/// The fields of an object that selectors read (see [`SELECTABLE_FIELDS`]), borrowed from its JSON
/// text; deserializing it skips every other field. A string with escapes cannot be borrowed and a
/// field of another type cannot be read: both fail, and the caller reads the object in full.
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Selectable<'a> {
    #[serde(borrow)]
    metadata: Option<SelectableMeta<'a>>,
    #[serde(borrow)]
    spec: Option<SelectableSpec<'a>>,
    #[serde(borrow)]
    status: Option<SelectableStatus<'a>>,
    #[serde(borrow, rename = "involvedObject")]
    involved_object: Option<SelectableInvolved<'a>>,
    reason: Option<&'a str>,
    #[serde(rename = "type")]
    type_: Option<&'a str>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct SelectableMeta<'a> {
    name: Option<&'a str>,
    namespace: Option<&'a str>,
    #[serde(borrow)]
    labels: Option<BTreeMap<&'a str, &'a str>>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct SelectableSpec<'a> {
    #[serde(rename = "nodeName")]
    node_name: Option<&'a str>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct SelectableStatus<'a> {
    phase: Option<&'a str>,
}

#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct SelectableInvolved<'a> {
    kind: Option<&'a str>,
    name: Option<&'a str>,
    namespace: Option<&'a str>,
    uid: Option<&'a str>,
}

impl<'a> Selectable<'a> {
    fn label(&self, key: &str) -> Option<&'a str> {
        self.metadata.as_ref()?.labels.as_ref()?.get(key).copied()
    }

    /// The value of a selectable field, "" when missing (as [`FieldSelector::matches`] reads it).
    fn field(&self, dotted: &str) -> &'a str {
        let meta = self.metadata.as_ref();
        let involved = self.involved_object.as_ref();
        let value = match dotted {
            "metadata.name" => meta.and_then(|m| m.name),
            "metadata.namespace" => meta.and_then(|m| m.namespace),
            "spec.nodeName" => self.spec.as_ref().and_then(|s| s.node_name),
            "status.phase" => self.status.as_ref().and_then(|s| s.phase),
            "involvedObject.kind" => involved.and_then(|i| i.kind),
            "involvedObject.name" => involved.and_then(|i| i.name),
            "involvedObject.namespace" => involved.and_then(|i| i.namespace),
            "involvedObject.uid" => involved.and_then(|i| i.uid),
            "reason" => self.reason,
            "type" => self.type_,
            _ => None,
        };
        value.unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_operator_of_the_string_syntax_selects_what_kubectl_would() {
        let sel = LabelSelector::parse(" app = web , tier!=db, env in (prod, qa),track notin(canary), owner, !legacy ")
            .unwrap();
        assert!(sel.matches(&labels(&[("app", "web"), ("env", "qa"), ("owner", "me")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("env", "qa")])), "owner must exist");
        assert!(!sel.matches(&labels(&[("app", "web"), ("env", "dev"), ("owner", "me")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("env", "qa"), ("owner", "me"), ("tier", "db")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("env", "qa"), ("owner", "me"), ("legacy", "")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("env", "qa"), ("owner", "me"), ("track", "canary")])));
        assert_eq!(sel.to_string(), "app=web,tier!=db,env in (prod,qa),track notin (canary),owner,!legacy");
    }

    #[test]
    fn double_equals_means_the_same_as_equals() {
        assert_eq!(LabelSelector::parse("a==b").unwrap(), LabelSelector::parse("a=b").unwrap());
    }

    #[test]
    fn empty_selector_matches_everything() {
        let sel = LabelSelector::parse("  ").unwrap();
        assert!(sel.is_empty());
        assert!(sel.matches_object(&json!({"metadata": {}})));
        assert_eq!(sel.to_string(), "");
    }

    #[test]
    fn prefixed_keys_are_accepted() {
        let sel = LabelSelector::parse("app.kubernetes.io/name=web").unwrap();
        assert!(sel.matches_object(&json!({"metadata": {"labels": {"app.kubernetes.io/name": "web"}}})));
    }

    #[test]
    fn malformed_selectors_are_bad_requests_naming_the_bad_part() {
        for (input, names) in [
            ("a=b,,c", "expected a label key"),
            ("Bad Key=x", "expected one of"),
            ("-a=b", "-a"),
            ("a=b c", "expected ','"),
            ("a in (x,y", "expected ',' or ')'"),
            ("a in ()", "expected a value"),
            ("a=-x", "-x"),
            ("a in x", "expected '('"),
            ("a=b!", "expected ','"),
        ] {
            let err = LabelSelector::parse(input).expect_err(input);
            assert_eq!(err.code(), 400, "{input}");
            assert!(err.to_string().contains(names), "{input}: {err}");
        }
    }

    #[test]
    fn metav1_selector_combines_match_labels_and_expressions() {
        let sel = LabelSelector::from_k8s(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "env", "operator": "In", "values": ["prod"]},
                {"key": "canary", "operator": "DoesNotExist"}
            ]
        }))
        .unwrap();
        assert!(sel.matches(&labels(&[("app", "web"), ("env", "prod")])));
        assert!(!sel.matches(&labels(&[("app", "web"), ("env", "prod"), ("canary", "1")])));
        assert_eq!(sel.to_string(), "app=web,env in (prod),!canary");
    }

    #[test]
    fn metav1_selector_rejects_bad_operators_and_shorthand_maps() {
        let err = LabelSelector::from_k8s(&json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}))
            .unwrap_err();
        assert!(err.to_string().contains("Gt"), "{err}");
        let err = LabelSelector::from_k8s(&json!({"matchExpressions": [{"key": "a", "operator": "In"}]})).unwrap_err();
        assert!(err.to_string().contains("non-empty"), "{err}");
        let err = LabelSelector::from_k8s(&json!({"app": "web"})).unwrap_err();
        assert!(err.to_string().contains("\"app\""), "{err}");
    }

    #[test]
    fn field_selector_finds_unbound_pods_and_offers_index_values() {
        let unbound = json!({"metadata": {"name": "web-0", "namespace": "default"}, "spec": {}});
        let bound = json!({"metadata": {"name": "web-1", "namespace": "default"}, "spec": {"nodeName": "n1"},
            "status": {"phase": "Running"}});
        let sel = FieldSelector::parse("spec.nodeName=").unwrap();
        assert!(sel.matches(&unbound) && !sel.matches(&bound));
        let sel = FieldSelector::parse("spec.nodeName==n1, status.phase!=Failed").unwrap();
        assert!(!sel.matches(&unbound) && sel.matches(&bound));
        assert_eq!(sel.exact_value("spec.nodeName"), Some("n1"));
        assert_eq!(sel.exact_value("status.phase"), None);
        assert!(FieldSelector::parse("").unwrap().is_empty());
        assert!(FieldSelector::parse("").unwrap().matches(&bound));
    }

    #[test]
    fn field_selector_sets_select_the_pods_of_several_nodes() {
        let on = |node: &str| json!({"metadata": {"name": "p", "namespace": "default"}, "spec": {"nodeName": node}});
        let sel = FieldSelector::parse("spec.nodeName in (sim-0-1, sim-0-2),metadata.namespace=default").unwrap();
        assert!(sel.matches(&on("sim-0-1")) && sel.matches(&on("sim-0-2")));
        assert!(!sel.matches(&on("sim-1-1")) && !sel.matches(&on("")));
        assert_eq!(sel.exact_value("spec.nodeName"), None, "a set is no single index value");
        assert_eq!(sel.to_string(), "spec.nodeName in (sim-0-1,sim-0-2),metadata.namespace=default");
        assert_eq!(FieldSelector::parse(&sel.to_string()).unwrap(), sel);
        let not = FieldSelector::parse("spec.nodeName notin (sim-0-1)").unwrap();
        assert!(!not.matches(&on("sim-0-1")) && not.matches(&on("")));
        for (bad, says) in [
            ("spec.nodeName in ()", "is not a value"),
            ("spec.nodeName in (a,,b)", "is not a value"),
            ("spec.nodeName in (a,metadata.name=b)", "is not a value"),
            ("spec.nodeName in (a", "')'"),
            ("spec.nodeName within (a)", "notin"),
            ("spec.replicas in (1)", "spec.replicas"),
        ] {
            let err = FieldSelector::parse(bad).unwrap_err();
            assert_eq!(err.code(), 400, "{bad}");
            assert!(err.to_string().contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn field_selector_on_unsupported_field_names_it_and_the_supported_ones() {
        let err = FieldSelector::parse("spec.replicas=3").unwrap_err();
        assert_eq!(err.code(), 400);
        let msg = err.to_string();
        assert!(msg.contains("spec.replicas") && msg.contains("status.phase"), "{msg}");
        assert!(FieldSelector::parse("metadata.name").is_err());
    }

    fn arb_key() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("app".to_string()),
            Just("tier".to_string()),
            Just("env".to_string()),
            Just("example.com/team".to_string()),
            "[a-z][a-z0-9_.-]{0,6}[a-z0-9]",
        ]
    }
    fn arb_value() -> impl Strategy<Value = String> {
        prop_oneof![Just("a".to_string()), Just("b".to_string()), Just("web".to_string()), "[A-Za-z0-9]{1,3}"]
    }
    fn arb_requirement() -> impl Strategy<Value = Requirement> {
        let set = || proptest::collection::btree_set(arb_value(), 1..4);
        prop_oneof![
            (arb_key(), arb_value()).prop_map(|(k, v)| Requirement::Equals(k, v)),
            (arb_key(), prop_oneof![Just(String::new()), arb_value()]).prop_map(|(k, v)| Requirement::Equals(k, v)),
            (arb_key(), arb_value()).prop_map(|(k, v)| Requirement::NotEquals(k, v)),
            (arb_key(), set()).prop_map(|(k, s)| Requirement::In(k, s)),
            (arb_key(), set()).prop_map(|(k, s)| Requirement::NotIn(k, s)),
            arb_key().prop_map(Requirement::Exists),
            arb_key().prop_map(Requirement::DoesNotExist),
        ]
    }

    proptest! {
        #[test]
        fn rendering_and_parsing_again_gives_the_same_selector(
            reqs in proptest::collection::vec(arb_requirement(), 0..6)
        ) {
            let sel = LabelSelector { requirements: reqs };
            let again = LabelSelector::parse(&sel.to_string());
            prop_assert_eq!(again.as_ref(), Ok(&sel));
            let twice = LabelSelector::parse(&sel.to_string()).map(|s| s.to_string());
            prop_assert_eq!(twice, Ok(sel.to_string()));
        }

        #[test]
        fn any_typed_string_parses_or_is_a_bad_request(s in "[ a-z!=(),/.äé-]{0,24}") {
            if let Err(e) = LabelSelector::parse(&s) {
                prop_assert_eq!(e.code(), 400);
            }
            if let Err(e) = FieldSelector::parse(&s) {
                prop_assert_eq!(e.code(), 400);
            }
        }

        #[test]
        fn matching_agrees_with_a_plain_model(
            reqs in proptest::collection::vec(arb_requirement(), 0..5),
            map in proptest::collection::btree_map(arb_key(), arb_value(), 0..5),
        ) {
            let model = reqs.iter().all(|r| match r {
                Requirement::Equals(k, v) => map.get(k).map(String::as_str) == Some(v.as_str()),
                Requirement::NotEquals(k, v) => map.get(k).map(String::as_str) != Some(v.as_str()),
                Requirement::In(k, s) => map.get(k).is_some_and(|x| s.iter().any(|y| y == x)),
                Requirement::NotIn(k, s) => map.get(k).is_none_or(|x| s.iter().all(|y| y != x)),
                Requirement::Exists(k) => map.contains_key(k),
                Requirement::DoesNotExist(k) => !map.contains_key(k),
            });
            let sel = LabelSelector::parse(&LabelSelector { requirements: reqs }.to_string()).unwrap();
            prop_assert_eq!(sel.matches(&map), model);
            let obj = json!({"metadata": {"labels": map}});
            prop_assert_eq!(sel.matches_object(&obj), model);
        }

        #[test]
        fn reading_only_the_selected_fields_from_text_agrees_with_the_parsed_object(
            reqs in proptest::collection::vec(arb_requirement(), 0..4),
            map in proptest::collection::btree_map(arb_key(), arb_value(), 0..4),
            field in 0..SELECTABLE_FIELDS.len(),
            value in "[a-c]{0,2}",
            negated: bool,
            other in "[a-c]{0,2}",
        ) {
            let labels = LabelSelector { requirements: reqs };
            let term = format!("{}{}{value}", SELECTABLE_FIELDS[field], if negated { "!=" } else { "=" });
            let sel = Selection::parse(Some(&labels.to_string()), Some(&term)).unwrap();
            // Every selectable field set, the chosen one to `other`, so that both answers occur.
            let mut obj = json!({"metadata": {"name": "n", "namespace": "ns", "labels": map}, "spec": {"nodeName": "x"},
                "status": {"phase": "Running"}, "reason": "r", "type": "Normal",
                "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns", "uid": "u"}});
            let (head, leaf) = SELECTABLE_FIELDS[field].rsplit_once('.').unwrap_or(("", SELECTABLE_FIELDS[field]));
            let parent = if head.is_empty() { &mut obj } else { &mut obj[head] };
            parent[leaf] = json!(other);
            let text = serde_json::to_vec(&obj).unwrap();
            prop_assert_eq!(sel.matches_json(&text), Some(sel.matches(&obj)));
        }
    }

    #[test]
    fn objects_of_unusual_shapes_are_selected_as_their_parsed_form_is() {
        let selections = [
            Selection::parse(Some("app=web"), None).unwrap(),
            Selection::parse(Some("!app"), Some("spec.nodeName=")).unwrap(),
            Selection::parse(None, Some("spec.nodeName=n1")).unwrap(),
            Selection::parse(None, Some("metadata.name!=web,status.phase=")).unwrap(),
            Selection::parse(Some("app in (web,db)"), Some("type=Normal")).unwrap(),
            Selection::default(),
        ];
        let texts = [
            r#"{"metadata": {"name": "web", "labels": {"app": "web"}}, "spec": {"nodeName": "n1"}}"#,
            r#"{"metadata": {"name": "we\u0062", "labels": {"app": "w\u0065b"}}, "spec": {"nodeName": "n\u0031"}}"#,
            r#"{"metadata": {"name": "web", "labels": {"app": 5, "tier": null}}, "spec": {"nodeName": 7}}"#,
            r#"{"metadata": null, "spec": null, "status": {"phase": null}}"#,
            r#"{"metadata": {"labels": null}, "spec": "a string spec", "status": ["phase"]}"#,
            r#"{"spec": {"nodeName": {"nested": "n1"}}, "type": ["Normal"]}"#,
            r#"{"kind": "ConfigMap", "data": {"spec.nodeName": "n1"}, "type": "Normal"}"#,
            r#"{"metadata": {"name": "a", "name": "web"}, "spec": {"nodeName": "n1"}}"#,
            "{}",
        ];
        for text in texts {
            let parsed: Value = serde_json::from_str(text).unwrap();
            for sel in &selections {
                assert_eq!(sel.matches_json(text.as_bytes()), Some(sel.matches(&parsed)), "{sel:?} on {text}");
            }
        }
        // Escapes read as what they stand for.
        assert_eq!(selections[3].matches_json(br#"{"metadata":{"name":"we\u0062"}}"#), Some(false));
        assert_eq!(selections[3].matches_json(br#"{"metadata":{"name":"we\u0063"}}"#), Some(true));
        assert_eq!(selections[0].matches_json(b"not json"), None);
        assert_eq!(selectable_field(br#"{"spec":{"nodeName":"n\u0031"}}"#, "spec.nodeName").as_deref(), Some("n1"));
        assert_eq!(selectable_field(br#"{"spec":{"nodeName":"n1"}}"#, "spec.nodeName").as_deref(), Some("n1"));
        assert_eq!(selectable_field(br#"{"spec":{}}"#, "spec.nodeName").as_deref(), Some(""));
        assert_eq!(selectable_field(b"{", "spec.nodeName"), None);
        // A list's items would fill the fields in order: not an object, so it is read in full.
        let list = br#"[{"labels": {"app": "web"}}]"#;
        assert_eq!(selections[0].matches_json(list), Some(false));
    }
}
