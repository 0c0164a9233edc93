//! Discovery documents: what kubectl and client libraries read to learn which resources exist.

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

pub fn core_versions() -> Value {
    json!({"kind": "APIVersions", "apiVersion": "v1", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})
}

pub fn groups() -> Value {
    let groups: Vec<Value> = kinds::GROUPS
        .iter()
        .map(|g| {
            let gv = format!("{g}/v1");
            json!({"name": g, "versions": [{"groupVersion": gv, "version": "v1"}],
                "preferredVersion": {"groupVersion": gv, "version": "v1"}})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

pub fn group(name: &str) -> Option<Value> {
    let g = groups();
    g["groups"].as_array()?.iter().find(|v| v["name"] == name).map(|v| {
        let mut v = v.clone();
        v["kind"] = json!("APIGroup");
        v["apiVersion"] = json!("v1");
        v
    })
}

fn verbs(res: &ResourceInfo) -> Vec<&'static str> {
    vec!["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        .into_iter()
        .filter(|v| res.kind != "Namespace" || *v != "deletecollection")
        .collect()
}

/// `APIResourceList` for one group version (`""` is core).
pub fn resources(group: &str) -> Option<Value> {
    let members: Vec<&ResourceInfo> = kinds::ALL.iter().filter(|r| r.group == group).collect();
    if members.is_empty() {
        return None;
    }
    let mut list = Vec::new();
    for r in members {
        list.push(json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": verbs(r), "shortNames": r.short_names,
        }));
        if r.has_status {
            list.push(json!({"name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.has_scale {
            list.push(json!({"name": format!("{}/scale", r.plural), "singularName": "", "namespaced": r.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
        if r.kind == "Pod" {
            list.push(json!({"name": "pods/binding", "singularName": "", "namespaced": true, "kind": "Binding", "verbs": ["create"]}));
            list.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy",
                "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
            list.push(json!({"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]}));
        }
    }
    let gv = if group.is_empty() { "v1".to_string() } else { format!("{group}/v1") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}))
}
