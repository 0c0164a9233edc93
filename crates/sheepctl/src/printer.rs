//! Printing objects: server-side `Table`s as aligned columns, and `-o json|yaml|name`.

use serde::Serialize;
use serde_json::Value;
use shepherd_api::kinds::ResourceInfo;

use crate::resource;

/// Column layout of kubectl's tab writer: at least 6 wide, 3 spaces of padding, the last column
/// unpadded.
const MIN_WIDTH: usize = 6;
const PADDING: usize = 3;

/// Which columns of a server `Table` to show, and how.
#[derive(Debug, Clone, Copy, Default)]
pub struct TableOptions {
    /// `-o wide`: include priority-1 columns.
    pub wide: bool,
    /// `-A`: a NAMESPACE column first, from each row's object metadata.
    pub with_namespace: bool,
}

/// Text rows of one or more server `Table`s, ready to align.
pub struct TextTable {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

fn cell_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "<none>".into(),
        other => other.to_string(),
    }
}

/// The visible column indices of a table and their header names.
fn visible_columns(table: &Value, opts: TableOptions) -> Vec<(usize, String)> {
    table["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| opts.wide || c["priority"].as_i64().unwrap_or(0) == 0)
        .map(|(i, c)| (i, c["name"].as_str().unwrap_or("").to_uppercase()))
        .collect()
}

/// Converts a server `Table` into text cells.
pub fn text_table(table: &Value, opts: TableOptions) -> TextTable {
    let columns = visible_columns(table, opts);
    let mut header: Vec<String> = columns.iter().map(|(_, n)| n.clone()).collect();
    if opts.with_namespace {
        header.insert(0, "NAMESPACE".into());
    }
    let rows = table["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|row| {
            let cells = row["cells"].as_array().cloned().unwrap_or_default();
            let mut out: Vec<String> = columns.iter().map(|(i, _)| cells.get(*i).map(cell_text).unwrap_or_default()).collect();
            if opts.with_namespace {
                out.insert(0, row.pointer("/object/metadata/namespace").and_then(Value::as_str).unwrap_or("").to_string());
            }
            out
        })
        .collect();
    TextTable { header, rows }
}

/// Column widths fitting the header and every row.
pub fn widths(t: &TextTable) -> Vec<usize> {
    let mut w: Vec<usize> = t.header.iter().map(|h| h.chars().count()).collect();
    for row in &t.rows {
        for (i, c) in row.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    w
}

/// One aligned line; `widths` may be wider than the cells (a watch keeps its first widths).
pub fn line(cells: &[String], widths: &[usize]) -> String {
    let mut out = String::new();
    for (i, c) in cells.iter().enumerate() {
        if i + 1 == cells.len() {
            out.push_str(c);
        } else {
            let w = (widths.get(i).copied().unwrap_or(0) + PADDING).max(MIN_WIDTH);
            out.push_str(c);
            out.extend(std::iter::repeat_n(' ', w.saturating_sub(c.chars().count())));
        }
    }
    out.trim_end().to_string()
}

/// The whole table as text, header first.
pub fn render(t: &TextTable) -> String {
    let w = widths(t);
    let mut out = line(&t.header, &w);
    out.push('\n');
    for row in &t.rows {
        out.push_str(&line(row, &w));
        out.push('\n');
    }
    out
}

/// The object (or each item of a list) without `metadata.managedFields`, which kubectl leaves out
/// of its output unless asked: they are long and say who set what, not what the object is.
fn without_managed_fields(v: &Value) -> Value {
    let mut v = v.clone();
    let strip = |o: &mut Value| {
        if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("managedFields");
        }
    };
    strip(&mut v);
    if let Some(items) = v.get_mut("items").and_then(Value::as_array_mut) {
        items.iter_mut().for_each(strip);
    }
    v
}

/// JSON as kubectl prints it: four-space indentation, without managedFields.
pub fn json(v: &Value) -> String {
    let v = &without_managed_fields(v);
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, serde_json::ser::PrettyFormatter::with_indent(b"    "));
    match v.serialize(&mut ser) {
        Ok(()) => String::from_utf8_lossy(&buf).into_owned() + "\n",
        Err(_) => v.to_string() + "\n",
    }
}

pub fn yaml(v: &Value) -> anyhow::Result<String> {
    let mut s = serde_saphyr::to_string(&without_managed_fields(v)).map_err(|e| anyhow::anyhow!("cannot write YAML: {e}"))?;
    if !s.ends_with('\n') {
        s.push('\n');
    }
    Ok(s)
}

/// `-o name`: `deployment.apps/web`.
pub fn name(res: &ResourceInfo, obj: &Value) -> String {
    resource::object_ref(res, obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""))
}

/// Several objects as kubectl's `List`.
pub fn list(items: Vec<Value>) -> Value {
    serde_json::json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn columns_align_like_kubectl_with_the_last_column_unpadded() {
        let t = TextTable {
            header: vec!["NAME".into(), "READY".into(), "AGE".into()],
            rows: vec![vec!["web-0".into(), "1/1".into(), "5s".into()]],
        };
        assert_eq!(render(&t), "NAME    READY   AGE\nweb-0   1/1     5s\n");
    }

    #[test]
    fn wide_columns_show_only_with_wide_and_namespaces_come_first() {
        let table = json!({"columnDefinitions": [{"name": "Name", "priority": 0}, {"name": "IP", "priority": 1}],
            "rows": [{"cells": ["a", "10.0.0.1"], "object": {"metadata": {"namespace": "ns1"}}}]});
        let narrow = text_table(&table, TableOptions::default());
        assert_eq!(narrow.header, vec!["NAME"]);
        let wide = text_table(&table, TableOptions { wide: true, with_namespace: true });
        assert_eq!(wide.header, vec!["NAMESPACE", "NAME", "IP"]);
        assert_eq!(wide.rows[0], vec!["ns1", "a", "10.0.0.1"]);
    }
}
