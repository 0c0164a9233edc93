//! Turning what a user typed (`deploy`, `deployment/web`) into resources and REST paths.

use anyhow::bail;
use shepherd_api::kinds::{self, ResourceInfo};

/// Resolves a resource name the way kubectl does: plural, singular, short name or kind.
pub fn resolve(typed: &str) -> anyhow::Result<&'static ResourceInfo> {
    match kinds::resolve(typed) {
        Some(r) => Ok(r),
        None => bail!("the server doesn't have a resource type \"{typed}\""),
    }
}

/// Splits `KIND NAME...` or `KIND/NAME ...` arguments into one resource and its names.
pub fn kind_and_names(args: &[String]) -> anyhow::Result<(&'static ResourceInfo, Vec<String>)> {
    let Some(first) = args.first() else {
        bail!("you must specify the type of resource, for example: sheepctl get pods");
    };
    if first.contains('/') {
        let mut kind = None;
        let mut names = Vec::new();
        for arg in args {
            let Some((k, name)) = arg.split_once('/') else {
                bail!("there is no need to specify a resource type as a separate argument when passing arguments in resource/name form (got {arg:?})");
            };
            let res = resolve(k)?;
            if kind.is_some_and(|prev: &ResourceInfo| prev.kind != res.kind) {
                bail!("all resources must be of one kind here (got {} and {})", kind.map(|k| k.kind).unwrap_or(""), res.kind);
            }
            if name.is_empty() {
                bail!("{arg:?} names no object: write {k}/NAME");
            }
            kind = Some(res);
            names.push(name.to_string());
        }
        let res = kind.ok_or_else(|| anyhow::anyhow!("no resource given"))?;
        return Ok((res, names));
    }
    Ok((resolve(first)?, args[1..].to_vec()))
}

/// What `get` was asked for: one or more kinds and the names to read of each.
pub struct Selection {
    pub kinds: Vec<&'static ResourceInfo>,
    pub names: Vec<String>,
    /// Several kinds or a category (`all`) were asked for: rows are named `kind/name`, as kubectl does.
    pub show_kind: bool,
}

/// Reads `KIND[,KIND...] [NAME...]` (a kind may be a category such as `all`) or `KIND/NAME...`.
pub fn selection(args: &[String]) -> anyhow::Result<Selection> {
    let first = args.first().map(String::as_str).unwrap_or("");
    if first.contains('/') || (!first.contains(',') && kinds::resolve(first).is_some()) {
        let (res, names) = kind_and_names(args)?;
        return Ok(Selection { kinds: vec![res], names, show_kind: false });
    }
    let mut selected: Vec<&'static ResourceInfo> = Vec::new();
    for typed in first.split(',').filter(|t| !t.is_empty()) {
        let members: Vec<&'static ResourceInfo> = match kinds::resolve(typed) {
            Some(r) => vec![r],
            None => kinds::in_category(&typed.to_ascii_lowercase()).collect(),
        };
        if members.is_empty() {
            resolve(typed)?;
        }
        for r in members {
            if !selected.iter().any(|s| std::ptr::eq(*s, r)) {
                selected.push(r);
            }
        }
    }
    if selected.is_empty() {
        bail!("you must specify the type of resource, for example: sheepctl get pods");
    }
    Ok(Selection { kinds: selected, names: args[1..].to_vec(), show_kind: true })
}

/// `deployment.apps` or `pod`: how kubectl prefixes an object's name in messages.
pub fn type_name(res: &ResourceInfo) -> String {
    if res.group.is_empty() { res.singular.to_string() } else { format!("{}.{}", res.singular, res.group) }
}

/// `deployment.apps/web`.
pub fn object_ref(res: &ResourceInfo, name: &str) -> String {
    format!("{}/{}", type_name(res), name)
}

/// The collection path: `/apis/apps/v1/namespaces/default/deployments`, or across all
/// namespaces when `namespace` is `None`.
pub fn collection_path(res: &ResourceInfo, namespace: Option<&str>) -> String {
    let base = if res.group.is_empty() {
        format!("/api/{}", res.version)
    } else {
        format!("/apis/{}/{}", res.group, res.version)
    };
    match (res.namespaced, namespace) {
        (true, Some(ns)) => format!("{base}/namespaces/{}/{}", encode(ns), res.plural),
        _ => format!("{base}/{}", res.plural),
    }
}

/// The path of one object.
pub fn object_path(res: &ResourceInfo, namespace: &str, name: &str) -> String {
    format!("{}/{}", collection_path(res, Some(namespace)), encode(name))
}

/// Percent-encodes a path segment or query value.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Builds `?a=b&c=d` from the pairs whose value is present.
pub fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> =
        pairs.iter().filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v)))).collect();
    if parts.is_empty() { String::new() } else { format!("?{}", parts.join("&")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds_of(typed: &str) -> Vec<&'static str> {
        selection(&[typed.to_string()]).map(|s| s.kinds.iter().map(|r| r.kind).collect()).unwrap_or_default()
    }

    #[test]
    fn comma_separated_kinds_and_categories_select_several_kinds_in_order() {
        assert_eq!(kinds_of("deploy,rs,pods"), ["Deployment", "ReplicaSet", "Pod"]);
        assert_eq!(kinds_of("all"), ["Pod", "Service", "Deployment", "ReplicaSet", "Job", "CronJob", "DaemonSet", "StatefulSet", "ReplicationController",
            "HorizontalPodAutoscaler"]);
        assert_eq!(kinds_of("all,nodes,po"), ["Pod", "Service", "Deployment", "ReplicaSet", "Job", "CronJob", "DaemonSet", "StatefulSet", "ReplicationController",
            "HorizontalPodAutoscaler", "Node"]);
        assert!(!selection(&["pods".to_string()]).unwrap().show_kind);
        assert!(selection(&["all".to_string()]).unwrap().show_kind);
        let err = selection(&["pods,widgets".to_string()]).err().unwrap().to_string();
        assert!(err.contains("\"widgets\""), "{err}");
    }
}
