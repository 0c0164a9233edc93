//! Hostile and unlucky requests over a real socket: patches of the document root, panics,
//! changes of type, write contention, revisions from the future, and protected debug routes.

mod common;

use std::time::{Duration, Instant};

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::json;
use shepherd_apiserver::HttpConfig;

#[tokio::test]
async fn a_json_patch_on_the_document_root_is_refused_and_writes_nothing() {
    let s = start().await;
    s.create(DEPLOYMENTS, &deployment("web")).await;
    let before = s.store.revision().await.expect("revision");
    let path = format!("{DEPLOYMENTS}/web");
    for ops in [
        json!([{"op": "add", "path": "", "value": ""}]),
        json!([{"op": "replace", "path": "", "value": 7}]),
        json!([{"op": "add", "path": "", "value": null}]),
        json!([{"op": "add", "path": "", "value": []}]),
        // A later failure used to make the patch library undo a root replacement, and panic.
        json!([{"op": "add", "path": "", "value": "x"}, {"op": "remove", "path": "/nope"}]),
        json!([{"op": "add", "path": "", "value": {}}, {"op": "test", "path": "/a", "value": 1}]),
        json!([{"op": "remove", "path": ""}]),
        json!([{"op": "move", "from": "/spec", "path": ""}]),
        json!([{"op": "copy", "from": "/spec/replicas", "path": ""}]),
        json!([{"op": "add", "path": "/metadata", "value": "not a map"}]),
    ] {
        for sub in ["", "/status", "/scale"] {
            let r = s.patch(&format!("{path}{sub}"), &ops, JSON_PATCH).await;
            assert!(r.code.is_client_error(), "{ops} on {sub:?}: {} {}", r.code, r.body);
            assert_eq!(r.body["kind"], "Status", "{ops}: {}", r.body);
        }
    }
    for body in [json!(""), json!([1]), json!(null), json!(42)] {
        for ct in [MERGE, STRATEGIC] {
            let r = s.patch(&path, &body, ct).await;
            assert_eq!(r.code, StatusCode::BAD_REQUEST, "{body} as {ct}: {}", r.body);
        }
    }
    // "/" is the member named "" of the root: an unknown field, dropped with a warning.
    let r = s.patch(&path, &json!([{"op": "add", "path": "/", "value": 1}]), JSON_PATCH).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert_eq!(r.warnings(), [r#"299 - "unknown field \"\"""#]);
    assert_eq!(s.store.revision().await.expect("revision"), before, "no refused patch wrote anything");
    assert_eq!(s.get(&path).await.body["spec"]["replicas"], 2, "the server still serves the object");
}

#[tokio::test]
async fn a_panicking_handler_is_answered_500_and_the_server_keeps_serving() {
    let extra = axum::Router::new().route(
        "/debug/explode",
        axum::routing::get(|| async {
            if std::hint::black_box(true) {
                panic!("deliberate panic in a handler");
            }
            "unreachable"
        }),
    );
    let s = start_with(HttpConfig::default(), extra).await;
    for _ in 0..3 {
        let r = s.get("/debug/explode").await;
        assert_eq!(r.code, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(r.body["kind"], "Status");
        assert_eq!(r.body["reason"], "InternalError");
        assert!(r.body["message"].as_str().is_some_and(|m| m.contains("GET /debug/explode")), "{}", r.body);
    }
    assert_eq!(s.get(PODS).await.code, StatusCode::OK);
}

#[tokio::test]
async fn debug_routes_need_the_token_like_the_api() {
    let extra = axum::Router::new().route("/debug/controllers", axum::routing::get(|| async { "[]" }));
    let s = start_with(HttpConfig { token: Some("s3cret".into()), ..HttpConfig::default() }, extra).await;
    assert_eq!(s.get("/debug/controllers").await.code, StatusCode::UNAUTHORIZED);
    let ok = s.http.get(s.url("/debug/controllers")).bearer_auth("s3cret").send().await.expect("get");
    assert_eq!(ok.status(), StatusCode::OK);
}

#[tokio::test]
async fn kind_and_api_version_cannot_be_changed_by_a_patch_or_an_update() {
    let s = start().await;
    let created = s.create(DEPLOYMENTS, &deployment("web")).await;
    let path = format!("{DEPLOYMENTS}/web");
    let before = s.store.revision().await.expect("revision");

    let r = s.patch(&path, &json!({"apiVersion": "v9", "kind": null}), MERGE).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    let fields: Vec<&str> = r.body["details"]["causes"].as_array().expect("causes").iter().filter_map(|c| c["field"].as_str()).collect();
    assert_eq!(fields, ["apiVersion", "kind"], "{}", r.body);
    assert!(r.body["message"].as_str().is_some_and(|m| m.contains("field is immutable")), "{}", r.body);

    let r = s.patch(&path, &json!([{"op": "replace", "path": "/kind", "value": "ReplicaSet"}]), JSON_PATCH).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.body["details"]["causes"][0]["field"], "kind");
    let r = s.patch(&format!("{path}/status"), &json!({"apiVersion": "apps/v2"}), STRATEGIC).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);

    // A PUT names its type in the body: another type is a bad request, as in Kubernetes.
    let mut other = created.clone();
    other["apiVersion"] = json!("apps/v9");
    let r = s.put(&path, &other).await;
    assert_eq!(r.code, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body["message"].as_str().is_some_and(|m| m.contains("apps/v9")), "{}", r.body);

    assert_eq!(s.store.revision().await.expect("revision"), before, "nothing was written");
    let got = s.get(&path).await.body;
    assert_eq!((got["apiVersion"].as_str(), got["kind"].as_str()), (Some("apps/v1"), Some("Deployment")));
}

#[tokio::test]
async fn a_patch_may_not_rename_or_move_an_object_and_finalizers_are_names_a_deleting_object_cannot_gain() {
    let s = start().await;
    const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
    s.create(CONFIGMAPS, &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "finalizers": ["example.com/hold"]}})).await;
    let path = format!("{CONFIGMAPS}/a");
    let before = s.store.revision().await.expect("revision");
    for (patch, ct, says) in [
        (json!({"metadata": {"name": "b"}}), MERGE, "the name of the object (b) does not match the name on the URL (a)"),
        (json!([{"op": "remove", "path": "/metadata/name"}]), JSON_PATCH, "the name of the object () does not match"),
        (json!({"metadata": {"namespace": "kube-system"}}), STRATEGIC, "the namespace of the provided object (kube-system) does not match"),
    ] {
        let r = s.patch(&path, &patch, ct).await;
        assert_eq!(r.code, StatusCode::BAD_REQUEST, "{patch}: {}", r.body);
        assert!(r.body["message"].as_str().is_some_and(|m| m.contains(says)), "{}", r.body);
    }
    let r = s.patch(&path, &json!({"metadata": {"finalizers": ["example.com/hold", "bad name!"]}}), MERGE).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.body["details"]["causes"][0]["field"], "metadata.finalizers", "{}", r.body);
    assert_eq!(s.store.revision().await.expect("revision"), before, "nothing was written");

    // Being deleted (held by its finalizer), it may lose finalizers but not gain one.
    assert!(s.delete(&path).await.code.is_success());
    let r = s.patch(&path, &json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}}), MERGE).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    let message = r.body["message"].as_str().unwrap_or_default();
    assert!(message.contains("no new finalizers can be added if the object is being deleted") && message.contains("example.com/more"), "{message}");
    let r = s.patch(&path, &json!({"metadata": {"finalizers": null}}), MERGE).await;
    assert!(r.code.is_success(), "{}", r.body);
    assert_eq!(s.get(&path).await.code, StatusCode::NOT_FOUND, "gone once its last finalizer is");
}

#[tokio::test]
async fn a_uid_in_a_patch_or_an_update_is_a_precondition() {
    let s = start().await;
    let created = s.create(DEPLOYMENTS, &deployment("web")).await;
    let path = format!("{DEPLOYMENTS}/web");
    let uid = created["metadata"]["uid"].as_str().expect("uid").to_string();
    let before = s.store.revision().await.expect("revision");

    let r = s.patch(&path, &json!({"metadata": {"uid": "not-this-one"}, "spec": {"replicas": 5}}), MERGE).await;
    assert_eq!(r.code, StatusCode::CONFLICT, "{}", r.body);
    let message = r.body["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("UID in precondition: not-this-one, UID in object meta: {uid}")), "{message}");
    let mut other = created.clone();
    other["metadata"]["uid"] = json!("not-this-one");
    other["metadata"].as_object_mut().expect("meta").remove("resourceVersion");
    let r = s.put(&path, &other).await;
    assert_eq!(r.code, StatusCode::CONFLICT, "{}", r.body);
    assert_eq!(s.store.revision().await.expect("revision"), before, "nothing was written");

    let r = s.patch(&path, &json!({"metadata": {"uid": uid}, "spec": {"replicas": 5}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "the right uid applies: {}", r.body);
    assert_eq!(r.body["spec"]["replicas"], 5);
}

#[tokio::test]
async fn generation_counts_changes_of_the_spec_only() {
    let s = start().await;
    s.create(DEPLOYMENTS, &deployment("web")).await;
    let path = format!("{DEPLOYMENTS}/web");
    let r = s.patch(&path, &json!({"metadata": {"labels": {"a": "b"}, "annotations": {"c": "d"}}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["metadata"]["generation"], 1, "metadata is not spec");
    let r = s.patch(&format!("{path}/status"), &json!({"status": {"replicas": 2}}), MERGE).await;
    assert_eq!(r.body["metadata"]["generation"], 1, "status is not spec: {}", r.body);
    let r = s.patch(&path, &json!({"spec": {"replicas": 3}}), MERGE).await;
    assert_eq!(r.body["metadata"]["generation"], 2);
    // The same spec again writes nothing and bumps nothing.
    let r = s.patch(&path, &json!({"spec": {"replicas": 3}}), MERGE).await;
    assert_eq!(r.body["metadata"]["generation"], 2);
}

#[tokio::test]
async fn concurrent_patches_without_a_resource_version_all_apply() {
    let s = std::sync::Arc::new(start().await);
    s.create(PODS, &pod("hot")).await;
    let path = format!("{PODS}/hot");
    let (clients, each) = (16, 50);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let s = s.clone();
        let path = path.clone();
        tasks.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            for i in 0..each {
                let patch = json!({"metadata": {"annotations": {format!("c{c}-{i}"): "x"}}});
                let r = s.patch(&path, &patch, MERGE).await;
                if r.code != StatusCode::OK {
                    failures.push(format!("{} {}", r.code, r.body));
                }
            }
            failures
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        failures.extend(t.await.expect("client task"));
    }
    assert!(failures.is_empty(), "{} of {} patches failed, e.g. {:?}", failures.len(), clients * each, failures.first());
    let got = s.get(&path).await.body;
    let annotations = got["metadata"]["annotations"].as_object().map_or(0, |a| a.len());
    assert_eq!(annotations, clients * each, "every patch's effect is in the object");

    // Status patches and PUTs without a resourceVersion are retried the same way.
    s.create(DEPLOYMENTS, &deployment("hot")).await;
    let deploy = format!("{DEPLOYMENTS}/hot");
    let mut tasks = Vec::new();
    for c in 0..clients {
        let s = s.clone();
        let deploy = deploy.clone();
        tasks.push(tokio::spawn(async move {
            let mut codes = Vec::new();
            for i in 0..10 {
                let status = json!({"status": {"observedGeneration": i, "replicas": c}});
                codes.push(s.patch(&format!("{deploy}/status"), &status, MERGE).await.code);
                let mut body = deployment("hot");
                body["metadata"]["labels"] = json!({"writer": format!("c{c}")});
                codes.push(s.put(&deploy, &body).await.code);
            }
            codes
        }));
    }
    for t in tasks {
        let codes = t.await.expect("client task");
        assert!(codes.iter().all(|c| *c == StatusCode::OK), "{codes:?}");
    }

    // With a resourceVersion the client asked for a precondition: a stale one is 409 at once.
    let stale = json!({"metadata": {"resourceVersion": "2", "annotations": {"late": "x"}}});
    let started = Instant::now();
    let r = s.patch(&path, &stale, MERGE).await;
    assert_eq!(r.code, StatusCode::CONFLICT, "{}", r.body);
    assert!(started.elapsed() < Duration::from_secs(1));
    let mut put = got.clone();
    put["metadata"]["resourceVersion"] = json!("2");
    assert_eq!(s.put(&path, &put).await.code, StatusCode::CONFLICT);
}

fn list_rv(r: &Reply) -> u64 {
    r.body["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).expect("list resourceVersion")
}

#[tokio::test]
async fn lists_and_gets_honour_resource_version_and_its_match() {
    let s = std::sync::Arc::new(start().await);
    for i in 0..3 {
        s.create(PODS, &pod(&format!("p{i}"))).await;
    }
    let now = s.store.revision().await.expect("revision");

    for q in ["", "?resourceVersion=0", &format!("?resourceVersion={now}"),
        &format!("?resourceVersion={now}&resourceVersionMatch=NotOlderThan"),
        "?resourceVersion=1&resourceVersionMatch=NotOlderThan",
        &format!("?resourceVersion={now}&resourceVersionMatch=Exact"), "?limit=-1"] {
        let r = s.get(&format!("{PODS}{q}")).await;
        assert_eq!(r.code, StatusCode::OK, "{q}: {}", r.body);
        assert_eq!(r.body["items"].as_array().map(Vec::len), Some(3), "{q}");
        assert_eq!(list_rv(&r), now, "{q}");
    }

    // Exact at a revision the store has moved past: the list as it stood then.
    let r = s.get(&format!("{PODS}?resourceVersion={}&resourceVersionMatch=Exact", now - 1)).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert_eq!(r.body["items"].as_array().map(Vec::len), Some(2), "p2 did not exist yet: {}", r.body);
    assert_eq!(list_rv(&r), now - 1);

    // A revision from the future: waited for, then 504 Timeout with Kubernetes' cause.
    for q in [format!("{PODS}?resourceVersion=999999"), format!("{PODS}?resourceVersion=999999&resourceVersionMatch=Exact"),
        format!("{PODS}/p0?resourceVersion=999999")] {
        let started = Instant::now();
        let r = s.get(&q).await;
        assert_eq!(r.code, StatusCode::GATEWAY_TIMEOUT, "{q}: {}", r.body);
        assert_eq!(r.body["reason"], "Timeout");
        assert_eq!(r.body["details"]["causes"][0]["reason"], "ResourceVersionTooLarge");
        assert!(r.body["message"].as_str().is_some_and(|m| m.starts_with("Too large resource version: 999999")), "{}", r.body);
        assert!(started.elapsed() >= Duration::from_secs(1), "it waited first");
    }

    // A revision that arrives while the list waits is served.
    let next = s.store.revision().await.expect("revision") + 1;
    let writer = {
        let s = s.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            s.create(PODS, &pod("late")).await;
        })
    };
    let r = s.get(&format!("{PODS}?resourceVersion={next}")).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert!(list_rv(&r) >= next);
    writer.await.expect("writer");

    // Bad parameters name themselves; the resourceVersionMatch rules are Kubernetes' ListOptions
    // validation (422), a resourceVersion that is no revision a 400.
    let r = s.get(&format!("{PODS}?resourceVersion=garbage")).await;
    assert_eq!(r.code, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body["message"].as_str().is_some_and(|m| m.contains("resourceVersion") && m.contains("garbage")), "{}", r.body);
    assert_eq!(s.get(&format!("{PODS}/p0?resourceVersion=garbage")).await.code, StatusCode::BAD_REQUEST);
    assert_eq!(s.get(&format!("{PODS}?limit=many")).await.code, StatusCode::BAD_REQUEST);
    let first = s.get(&format!("{PODS}?limit=1")).await;
    let token = first.body["metadata"]["continue"].as_str().expect("a continue token").to_string();
    let r = s.get(&format!("{PODS}?limit=1&continue={token}&resourceVersion={now}")).await;
    assert_eq!(r.code, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(s.get(&format!("{PODS}?limit=1&continue={token}&resourceVersion=0")).await.code, StatusCode::OK);
    for (q, says) in [
        ("watch=true&resourceVersionMatch=NotOlderThan", "forbidden for watch unless sendInitialEvents is provided"),
        ("watch=true&sendInitialEvents=true", "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"),
        ("resourceVersion=5&resourceVersionMatch=Bogus", "Unsupported value: \"Bogus\""),
        ("resourceVersionMatch=Exact", "resourceVersionMatch is forbidden unless resourceVersion is provided"),
        ("resourceVersion=0&resourceVersionMatch=Exact", "forbidden for resourceVersion \"0\""),
    ] {
        let r = s.get(&format!("{PODS}?{q}")).await;
        assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{q}: {}", r.body);
        assert_eq!(r.body["details"]["causes"][0]["field"], "resourceVersionMatch", "{q}");
        assert!(r.body["message"].as_str().is_some_and(|m| m.contains(says)), "{q}: {}", r.body);
    }
}

#[tokio::test]
async fn unknown_fields_follow_the_field_validation_parameter() {
    let s = start().await;
    let with_unknown = |name: &str| {
        let mut p = pod(name);
        p["spec"]["containers"][0]["imagee"] = json!("typo");
        p["spec"]["foo"] = json!({"bar": 1});
        p
    };
    let before = s.store.revision().await.expect("revision");
    let r = s.post(&format!("{PODS}?fieldValidation=Strict"), &with_unknown("strict")).await;
    assert_eq!(r.code, StatusCode::BAD_REQUEST, "{}", r.body);
    assert_eq!(r.body["reason"], "BadRequest");
    assert_eq!(
        r.body["message"],
        "Pod in version \"v1\" cannot be handled as a Pod: strict decoding error: \
         unknown field \"spec.containers[0].imagee\", unknown field \"spec.foo\""
    );
    let dup = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"d","name":"dup"},"spec":{"containers":[{"name":"c","image":"i"}]}}"#;
    let r = s.raw(Method::POST, &format!("{PODS}?fieldValidation=Strict"), Some(dup.into()), "application/json").await;
    assert_eq!(r.code, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body["message"].as_str().is_some_and(|m| m.ends_with("strict decoding error: duplicate field \"metadata.name\"")), "{}", r.body);
    assert_eq!(s.store.revision().await.expect("revision"), before, "Strict wrote nothing");

    // Warn (the default, as in Kubernetes): dropped, each named in a Warning header.
    for q in ["?fieldValidation=Warn", ""] {
        let name = if q.is_empty() { "default" } else { "warn" };
        let r = s.post(&format!("{PODS}{q}"), &with_unknown(name)).await;
        assert_eq!(r.code, StatusCode::CREATED, "{q}: {}", r.body);
        assert_eq!(r.warnings(), [
            r#"299 - "unknown field \"spec.containers[0].imagee\"""#,
            r#"299 - "unknown field \"spec.foo\"""#,
        ], "{q}");
        let stored = s.get(&format!("{PODS}/{name}")).await.body;
        assert!(stored["spec"].get("foo").is_none() && stored["spec"]["containers"][0].get("imagee").is_none(), "{stored}");
    }
    let r = s.raw(Method::POST, PODS, Some(dup.replace("\"d\"", "\"x\"").replace("dup", "dup2")), "application/json").await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    assert_eq!(r.body["metadata"]["name"], "dup2", "the last duplicate wins");
    assert_eq!(r.warnings(), [r#"299 - "duplicate field \"metadata.name\"""#]);

    let r = s.post(&format!("{PODS}?fieldValidation=Ignore"), &with_unknown("ignore")).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    assert!(r.warnings().is_empty());

    // Patches: the patched object is what is checked.
    let path = format!("{PODS}/ignore");
    let r = s.patch(&format!("{path}?fieldValidation=Strict"), &json!({"spec": {"bogus": 1}}), MERGE).await;
    assert_eq!(r.code, StatusCode::BAD_REQUEST, "{}", r.body);
    assert!(r.body["message"].as_str().is_some_and(|m| m.contains("unknown field \"spec.bogus\"")), "{}", r.body);
    let r = s.patch(&path, &json!({"metadata": {"labels": {"a": "b"}}, "spec": {"bogus": 1}}), MERGE).await;
    assert_eq!(r.code, StatusCode::OK, "{}", r.body);
    assert_eq!(r.warnings(), [r#"299 - "unknown field \"spec.bogus\"""#]);
    assert_eq!(r.body["metadata"]["labels"]["a"], "b");

    // Fields Kubernetes has and Shepherd lacks are refused under every setting.
    for v in ["Strict", "Warn", "Ignore"] {
        let mut vols = pod("vols");
        vols["spec"]["volumes"] = json!([{"name": "data", "nfs": {"server": "nfs.example", "path": "/"}}]);
        let r = s.post(&format!("{PODS}?fieldValidation={v}"), &vols).await;
        assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{v}: {}", r.body);
        assert_eq!(r.body["details"]["causes"][0]["field"], "spec.volumes[0].nfs");
    }
    let r = s.post(&format!("{PODS}?fieldValidation=Loose"), &pod("loose")).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.body["details"]["causes"][0]["field"], "fieldValidation");
}

#[tokio::test]
async fn a_dry_run_validates_in_full_and_writes_nothing() {
    let s = start().await;
    s.create(DEPLOYMENTS, &deployment("web")).await;
    let mut bound = pod("bound");
    bound["spec"]["nodeName"] = json!("node-1");
    s.create(PODS, &bound).await;
    let before = s.store.revision().await.expect("revision");
    let dry = "dryRun=All";

    // Create: defaulted, with a uid and creation time, and no resourceVersion.
    let r = s.post(&format!("{PODS}?{dry}"), &pod("ghost")).await;
    assert_eq!(r.code, StatusCode::CREATED, "{}", r.body);
    assert!(r.body["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36), "{}", r.body);
    assert!(r.body["metadata"]["creationTimestamp"].is_string());
    assert!(r.body["metadata"].get("resourceVersion").is_none(), "{}", r.body);
    assert_eq!(r.body["spec"]["restartPolicy"], "Always", "defaults applied");
    assert_eq!(s.get(&format!("{PODS}/ghost")).await.code, StatusCode::NOT_FOUND);
    let mut generated = pod("");
    generated["metadata"] = json!({"generateName": "gen-"});
    let r = s.post(&format!("{PODS}?{dry}"), &generated).await;
    assert!(r.body["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("gen-") && n.len() > 4), "{}", r.body);
    // ...and validation and admission in full.
    let mut bad = pod("Bad_Name");
    bad["spec"]["containers"][0]["image"] = json!("");
    assert_eq!(s.post(&format!("{PODS}?{dry}"), &bad).await.code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(s.post(&format!("{PODS}?{dry}"), &pod("bound")).await.code, StatusCode::CONFLICT, "already exists");
    assert_eq!(s.post(&format!("/api/v1/namespaces/nope/pods?{dry}"), &pod("n")).await.code, StatusCode::NOT_FOUND);

    // Update, patch, status and scale: the would-be object, the store untouched.
    let path = format!("{DEPLOYMENTS}/web");
    let mut changed = s.get(&path).await.body;
    changed["spec"]["replicas"] = json!(7);
    let r = s.put(&format!("{path}?{dry}"), &changed).await;
    assert_eq!((r.code, r.body["spec"]["replicas"].as_i64(), r.body["metadata"]["generation"].as_i64()), (StatusCode::OK, Some(7), Some(2)));
    let r = s.patch(&format!("{path}?{dry}"), &json!({"spec": {"replicas": 5}}), MERGE).await;
    assert_eq!(r.body["spec"]["replicas"], 5, "{}", r.body);
    let r = s.patch(&format!("{path}?{dry}"), &json!([{"op": "replace", "path": "/spec/replicas", "value": 4}]), JSON_PATCH).await;
    assert_eq!(r.body["spec"]["replicas"], 4, "{}", r.body);
    assert_eq!(s.patch(&format!("{path}?{dry}"), &json!({"spec": {"replicas": -1}}), MERGE).await.code, StatusCode::UNPROCESSABLE_ENTITY);
    let r = s.patch(&format!("{path}/status?{dry}"), &json!({"status": {"replicas": 9}}), MERGE).await;
    assert_eq!(r.body["status"]["replicas"], 9, "{}", r.body);
    let r = s.patch(&format!("{path}/scale?{dry}"), &json!({"spec": {"replicas": 6}}), MERGE).await;
    assert_eq!((r.body["kind"].as_str(), r.body["spec"]["replicas"].as_i64()), (Some("Scale"), Some(6)), "{}", r.body);
    let r = s.put(&format!("{path}/scale?{dry}"), &json!({"spec": {"replicas": 8}})).await;
    assert_eq!(r.body["spec"]["replicas"], 8, "{}", r.body);

    // Delete: a bound pod as the graceful delete would leave it; deletecollection lists them all.
    let r = s.delete(&format!("{PODS}/bound?{dry}")).await;
    assert_eq!(r.code, StatusCode::ACCEPTED, "{}", r.body);
    assert!(r.body["metadata"]["deletionTimestamp"].is_string(), "{}", r.body);
    let r = s.delete(&format!("{path}?{dry}")).await;
    assert_eq!((r.code, r.body["metadata"]["name"].as_str()), (StatusCode::OK, Some("web")));
    let r = s.delete(&format!("{PODS}?{dry}")).await;
    assert_eq!(r.body["items"].as_array().map(Vec::len), Some(1), "{}", r.body);
    let r = s.send(Method::DELETE, &format!("{PODS}/bound"), Some(&json!({"dryRun": ["All"]})), "application/json").await;
    assert_eq!(r.code, StatusCode::ACCEPTED, "dryRun in the DeleteOptions body: {}", r.body);

    assert_eq!(s.store.revision().await.expect("revision"), before, "no dry run wrote anything");
    let got = s.get(&format!("{PODS}/bound")).await.body;
    assert!(got["metadata"].get("deletionTimestamp").is_none());
    assert_eq!(s.get(&path).await.body["spec"]["replicas"], 2);

    let r = s.post(&format!("{PODS}?dryRun=Server"), &pod("x")).await;
    assert_eq!(r.code, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert_eq!(r.body["details"]["causes"][0]["field"], "dryRun");
    assert_eq!(s.delete(&format!("{PODS}/bound?dryRun=yes")).await.code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(s.store.revision().await.expect("revision"), before);
}

/// A paginated list reads every page at the first page's revision: each object exactly once, as
/// it was then, whatever is created, changed or deleted between the pages.
#[tokio::test]
async fn a_paginated_list_is_one_snapshot_despite_writes_between_pages() {
    let s = start().await;
    for i in 0..20 {
        s.create(PODS, &pod(&format!("p{i:02}"))).await;
    }
    let first = s.get(&format!("{PODS}?limit=5")).await;
    let at = list_rv(&first);
    let mut names: Vec<String> = Vec::new();
    let mut page = first;
    let mut round = 0;
    loop {
        for item in page.body["items"].as_array().expect("items") {
            assert_eq!(item["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse::<u64>().ok()).map(|v| v <= at), Some(true));
            names.push(item["metadata"]["name"].as_str().unwrap_or("").to_string());
        }
        assert_eq!(list_rv(&page), at, "every page carries the first page's revision");
        // Between pages: delete one not yet listed, add one that sorts between, change one.
        round += 1;
        s.create(PODS, &pod(&format!("p{:02}x", round * 5))).await;
        let r = s.http.delete(s.url(&format!("{PODS}/p{:02}", 19 - round))).send().await.expect("delete");
        assert!(r.status().is_success());
        let Some(token) = page.body["metadata"]["continue"].as_str().filter(|t| !t.is_empty()).map(str::to_string) else { break };
        page = s.get(&format!("{PODS}?limit=5&continue={token}")).await;
        assert_eq!(page.code, StatusCode::OK, "{}", page.body);
    }
    assert_eq!(names, (0..20).map(|i| format!("p{i:02}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_continue_token_or_exact_revision_older_than_the_history_is_gone() {
    let limits = shepherd_store::HistoryLimits { max_events: 5, ..Default::default() };
    let s = common::start_on(limits, shepherd_apiserver::HttpConfig::default(), axum::Router::new()).await;
    for i in 0..4 {
        s.create(PODS, &pod(&format!("p{i}"))).await;
    }
    let first = s.get(&format!("{PODS}?limit=2")).await;
    let at = list_rv(&first);
    let token = first.body["metadata"]["continue"].as_str().expect("a continue token").to_string();
    for i in 0..10 {
        s.create(PODS, &pod(&format!("q{i}"))).await;
    }
    let r = s.get(&format!("{PODS}?limit=2&continue={token}")).await;
    assert_eq!(r.code, StatusCode::GONE, "{}", r.body);
    assert_eq!(r.body["reason"], "Expired");
    assert!(r.body["message"].as_str().is_some_and(|m| m.contains("continue parameter is too old")), "{}", r.body);
    let r = s.get(&format!("{PODS}?resourceVersion={at}&resourceVersionMatch=Exact")).await;
    assert_eq!(r.code, StatusCode::GONE, "{}", r.body);
    let tampered: String = token.chars().rev().collect();
    assert_eq!(s.get(&format!("{PODS}?limit=2&continue={tampered}")).await.code, StatusCode::BAD_REQUEST);
}
