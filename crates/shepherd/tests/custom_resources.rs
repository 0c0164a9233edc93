//! Custom resources across a restart of the real binary: the definitions in the store are served
//! again at start, with their objects.

mod common;

use common::Daemon;
use serde_json::{Value, json};

fn call(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut req = reqwest::Client::new().request(method, url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("request");
        let code = resp.status().as_u16();
        (code, resp.json::<Value>().await.unwrap_or(Value::Null))
    })
}

#[test]
fn a_definition_and_its_objects_are_served_again_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "gadgets.restart.example.com"},
        "spec": {"group": "restart.example.com", "scope": "Namespaced",
            "names": {"plural": "gadgets", "kind": "Gadget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer", "default": 5}}}}}}}]},
    });
    let gadgets = "/apis/restart.example.com/v1/namespaces/default/gadgets";
    let mut daemon = Daemon::start("server", &data, &[]);
    let (code, body) = call(reqwest::Method::POST, &format!("{}/apis/apiextensions.k8s.io/v1/customresourcedefinitions", daemon.url), Some(crd));
    assert_eq!(code, 201, "{body}");
    let gadget = json!({"apiVersion": "restart.example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}, "spec": {}});
    let (code, body) = call(reqwest::Method::POST, &format!("{}{gadgets}", daemon.url), Some(gadget));
    assert_eq!(code, 201, "{body}");
    assert!(daemon.terminate().success());

    let daemon = Daemon::start("server", &data, &[]);
    let (code, body) = call(reqwest::Method::GET, &format!("{}{gadgets}/g", daemon.url), None);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["spec"]["size"], 5);
    let bad = json!({"apiVersion": "restart.example.com/v1", "kind": "Gadget", "metadata": {"name": "h"}, "spec": {"size": "x"}});
    let (code, body) = call(reqwest::Method::POST, &format!("{}{gadgets}", daemon.url), Some(bad));
    assert_eq!(code, 422, "the schema is enforced after the restart too: {body}");
}
