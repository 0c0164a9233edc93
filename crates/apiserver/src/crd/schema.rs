//! Structural OpenAPI v3 schemas of custom resources: checking a definition's schema, and
//! pruning, defaulting and validating objects against it, with Kubernetes' field paths and wording.

use serde_json::{Map, Value, json};
use shepherd_api::Cause;

/// A schema keyword, or null when absent.
fn kw<'a>(schema: &'a Value, key: &str) -> Option<&'a Value> {
    schema.get(key).filter(|v| !v.is_null())
}

fn flag(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool) == Some(true)
}

fn type_of(schema: &Value) -> &str {
    schema.get("type").and_then(Value::as_str).unwrap_or("")
}

fn child(path: &str, field: &str) -> String {
    if path.is_empty() { field.to_string() } else { format!("{path}.{field}") }
}

/// The schema of `additionalProperties`, when it is one (`true` allows anything; `false` and
/// absent, nothing beyond `properties`).
fn additional(schema: &Value) -> Option<&Value> {
    kw(schema, "additionalProperties").filter(|v| v.is_object())
}

// ---------------------------------------------------------------------------------------------
// Definition checks
// ---------------------------------------------------------------------------------------------

/// Checks that `schema` (found at `path`, e.g. `spec.versions[0].schema.openAPIV3Schema`) is
/// structural, as Kubernetes requires of `apiextensions.k8s.io/v1` definitions.
pub(crate) fn check_structural(schema: &Value, path: &str, causes: &mut Vec<Cause>) {
    if !schema.is_object() {
        causes.push(Cause::invalid(path, format!("Invalid value: {schema}: must be an object")));
        return;
    }
    match type_of(schema) {
        "" => causes.push(Cause::new("FieldValueRequired", child(path, "type"), "Required value: must not be empty at the root")),
        "object" => {}
        other => causes.push(Cause::invalid(child(path, "type"), format!("Invalid value: \"{other}\": must be object at the root"))),
    }
    // Object metadata has its own rules; a schema may only narrow the name.
    if let Some(meta) = schema.get("properties").and_then(|p| p.get("metadata")) {
        let only_names = meta.as_object().is_some_and(|m| {
            m.iter().all(|(k, v)| match k.as_str() {
                "type" => v == "object",
                "properties" => v.as_object().is_some_and(|p| p.keys().all(|k| k == "name" || k == "generateName")),
                _ => false,
            })
        });
        if !only_names {
            causes.push(Cause::forbidden(
                format!("{path}.properties[metadata]"),
                "Forbidden: must not specify anything other than name and generateName, but metadata is implicitly specified",
            ));
        }
    }
    check_node(schema, path, causes);
}

fn check_node(schema: &Value, path: &str, causes: &mut Vec<Cause>) {
    const TYPES: [&str; 7] = ["", "object", "array", "string", "integer", "number", "boolean"];
    let ty = type_of(schema);
    if !TYPES.contains(&ty) {
        causes.push(Cause::not_supported(
            child(path, "type"),
            format!("Unsupported value: \"{ty}\": supported values: \"array\", \"boolean\", \"integer\", \"number\", \"object\", \"string\""),
        ));
    }
    if kw(schema, "$ref").is_some() {
        causes.push(Cause::forbidden(child(path, "$ref"), "Forbidden: $ref is not supported"));
    }
    if flag(schema, "uniqueItems") {
        causes.push(Cause::forbidden(
            child(path, "uniqueItems"),
            "Forbidden: uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    if kw(schema, "additionalItems").is_some() {
        causes.push(Cause::forbidden(child(path, "additionalItems"), "Forbidden: additionalItems cannot be set to true"));
    }
    if flag(schema, "x-kubernetes-int-or-string") && !ty.is_empty() {
        causes.push(Cause::invalid(
            child(path, "type"),
            format!("Invalid value: \"{ty}\": must be empty if x-kubernetes-int-or-string is true"),
        ));
    }
    if let Some(p) = kw(schema, "pattern").and_then(Value::as_str)
        && regex::Regex::new(p).is_err()
    {
        causes.push(Cause::invalid(child(path, "pattern"), format!("Invalid value: \"{p}\": must be a valid regular expression")));
    }
    let props = kw(schema, "properties").and_then(Value::as_object);
    if props.is_some() && kw(schema, "additionalProperties").is_some_and(|a| a != &json!(false)) {
        causes.push(Cause::forbidden(
            child(path, "additionalProperties"),
            "Forbidden: additionalProperties and properties are mutual exclusive",
        ));
    }
    for (name, sub) in props.into_iter().flatten() {
        let p = format!("{path}.properties[{name}]");
        require_type(sub, &p, "must not be empty for specified object fields", causes);
        check_node(sub, &p, causes);
    }
    if let Some(sub) = additional(schema) {
        let p = child(path, "additionalProperties");
        require_type(sub, &p, "must not be empty for specified object fields", causes);
        check_node(sub, &p, causes);
    }
    match kw(schema, "items") {
        Some(items) if items.is_object() => {
            let p = child(path, "items");
            require_type(items, &p, "must not be empty for specified array items", causes);
            check_node(items, &p, causes);
        }
        Some(other) => causes.push(Cause::forbidden(
            child(path, "items"),
            format!("Forbidden: items must be a schema object and not an array: {other}"),
        )),
        None if ty == "array" => causes.push(Cause::required(child(path, "items")).with_message("Required value: must be specified")),
        None => {}
    }
    if let Some(d) = kw(schema, "default") {
        let mut found = Vec::new();
        validate_value(schema, d, &child(path, "default"), &mut found);
        causes.extend(found);
    }
}

fn require_type(schema: &Value, path: &str, message: &str, causes: &mut Vec<Cause>) {
    let exempt = flag(schema, "x-kubernetes-int-or-string") || flag(schema, "x-kubernetes-preserve-unknown-fields");
    if type_of(schema).is_empty() && !exempt {
        causes.push(Cause::new("FieldValueRequired", child(path, "type"), format!("Required value: {message}")));
    }
}

trait WithMessage {
    fn with_message(self, message: &str) -> Self;
}

impl WithMessage for Cause {
    fn with_message(mut self, message: &str) -> Self {
        self.message = message.to_string();
        self
    }
}

// ---------------------------------------------------------------------------------------------
// Objects
// ---------------------------------------------------------------------------------------------

/// Fields every object has whatever its schema says: type and metadata (checked by the common
/// object rules).
const ROOT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Removes the fields the schema does not specify and returns their paths (`spec.colour`), as
/// Kubernetes prunes custom objects; `x-kubernetes-preserve-unknown-fields` keeps them.
pub(crate) fn prune(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(m) = obj.as_object_mut() {
        prune_object(schema, m, "", true, &mut found);
    }
    found
}

fn prune_object(schema: &Value, m: &mut Map<String, Value>, path: &str, root: bool, found: &mut Vec<String>) {
    let preserve = flag(schema, "x-kubernetes-preserve-unknown-fields");
    let embedded = flag(schema, "x-kubernetes-embedded-resource");
    let props = kw(schema, "properties").and_then(Value::as_object);
    let extra = additional(schema);
    let any_extra = schema.get("additionalProperties") == Some(&json!(true));
    m.retain(|k, v| {
        let p = child(path, k);
        if let Some(sub) = props.and_then(|ps| ps.get(k)).or(extra) {
            prune_value(sub, v, &p, found);
            return true;
        }
        if (root || embedded) && ROOT_FIELDS.contains(&k.as_str()) {
            return true;
        }
        if preserve || any_extra {
            return true;
        }
        found.push(p);
        false
    });
}

fn prune_value(schema: &Value, v: &mut Value, path: &str, found: &mut Vec<String>) {
    match v {
        Value::Object(m) => prune_object(schema, m, path, false, found),
        Value::Array(items) => {
            if let Some(item_schema) = kw(schema, "items").filter(|i| i.is_object()) {
                for (i, item) in items.iter_mut().enumerate() {
                    prune_value(item_schema, item, &format!("{path}[{i}]"), found);
                }
            }
        }
        _ => {}
    }
}

/// Fills in `default`s of absent fields, inside out as Kubernetes does: a defaulted object gets
/// the defaults of its own fields too.
pub(crate) fn apply_defaults(schema: &Value, v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(props) = kw(schema, "properties").and_then(Value::as_object) {
                for (name, sub) in props {
                    // A null is defaulted too, unless the field may be null.
                    let missing = match m.get(name) {
                        None => true,
                        Some(x) => x.is_null() && !flag(sub, "nullable"),
                    };
                    if missing && let Some(d) = kw(sub, "default")
                    {
                        m.insert(name.clone(), d.clone());
                    }
                }
                for (name, sub) in props {
                    if let Some(x) = m.get_mut(name) {
                        apply_defaults(sub, x);
                    }
                }
            }
            if let Some(sub) = additional(schema) {
                for x in m.values_mut() {
                    apply_defaults(sub, x);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = kw(schema, "items").filter(|i| i.is_object()) {
                for x in items {
                    apply_defaults(sub, x);
                }
            }
        }
        _ => {}
    }
}

/// Checks an object against its schema; the causes name fields as Kubernetes does.
pub(crate) fn validate(schema: &Value, obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(m) = obj.as_object() else { return causes };
    let props = kw(schema, "properties").and_then(Value::as_object);
    for (k, v) in m {
        if ROOT_FIELDS.contains(&k.as_str()) {
            continue;
        }
        if let Some(sub) = props.and_then(|p| p.get(k)).or(additional(schema)) {
            validate_value(sub, v, k, &mut causes);
        }
    }
    check_required(schema, m, "", &mut causes);
    causes
}

fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A value as Kubernetes quotes it in a message: strings quoted, the rest as JSON.
fn shown(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "" => true,
        "integer" => json_type_name(v) == "integer" || v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        other => json_type_name(v) == other,
    }
}

fn validate_value(schema: &Value, v: &Value, path: &str, causes: &mut Vec<Cause>) {
    if v.is_null() {
        if !flag(schema, "nullable") && !type_of(schema).is_empty() {
            causes.push(Cause::invalid(path, format!(
                "Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                type_of(schema)
            )));
        }
        return;
    }
    if flag(schema, "x-kubernetes-int-or-string") {
        if !(v.is_string() || type_matches("integer", v)) {
            causes.push(Cause::invalid(path, format!(
                "Invalid value: {}: {path} in body must be of type integer,string: \"{}\"",
                shown(v),
                json_type_name(v)
            )));
        }
        return;
    }
    check_combinators(schema, v, path, causes);
    let ty = type_of(schema);
    if !type_matches(ty, v) {
        causes.push(Cause::invalid(path, format!(
            "Invalid value: \"{}\": {path} in body must be of type {ty}: \"{}\"",
            json_type_name(v),
            json_type_name(v)
        )));
        return;
    }
    if let Some(allowed) = kw(schema, "enum").and_then(Value::as_array)
        && !allowed.contains(v)
    {
        let list: Vec<String> = allowed.iter().map(|a| a.to_string()).collect();
        causes.push(Cause::not_supported(path, format!(
            "Unsupported value: {}: supported values: {}",
            v,
            list.join(", ")
        )));
    }
    match v {
        Value::Number(n) => check_number(schema, n.as_f64().unwrap_or(0.0), v, path, causes),
        Value::String(s) => check_string(schema, s, path, causes),
        Value::Array(items) => {
            let len = items.len() as u64;
            if let Some(min) = kw(schema, "minItems").and_then(Value::as_u64).filter(|m| len < *m) {
                causes.push(Cause::invalid(path, format!("Invalid value: {len}: {path} in body should have at least {min} items")));
            }
            if let Some(max) = kw(schema, "maxItems").and_then(Value::as_u64).filter(|m| len > *m) {
                causes.push(Cause::new("FieldValueTooMany", path, format!("Too many: {len}: must have at most {max} items")));
            }
            if let Some(sub) = kw(schema, "items").filter(|i| i.is_object()) {
                for (i, item) in items.iter().enumerate() {
                    validate_value(sub, item, &format!("{path}[{i}]"), causes);
                }
            }
        }
        Value::Object(m) => {
            let len = m.len() as u64;
            if let Some(min) = kw(schema, "minProperties").and_then(Value::as_u64).filter(|x| len < *x) {
                causes.push(Cause::invalid(path, format!("Invalid value: {len}: {path} in body should have at least {min} properties")));
            }
            if let Some(max) = kw(schema, "maxProperties").and_then(Value::as_u64).filter(|x| len > *x) {
                causes.push(Cause::new("FieldValueTooMany", path, format!("Too many: {len}: must have at most {max} items")));
            }
            let props = kw(schema, "properties").and_then(Value::as_object);
            let embedded = flag(schema, "x-kubernetes-embedded-resource");
            for (k, x) in m {
                if embedded && ROOT_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(sub) = props.and_then(|p| p.get(k)).or(additional(schema)) {
                    validate_value(sub, x, &format!("{path}.{k}"), causes);
                }
            }
            check_required(schema, m, path, causes);
            if embedded {
                for field in ["apiVersion", "kind"] {
                    if m.get(field).and_then(Value::as_str).is_none_or(|s| s.is_empty()) {
                        causes.push(Cause::required(format!("{path}.{field}")).with_message("Required value: must not be empty"));
                    }
                }
            }
        }
        _ => {}
    }
}

/// `allOf`, `anyOf`, `oneOf` and `not`: value validations a structural schema may add.
fn check_combinators(schema: &Value, v: &Value, path: &str, causes: &mut Vec<Cause>) {
    let fits = |sub: &Value| {
        let mut found = Vec::new();
        validate_value(sub, v, path, &mut found);
        found
    };
    for sub in kw(schema, "allOf").and_then(Value::as_array).into_iter().flatten() {
        causes.extend(fits(sub));
    }
    if let Some(any) = kw(schema, "anyOf").and_then(Value::as_array)
        && !any.is_empty()
        && !any.iter().any(|sub| fits(sub).is_empty())
    {
        causes.push(Cause::invalid(path, format!("Invalid value: {}: {path} in body must validate at least one schema (anyOf)", shown(v))));
    }
    if let Some(one) = kw(schema, "oneOf").and_then(Value::as_array)
        && !one.is_empty()
        && one.iter().filter(|sub| fits(sub).is_empty()).count() != 1
    {
        causes.push(Cause::invalid(path, format!("Invalid value: {}: {path} in body must validate one and only one schema (oneOf)", shown(v))));
    }
    if let Some(not) = kw(schema, "not").filter(|n| n.is_object())
        && fits(not).is_empty()
    {
        causes.push(Cause::invalid(path, format!("Invalid value: {}: {path} in body must not validate the schema (not)", shown(v))));
    }
}

fn check_required(schema: &Value, m: &Map<String, Value>, path: &str, causes: &mut Vec<Cause>) {
    for r in kw(schema, "required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        if !m.contains_key(r) {
            causes.push(Cause::required(child(path, r)));
        }
    }
}

fn check_number(schema: &Value, f: f64, v: &Value, path: &str, causes: &mut Vec<Cause>) {
    let bound = |key: &str| kw(schema, key).and_then(Value::as_f64);
    let shown_bound = |key: &str| kw(schema, key).map(Value::to_string).unwrap_or_default();
    if let Some(min) = bound("minimum") {
        let exclusive = flag(schema, "exclusiveMinimum");
        if f < min || (exclusive && f == min) {
            let op = if exclusive { "greater than" } else { "greater than or equal to" };
            causes.push(Cause::invalid(path, format!("Invalid value: {v}: {path} in body should be {op} {}", shown_bound("minimum"))));
        }
    }
    if let Some(max) = bound("maximum") {
        let exclusive = flag(schema, "exclusiveMaximum");
        if f > max || (exclusive && f == max) {
            let op = if exclusive { "less than" } else { "less than or equal to" };
            causes.push(Cause::invalid(path, format!("Invalid value: {v}: {path} in body should be {op} {}", shown_bound("maximum"))));
        }
    }
    if let Some(m) = bound("multipleOf").filter(|m| *m > 0.0)
        && (f / m).fract() != 0.0
    {
        causes.push(Cause::invalid(path, format!("Invalid value: {v}: {path} in body should be a multiple of {}", shown_bound("multipleOf"))));
    }
    if type_of(schema) == "integer" {
        let out_of = match kw(schema, "format").and_then(Value::as_str) {
            Some("int32") => !(f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&f),
            _ => false,
        };
        if out_of {
            causes.push(Cause::invalid(path, format!("Invalid value: {v}: {path} in body must be of type int32: \"{v}\"")));
        }
    }
}

fn check_string(schema: &Value, s: &str, path: &str, causes: &mut Vec<Cause>) {
    let chars = s.chars().count() as u64;
    if let Some(min) = kw(schema, "minLength").and_then(Value::as_u64).filter(|m| chars < *m) {
        causes.push(Cause::invalid(path, format!("Invalid value: {s:?}: {path} in body should be at least {min} chars long")));
    }
    if let Some(max) = kw(schema, "maxLength").and_then(Value::as_u64).filter(|m| chars > *m) {
        causes.push(Cause::new("FieldValueTooLong", path, format!("Too long: may not be more than {max} bytes")));
    }
    if let Some(p) = kw(schema, "pattern").and_then(Value::as_str)
        && let Ok(re) = regex::Regex::new(p)
        && !re.is_match(s)
    {
        causes.push(Cause::invalid(path, format!("Invalid value: {s:?}: {path} in body should match '{p}'")));
    }
    if let Some(format) = kw(schema, "format").and_then(Value::as_str)
        && !format_matches(format, s)
    {
        causes.push(Cause::invalid(path, format!("Invalid value: {s:?}: {path} in body must be of type {format}: {s:?}")));
    }
}

/// The string formats Kubernetes checks; others are accepted as they are (as Kubernetes does).
fn format_matches(format: &str, s: &str) -> bool {
    match format {
        "date-time" => s.parse::<jiff::Timestamp>().is_ok(),
        "date" => s.parse::<jiff::civil::Date>().is_ok() && s.len() == 10,
        "uuid" => uuid::Uuid::try_parse(s).is_ok(),
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => s.split_once('/').is_some_and(|(ip, bits)| {
            ip.parse::<std::net::IpAddr>().is_ok() && bits.parse::<u8>().is_ok()
        }),
        "hostname" => shepherd_api::validation::is_dns1123_subdomain(s),
        "email" => s.split_once('@').is_some_and(|(user, host)| !user.is_empty() && host.contains('.')),
        "byte" => s.len().is_multiple_of(4)
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/' || b == b'='),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn widget_schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "colour": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                "port": {"x-kubernetes-int-or-string": true},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }},
            "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
        }})
    }

    #[test]
    fn an_object_field_without_a_type_is_named_with_kubernetes_wording() {
        let schema = json!({"type": "object", "properties": {"spec": {"properties": {"a": {"type": "string"}}}}});
        let mut causes = Vec::new();
        check_structural(&schema, "spec.versions[0].schema.openAPIV3Schema", &mut causes);
        assert_eq!(causes.len(), 1, "{causes:?}");
        assert_eq!(causes[0].field, "spec.versions[0].schema.openAPIV3Schema.properties[spec].type");
        assert_eq!(causes[0].message, "Required value: must not be empty for specified object fields");
        let mut root = Vec::new();
        check_structural(&json!({"properties": {}}), "s", &mut root);
        assert_eq!(root[0].message, "Required value: must not be empty at the root");
        let mut fine = Vec::new();
        check_structural(&widget_schema(), "s", &mut fine);
        assert!(fine.is_empty(), "{fine:?}");
        let mut meta = Vec::new();
        check_structural(&json!({"type": "object", "properties": {"metadata": {"type": "object",
            "properties": {"labels": {"type": "object"}}}}}), "s", &mut meta);
        assert_eq!(meta.len(), 1, "{meta:?}");
        assert_eq!(meta[0].field, "s.properties[metadata]");
    }

    #[test]
    fn unknown_fields_are_pruned_except_where_preserved_and_defaults_fill_gaps() {
        let mut obj = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"size": 3, "bogus": 1, "extra": {"anything": [1]}}, "top": true});
        let pruned = prune(&widget_schema(), &mut obj);
        assert_eq!(pruned, ["spec.bogus", "top"]);
        apply_defaults(&widget_schema(), &mut obj);
        assert_eq!(obj["spec"], json!({"size": 3, "colour": "red", "extra": {"anything": [1]}}));
        assert_eq!(obj["metadata"]["name"], "w");
        let nullable = json!({"type": "object", "properties": {"a": {"type": "string", "default": "x", "nullable": true},
            "b": {"type": "string", "default": "y"}}});
        let mut nulls = json!({"a": null, "b": null});
        apply_defaults(&nullable, &mut nulls);
        assert_eq!(nulls, json!({"a": null, "b": "y"}));
    }

    #[test]
    fn invalid_values_are_named_by_their_field_path() {
        let obj = json!({"spec": {"size": 11, "colour": "green", "name": "ABC", "port": true, "tags": ["a", "b", "c"]}});
        let causes = validate(&widget_schema(), &obj);
        let fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(fields, ["spec.colour", "spec.name", "spec.port", "spec.size", "spec.tags"], "{causes:?}");
        assert!(causes[3].message.contains("should be less than or equal to 10"), "{}", causes[3].message);
        let missing = validate(&widget_schema(), &json!({"spec": {"size": "big"}}));
        assert_eq!(missing[0].message, "Invalid value: \"string\": spec.size in body must be of type integer: \"string\"");
        let required = validate(&widget_schema(), &json!({"spec": {}}));
        assert_eq!((required[0].field.as_str(), required[0].reason), ("spec.size", "FieldValueRequired"));
        assert!(validate(&widget_schema(), &json!({"spec": {"size": 2, "port": "http"}})).is_empty());
    }

    #[test]
    fn one_of_any_of_and_not_are_enforced() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}, "n": {"type": "integer", "not": {"enum": [13]},
                "anyOf": [{"minimum": 0}, {"maximum": -10}]}},
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}}});
        assert!(validate(&schema, &json!({"spec": {"a": "x", "n": 1}})).is_empty());
        let both = validate(&schema, &json!({"spec": {"a": "x", "b": "y"}}));
        assert!(both[0].message.contains("must validate one and only one schema (oneOf)"), "{both:?}");
        let n: Vec<String> = validate(&schema, &json!({"spec": {"a": "x", "n": -5}})).into_iter().map(|c| c.message).collect();
        assert!(n.iter().any(|m| m.contains("(anyOf)")), "{n:?}");
        let unlucky = validate(&schema, &json!({"spec": {"a": "x", "n": 13}}));
        assert!(unlucky[0].message.contains("must not validate the schema (not)"), "{unlucky:?}");
    }
}
