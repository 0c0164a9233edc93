//! Server-side apply over HTTP: field managers, conflicts, force, dry run, and the ownership other
//! writes record.

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const APPLY: &str = "application/apply-patch+yaml";

fn web(replicas: i64, image: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": image}]}}}})
}

async fn apply(s: &Server, path: &str, query: &str, body: &Value) -> Reply {
    s.patch(&format!("{path}?{query}"), body, APPLY).await
}

fn managers(obj: &Value) -> Vec<(String, String)> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| (e["manager"].as_str().unwrap_or("").to_string(), e["operation"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn entry<'a>(obj: &'a Value, manager: &str) -> &'a Value {
    obj["metadata"]["managedFields"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["manager"] == manager))
        .unwrap_or_else(|| panic!("no managedFields entry of {manager}: {obj}"))
}

#[tokio::test]
async fn an_apply_without_a_field_manager_is_refused_as_kubernetes_refuses_it_and_writes_nothing() {
    let s = start().await;
    let r = s.patch(&format!("{DEPLOYMENTS}/web"), &web(1, "a"), APPLY).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(
        r.body["message"],
        "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch"
    );
    assert_eq!(r.body["details"]["causes"][0]["field"], "fieldManager");
    assert_eq!(s.get(&format!("{DEPLOYMENTS}/web")).await.code, StatusCode::NOT_FOUND);
    let r = s.patch(&format!("{DEPLOYMENTS}/web?force=true"), &json!({}), MERGE).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "force on a merge patch: {}", r.body);
}

#[tokio::test]
async fn an_apply_creates_the_object_and_owns_exactly_what_it_applied() {
    let s = start().await;
    let r = apply(&s, &format!("{DEPLOYMENTS}/web"), "fieldManager=ops", &web(2, "nginx")).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    assert_eq!(managers(&r.body), vec![("ops".to_string(), "Apply".to_string())]);
    let e = entry(&r.body, "ops");
    assert_eq!(e["apiVersion"], "apps/v1");
    assert_eq!(e["fieldsType"], "FieldsV1");
    assert!(e["time"].is_string());
    let fields = &e["fieldsV1"];
    assert_eq!(fields["f:spec"]["f:replicas"], json!({}));
    assert_eq!(fields["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"web\"}"]["f:image"], json!({}));
    assert!(fields["f:spec"].get("f:progressDeadlineSeconds").is_none(), "a defaulted field is not the applier's");
    assert_eq!(r.body["spec"]["progressDeadlineSeconds"], 600, "defaults fill what was not applied");

    // The same apply again changes nothing and writes nothing.
    let again = apply(&s, &format!("{DEPLOYMENTS}/web"), "fieldManager=ops", &web(2, "nginx")).await;
    assert_eq!(again.code, StatusCode::OK);
    assert_eq!(again.body["metadata"]["resourceVersion"], r.body["metadata"]["resourceVersion"]);
}

#[tokio::test]
async fn a_change_to_a_field_another_manager_owns_is_a_409_naming_both_until_forced() {
    let s = start().await;
    let path = format!("{DEPLOYMENTS}/web");
    apply(&s, &path, "fieldManager=ops", &web(2, "nginx")).await;
    let mut other = web(5, "nginx:2");
    other["spec"].as_object_mut().map(|m| m.remove("selector"));
    let r = apply(&s, &path, "fieldManager=ci", &other).await;
    assert_eq!(r.code, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(r.body["reason"], "Conflict");
    let causes = r.body["details"]["causes"].as_array().cloned().unwrap_or_default();
    let fields: Vec<&str> = causes.iter().filter_map(|c| c["field"].as_str()).collect();
    assert_eq!(fields, vec![".spec.replicas", ".spec.template.spec.containers[name=\"web\"].image"], "{}", r.body);
    assert!(causes.iter().all(|c| c["reason"] == "FieldManagerConflict" && c["message"] == "conflict with \"ops\""));
    assert_eq!(
        r.body["message"],
        "Apply failed with 2 conflicts: conflicts with \"ops\":\n- .spec.replicas\n- .spec.template.spec.containers[name=\"web\"].image"
    );
    assert_eq!(s.get(&path).await.body["spec"]["replicas"], 2, "a refused apply writes nothing");

    // The same values are shared ownership, not a conflict.
    let shared = apply(&s, &path, "fieldManager=ci", &json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"}, "spec": {"replicas": 2}})).await;
    assert_eq!(shared.code, StatusCode::OK, "{}", shared.body);

    let forced = apply(&s, &path, "fieldManager=ci&force=true", &other).await;
    assert_eq!(forced.code, StatusCode::OK, "{}", forced.body);
    assert_eq!(forced.body["spec"]["replicas"], 5);
    let ops = &entry(&forced.body, "ops")["fieldsV1"];
    assert!(ops["f:spec"].get("f:replicas").is_none(), "the forced field left its old owner: {ops}");
    assert!(ops["f:spec"].get("f:selector").is_some(), "what was not taken stays");

    // A merge patch is an update: it takes the field, and an apply then conflicts with its manager.
    let r = s.patch(&format!("{path}?fieldManager=scaler"), &json!({"spec": {"replicas": 7}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK);
    let r = apply(&s, &path, "fieldManager=ci", &other).await;
    assert_eq!(r.code, StatusCode::CONFLICT);
    assert_eq!(r.body["message"], "Apply failed with 1 conflict: conflict with \"scaler\" using apps/v1: .spec.replicas");
}

#[tokio::test]
async fn fields_an_applier_stops_applying_are_removed_unless_another_manager_owns_them() {
    let s = start().await;
    let path = format!("{DEPLOYMENTS}/web");
    let mut first = web(2, "nginx");
    first["metadata"]["labels"] = json!({"team": "a", "tier": "web"});
    first["spec"]["template"]["spec"]["containers"] =
        json!([{"name": "web", "image": "nginx"}, {"name": "log", "image": "busybox"}]);
    apply(&s, &path, "fieldManager=ops", &first).await;
    let r = s.patch(&format!("{path}?fieldManager=labeller"), &json!({"metadata": {"labels": {"tier": "web"}}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK);
    // `tier` had the same value: the labeller does not own it (it changed nothing).
    let r = s.patch(&format!("{path}?fieldManager=labeller"), &json!({"metadata": {"labels": {"tier": "front"}}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK);

    let second = web(2, "nginx");
    let r = apply(&s, &path, "fieldManager=ops&force=true", &second).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["metadata"]["labels"], json!({"tier": "front"}), "team went, tier is the labeller's");
    let names: Vec<&str> =
        r.body["spec"]["template"]["spec"]["containers"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(names, vec!["web"]);
}

#[tokio::test]
async fn a_dry_run_apply_answers_the_result_and_writes_nothing() {
    let s = start().await;
    let path = format!("{DEPLOYMENTS}/web");
    let r = apply(&s, &path, "fieldManager=ops&dryRun=All", &web(2, "nginx")).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["spec"]["replicas"], 2);
    assert_eq!(s.get(&path).await.code, StatusCode::NOT_FOUND);
    apply(&s, &path, "fieldManager=ops", &web(2, "nginx")).await;
    let r = apply(&s, &path, "fieldManager=ops&dryRun=All", &web(4, "nginx")).await;
    assert_eq!(r.body["spec"]["replicas"], 4);
    assert_eq!(s.get(&path).await.body["spec"]["replicas"], 2);
    let r = apply(&s, &path, "fieldManager=ci&dryRun=All", &web(4, "nginx")).await;
    assert_eq!(r.code, StatusCode::CONFLICT, "a dry run still finds conflicts");
}

#[tokio::test]
async fn yaml_bodies_strict_field_validation_and_the_status_subresource_are_served() {
    let s = start().await;
    let yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: c\n    image: minimal\n";
    let r = s.raw(Method::PATCH, &format!("{PODS}/p?fieldManager=y"), Some(yaml.into()), APPLY).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    let bad = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  bogus: 1\n";
    let r = s.raw(Method::PATCH, &format!("{PODS}/p?fieldManager=y&fieldValidation=Strict"), Some(bad.into()), APPLY).await;
    assert_eq!(r.code, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body["message"].as_str().unwrap_or("").contains("unknown field \"spec.bogus\""), "{}", r.body);

    let status = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    let r = apply(&s, &format!("{PODS}/p/status"), "fieldManager=agent", &status).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["status"]["phase"], "Running");
    let e = entry(&r.body, "agent");
    assert_eq!(e["subresource"], "status");
    assert!(e["fieldsV1"]["f:status"]["f:conditions"]["k:{\"type\":\"Ready\"}"].is_object(), "{e}");
    assert!(e["fieldsV1"].get("f:spec").is_none());
}

#[tokio::test]
async fn other_writes_record_update_entries_merged_per_manager_named_by_user_agent_by_default() {
    let s = start().await;
    let created = s
        .http
        .post(s.url(DEPLOYMENTS))
        .header("user-agent", "kubectl/v1.33.0 (linux/amd64) kubernetes/abc")
        .json(&web(1, "a"))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), StatusCode::CREATED);
    let obj: Value = created.json().await.expect("json");
    assert_eq!(managers(&obj), vec![("kubectl".to_string(), "Update".to_string())]);
    assert!(entry(&obj, "kubectl")["fieldsV1"]["f:spec"]["f:progressDeadlineSeconds"].is_object(), "a create owns defaults");
    let path = format!("{DEPLOYMENTS}/web");
    for replicas in 2..5 {
        let r = s.patch(&format!("{path}?fieldManager=scaler"), &json!({"spec": {"replicas": replicas}}), MERGE).await;
        assert_eq!(r.code, StatusCode::OK);
    }
    let r = s.patch(&format!("{path}?fieldManager=scaler"), &json!([{"op": "add", "path": "/spec/paused", "value": true}]), JSON_PATCH).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    let list = managers(&r.body);
    assert_eq!(list.len(), 2, "one entry per manager: {list:?}");
    let scaler = &entry(&r.body, "scaler")["fieldsV1"]["f:spec"];
    assert!(scaler["f:replicas"].is_object() && scaler["f:paused"].is_object(), "{scaler}");
    assert!(entry(&r.body, "kubectl")["fieldsV1"]["f:spec"].get("f:replicas").is_none(), "the scaler took replicas");
}
