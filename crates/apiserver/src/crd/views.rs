//! Custom objects seen through their definition's JSON paths: the Scale subresource and the
//! Table of `additionalPrinterColumns`.

use serde_json::{Value, json};
use shepherd_api::kinds::{self, CustomVersion, ResourceInfo};
use shepherd_api::{ApiError, JsonPath};

use super::str_at;

/// A simple JSONPath (`.spec.replicas`, `.status.conditions[0].type`) as JSON-pointer steps;
/// none for anything fancier, which Shepherd does not evaluate.
pub(crate) fn simple_path(path: &str) -> Option<Vec<String>> {
    let path = path.trim();
    let path = path.strip_prefix('{').and_then(|p| p.strip_suffix('}')).unwrap_or(path);
    let rest = path.strip_prefix('.')?;
    let mut steps = Vec::new();
    for part in rest.split('.') {
        let (field, mut index) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if field.is_empty() || !field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            return None;
        }
        steps.push(field.to_string());
        while !index.is_empty() {
            let close = index.find(']')?;
            let n: usize = index.get(1..close)?.parse().ok()?;
            steps.push(n.to_string());
            index = &index[close + 1..];
        }
    }
    Some(steps)
}

fn value_at<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let steps = simple_path(path)?;
    let mut v = obj;
    for s in &steps {
        v = match v {
            Value::Object(m) => m.get(s)?,
            Value::Array(a) => a.get(s.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(v)
}

/// Sets the value at a simple path, creating the objects on the way.
fn set_at(obj: &mut Value, path: &str, value: Value) -> Result<(), ApiError> {
    let steps = simple_path(path).ok_or_else(|| ApiError::Internal(format!("scale path {path:?} is not a simple path")))?;
    let mut v = obj;
    for s in &steps {
        if !v.is_object() {
            *v = json!({});
        }
        let Value::Object(m) = v else { unreachable!("just made an object") };
        v = m.entry(s.clone()).or_insert(Value::Null);
    }
    *v = value;
    Ok(())
}

/// The `autoscaling/v1` Scale of a custom object, read through its definition's paths.
pub(crate) fn scale_of(scale: &Value, obj: &Value) -> Value {
    let path = |f: &str| str_at(scale, &format!("/{f}")).to_string();
    let int = |p: String| value_at(obj, &p).and_then(Value::as_i64).unwrap_or(0);
    let selector = value_at(obj, &path("labelSelectorPath")).and_then(Value::as_str).unwrap_or("").to_string();
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": obj.at("/metadata/name"), "namespace": obj.at("/metadata/namespace"),
            "uid": obj.at("/metadata/uid"), "resourceVersion": obj.at("/metadata/resourceVersion"),
            "creationTimestamp": obj.at("/metadata/creationTimestamp"),
        },
        "spec": {"replicas": int(path("specReplicasPath"))},
        "status": {"replicas": int(path("statusReplicasPath")), "selector": selector},
    })
}

/// The Scale view of any scalable object, built-in or custom.
pub(crate) fn scale_view(res: &ResourceInfo, obj: &Value) -> Option<Value> {
    kinds::custom(res).and_then(|c| c.scale.as_ref().map(|s| scale_of(s, obj)))
}

/// Writes a Scale's replicas into a custom object; false for built-in kinds.
pub(crate) fn set_replicas(res: &ResourceInfo, obj: &mut Value, replicas: i64) -> Result<bool, ApiError> {
    let Some(custom) = kinds::custom(res) else { return Ok(false) };
    let Some(scale) = &custom.scale else { return Ok(false) };
    set_at(obj, str_at(scale, "/specReplicasPath"), json!(replicas))?;
    Ok(true)
}

/// A Table of custom objects: Name, the definition's printer columns, or Age without any.
pub(crate) fn table(custom: &CustomVersion, objects: &[Value], resource_version: &str) -> Value {
    let mut defs = vec![json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0})];
    let columns: Vec<Value> = if custom.printer_columns.is_empty() {
        vec![json!({"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"})]
    } else {
        custom.printer_columns.clone()
    };
    for col in &columns {
        defs.push(json!({"name": col["name"], "type": col["type"], "format": col.get("format").cloned().unwrap_or(json!("")),
            "description": col.get("description").cloned().unwrap_or(json!("")), "priority": col.get("priority").cloned().unwrap_or(json!(0))}));
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![json!(str_at(o, "/metadata/name"))];
            for col in &columns {
                let v = value_at(o, str_at(col, "/jsonPath"));
                cells.push(match (str_at(col, "/type"), v) {
                    (_, None) => Value::Null,
                    ("date", Some(Value::String(t))) => match t.parse::<jiff::Timestamp>() {
                        Ok(ts) => json!(crate::table::human_age(jiff::Timestamp::now().as_second() - ts.as_second())),
                        Err(_) => json!(t),
                    },
                    (_, Some(v @ (Value::Object(_) | Value::Array(_)))) => json!(v.to_string()),
                    (_, Some(v)) => v.clone(),
                });
            }
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                "metadata": o.get("metadata").cloned().unwrap_or(json!({}))}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": defs, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_json_paths_are_read_and_fancy_ones_refused() {
        assert_eq!(simple_path(".spec.replicas"), Some(vec!["spec".to_string(), "replicas".to_string()]));
        assert_eq!(simple_path(".status.conditions[0].type").map(|s| s.len()), Some(4));
        assert_eq!(simple_path("spec.replicas"), None);
        assert_eq!(simple_path(".spec.items[*].name"), None);
        let obj = json!({"spec": {"replicas": 3}});
        assert_eq!(value_at(&obj, ".spec.replicas"), Some(&json!(3)));
    }
}
