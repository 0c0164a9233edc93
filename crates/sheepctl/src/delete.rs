//! `sheepctl delete`: by kind and names or by manifest, with a cascade policy and `--wait`.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::Value;
use shepherd_api::kinds::ResourceInfo;

use crate::connection::Cluster;
use crate::{manifest, resource};

/// `--cascade`: what happens to the objects the deleted one owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Cascade {
    /// Delete the object now; the garbage collector deletes its dependents afterwards.
    Background,
    /// Delete the dependents first; the object goes last.
    Foreground,
    /// Keep the dependents, without an owner.
    Orphan,
}

impl Cascade {
    fn policy(self) -> &'static str {
        match self {
            Cascade::Background => "Background",
            Cascade::Foreground => "Foreground",
            Cascade::Orphan => "Orphan",
        }
    }
}

pub struct DeleteArgs {
    pub resource: Vec<String>,
    pub files: Vec<String>,
    pub cascade: Cascade,
    pub wait: bool,
    pub timeout: Duration,
    pub ignore_not_found: bool,
}

pub async fn run(cluster: &Cluster, args: &DeleteArgs) -> anyhow::Result<bool> {
    let mut targets: Vec<(&'static ResourceInfo, String, String)> = Vec::new();
    if !args.files.is_empty() {
        if !args.resource.is_empty() {
            bail!("name the objects either with -f or as KIND NAME, not both");
        }
        for m in manifest::load(&args.files)? {
            targets.push((m.res, m.namespace(&cluster.namespace).to_string(), m.name().to_string()));
        }
    } else {
        let (res, names) = resource::kind_and_names(&args.resource)?;
        if names.is_empty() {
            bail!("resource(s) were provided, but no name was specified: sheepctl delete {} NAME", res.singular);
        }
        targets.extend(names.into_iter().map(|n| (res, cluster.namespace.clone(), n)));
    }
    let mut ok = true;
    let mut pending = Vec::new();
    for (res, ns, name) in targets {
        let path = resource::object_path(res, &ns, &name);
        let query = resource::query(&[("propagationPolicy", Some(args.cascade.policy().to_string()))]);
        match cluster.delete(&format!("{path}{query}")).await {
            Ok(_) => {
                println!("{} \"{name}\" deleted", resource::type_name(res));
                pending.push((res, path, name));
            }
            Err(e) if e.is_not_found() && args.ignore_not_found => {}
            Err(e) => {
                eprintln!("Error: {e}");
                ok = false;
            }
        }
    }
    if args.wait {
        let deadline = Instant::now() + args.timeout;
        for (res, path, name) in pending {
            wait_gone(cluster, res, &path, &name, deadline).await?;
        }
    }
    Ok(ok)
}

/// Polls until the object is gone (finalizers done); deletion is rare enough that polling the
/// one object is cheaper than a watch connection.
async fn wait_gone(cluster: &Cluster, res: &ResourceInfo, path: &str, name: &str, deadline: Instant) -> anyhow::Result<()> {
    loop {
        match cluster.get(path).await {
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e.into()),
            Ok(obj) => {
                if Instant::now() >= deadline {
                    let finalizers = obj.pointer("/metadata/finalizers").and_then(Value::as_array).map(|f| {
                        f.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(", ")
                    }).unwrap_or_default();
                    bail!("timed out waiting for {} \"{name}\" to be deleted (finalizers: {})", resource::type_name(res),
                        if finalizers.is_empty() { "none" } else { &finalizers });
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
