//! `sheepctl label` and `sheepctl annotate`: `KEY=VALUE` sets, `KEY-` removes, via a merge patch.

use anyhow::bail;
use serde_json::{Map, Value, json};

use crate::connection::Cluster;
use crate::resource;

#[derive(Debug, Clone, Copy)]
pub enum Field {
    Labels,
    Annotations,
}

impl Field {
    fn key(self) -> &'static str {
        match self {
            Field::Labels => "labels",
            Field::Annotations => "annotations",
        }
    }
    fn done(self) -> &'static str {
        match self {
            Field::Labels => "labeled",
            Field::Annotations => "annotated",
        }
    }
}

/// A key to set (`Some(value)`) or remove (`None`).
type Change = (String, Option<String>);

/// Splits the arguments into the object (`KIND NAME` or `KIND/NAME`) and the changes.
fn parse(args: &[String]) -> anyhow::Result<(Vec<String>, Vec<Change>)> {
    let mut target = Vec::new();
    let mut changes = Vec::new();
    for a in args {
        if let Some((k, v)) = a.split_once('=') {
            if k.is_empty() {
                bail!("invalid change {a:?}: the key is empty");
            }
            changes.push((k.to_string(), Some(v.to_string())));
        } else if let Some(k) = a.strip_suffix('-').filter(|_| !target.is_empty()) {
            changes.push((k.to_string(), None));
        } else if changes.is_empty() {
            target.push(a.clone());
        } else {
            bail!("invalid change {a:?}: write KEY=VALUE to set or KEY- to remove");
        }
    }
    if changes.is_empty() {
        bail!("give at least one change: KEY=VALUE to set or KEY- to remove");
    }
    Ok((target, changes))
}

pub async fn run(cluster: &Cluster, field: Field, args: &[String], overwrite: bool) -> anyhow::Result<()> {
    let (target, changes) = parse(args)?;
    let (res, names) = resource::kind_and_names(&target)?;
    if names.is_empty() {
        bail!("name the object: sheepctl {} {} NAME KEY=VALUE", if matches!(field, Field::Labels) { "label" } else { "annotate" }, res.singular);
    }
    for name in &names {
        let path = resource::object_path(res, &cluster.namespace, name);
        let live = cluster.get(&path).await?;
        let current = live.pointer(&format!("/metadata/{}", field.key())).cloned().unwrap_or(json!({}));
        let mut patch = Map::new();
        for (k, v) in &changes {
            match v {
                Some(v) => {
                    if let Some(old) = current.get(k).and_then(Value::as_str)
                        && old != v
                        && !overwrite
                    {
                        bail!("'{k}' already has a value ({old}), and --overwrite is false");
                    }
                    patch.insert(k.clone(), json!(v));
                }
                None => {
                    patch.insert(k.clone(), Value::Null);
                }
            }
        }
        cluster.merge_patch(&path, &json!({"metadata": {field.key(): patch}})).await?;
        println!("{} {}", resource::object_ref(res, name), field.done());
    }
    Ok(())
}
