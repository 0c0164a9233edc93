//! The API over a real socket: CRUD, subresources, watch, selectors, paging, and every rejection.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};
use shepherd_apiserver::{ApiServer, HttpConfig};
use shepherd_store::{HistoryLimits, LocalStore, Store};

struct Server {
    base: String,
    http: reqwest::Client,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

async fn start_with(limits: HistoryLimits, config: HttpConfig) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(LocalStore::open_redb(&dir.path().join("s.redb"), limits).expect("store"));
    let server = ApiServer::new(store.clone(), config).await.expect("server");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, server.router()).await });
    Server { base: format!("http://{addr}"), http: reqwest::Client::new(), store, _dir: dir }
}

async fn start() -> Server {
    start_with(HistoryLimits::default(), HttpConfig::default()).await
}

fn pod(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "minimal"}]}})
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }
    async fn send(&self, method: reqwest::Method, path: &str, body: Option<&Value>, content_type: &str) -> (StatusCode, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(b) = body {
            req = req.header("content-type", content_type).body(b.to_string());
        }
        let resp = req.send().await.expect("request");
        let code = resp.status();
        let text = resp.text().await.expect("body");
        (code, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(reqwest::Method::GET, path, None, "").await
    }
    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(reqwest::Method::POST, path, Some(body), "application/json").await
    }
    async fn put(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        self.send(reqwest::Method::PUT, path, Some(body), "application/json").await
    }
    async fn patch(&self, path: &str, body: &Value, ct: &str) -> (StatusCode, Value) {
        self.send(reqwest::Method::PATCH, path, Some(body), ct).await
    }
    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.send(reqwest::Method::DELETE, path, None, "").await
    }
}

const PODS: &str = "/api/v1/namespaces/default/pods";

#[tokio::test]
async fn objects_are_created_read_updated_patched_and_deleted() {
    let s = start().await;
    let (code, created) = s.post(PODS, &pod("web-0", json!({"app": "web"}))).await;
    assert_eq!(code, StatusCode::CREATED, "{created}");
    let rv: u64 = created["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok()).expect("rv");
    assert!(created["metadata"]["uid"].as_str().is_some_and(|u| u.len() == 36));
    assert_eq!(created["status"]["phase"], "Pending");
    assert_eq!(created["spec"]["restartPolicy"], "Always", "defaults are applied");

    let (code, got) = s.get(&format!("{PODS}/web-0")).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(got, created);

    let (code, list) = s.get(PODS).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"][0]["metadata"]["name"], "web-0");
    assert!(list["metadata"]["resourceVersion"].as_str().is_some_and(|r| !r.is_empty()));

    // Update with the current resourceVersion wins; with the old one it is a conflict.
    let mut changed = got.clone();
    changed["metadata"]["labels"]["tier"] = json!("front");
    let (code, updated) = s.put(&format!("{PODS}/web-0"), &changed).await;
    assert_eq!(code, StatusCode::OK, "{updated}");
    let (code, status) = s.put(&format!("{PODS}/web-0"), &changed).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert_eq!(status["reason"], "Conflict");
    assert_eq!(status["kind"], "Status");

    let (code, merged) = s.patch(&format!("{PODS}/web-0"), &json!({"metadata": {"annotations": {"a": "1"}}}), "application/merge-patch+json").await;
    assert_eq!(code, StatusCode::OK, "{merged}");
    assert_eq!(merged["metadata"]["labels"]["tier"], "front");
    let (code, jp) = s.patch(&format!("{PODS}/web-0"),
        &json!([{"op": "replace", "path": "/metadata/annotations/a", "value": "2"}]), "application/json-patch+json").await;
    assert_eq!(code, StatusCode::OK, "{jp}");
    assert_eq!(jp["metadata"]["annotations"]["a"], "2");
    let jp_rv: u64 = jp["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok()).expect("rv");
    assert!(jp_rv > rv);

    let (code, _) = s.delete(&format!("{PODS}/web-0")).await;
    assert_eq!(code, StatusCode::OK);
    let (code, gone) = s.get(&format!("{PODS}/web-0")).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(gone["reason"], "NotFound");
    assert_eq!(gone["message"], "pods \"web-0\" not found");
}

#[tokio::test]
async fn status_and_spec_are_written_through_their_own_endpoints() {
    let s = start().await;
    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "minimal"}]}}}});
    let path = "/apis/apps/v1/namespaces/default/deployments";
    let (code, d) = s.post(path, &deploy).await;
    assert_eq!(code, StatusCode::CREATED, "{d}");
    assert_eq!(d["metadata"]["generation"], 1);

    // A status write through the main resource is ignored; through /status it lands.
    let mut with_status = d.clone();
    with_status["status"] = json!({"replicas": 3});
    with_status["metadata"]["labels"] = json!({"x": "y"});
    let (_, main) = s.put(&format!("{path}/web"), &with_status).await;
    assert!(main.get("status").is_none_or(|st| st.get("replicas").is_none()), "{main}");
    assert_eq!(main["metadata"]["generation"], 1, "metadata changes do not bump generation");
    let mut st = main.clone();
    st["status"] = json!({"replicas": 3, "observedGeneration": 1});
    let (code, after) = s.put(&format!("{path}/web/status"), &st).await;
    assert_eq!(code, StatusCode::OK, "{after}");
    assert_eq!(after["status"]["replicas"], 3);

    // Scale subresource: changes spec.replicas and bumps generation.
    let (code, scale) = s.get(&format!("{path}/web/scale")).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["spec"]["replicas"], 3);
    assert_eq!(scale["status"]["selector"], "app=web");
    let (code, scaled) = s.patch(&format!("{path}/web/scale"), &json!({"spec": {"replicas": 5}}), "application/merge-patch+json").await;
    assert_eq!(code, StatusCode::OK, "{scaled}");
    let (_, d) = s.get(&format!("{path}/web")).await;
    assert_eq!(d["spec"]["replicas"], 5);
    assert_eq!(d["metadata"]["generation"], 2);
    assert_eq!(d["status"]["replicas"], 3, "scaling keeps status");
}

#[tokio::test]
async fn a_pod_is_bound_once() {
    let s = start().await;
    s.post(PODS, &pod("p", json!({}))).await;
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}});
    let (code, _) = s.post(&format!("{PODS}/p/binding"), &binding).await;
    assert_eq!(code, StatusCode::CREATED);
    let (code, again) = s.post(&format!("{PODS}/p/binding"), &binding).await;
    assert_eq!(code, StatusCode::CONFLICT, "{again}");
    let (_, p) = s.get(&format!("{PODS}/p")).await;
    assert_eq!(p["spec"]["nodeName"], "n1");
    assert_eq!(p["status"]["conditions"][0]["type"], "PodScheduled");
    // A bound pod is deleted gracefully: marked, then removed when its agent says so.
    let (code, marked) = s.delete(&format!("{PODS}/p")).await;
    assert_eq!(code, StatusCode::ACCEPTED);
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    let (code, _) = s.delete(&format!("{PODS}/p?gracePeriodSeconds=0")).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(s.get(&format!("{PODS}/p")).await.0, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn finalizers_hold_an_object_until_they_are_removed() {
    let s = start().await;
    let mut p = pod("held", json!({}));
    p["metadata"]["finalizers"] = json!(["example.com/hold"]);
    s.post(PODS, &p).await;
    let (code, marked) = s.delete(&format!("{PODS}/held")).await;
    assert_eq!(code, StatusCode::ACCEPTED);
    assert!(marked["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(s.get(&format!("{PODS}/held")).await.0, StatusCode::OK, "still there");
    // Asking again with another propagation policy adds that policy's finalizer.
    let (code, again) = s.delete(&format!("{PODS}/held?propagationPolicy=Orphan")).await;
    assert_eq!(code, StatusCode::ACCEPTED);
    assert_eq!(again["metadata"]["finalizers"], json!(["example.com/hold", "orphan"]));
    assert_eq!(again["metadata"]["deletionTimestamp"], marked["metadata"]["deletionTimestamp"]);
    let (code, _) = s.patch(&format!("{PODS}/held"), &json!({"metadata": {"finalizers": null}}), "application/merge-patch+json").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(s.get(&format!("{PODS}/held")).await.0, StatusCode::NOT_FOUND, "gone once the last finalizer is removed");
}

#[tokio::test]
async fn lists_filter_by_labels_and_fields_and_page_with_continue() {
    let s = start().await;
    for i in 0..7 {
        let tier = if i % 2 == 0 { "front" } else { "back" };
        s.post(PODS, &pod(&format!("p{i}"), json!({"app": "web", "tier": tier}))).await;
    }
    let names = |v: &Value| -> Vec<String> {
        v["items"].as_array().expect("items").iter().map(|i| i["metadata"]["name"].as_str().unwrap_or("").to_string()).collect()
    };
    let (_, front) = s.get(&format!("{PODS}?labelSelector=tier%3Dfront")).await;
    assert_eq!(names(&front), ["p0", "p2", "p4", "p6"]);
    let (_, notin) = s.get(&format!("{PODS}?labelSelector=tier%20notin%20(front),app")).await;
    assert_eq!(names(&notin), ["p1", "p3", "p5"]);
    let (_, byname) = s.get(&format!("{PODS}?fieldSelector=metadata.name%3Dp3")).await;
    assert_eq!(names(&byname), ["p3"]);
    let (_, set) = s.get(&format!("{PODS}?fieldSelector=metadata.name%20in%20(p1,p5,gone),spec.nodeName%3D")).await;
    assert_eq!(names(&set), ["p1", "p5"], "a set of values, as an agent standing in for many nodes asks for its pods");
    let (code, bad) = s.get(&format!("{PODS}?fieldSelector=metadata.name%20in%20()")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}");
    let (_, unbound) = s.get("/api/v1/pods?fieldSelector=spec.nodeName%3D").await;
    assert_eq!(names(&unbound).len(), 7);
    for (name, uid) in [("e1", "u-1"), ("e2", "u-2")] {
        let ev = json!({"metadata": {"name": name}, "involvedObject": {"kind": "Pod", "name": "p3", "uid": uid},
            "reason": "Tested", "message": "m", "type": "Normal"});
        assert_eq!(s.post("/api/v1/namespaces/default/events", &ev).await.0, StatusCode::CREATED);
    }
    let (_, evs) = s.get("/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dp3,involvedObject.uid%3Du-2").await;
    assert_eq!(names(&evs), ["e2"], "kubectl describe selects an object's events this way");
    let (code, bad) = s.get(&format!("{PODS}?fieldSelector=spec.image%3Dx")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}");

    let mut all = Vec::new();
    let mut next = format!("{PODS}?limit=3");
    let mut pages = 0;
    loop {
        let (_, page) = s.get(&next).await;
        pages += 1;
        all.extend(names(&page));
        match page["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() => next = format!("{PODS}?limit=3&continue={c}"),
            _ => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(all, (0..7).map(|i| format!("p{i}")).collect::<Vec<_>>());
}

/// A list too large to render whole (here ~500 KB) is sent as it is rendered; it reads exactly
/// as the same objects listed in small pages do, with a selector and with a continue token too.
#[tokio::test]
async fn a_large_list_is_streamed_and_reads_as_its_small_pages_do() {
    let server = start().await;
    let s = &server;
    const CMS: &str = "/api/v1/namespaces/default/configmaps";
    let filler = "x".repeat(2_000);
    for i in 0..250 {
        let half = if i % 2 == 0 { "even" } else { "odd" };
        let cm = json!({"metadata": {"name": format!("cm-{i:03}"), "labels": {"half": half}}, "data": {"filler": filler, "i": i.to_string()}});
        assert_eq!(s.post(CMS, &cm).await.0, StatusCode::CREATED);
    }
    // An object written twice reads with its latest value and revision both ways.
    let (_, one) = s.get(&format!("{CMS}/cm-007")).await;
    let mut changed = one.clone();
    changed["data"]["i"] = json!("seven");
    assert_eq!(s.put(&format!("{CMS}/cm-007"), &changed).await.0, StatusCode::OK);

    let in_pages = |query: &'static str| async move {
        let (mut items, mut next) = (Vec::new(), String::new());
        loop {
            let (code, page) = s.get(&format!("{CMS}?limit=40{query}&continue={next}")).await;
            assert_eq!(code, StatusCode::OK, "{page}");
            items.extend(page["items"].as_array().expect("items").iter().cloned());
            match page["metadata"]["continue"].as_str() {
                Some(c) if !c.is_empty() => next = c.to_string(),
                _ => return items,
            }
        }
    };
    let streamed = |path: String| async move {
        let resp = s.http.get(s.url(&path)).send().await.expect("list");
        assert_eq!(resp.status(), StatusCode::OK);
        assert!(resp.headers().get("content-length").is_none(), "{path} was rendered whole before it was sent");
        resp.json::<Value>().await.expect("a list")
    };
    let all = streamed(CMS.to_string()).await;
    assert_eq!(all["kind"], "ConfigMapList");
    assert_eq!(all["metadata"]["resourceVersion"].as_str(), Some(s.store.revision().await.expect("rev").to_string().as_str()));
    let items = all["items"].as_array().expect("items");
    assert_eq!(items.len(), 250);
    assert_eq!(items, &in_pages("").await);
    assert_eq!(items[7]["data"]["i"], "seven");
    assert_eq!(items[7]["metadata"]["resourceVersion"], changed_rv(s, "cm-007").await);

    let even = streamed(format!("{CMS}?labelSelector=half%3Deven")).await;
    let even = even["items"].as_array().expect("items");
    assert_eq!(even.len(), 125);
    assert_eq!(even, &in_pages("&labelSelector=half%3Deven").await);

    let first = streamed(format!("{CMS}?limit=200")).await;
    assert_eq!(first["items"].as_array().expect("items")[..], items[..200]);
    let token = first["metadata"]["continue"].as_str().expect("a continue token");
    let (_, rest) = s.get(&format!("{CMS}?limit=200&continue={token}")).await;
    assert_eq!(rest["items"].as_array().expect("items")[..], items[200..]);
    assert!(rest["metadata"]["continue"].is_null(), "{}", rest["metadata"]);
}

async fn changed_rv(s: &Server, name: &str) -> Value {
    s.get(&format!("/api/v1/namespaces/default/configmaps/{name}")).await.1["metadata"]["resourceVersion"].clone()
}

async fn watch_lines(s: &Server, path: &str, n: usize) -> Vec<Value> {
    let resp = s.http.get(s.url(path)).send().await.expect("watch");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    while out.len() < n {
        let chunk = tokio::time::timeout(Duration::from_secs(5), body.next()).await.expect("event in time");
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
async fn watch_resumes_from_a_resource_version_without_gaps() {
    let s = start().await;
    let (_, list) = s.get(PODS).await;
    let start_rv = list["metadata"]["resourceVersion"].as_str().expect("rv").to_string();
    s.post(PODS, &pod("a", json!({"app": "x"}))).await;
    let (_, b) = s.post(PODS, &pod("b", json!({"app": "x"}))).await;
    s.patch(&format!("{PODS}/a"), &json!({"metadata": {"labels": {"v": "2"}}}), "application/merge-patch+json").await;
    s.delete(&format!("{PODS}/b")).await;

    let events = watch_lines(&s, &format!("{PODS}?watch=true&resourceVersion={start_rv}"), 4).await;
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap_or("")).collect();
    assert_eq!(kinds, ["ADDED", "ADDED", "MODIFIED", "DELETED"]);
    let revs: Vec<u64> = events.iter().map(|e| e["object"]["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok()).unwrap_or(0)).collect();
    assert!(revs.windows(2).all(|w| w[1] == w[0] + 1), "consecutive: {revs:?}");

    // Resuming from the second event replays exactly the rest.
    let from = b["metadata"]["resourceVersion"].as_str().expect("rv");
    let rest = watch_lines(&s, &format!("{PODS}?watch=true&resourceVersion={from}"), 2).await;
    assert_eq!(rest.iter().map(|e| e["type"].as_str().unwrap_or("")).collect::<Vec<_>>(), ["MODIFIED", "DELETED"]);

    // Without a resourceVersion the watch starts with the current state.
    let initial = watch_lines(&s, &format!("{PODS}?watch=true"), 1).await;
    assert_eq!(initial[0]["type"], "ADDED");
    assert_eq!(initial[0]["object"]["metadata"]["name"], "a");

    // A selector turns label changes into ADDED/DELETED for the watcher.
    let sel = watch_lines(&s, &format!("{PODS}?watch=true&resourceVersion={start_rv}&labelSelector=v%3D2"), 1).await;
    assert_eq!(sel[0]["type"], "ADDED");
    assert_eq!(sel[0]["object"]["metadata"]["labels"]["v"], "2");

    // Bookmarks and the initial-events marker.
    let stream = watch_lines(&s, &format!("{PODS}?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"), 2).await;
    assert_eq!(stream[1]["type"], "BOOKMARK");
    assert_eq!(stream[1]["object"]["kind"], "Pod");
    assert_eq!(stream[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
}

#[tokio::test]
async fn a_node_watch_sees_its_pods_bound_changed_and_deleted_and_nothing_of_other_nodes() {
    let s = start().await;
    let (_, list) = s.get(PODS).await;
    let rv0 = list["metadata"]["resourceVersion"].as_str().expect("rv").to_string();
    let node_watch = |from: String| {
        let url = s.url(&format!("/api/v1/pods?watch=true&resourceVersion={from}&fieldSelector=spec.nodeName%3Dn1"));
        let http = s.http.clone();
        async move {
            let resp = http.get(url).send().await.expect("watch");
            let mut body = resp.bytes_stream();
            let (mut buf, mut out) = (Vec::new(), Vec::<(String, String)>::new());
            while out.last().is_none_or(|(kind, _)| kind != "DELETED") {
                let chunk = tokio::time::timeout(Duration::from_secs(5), body.next()).await.expect("event in time");
                let Some(Ok(chunk)) = chunk else { break };
                buf.extend_from_slice(&chunk);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Value = serde_json::from_slice(&buf.drain(..=pos).collect::<Vec<_>>()).expect("json line");
                    let name = line["object"]["metadata"]["name"].as_str().unwrap_or("").to_string();
                    out.push((line["type"].as_str().unwrap_or("").to_string(), name));
                }
            }
            out
        }
    };
    let first = tokio::spawn(node_watch(rv0));
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.post(PODS, &pod("p", json!({}))).await;
    let mut elsewhere = pod("q", json!({}));
    elsewhere["spec"]["nodeName"] = json!("n2");
    s.post(PODS, &elsewhere).await;
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}});
    let (code, _) = s.post(&format!("{PODS}/p/binding"), &binding).await;
    assert_eq!(code, StatusCode::CREATED);
    let (_, bound) = s.get(&format!("{PODS}/p")).await;
    let bound_rv = bound["metadata"]["resourceVersion"].as_str().expect("rv").to_string();
    s.patch(&format!("{PODS}/q"), &json!({"metadata": {"labels": {"v": "2"}}}), "application/merge-patch+json").await;
    s.patch(&format!("{PODS}/p"), &json!({"metadata": {"labels": {"v": "2"}}}), "application/merge-patch+json").await;
    s.delete(&format!("{PODS}/q?gracePeriodSeconds=0")).await;
    s.delete(&format!("{PODS}/p?gracePeriodSeconds=0")).await;

    let seen = first.await.expect("watch task");
    assert!(seen.iter().all(|(_, name)| name == "p"), "only the pod bound to n1: {seen:?}");
    let kinds: Vec<&str> = seen.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"ADDED"), "bound is added: {kinds:?}");
    assert_eq!(kinds.get(1), Some(&"MODIFIED"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"DELETED"), "{kinds:?}");
    // Watching again from the binding gives exactly what followed it.
    let again = node_watch(bound_rv).await;
    assert_eq!(again, seen[1..], "resumed from the binding");
}

#[tokio::test]
async fn boolean_query_parameters_are_read_as_kubernetes_reads_them() {
    let s = start().await;
    s.post(PODS, &pod("a", json!({}))).await;
    // The Python client writes Python's booleans: `watch=True`.
    for on in ["True", "TRUE", "1", "yes"] {
        let events = watch_lines(&s, &format!("{PODS}?watch={on}&allowWatchBookmarks=True"), 1).await;
        assert_eq!(events[0]["type"], "ADDED", "watch={on}");
    }
    for off in ["False", "false", "0"] {
        let (code, list) = s.get(&format!("{PODS}?watch={off}")).await;
        assert_eq!((code, list["kind"].as_str()), (StatusCode::OK, Some("PodList")), "watch={off}");
    }
}

#[tokio::test]
async fn a_watch_from_before_the_history_gets_410_expired() {
    let s = start_with(HistoryLimits { max_events: 2, ..HistoryLimits::default() }, HttpConfig::default()).await;
    for i in 0..5 {
        s.post(PODS, &pod(&format!("p{i}"), json!({}))).await;
    }
    let events = watch_lines(&s, &format!("{PODS}?watch=true&resourceVersion=1"), 1).await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");
}

#[tokio::test]
async fn after_the_store_compacts_a_watch_or_exact_list_from_before_it_gets_410_expired() {
    let s = start().await;
    s.post(PODS, &pod("a", json!({}))).await;
    let (_, list) = s.get(PODS).await;
    let old: u64 = list["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).expect("rv");
    s.post(PODS, &pod("b", json!({}))).await;
    let now = s.store.revision().await.expect("revision");
    let (code, _) = s.get(&format!("{PODS}?resourceVersion={old}&resourceVersionMatch=Exact")).await;
    assert_eq!(code, StatusCode::OK, "before the compaction the old revision reads");
    s.store.compact(now).await.expect("compact");
    let events = watch_lines(&s, &format!("{PODS}?watch=true&resourceVersion={old}"), 1).await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    let (code, body) = s.get(&format!("{PODS}?resourceVersion={old}&resourceVersionMatch=Exact")).await;
    assert_eq!(code, StatusCode::GONE, "{body}");
    assert_eq!(body["reason"], "Expired");
    let (code, list) = s.get(&format!("{PODS}?resourceVersion={now}&resourceVersionMatch=Exact")).await;
    assert_eq!(code, StatusCode::OK, "the compacted revision itself still reads");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn every_rejection_says_why_and_writes_nothing() {
    let s = start_with(HistoryLimits::default(), HttpConfig { max_body_bytes: 4096, ..HttpConfig::default() }).await;
    s.post(PODS, &pod("exists", json!({}))).await;
    let before = s.store.revision().await.expect("revision");
    let raw = |body: &str| {
        let req = s.http.post(s.url(PODS)).header("content-type", "application/json").body(body.to_string());
        async move {
            let r = req.send().await.expect("send");
            (r.status(), r.json::<Value>().await.expect("status json"))
        }
    };

    let (code, st) = raw("{\"metadata\": {\"name\": \"x\"},\n  \"spec\": }").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(st["message"].as_str().is_some_and(|m| m.contains("line 2")), "{st}");

    let (code, st) = s.post(PODS, &pod("Bad_Name", json!({}))).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(st["details"]["causes"][0]["field"], "metadata.name");

    let mut unknown = pod("u", json!({}));
    unknown["spec"]["containers"][0]["imagee"] = json!("typo");
    let (code, st) = s.post(&format!("{PODS}?fieldValidation=Strict"), &unknown).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(st.to_string().contains("imagee"), "{st}");

    let mut vols = pod("v", json!({}));
    vols["spec"]["volumes"] = json!([{"name": "data", "nfs": {"server": "nfs.example", "path": "/"}}]);
    let (code, st) = s.post(PODS, &vols).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(st["details"]["causes"].as_array().expect("causes").iter().any(|c| c["field"] == "spec.volumes[0].nfs"), "{st}");

    let mut bad_label = pod("l", json!({"app": "has space"}));
    bad_label["spec"]["containers"][0]["ports"] = json!([{"containerPort": 70000}]);
    let (code, st) = s.post(PODS, &bad_label).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(st["details"]["causes"].as_array().map(Vec::len), Some(2), "both fields named: {st}");

    let (code, st) = s.post(PODS, &pod("exists", json!({}))).await;
    assert_eq!(code, StatusCode::CONFLICT);
    assert_eq!(st["reason"], "AlreadyExists");

    let mut other_ns = pod("o", json!({}));
    other_ns["metadata"]["namespace"] = json!("elsewhere");
    assert_eq!(s.post(PODS, &other_ns).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(s.post("/api/v1/namespaces/nope/pods", &pod("n", json!({}))).await.0, StatusCode::NOT_FOUND);

    let mut big = pod("big", json!({}));
    big["metadata"]["annotations"] = json!({"x": "y".repeat(5000)});
    let (code, st) = s.post(PODS, &big).await;
    assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(st["reason"], "RequestEntityTooLarge");

    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"replicas": -1, "selector": {"matchLabels": {"app": "a"}},
            "template": {"metadata": {"labels": {"app": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    let (code, st) = s.post("/apis/apps/v1/namespaces/default/deployments", &deploy).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    let fields: Vec<&str> = st["details"]["causes"].as_array().expect("causes").iter().filter_map(|c| c["field"].as_str()).collect();
    assert!(fields.contains(&"spec.replicas"), "{fields:?}");
    assert!(fields.iter().any(|f| f.starts_with("spec.template.metadata.labels") || f.starts_with("spec.selector")), "{fields:?}");

    let (code, st) = s.patch(&format!("{PODS}/exists"), &json!({"metadata": {"name": "x"}}), "application/apply-patch+yaml").await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "an apply names its field manager: {st}");
    let (code, st) = s.patch(&format!("{PODS}/exists"), &json!({"metadata": {"name": "x"}}), "application/apply-patch+cbor").await;
    assert_eq!(code, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{st}");
    let (code, _) = s.get("/apis/apps/v1/namespaces/default/widgets").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    let (code, st) = s.send(reqwest::Method::PUT, PODS, Some(&json!({})), "application/json").await;
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED, "{st}");
    let (code, _) = s.delete(&format!("{PODS}/exists?propagationPolicy=Sideways")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);

    assert_eq!(s.store.revision().await.expect("revision"), before, "no rejected request wrote anything");
}

#[tokio::test]
async fn discovery_names_resources_with_short_names_and_subresources() {
    let s = start().await;
    let (_, core) = s.get("/api/v1").await;
    let pods = core["resources"].as_array().expect("resources").iter().find(|r| r["name"] == "pods").expect("pods").clone();
    assert_eq!(pods["shortNames"], json!(["po"]));
    assert!(pods["verbs"].as_array().expect("verbs").contains(&json!("watch")));
    let (_, apps) = s.get("/apis/apps/v1").await;
    let names: Vec<&str> = apps["resources"].as_array().expect("resources").iter().filter_map(|r| r["name"].as_str()).collect();
    assert!(names.contains(&"deployments/scale") && names.contains(&"replicasets/status"), "{names:?}");
    let (_, groups) = s.get("/apis").await;
    let group_names: Vec<&str> = groups["groups"].as_array().expect("groups").iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(group_names.len(), 11, "{group_names:?}");
    assert!(
        ["autoscaling", "metrics.k8s.io", "certificates.k8s.io"].iter().all(|g| group_names.contains(g)),
        "{group_names:?}"
    );
    let (_, lease) = s.get("/apis/coordination.k8s.io/v1").await;
    assert_eq!(lease["resources"][0]["name"], "leases");
    let (code, v) = s.get("/version").await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(v["major"], "1");
}

#[tokio::test]
async fn metrics_count_requests_watches_and_objects() {
    let s = start().await;
    s.post(PODS, &pod("m", json!({}))).await;
    s.get(&format!("{PODS}/nope")).await;
    let text = s.http.get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(text.contains(r#"apiserver_request_total{verb="POST",resource="pods",code="201"} 1"#), "{text}");
    assert!(text.contains(r#"apiserver_request_total{verb="GET",resource="pods",code="404"} 1"#));
    assert!(text.contains(r#"apiserver_storage_objects{resource="pods"} 1"#));
    assert!(text.contains("shepherd_store_write_duration_seconds_bucket"));
    assert!(text.contains("apiserver_open_watches 0"));
}

#[tokio::test]
async fn a_token_is_required_when_configured() {
    let s = start_with(HistoryLimits::default(), HttpConfig { token: Some("s3cret".into()), ..HttpConfig::default() }).await;
    assert_eq!(s.get(PODS).await.0, StatusCode::UNAUTHORIZED);
    let ok = s.http.get(s.url(PODS)).bearer_auth("s3cret").send().await.expect("get");
    assert_eq!(ok.status(), StatusCode::OK);
}
