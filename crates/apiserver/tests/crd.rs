//! CustomResourceDefinitions over a real socket: a definition makes its resource served, objects
//! are validated, defaulted and pruned by its schema, and deleting it deletes its objects.
//!
//! The served custom resources are process-wide, so each test uses a group of its own.

mod common;

use std::time::{Duration, Instant};

use common::{MERGE, STRATEGIC, Server, start};
use reqwest::StatusCode;
use serde_json::{Value, json};

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

fn widget_crd(group: &str) -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("widgets.{group}")},
        "spec": {
            "group": group, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "required": ["size"], "properties": {
                        "size": {"type": "integer", "minimum": 1, "maximum": 10},
                        "colour": {"type": "string", "enum": ["red", "blue"], "default": "red"},
                        "replicas": {"type": "integer"},
                    }},
                    "status": {"type": "object", "properties": {"replicas": {"type": "integer"}, "selector": {"type": "string"}}},
                }}},
                "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                    "statusReplicasPath": ".status.replicas", "labelSelectorPath": ".status.selector"}},
                "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                    {"name": "Colour", "type": "string", "jsonPath": ".spec.colour", "priority": 1}],
            }],
        },
    })
}

fn widgets(group: &str) -> String {
    format!("/apis/{group}/v1/namespaces/default/widgets")
}

fn widget(name: &str, group: &str, spec: Value) -> Value {
    json!({"apiVersion": format!("{group}/v1"), "kind": "Widget", "metadata": {"name": name}, "spec": spec})
}

/// Polls until `check` holds, failing after a generous deadline.
async fn eventually<F: Fn(&Value) -> bool>(s: &Server, path: &str, what: &str, check: F) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = s.get(path).await;
        if check(&r.body) || (r.code == StatusCode::NOT_FOUND && check(&Value::Null)) {
            return r.body;
        }
        assert!(Instant::now() < deadline, "{what}: last answer {} {}", r.code, r.body);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_created_definition_is_established_and_its_resource_served_at_once() {
    let s = start().await;
    let group = "established.example.com";
    let r = s.post(CRDS, &widget_crd(group)).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    let conditions = r.body["status"]["conditions"].as_array().expect("conditions").clone();
    for t in ["NamesAccepted", "Established"] {
        assert!(conditions.iter().any(|c| c["type"] == t && c["status"] == "True"), "{t}: {conditions:?}");
    }
    assert_eq!(r.body["status"]["storedVersions"], json!(["v1"]));
    assert_eq!(r.body["metadata"]["finalizers"], json!(["customresourcecleanup.apiextensions.k8s.io"]));

    let list = s.get(&widgets(group)).await;
    assert_eq!(list.code, StatusCode::OK, "{}", list.body);
    assert_eq!(list.body["kind"], "WidgetList");
    let created = s.post(&widgets(group), &widget("w1", group, json!({"size": 3}))).await;
    assert_eq!(created.code, StatusCode::CREATED, "{}", created.body);

    let discovered = s.get(&format!("/apis/{group}/v1")).await;
    let entry = discovered.body["resources"].as_array().expect("resources").iter().find(|e| e["name"] == "widgets").cloned();
    assert_eq!(entry.as_ref().map(|e| e["shortNames"].clone()), Some(json!(["wd"])), "{}", discovered.body);
    let groups = s.get("/apis").await;
    assert!(groups.body["groups"].as_array().expect("groups").iter().any(|g| g["name"] == group));
}

#[tokio::test]
async fn a_non_structural_schema_is_refused_naming_the_field() {
    let s = start().await;
    let mut crd = widget_crd("structural.example.com");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        .as_object_mut()
        .expect("spec schema")
        .remove("type");
    let r = s.post(CRDS, &crd).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    let message = r.body["message"].as_str().unwrap_or("");
    assert!(
        message.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"),
        "{message}"
    );
    assert_eq!(s.get(&format!("{CRDS}/widgets.structural.example.com")).await.code, StatusCode::NOT_FOUND);
    assert_eq!(s.get(&widgets("structural.example.com")).await.code, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn objects_are_validated_defaulted_and_pruned_by_the_schema() {
    let s = start().await;
    let group = "schema.example.com";
    assert_eq!(s.post(CRDS, &widget_crd(group)).await.code, StatusCode::CREATED);

    let bad = s.post(&widgets(group), &widget("big", group, json!({"size": 11}))).await;
    assert_eq!(bad.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.body);
    assert_eq!(bad.body["details"]["causes"][0]["field"], "spec.size", "{}", bad.body);
    assert!(bad.body["message"].as_str().unwrap_or("").starts_with("Widget.schema.example.com \"big\" is invalid"), "{}", bad.body);

    let missing = s.post(&widgets(group), &widget("none", group, json!({}))).await;
    assert_eq!(missing.code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(missing.body["details"]["causes"][0]["reason"], "FieldValueRequired");

    let strict = format!("{}?fieldValidation=Strict", widgets(group));
    let refused = s.post(&strict, &widget("strict", group, json!({"size": 2, "shape": "round"}))).await;
    assert_eq!(refused.code, StatusCode::BAD_REQUEST, "{}", refused.body);
    assert!(refused.body["message"].as_str().unwrap_or("").contains("unknown field \"spec.shape\""), "{}", refused.body);

    let ok = s.post(&widgets(group), &widget("w1", group, json!({"size": 2, "shape": "round"}))).await;
    assert_eq!(ok.code, StatusCode::CREATED, "{}", ok.body);
    let stored = s.get(&format!("{}/w1", widgets(group))).await.body;
    assert_eq!(stored["spec"], json!({"size": 2, "colour": "red"}));
}

#[tokio::test]
async fn the_status_and_scale_subresources_follow_the_definition() {
    let s = start().await;
    let group = "subresources.example.com";
    assert_eq!(s.post(CRDS, &widget_crd(group)).await.code, StatusCode::CREATED);
    let path = format!("{}/w1", widgets(group));
    let mut w = widget("w1", group, json!({"size": 2, "replicas": 1}));
    w["status"] = json!({"replicas": 7});
    let created = s.post(&widgets(group), &w).await;
    assert_eq!(created.code, StatusCode::CREATED, "{}", created.body);
    assert_eq!(created.body.get("status"), None, "a create does not set the status");

    let status = json!({"status": {"replicas": 1, "selector": "app=w1"}, "spec": {"size": 9}});
    let r = s.patch(&format!("{path}/status"), &status, MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert_eq!((r.body["status"]["replicas"].clone(), r.body["spec"]["size"].clone()), (json!(1), json!(2)));

    let scale = s.get(&format!("{path}/scale")).await;
    assert_eq!(scale.body["spec"]["replicas"], 1, "{}", scale.body);
    assert_eq!(scale.body["status"]["selector"], "app=w1");
    let r = s.patch(&format!("{path}/scale"), &json!({"spec": {"replicas": 4}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert_eq!(s.get(&path).await.body["spec"]["replicas"], 4);
    let strategic = s.patch(&path, &json!({"spec": {"size": 3}}), STRATEGIC).await;
    assert_eq!(strategic.code, StatusCode::UNSUPPORTED_MEDIA_TYPE, "custom resources take no strategic merge patch");

    let table = s.http.get(s.url(&widgets(group)))
        .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
        .send().await.expect("table").json::<Value>().await.expect("json");
    let names: Vec<&str> = table["columnDefinitions"].as_array().expect("columns").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, ["Name", "Size", "Colour"]);
    assert_eq!(table["rows"][0]["cells"], json!(["w1", 2, "red"]));
}

#[tokio::test]
async fn deleting_a_definition_deletes_its_objects_and_stops_serving_it() {
    let s = start().await;
    let group = "cleanup.example.com";
    assert_eq!(s.post(CRDS, &widget_crd(group)).await.code, StatusCode::CREATED);
    for name in ["a", "b"] {
        assert_eq!(s.post(&widgets(group), &widget(name, group, json!({"size": 1}))).await.code, StatusCode::CREATED);
    }
    let r = s.delete(&format!("{CRDS}/widgets.{group}")).await;
    assert!(r.code.is_success(), "{}", r.body);
    eventually(&s, &format!("{CRDS}/widgets.{group}"), "the definition goes", |b| b.is_null() || b["code"] == 404).await;
    assert_eq!(s.get(&widgets(group)).await.code, StatusCode::NOT_FOUND);
    let left = s.store.list(&format!("/registry/{group}/widgets/"), None, None).await.expect("list");
    assert!(left.items.is_empty(), "objects left behind: {}", left.items.len());
}

#[tokio::test]
async fn objects_written_through_any_served_version_are_stored_in_the_storage_version() {
    let s = start().await;
    let group = "versions.example.com";
    let mut crd = widget_crd(group);
    let v1 = crd["spec"]["versions"][0].clone();
    let mut beta = v1.clone();
    beta["name"] = json!("v1beta1");
    beta["storage"] = json!(false);
    let mut alpha = v1.clone();
    alpha["name"] = json!("v1alpha1");
    alpha["storage"] = json!(false);
    alpha["served"] = json!(false);
    crd["spec"]["versions"] = json!([beta, v1, alpha]);
    assert_eq!(s.post(CRDS, &crd).await.code, StatusCode::CREATED);

    let beta_path = format!("/apis/{group}/v1beta1/namespaces/default/widgets");
    let mut w = widget("w1", group, json!({"size": 1}));
    w["apiVersion"] = json!(format!("{group}/v1beta1"));
    let r = s.post(&beta_path, &w).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["apiVersion"], format!("{group}/v1beta1"));
    assert_eq!(s.get(&format!("{}/w1", widgets(group))).await.body["apiVersion"], format!("{group}/v1"));
    let listed = s.get(&beta_path).await.body;
    assert_eq!(listed["items"][0]["apiVersion"], format!("{group}/v1beta1"), "{listed}");
    let stored = s.store.get(&format!("/registry/{group}/widgets/default/w1")).await.expect("get").expect("stored");
    let stored: Value = serde_json::from_slice(&stored.value).expect("json");
    assert_eq!(stored["apiVersion"], format!("{group}/v1"));
    assert_eq!(s.get(&format!("/apis/{group}/v1alpha1/namespaces/default/widgets")).await.code, StatusCode::NOT_FOUND);
    let preferred = s.get(&format!("/apis/{group}")).await.body;
    assert_eq!(preferred["preferredVersion"]["version"], "v1", "{preferred}");
}

#[tokio::test]
async fn a_definition_adds_its_schema_to_the_openapi_documents_and_changes_their_etag() {
    let s = start().await;
    let group = "openapi.example.com";
    let before = s.get("/openapi/v2").await;
    let etag_before = before.headers.get("etag").cloned();
    assert_eq!(s.post(CRDS, &widget_crd(group)).await.code, StatusCode::CREATED);

    let after = s.get("/openapi/v2").await;
    assert_ne!(after.headers.get("etag").cloned(), etag_before, "the ETag must change with the served kinds");
    let widget = &after.body["definitions"]["com.example.openapi.v1.Widget"];
    assert_eq!(widget["properties"]["spec"]["properties"]["size"]["type"], "integer", "{widget}");
    assert_eq!(widget["x-kubernetes-group-version-kind"][0]["kind"], "Widget");
    let patch = &after.body["paths"][format!("/apis/{group}/v1/namespaces/{{namespace}}/widgets/{{name}}").as_str()]["patch"];
    assert!(patch["parameters"].as_array().is_some_and(|p| p.iter().any(|q| q["name"] == "fieldValidation")), "{patch}");

    let index = s.get("/openapi/v3").await.body;
    let url = index["paths"][format!("apis/{group}/v1").as_str()]["serverRelativeURL"].as_str().expect("listed").to_string();
    let doc = s.get(&url).await.body;
    assert_eq!(doc["components"]["schemas"]["com.example.openapi.v1.Widget"]["properties"]["spec"]["required"], json!(["size"]));
}

/// The first `n` events of a watch.
async fn watch_events(s: &Server, path: &str, n: usize) -> Vec<Value> {
    use futures::StreamExt;
    let resp = s.http.get(s.url(path)).send().await.expect("watch");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.bytes_stream();
    let (mut buf, mut out) = (Vec::new(), Vec::new());
    while out.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next()).await.expect("event in time");
        let Some(Ok(chunk)) = chunk else { break };
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            out.push(serde_json::from_slice(&line).expect("json line"));
        }
    }
    out
}

#[tokio::test]
async fn custom_objects_are_watched_and_selected_like_built_in_ones() {
    let s = start().await;
    let group = "watch.example.com";
    let mut crd = widget_crd(group);
    let mut beta = crd["spec"]["versions"][0].clone();
    beta["name"] = json!("v1beta1");
    beta["storage"] = json!(false);
    crd["spec"]["versions"].as_array_mut().expect("versions").push(beta);
    assert_eq!(s.post(CRDS, &crd).await.code, StatusCode::CREATED);
    for (name, colour) in [("a", "red"), ("b", "blue")] {
        let mut w = widget(name, group, json!({"size": 1}));
        w["metadata"]["labels"] = json!({"colour": colour});
        assert_eq!(s.post(&widgets(group), &w).await.code, StatusCode::CREATED);
    }
    let by_label = s.get(&format!("{}?labelSelector=colour%3Dblue", widgets(group))).await.body;
    assert_eq!(by_label["items"].as_array().map(|i| i.iter().map(|o| o["metadata"]["name"].clone()).collect::<Vec<_>>()), Some(vec![json!("b")]));
    let by_field = s.get(&format!("/apis/{group}/v1/widgets?fieldSelector=metadata.name%3Da,metadata.namespace%3Ddefault")).await.body;
    assert_eq!(by_field["items"].as_array().map(Vec::len), Some(1), "{by_field}");

    let beta_watch = format!("/apis/{group}/v1beta1/namespaces/default/widgets?watch=true&labelSelector=colour%3Dred");
    let events = watch_events(&s, &beta_watch, 1).await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "a");
    assert_eq!(events[0]["object"]["apiVersion"], format!("{group}/v1beta1"));

    let protobuf_first = s.http.get(s.url(&widgets(group)))
        .header("accept", "application/vnd.kubernetes.protobuf, application/json")
        .send().await.expect("get");
    assert_eq!(protobuf_first.status(), StatusCode::OK);
    assert!(protobuf_first.headers()["content-type"].to_str().unwrap_or("").starts_with("application/json"));
    let only_protobuf = s.http.get(s.url(&widgets(group)))
        .header("accept", "application/vnd.kubernetes.protobuf")
        .send().await.expect("get");
    assert_eq!(only_protobuf.status(), StatusCode::NOT_ACCEPTABLE);
}

#[tokio::test]
async fn updating_a_definition_changes_what_is_served() {
    let s = start().await;
    let group = "update.example.com";
    let created = s.post(CRDS, &widget_crd(group)).await.body;
    let mut crd = created.clone();
    let mut beta = crd["spec"]["versions"][0].clone();
    beta["name"] = json!("v2");
    beta["storage"] = json!(false);
    crd["spec"]["versions"].as_array_mut().expect("versions").push(beta);
    crd["spec"]["versions"][0]["served"] = json!(false);
    let r = s.put(&format!("{CRDS}/widgets.{group}"), &crd).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert_eq!(s.get(&widgets(group)).await.code, StatusCode::NOT_FOUND, "v1 is no longer served");
    assert_eq!(s.get(&format!("/apis/{group}/v2/namespaces/default/widgets")).await.code, StatusCode::OK);
    let mut scope = r.body.clone();
    scope["spec"]["scope"] = json!("Cluster");
    let refused = s.put(&format!("{CRDS}/widgets.{group}"), &scope).await;
    assert_eq!(refused.code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(refused.body["details"]["causes"][0]["field"], "spec.scope");
}

#[tokio::test]
async fn a_definition_whose_names_are_taken_is_not_accepted_nor_served() {
    let s = start().await;
    let group = "conflict.example.com";
    assert_eq!(s.post(CRDS, &widget_crd(group)).await.code, StatusCode::CREATED);
    let mut other = widget_crd(group);
    other["metadata"]["name"] = json!(format!("gadgets.{group}"));
    other["spec"]["names"] = json!({"plural": "gadgets", "kind": "Widget"});
    let r = s.post(CRDS, &other).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    let accepted = r.body["status"]["conditions"].as_array().expect("conditions").iter()
        .find(|c| c["type"] == "NamesAccepted").cloned().expect("NamesAccepted");
    assert_eq!((accepted["status"].as_str(), accepted["reason"].as_str()), (Some("False"), Some("NameConflict")), "{accepted}");
    assert_eq!(s.get(&format!("/apis/{group}/v1/namespaces/default/gadgets")).await.code, StatusCode::NOT_FOUND);
    assert_eq!(s.get(&widgets(group)).await.code, StatusCode::OK, "the first definition is still served");

    assert!(s.delete(&format!("{CRDS}/widgets.{group}")).await.code.is_success());
    eventually(&s, &format!("{CRDS}/gadgets.{group}"), "the names are accepted once free", |d| {
        d["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Established" && c["status"] == "True"))
    })
    .await;
    assert_eq!(s.get(&format!("/apis/{group}/v1/namespaces/default/gadgets")).await.code, StatusCode::OK);
}

#[tokio::test]
async fn a_finalizer_holds_a_custom_object_and_the_definition_until_it_is_removed() {
    let s = start().await;
    let group = "finalizers.example.com";
    assert_eq!(s.post(CRDS, &widget_crd(group)).await.code, StatusCode::CREATED);
    let mut w = widget("held", group, json!({"size": 1}));
    w["metadata"]["finalizers"] = json!(["example.com/hold"]);
    assert_eq!(s.post(&widgets(group), &w).await.code, StatusCode::CREATED);
    let path = format!("{}/held", widgets(group));

    let r = s.delete(&path).await;
    assert_eq!(r.code, StatusCode::ACCEPTED, "{}", r.body);
    assert!(r.body["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(s.delete(&format!("{CRDS}/widgets.{group}")).await.code, StatusCode::ACCEPTED);
    // The definition waits for its last object, which stays served so its finalizer can go.
    eventually(&s, &format!("{CRDS}/widgets.{group}"), "the definition reports its cleanup", |d| {
        d["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Terminating"))
    })
    .await;
    assert_eq!(s.get(&path).await.code, StatusCode::OK);
    let r = s.patch(&path, &json!({"metadata": {"finalizers": null}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    eventually(&s, &format!("{CRDS}/widgets.{group}"), "the definition goes", |b| b.is_null() || b["code"] == 404).await;
    assert_eq!(s.get(&path).await.code, StatusCode::NOT_FOUND);
}
