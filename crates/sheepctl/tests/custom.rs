//! sheepctl on custom resources: a kind a CustomResourceDefinition adds resolves by its names and
//! works with get (printer columns), describe, apply and delete, as built-in kinds do.

mod common;

use common::Shepherd;
use serde_json::json;

fn with_widgets() -> Shepherd {
    let s = Shepherd::server();
    s.ok("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", Some(json!({
        "metadata": {"name": "widgets.tools.example.com"},
        "spec": {"group": "tools.example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}}}}},
                "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]}]},
    })));
    s
}

#[test]
fn a_custom_kind_is_applied_listed_described_and_deleted_by_its_names() {
    let s = with_widgets();
    let manifest = "apiVersion: tools.example.com/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 3\n";
    let applied = s.sheepctl_stdin(&["apply", "-f", "-"], manifest);
    assert!(applied.ok().contains("widget.tools.example.com/w1 created"), "{}", applied.ok());

    let out = s.sheepctl(&["get", "wd"]).ok().to_string();
    let header: Vec<&str> = out.lines().next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, ["NAME", "SIZE"], "{out}");
    assert!(out.lines().nth(1).is_some_and(|l| l.split_whitespace().collect::<Vec<_>>() == ["w1", "3"]), "{out}");
    let described = s.sheepctl(&["describe", "widgets.tools.example.com", "w1"]).ok().to_string();
    assert!(described.contains("Name:") && described.contains("size:  3"), "{described}");

    let deleted = s.sheepctl(&["delete", "widget/w1"]).ok().to_string();
    assert!(deleted.contains("\"w1\" deleted"), "{deleted}");
    let (code, _) = s.api("GET", "/apis/tools.example.com/v1/namespaces/default/widgets/w1", None);
    assert_eq!(code, 404);
}
