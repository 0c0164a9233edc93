//! `sheepctl get`: tables printed by the server, `-o json|yaml|name|wide`, and `-w`.

use anyhow::bail;
use futures::{AsyncBufReadExt, StreamExt};
use serde_json::Value;
use shepherd_api::kinds::ResourceInfo;

use crate::connection::{Cluster, TABLE_ACCEPT};
use crate::printer::{self, TableOptions};
use crate::resource;

/// Output forms of `-o`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Json,
    Yaml,
    Name,
    Wide,
}

pub struct GetArgs {
    pub resource: Vec<String>,
    pub output: Option<Output>,
    pub selector: Option<String>,
    pub field_selector: Option<String>,
    pub all_namespaces: bool,
    pub watch: bool,
}

/// Runs `get`; returns false when some named object could not be read (already reported).
pub async fn run(cluster: &Cluster, args: &GetArgs) -> anyhow::Result<bool> {
    let sel = resource::selection(&args.resource)?;
    let names = &sel.names;
    if args.all_namespaces && !names.is_empty() {
        bail!("a resource cannot be retrieved by name across all namespaces");
    }
    let ns = if args.all_namespaces { None } else { Some(cluster.namespace.as_str()) };
    let query = resource::query(&[("labelSelector", args.selector.clone()), ("fieldSelector", args.field_selector.clone())]);
    if args.watch {
        let [res] = sel.kinds.as_slice() else { bail!("you may only specify a single resource type to watch") };
        let opts = TableOptions { wide: args.output == Some(Output::Wide), with_namespace: args.all_namespaces && res.namespaced };
        return watch(cluster, res, ns, names, &query, opts, args.output).await.map(|()| true);
    }
    let mut ok = true;
    match args.output {
        None | Some(Output::Wide) => {
            let mut printed = false;
            for res in &sel.kinds {
                let opts = TableOptions { wide: args.output == Some(Output::Wide), with_namespace: args.all_namespaces && res.namespaced };
                let mut tables = Vec::new();
                if names.is_empty() {
                    tables.push(cluster.get_table(&format!("{}{query}", resource::collection_path(res, ns))).await?);
                } else {
                    for name in names {
                        match cluster.get_table(&resource::object_path(res, &cluster.namespace, name)).await {
                            Ok(t) => tables.push(t),
                            Err(e) => {
                                eprintln!("Error: {e}");
                                ok = false;
                            }
                        }
                    }
                }
                let Some(first) = tables.first() else { continue };
                let mut text = printer::text_table(first, opts);
                for t in &tables[1..] {
                    text.rows.extend(printer::text_table(t, opts).rows);
                }
                if text.rows.is_empty() {
                    continue;
                }
                if sel.show_kind {
                    name_rows_by_kind(&mut text, res);
                }
                // kubectl separates the tables of several kinds by an empty line.
                if printed {
                    println!();
                }
                print!("{}", printer::render(&text));
                printed = true;
            }
            if !printed && names.is_empty() {
                let namespaced = sel.kinds.iter().find(|r| r.namespaced).unwrap_or(&sel.kinds[0]);
                eprintln!("{}", no_resources(namespaced, ns));
            }
        }
        Some(form) => {
            let mut items = Vec::new();
            let single = names.len() == 1 && sel.kinds.len() == 1;
            for res in &sel.kinds {
                if names.is_empty() {
                    let list = cluster.get(&format!("{}{query}", resource::collection_path(res, ns))).await?;
                    for mut item in list["items"].as_array().cloned().unwrap_or_default() {
                        fill_type(&mut item, res);
                        items.push((*res, item));
                    }
                } else {
                    for name in names {
                        match cluster.get(&resource::object_path(res, &cluster.namespace, name)).await {
                            Ok(v) => items.push((*res, v)),
                            Err(e) => {
                                eprintln!("Error: {e}");
                                ok = false;
                            }
                        }
                    }
                }
            }
            match form {
                Output::Name => items.iter().for_each(|(res, o)| println!("{}", printer::name(res, o))),
                Output::Json | Output::Yaml => {
                    let mut objects: Vec<Value> = items.into_iter().map(|(_, o)| o).collect();
                    let value = if single && objects.len() == 1 {
                        objects.remove(0)
                    } else if single {
                        return Ok(ok);
                    } else {
                        printer::list(objects)
                    };
                    if form == Output::Json {
                        print!("{}", printer::json(&value));
                    } else {
                        print!("{}", printer::yaml(&value)?);
                    }
                }
                Output::Wide => unreachable!("handled with the tables"),
            }
        }
    }
    Ok(ok)
}

/// `pod/web-0` instead of `web-0` in the NAME column, so rows of several kinds tell apart.
fn name_rows_by_kind(text: &mut printer::TextTable, res: &ResourceInfo) {
    let Some(col) = text.header.iter().position(|h| h == "NAME") else { return };
    for row in &mut text.rows {
        if let Some(cell) = row.get_mut(col) {
            *cell = resource::object_ref(res, cell);
        }
    }
}

/// Items of a list carry no kind on the wire; kubectl fills it in for `-o json|yaml`.
fn fill_type(item: &mut Value, res: &ResourceInfo) {
    if let Some(obj) = item.as_object_mut() {
        obj.entry("apiVersion").or_insert_with(|| Value::String(res.api_version()));
        obj.entry("kind").or_insert_with(|| Value::String(res.kind.to_string()));
    }
}

pub fn no_resources(res: &ResourceInfo, ns: Option<&str>) -> String {
    match ns {
        Some(ns) if res.namespaced => format!("No resources found in {ns} namespace."),
        _ => "No resources found".to_string(),
    }
}

/// Prints the current rows, then a row for every change, until the server ends the watch.
async fn watch(
    cluster: &Cluster,
    res: &ResourceInfo,
    ns: Option<&str>,
    names: &[String],
    query: &str,
    opts: TableOptions,
    output: Option<Output>,
) -> anyhow::Result<()> {
    let mut selector_query = query.to_string();
    if let [name] = names {
        let field = format!("metadata.name={name}");
        selector_query = if selector_query.is_empty() { format!("?fieldSelector={}", resource::encode(&field)) }
            else { format!("{selector_query}&fieldSelector={}", resource::encode(&field)) };
    } else if names.len() > 1 {
        bail!("watch is only supported on individual resources and resource collections, but {} resources were found", names.len());
    }
    let base = resource::collection_path(res, ns);
    let table = cluster.get_table(&format!("{base}{selector_query}")).await?;
    let rv = table.pointer("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or("0").to_string();
    let text = printer::text_table(&table, opts);
    let mut widths = printer::widths(&text);
    let mut header_printed = false;
    let use_table = matches!(output, None | Some(Output::Wide));
    if use_table && !text.rows.is_empty() {
        print!("{}", printer::render(&text));
        header_printed = true;
    }
    let sep = if selector_query.is_empty() { '?' } else { '&' };
    let watch_path = format!("{base}{selector_query}{sep}watch=true&resourceVersion={}", resource::encode(&rv));
    let accept = if use_table { TABLE_ACCEPT } else { "application/json" };
    let stream = cluster.stream(&watch_path, accept).await?;
    let mut lines = stream.lines();
    use std::io::Write;
    while let Some(line) = lines.next().await {
        let line = line.map_err(|e| anyhow::anyhow!("the watch stream from {} broke: {e}", cluster.server))?;
        if line.trim().is_empty() {
            continue;
        }
        let event: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => continue,
        };
        match event["type"].as_str().unwrap_or("") {
            "ADDED" | "MODIFIED" | "DELETED" => {}
            "ERROR" => bail!("{}", event.pointer("/object/message").and_then(Value::as_str).unwrap_or("the watch ended with an error")),
            _ => continue,
        }
        let object = &event["object"];
        if use_table {
            let t = printer::text_table(object, opts);
            for (w, new) in widths.iter_mut().zip(printer::widths(&t)) {
                *w = (*w).max(new);
            }
            if !header_printed {
                println!("{}", printer::line(&t.header, &widths));
                header_printed = true;
            }
            for row in &t.rows {
                println!("{}", printer::line(row, &widths));
            }
        } else {
            let mut o = object.clone();
            fill_type(&mut o, res);
            match output {
                Some(Output::Name) => println!("{}", printer::name(res, &o)),
                Some(Output::Yaml) => print!("---\n{}", printer::yaml(&o)?),
                _ => print!("{}", printer::json(&o)),
            }
        }
        let _ = std::io::stdout().flush();
    }
    Ok(())
}
