//! Discovery documents: what kubectl and client libraries read to learn which resources exist.
//!
//! Every document is derived from `kinds::ALL`, so a kind added there is discovered without a
//! change here: the legacy per-group documents (`/api`, `/apis`, `/apis/{group}`,
//! `/apis/{group}/{version}`) and the aggregated `APIGroupDiscoveryList` that kubectl 1.26+ asks
//! for first.

use serde_json::{Value, json};
use shepherd_api::kinds::{self, ResourceInfo};

pub const GIT_VERSION: &str = concat!("v1.33.0-shepherd.", env!("CARGO_PKG_VERSION"));

pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": GIT_VERSION,
        "gitCommit": "",
        "gitTreeState": "clean",
        "buildDate": "",
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

/// Every resource discovery lists: the stored kinds, the read-only metrics resources, and the
/// versions served by conversion.
fn discovered() -> Vec<&'static ResourceInfo> {
    let mut all = kinds::all();
    all.extend(kinds::METRICS.iter());
    all.extend(kinds::CONVERTED.iter());
    all
}

/// The served groups besides core, in discovery order.
fn group_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = Vec::new();
    for r in discovered().into_iter().filter(|r| !r.group.is_empty()) {
        if !names.contains(&r.group) {
            names.push(r.group);
        }
    }
    names
}

/// The versions a group serves (`""` is core), in discovery order; the first is preferred.
fn versions_of(group: &str) -> Vec<&'static str> {
    let mut versions: Vec<&'static str> = Vec::new();
    for r in discovered().into_iter().filter(|r| r.group == group) {
        if !versions.contains(&r.version) {
            versions.push(r.version);
        }
    }
    if !kinds::GROUPS.contains(&group) && !group.is_empty() {
        versions.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
    }
    versions
}

/// Kubernetes' order of versions (`v2` > `v1` > `v1beta2` > `v1beta1` > `v1alpha1` > others):
/// the first of a custom group's versions is its preferred one.
fn version_priority(v: &str) -> (u8, u64, u64) {
    let Some(rest) = v.strip_prefix('v') else { return (0, 0, 0) };
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    let Ok(major) = rest[..digits].parse::<u64>() else { return (0, 0, 0) };
    let tail = &rest[digits..];
    let (level, minor) = match tail {
        "" => (3, 0),
        t if t.starts_with("beta") => (2, t[4..].parse().unwrap_or(0)),
        t if t.starts_with("alpha") => (1, t[5..].parse().unwrap_or(0)),
        _ => return (0, 0, 0),
    };
    (level, major, minor)
}

/// Whether `group`/`version` is served (`""` is core); the router answers 404 otherwise.
pub fn serves(group: &str, version: &str) -> bool {
    discovered().into_iter().any(|r| r.group == group && r.version == version)
}

pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "apiVersion": "v1", "versions": versions_of(""),
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})
}

fn group_entry(name: &str) -> Value {
    let gv = |v: &str| json!({"groupVersion": format!("{name}/{v}"), "version": v});
    let versions: Vec<Value> = versions_of(name).into_iter().map(gv).collect();
    json!({"name": name, "preferredVersion": versions.first().cloned().unwrap_or(Value::Null), "versions": versions})
}

pub fn groups() -> Value {
    let groups: Vec<Value> = group_names().into_iter().map(group_entry).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(name: &str) -> Option<Value> {
    if name.is_empty() || !group_names().contains(&name) {
        return None;
    }
    let mut g = group_entry(name);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

fn verbs(res: &ResourceInfo) -> Vec<&'static str> {
    if kinds::is_review(res) {
        return vec!["create"];
    }
    if kinds::METRICS.contains(res) {
        return vec!["get", "list"];
    }
    ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        .into_iter()
        .filter(|v| res.kind != "Namespace" || *v != "deletecollection")
        .collect()
}

/// One subresource as discovery lists it.
struct Subresource {
    name: &'static str,
    /// Group, version and kind of what the subresource answers.
    response: (&'static str, &'static str, &'static str),
    verbs: &'static [&'static str],
}

fn subresources(res: &ResourceInfo) -> Vec<Subresource> {
    let mut subs = Vec::new();
    if res.has_status {
        subs.push(Subresource { name: "status", response: (res.group, res.version, res.kind), verbs: &["get", "patch", "update"] });
    }
    if res.has_scale {
        subs.push(Subresource { name: "scale", response: ("autoscaling", "v1", "Scale"), verbs: &["get", "patch", "update"] });
    }
    if res.kind == "CertificateSigningRequest" {
        subs.push(Subresource { name: "approval", response: (res.group, res.version, res.kind), verbs: &["get", "patch", "update"] });
    }
    if res.kind == "ServiceAccount" {
        subs.push(Subresource { name: "token", response: ("authentication.k8s.io", "v1", "TokenRequest"), verbs: &["create"] });
    }
    if res.kind == "Pod" {
        subs.push(Subresource { name: "binding", response: ("", "v1", "Binding"), verbs: &["create"] });
        subs.push(Subresource { name: "eviction", response: ("policy", "v1", "Eviction"), verbs: &["create"] });
        subs.push(Subresource { name: "log", response: ("", "v1", "Pod"), verbs: &["get"] });
        subs.push(Subresource { name: "exec", response: ("", "v1", "PodExecOptions"), verbs: &["create", "get"] });
        subs.push(Subresource { name: "attach", response: ("", "v1", "PodAttachOptions"), verbs: &["create", "get"] });
        subs.push(Subresource { name: "portforward", response: ("", "v1", "PodPortForwardOptions"), verbs: &["create", "get"] });
    }
    subs
}

/// Whether `res` has a subresource called `name` (`status`, `scale`, `log`...).
pub fn has_subresource(res: &ResourceInfo, name: &str) -> bool {
    subresources(res).iter().any(|s| s.name == name)
}

fn members(group: &str, version: &str) -> impl Iterator<Item = &'static ResourceInfo> {
    let (group, version) = (group.to_string(), version.to_string());
    discovered().into_iter().filter(move |r| r.group == group && r.version == version)
}

/// `APIResourceList` for one group version (`""` is core).
pub fn resources(group: &str, version: &str) -> Option<Value> {
    if !serves(group, version) {
        return None;
    }
    let mut list = Vec::new();
    for r in members(group, version) {
        let mut entry = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": verbs(r),
        });
        if !r.short_names.is_empty() {
            entry["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            entry["categories"] = json!(r.categories);
        }
        list.push(entry);
        for sub in subresources(r) {
            let (g, v, kind) = sub.response;
            let mut entry = json!({"name": format!("{}/{}", r.plural, sub.name), "singularName": "",
                "namespaced": r.namespaced, "kind": kind, "verbs": sub.verbs});
            if (g, v) != (r.group, r.version) {
                entry["group"] = json!(g);
                entry["version"] = json!(v);
            }
            list.push(entry);
        }
    }
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}))
}

/// The aggregated discovery versions Shepherd answers (`apidiscovery.k8s.io/<version>`).
pub const AGGREGATED_VERSIONS: &[&str] = &["v2", "v2beta1"];

/// The `Content-Type` of an aggregated discovery document.
pub fn aggregated_content_type(version: &str) -> String {
    format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList")
}

/// Picks the document an `Accept` header asks for at `/api` or `/apis`: `Some(version)` for
/// aggregated discovery, `None` for the legacy document. Media ranges are tried in order, as
/// clients list their preferences first.
pub fn negotiate(accept: &str) -> Option<&'static str> {
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or("");
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).map(|(k, v)| (k.trim(), v.trim())).collect();
        let param = |key: &str| params.iter().find(|(k, _)| *k == key).map(|(_, v)| *v);
        if param("as") == Some("APIGroupDiscoveryList") {
            let ours = media == "application/json" && param("g") == Some("apidiscovery.k8s.io");
            if let Some(v) = AGGREGATED_VERSIONS.iter().find(|v| ours && param("v") == Some(**v)) {
                return Some(v);
            }
            continue;
        }
        if matches!(media, "application/json" | "*/*" | "application/*") {
            return None;
        }
    }
    None
}

fn aggregated_resource(r: &ResourceInfo) -> Value {
    let kind = |(group, version, kind): (&str, &str, &str)| json!({"group": group, "version": version, "kind": kind});
    let subs: Vec<Value> = subresources(r)
        .into_iter()
        .map(|s| json!({"subresource": s.name, "responseKind": kind(s.response), "verbs": s.verbs}))
        .collect();
    let mut entry = json!({
        "resource": r.plural,
        "responseKind": kind((r.group, r.version, r.kind)),
        "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
        "singularResource": r.singular,
        "verbs": verbs(r),
    });
    if !r.short_names.is_empty() {
        entry["shortNames"] = json!(r.short_names);
    }
    if !r.categories.is_empty() {
        entry["categories"] = json!(r.categories);
    }
    if !subs.is_empty() {
        entry["subresources"] = json!(subs);
    }
    entry
}

fn aggregated_group(name: &str) -> Value {
    let versions: Vec<Value> = versions_of(name)
        .into_iter()
        .map(|v| {
            let resources: Vec<Value> = members(name, v).map(aggregated_resource).collect();
            json!({"version": v, "resources": resources, "freshness": "Current"})
        })
        .collect();
    let metadata = if name.is_empty() { json!({"creationTimestamp": null}) } else { json!({"name": name, "creationTimestamp": null}) };
    json!({"metadata": metadata, "versions": versions})
}

/// The aggregated `APIGroupDiscoveryList` of `/api` (`core`) or `/apis` (every other group).
pub fn aggregated(core: bool, version: &str) -> Value {
    let items: Vec<Value> = if core { vec![aggregated_group("")] } else { group_names().into_iter().map(aggregated_group).collect() };
    json!({"kind": "APIGroupDiscoveryList", "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {}, "items": items})
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECTL_1_33: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,\
        application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

    #[test]
    fn the_first_aggregated_type_a_client_lists_is_served_and_plain_json_gets_the_legacy_document() {
        assert_eq!(negotiate(KUBECTL_1_33), Some("v2"));
        assert_eq!(negotiate("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"), Some("v2beta1"));
        assert_eq!(negotiate("application/json;g=apidiscovery.k8s.io;v=v9;as=APIGroupDiscoveryList,application/json"), None);
        assert_eq!(negotiate("application/json"), None);
        assert_eq!(negotiate(""), None);
        assert_eq!(negotiate("application/json, application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"), None);
    }

    #[test]
    fn every_served_kind_appears_in_the_aggregated_documents_with_its_subresources() {
        let core = aggregated(true, "v2");
        let groups = aggregated(false, "v2");
        let all: Vec<&Value> = [&core, &groups]
            .into_iter()
            .flat_map(|l| l["items"].as_array().into_iter().flatten())
            .flat_map(|g| g["versions"].as_array().into_iter().flatten())
            .flat_map(|v| v["resources"].as_array().into_iter().flatten())
            .collect();
        for r in kinds::ALL {
            assert!(all.iter().any(|e| e["resource"] == r.plural && e["responseKind"]["kind"] == r.kind), "{}", r.plural);
        }
        let deploy = all.iter().find(|e| e["resource"] == "deployments").unwrap();
        assert_eq!(deploy["shortNames"], json!(["deploy"]));
        assert_eq!(deploy["categories"], json!(["all"]));
        assert_eq!(deploy["scope"], "Namespaced");
        let scale = deploy["subresources"].as_array().unwrap().iter().find(|s| s["subresource"] == "scale").unwrap();
        assert_eq!(scale["responseKind"], json!({"group": "autoscaling", "version": "v1", "kind": "Scale"}));
    }

    #[test]
    fn legacy_documents_list_categories_and_refuse_unknown_groups_and_versions() {
        let core = resources("", "v1").unwrap();
        let pods = core["resources"].as_array().unwrap().iter().find(|r| r["name"] == "pods").unwrap();
        assert_eq!(pods["categories"], json!(["all"]));
        assert!(resources("", "v2").is_none());
        assert!(resources("widgets.example.com", "v1").is_none());
        assert!(group("widgets.example.com").is_none());
        assert_eq!(group("apps").unwrap()["preferredVersion"]["groupVersion"], "apps/v1");
    }
}
