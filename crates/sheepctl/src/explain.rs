//! `sheepctl explain`: the documentation of a kind or of one of its fields, read from the
//! server's OpenAPI v3 document of the kind's group-version, printed as `kubectl explain` does.

use anyhow::{Context, anyhow, bail};
use serde_json::{Map, Value};
use shepherd_api::kinds::{self, ResourceInfo};

use crate::connection::Cluster;
use crate::resource;

/// Descriptions are wrapped to this many columns, indentation included, like kubectl's.
const WIDTH: usize = 80;

/// Prints the explanation of `RESOURCE[.field.path]`.
pub async fn run(cluster: &Cluster, target: &str, recursive: bool) -> anyhow::Result<()> {
    let (res, fields) = split_target(target)?;
    let doc = cluster.get(&document_path(res)).await.with_context(|| format!("reading the OpenAPI schema of {}", res.api_version()))?;
    let schemas = doc.pointer("/components/schemas").and_then(Value::as_object).ok_or_else(|| anyhow!("the server's OpenAPI document for {} has no schemas", res.api_version()))?;
    print!("{}", explain(schemas, res, &fields, recursive)?);
    Ok(())
}

/// Splits `RESOURCE[.VERSION.GROUP|.GROUP][.field.path]` into the resource and the field path.
/// The resource is the longest group-qualified prefix that names one (`deployments.apps`,
/// `deployment.v1.apps`, `leases.coordination.k8s.io`, whose group has dots itself), else the
/// first segment (`deploy`, `pods`).
fn split_target(target: &str) -> anyhow::Result<(&'static ResourceInfo, Vec<&str>)> {
    let segments: Vec<&str> = target.split('.').collect();
    for take in (2..=segments.len()).rev() {
        let prefix = segments[..take].join(".").to_ascii_lowercase();
        let qualified = kinds::ALL.iter().filter(|r| !r.group.is_empty()).find(|r| {
            let kind = r.kind.to_ascii_lowercase();
            let names = [r.plural, r.singular, kind.as_str()].into_iter().chain(r.short_names.iter().copied());
            names.into_iter().any(|n| prefix == format!("{n}.{}", r.group) || prefix == format!("{n}.{}.{}", r.version, r.group))
        });
        if let Some(res) = qualified {
            return Ok((res, segments[take..].to_vec()));
        }
    }
    Ok((resource::resolve(segments[0])?, segments[1..].to_vec()))
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/apps/v1`.
fn document_path(res: &ResourceInfo) -> String {
    if res.group.is_empty() { format!("/openapi/v3/api/{}", res.version) } else { format!("/openapi/v3/apis/{}/{}", res.group, res.version) }
}

/// The text `explain` prints for a kind and a (possibly empty) field path inside it.
fn explain(schemas: &Map<String, Value>, res: &ResourceInfo, fields: &[&str], recursive: bool) -> anyhow::Result<String> {
    let root = schemas
        .values()
        .find(|s| is_kind(s, res))
        .ok_or_else(|| anyhow!("the server's OpenAPI document has no schema for {} {}", res.api_version(), res.kind))?;
    let mut out = String::new();
    if !res.group.is_empty() {
        out.push_str(&format!("GROUP:      {}\n", res.group));
    }
    out.push_str(&format!("KIND:       {}\nVERSION:    {}\n\n", res.kind, res.version));

    // `field` is the schema as written on the parent (its description), `ty` the type it names.
    let mut field = root;
    let mut ty = root;
    let mut walked = res.kind.to_string();
    for name in fields {
        let properties = ty.get("properties").and_then(Value::as_object);
        let Some(next) = properties.and_then(|p| p.get(*name)) else {
            bail!("field \"{name}\" does not exist in {walked}");
        };
        walked = format!("{walked}.{name}");
        field = next;
        ty = element_type(schemas, next);
    }

    let mut description = Vec::new();
    if let Some(last) = fields.last() {
        out.push_str(&format!("FIELD: {last} <{}>\n\n\n", type_name(schemas, field)));
        description.extend(field.get("description").and_then(Value::as_str));
        if !std::ptr::eq(ty, field) {
            description.extend(ty.get("description").and_then(Value::as_str));
        }
    } else {
        description.extend(root.get("description").and_then(Value::as_str));
    }
    out.push_str("DESCRIPTION:\n");
    for d in description {
        out.push_str(&wrap(d, 4));
    }
    // kubectl's template ends the description with an indented empty line and the whole text
    // with an empty line; kept so that both tools print the same bytes.
    out.push_str("    \n");
    if let Some(properties) = ty.get("properties").and_then(Value::as_object) {
        out.push_str("FIELDS:\n");
        if recursive {
            let mut seen = Vec::new();
            field_tree(schemas, ty, properties, 2, &mut seen, &mut out);
        } else {
            for (name, prop) in properties {
                out.push_str(&format!("  {name}\t<{}>{}\n", type_name(schemas, prop), required_mark(ty, name)));
                if let Some(d) = prop.get("description").and_then(Value::as_str) {
                    out.push_str(&wrap(d, 4));
                }
                out.push('\n');
            }
        }
    }
    out.push('\n');
    Ok(out)
}

fn is_kind(schema: &Value, res: &ResourceInfo) -> bool {
    let gvks = schema.get("x-kubernetes-group-version-kind").and_then(Value::as_array);
    gvks.into_iter().flatten().any(|g| {
        g.get("group").and_then(Value::as_str) == Some(res.group)
            && g.get("version").and_then(Value::as_str) == Some(res.version)
            && g.get("kind").and_then(Value::as_str) == Some(res.kind)
    })
}

/// The schema named by `$ref`, directly or as the single member of `allOf`.
fn reference<'a>(schemas: &'a Map<String, Value>, schema: &Value) -> Option<(&'a str, &'a Value)> {
    let r = schema
        .get("$ref")
        .or_else(|| schema.get("allOf").and_then(Value::as_array).and_then(|all| all.iter().find_map(|s| s.get("$ref"))))
        .and_then(Value::as_str)?;
    let name = r.rsplit('/').next()?;
    schemas.get_key_value(name).map(|(k, v)| (k.as_str(), v))
}

/// The type whose fields a path continues into: the referenced schema, through arrays to their
/// elements and through maps to their values.
fn element_type<'a>(schemas: &'a Map<String, Value>, schema: &'a Value) -> &'a Value {
    if let Some((_, target)) = reference(schemas, schema) {
        return target;
    }
    if let Some(items) = schema.get("items").filter(|i| i.is_object()) {
        return element_type(schemas, items);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        return element_type(schemas, values);
    }
    schema
}

/// kubectl's type names: `string`, `[]Container`, `map[string]string`, `ObjectMeta`, `Object`.
fn type_name(schemas: &Map<String, Value>, schema: &Value) -> String {
    if let Some((name, target)) = reference(schemas, schema) {
        // A reference to a primitive (`Time` is a string) shows the primitive.
        return match target.get("type").and_then(Value::as_str) {
            Some(t) if t != "object" => t.to_string(),
            _ => name.rsplit('.').next().unwrap_or(name).to_string(),
        };
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("array") => format!("[]{}", schema.get("items").map(|i| type_name(schemas, i)).unwrap_or_else(|| "Object".into())),
        Some("object") => match schema.get("additionalProperties").filter(|v| v.is_object()) {
            Some(values) => format!("map[string]{}", type_name(schemas, values)),
            None => "Object".into(),
        },
        Some(t) => t.to_string(),
        None if schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) => "IntOrString".into(),
        None => "Object".into(),
    }
}

fn required_mark(parent: &Value, name: &str) -> &'static str {
    let required = parent.get("required").and_then(Value::as_array);
    if required.is_some_and(|r| r.iter().any(|n| n.as_str() == Some(name))) { " -required-" } else { "" }
}

/// `--recursive`: every field below, indented by depth, without descriptions. A type already
/// being printed higher up is not entered again, so self-referencing schemas end.
fn field_tree<'a>(schemas: &'a Map<String, Value>, parent: &'a Value, properties: &'a Map<String, Value>, indent: usize, seen: &mut Vec<*const Value>, out: &mut String) {
    seen.push(parent);
    for (name, prop) in properties {
        out.push_str(&format!("{:indent$}{name}\t<{}>{}\n", "", type_name(schemas, prop), required_mark(parent, name)));
        let ty = element_type(schemas, prop);
        if let Some(children) = ty.get("properties").and_then(Value::as_object)
            && !seen.contains(&(ty as *const Value))
        {
            field_tree(schemas, ty, children, indent + 2, seen, out);
        }
    }
    seen.pop();
}

/// Word-wraps `text` to [`WIDTH`] columns, every line indented by `indent`. A line breaks only
/// at whitespace and drops the whitespace it breaks at; other runs of spaces and leading tabs
/// (the code examples in some descriptions) are kept, so the output is kubectl's.
fn wrap(text: &str, indent: usize) -> String {
    let limit = WIDTH - indent;
    let mut out = String::new();
    for paragraph in text.split('\n') {
        for line in wrap_line(paragraph, limit) {
            out.push_str(&format!("{:indent$}{line}\n", ""));
        }
    }
    out
}

fn wrap_line(text: &str, limit: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let (mut line, mut space, mut word) = (String::new(), String::new(), String::new());
    let width = |s: &str| s.chars().count();
    for ch in text.chars() {
        if ch.is_whitespace() && ch != '\u{a0}' {
            if space.is_empty() || !word.is_empty() {
                line.push_str(&space);
                line.push_str(&word);
                space.clear();
                word.clear();
            }
            space.push(ch);
        } else {
            word.push(ch);
            if width(&line) + width(&space) + width(&word) > limit && width(&word) < limit {
                lines.push(std::mem::take(&mut line));
                space.clear();
            }
        }
    }
    if !word.is_empty() || width(&line) + width(&space) <= limit {
        line.push_str(&space);
    }
    line.push_str(&word);
    lines.push(line);
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_may_be_named_with_its_group_and_version_before_the_field_path() {
        let split = |t: &str| split_target(t).map(|(r, f)| (r.kind, f.join("."))).expect(t);
        assert_eq!(split("deploy.spec.replicas"), ("Deployment", "spec.replicas".into()));
        assert_eq!(split("deployments.apps.spec.replicas"), ("Deployment", "spec.replicas".into()));
        assert_eq!(split("deployment.v1.apps"), ("Deployment", String::new()));
        assert_eq!(split("leases.coordination.k8s.io.spec"), ("Lease", "spec".into()));
        assert_eq!(split("pods"), ("Pod", String::new()));
        assert!(split_target("widgets.apps.spec").is_err());
    }

    #[test]
    fn wrapping_keeps_words_whole_and_lines_within_the_width() {
        let text = "word ".repeat(40);
        let wrapped = wrap(&text, 4);
        assert!(wrapped.lines().all(|l| l.len() <= WIDTH && l.starts_with("    word")), "{wrapped}");
        assert_eq!(wrapped.split_whitespace().count(), 40);
        assert_eq!(wrap("a\nb", 2), "  a\n  b\n");
        assert_eq!(wrap("\t Name: x,\n\t   {", 4), "    \t Name: x,\n    \t   {\n", "leading whitespace is kept");
    }
}
