//! An HTTP fuzzer: random create, update, patch (every type) and dry-run delete requests of every
//! kind against a real server on loopback. No request may panic or get a 5xx, and a refused one
//! writes nothing. Runs for `SHEPHERD_FUZZ_SECONDS` (default 10) seconds. Every request is
//! authenticated, as an administrator or as a user holding `edit` in the namespace, on a server
//! that issues ServiceAccount tokens: authorization and every admission step run, the token
//! mounting included.

mod common;

use std::time::{Duration, Instant};

use common::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use reqwest::Method;
use serde_json::{Map, Value, json};

const APPLY: &str = "application/apply-patch+yaml";

/// A kind under test: its collection path and a valid object of it named `fz`.
struct Kind {
    collection: &'static str,
    subresources: &'static [&'static str],
    seed: fn() -> Value,
}

const KINDS: &[Kind] = &[
    Kind { collection: PODS, subresources: &["", "/status"], seed: || pod("fz") },
    Kind { collection: DEPLOYMENTS, subresources: &["", "/status", "/scale"], seed: || deployment("fz") },
    Kind {
        collection: "/apis/apps/v1/namespaces/default/replicasets",
        subresources: &["", "/status", "/scale"],
        seed: || {
            let mut d = deployment("fz");
            d["kind"] = json!("ReplicaSet");
            if let Some(spec) = d["spec"].as_object_mut() {
                spec.remove("strategy");
            }
            d
        },
    },
    Kind {
        collection: "/api/v1/namespaces/default/services",
        subresources: &["", "/status"],
        seed: || json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "fz"},
            "spec": {"selector": {"app": "fz"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    },
    Kind {
        collection: "/api/v1/namespaces/default/endpoints",
        subresources: &[""],
        seed: || json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "fz"},
            "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]}),
    },
    Kind {
        collection: "/api/v1/namespaces",
        subresources: &["", "/status"],
        seed: || json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fz"}}),
    },
    Kind {
        collection: "/api/v1/nodes",
        subresources: &["", "/status"],
        seed: || json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "fz", "labels": {"a": "b"}}}),
    },
    Kind {
        collection: "/api/v1/namespaces/default/events",
        subresources: &[""],
        seed: || json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "fz"},
            "involvedObject": {"kind": "Pod", "name": "fz", "namespace": "default"}, "reason": "Tested", "message": "m"}),
    },
    Kind {
        collection: "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        subresources: &[""],
        seed: || json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "fz"},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 10}}),
    },
    Kind {
        collection: "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
        subresources: &[""],
        seed: || json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "fz"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}),
    },
    Kind {
        collection: "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        subresources: &[""],
        seed: || json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "fz"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "name": "fz"}]}),
    },
];

/// Field names that reach deep into real objects, beside random ones.
const KEYS: &[&str] = &[
    "metadata", "spec", "status", "name", "namespace", "labels", "annotations", "finalizers", "uid",
    "resourceVersion", "generation", "deletionTimestamp", "ownerReferences", "apiVersion", "kind", "containers",
    "image", "ports", "containerPort", "port", "targetPort", "replicas", "selector", "matchLabels",
    "matchExpressions", "template", "strategy", "rollingUpdate", "maxSurge", "nodeName", "phase", "conditions",
    "resources", "limits", "cpu", "memory", "env", "value", "livenessProbe", "httpGet", "subsets", "addresses",
    "ip", "clusterIP", "type", "holderIdentity", "involvedObject", "taints", "volumes", "$patch",
    "$setElementOrder/containers", "",
];

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(KEYS).prop_map(str::to_string),
        1 => "\\PC{0,8}",
        1 => "[a-z~/.]{0,4}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop_oneof![Just(json!(0)), Just(json!(-1)), Just(json!(65536)), Just(json!(1e308)), Just(json!(u64::MAX)),
            Just(json!(i64::MIN)), Just(json!(0.5))],
        "\\PC{0,24}".prop_map(Value::from),
        prop_oneof![Just(""), Just("minimal"), Just("web"), Just("100m"), Just("1Gi"), Just("25%"), Just("Always"),
            Just("delete"), Just("replace"), Just("10.0.0.1"), Just("2026-01-01T00:00:00Z")]
        .prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..5)
                .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

/// An object nested `depth` levels deep: past the parser's limit at 128.
fn deep(depth: usize) -> Value {
    (0..depth).fold(json!(1), |v, i| if i % 2 == 0 { json!({"a": v}) } else { json!([v]) })
}

/// One change to a valid object: set or remove the value at one of its paths (chosen by index
/// among the paths the object has, or a new key under one of them).
#[derive(Debug, Clone)]
enum Edit {
    Set { at: usize, new_key: Option<String>, value: Value },
    Remove { at: usize },
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<usize>(), proptest::option::of(key()), value()).prop_map(|(at, new_key, value)| Edit::Set { at, new_key, value }),
        1 => (any::<usize>(), proptest::option::of(key()), (100usize..140).prop_map(deep))
            .prop_map(|(at, new_key, value)| Edit::Set { at, new_key, value }),
        1 => any::<usize>().prop_map(|at| Edit::Remove { at }),
    ]
}

/// Every JSON pointer inside `v`, the root ("") first.
fn pointers(v: &Value) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        match v.pointer(&p) {
            Some(Value::Object(m)) => {
                out.extend(m.keys().map(|k| format!("{p}/{}", k.replace('~', "~0").replace('/', "~1"))))
            }
            Some(Value::Array(a)) => out.extend((0..a.len()).map(|n| format!("{p}/{n}"))),
            _ => {}
        }
        i += 1;
    }
    out
}

fn apply_edits(mut obj: Value, edits: &[Edit]) -> Value {
    for e in edits {
        let paths = pointers(&obj);
        match e {
            Edit::Set { at, new_key, value } => {
                let p = &paths[at % paths.len()];
                let Some(target) = obj.pointer_mut(p) else { continue };
                match (new_key, target.as_object_mut()) {
                    (Some(k), Some(m)) => {
                        m.insert(k.clone(), value.clone());
                    }
                    _ => *target = value.clone(),
                }
            }
            Edit::Remove { at } => {
                let p = &paths[at % paths.len()];
                if let Some((parent, last)) = p.rsplit_once('/')
                    && let Some(t) = obj.pointer_mut(parent)
                {
                    let last = last.replace("~1", "/").replace("~0", "~");
                    match t {
                        Value::Object(m) => {
                            m.remove(&last);
                        }
                        Value::Array(a) => {
                            if let Ok(n) = last.parse::<usize>()
                                && n < a.len()
                            {
                                a.remove(n);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    obj
}

/// A JSON patch operation with paths that hit real fields, the root, and nonsense.
fn json_patch_op() -> impl Strategy<Value = Value> {
    let path = prop_oneof![
        1 => prop_oneof![Just("".to_string()), Just("/".to_string())],
        2 => json_patch_path(),
    ];
    let op = proptest::sample::select(&["add", "remove", "replace", "move", "copy", "test", "bogus"][..]);
    (op, path.clone(), path, value(), any::<u8>()).prop_map(|(op, path, from, value, shape)| {
        let mut o = json!({"op": op, "path": path, "from": from, "value": value});
        // Sometimes leave fields out or give them the wrong type.
        match shape % 8 {
            0 => {
                if let Some(m) = o.as_object_mut() {
                    m.remove("value");
                }
            }
            1 => o["path"] = json!(7),
            2 => {
                if let Some(m) = o.as_object_mut() {
                    m.remove("from");
                }
            }
            _ => {}
        }
        o
    })
}

fn json_patch_path() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("".to_string()), Just("/".to_string()), Just("/metadata".to_string()),
        Just("/metadata/labels/a".to_string()), Just("/metadata/annotations".to_string()), Just("/spec".to_string()),
        Just("/spec/replicas".to_string()), Just("/spec/containers/0/image".to_string()),
        Just("/spec/containers/-".to_string()), Just("/spec/template/spec/containers/0".to_string()),
        Just("/status".to_string()), Just("/kind".to_string()), Just("/apiVersion".to_string()),
        Just("/metadata/name".to_string()), Just("/spec/ports/0/port".to_string()), Just("/subsets/0".to_string()),
        Just("/a~1b/~0".to_string()), Just("/spec/containers/99".to_string()), Just("/spec/containers/01".to_string()),
        proptest::collection::vec(key(), 1..4).prop_map(|ks| ks.iter().map(|k| format!("/{k}")).collect()),
        "\\PC{0,10}",
    ]
}

#[derive(Debug, Clone)]
enum Body {
    Json(Value),
    Raw(String),
}

#[derive(Debug, Clone)]
struct Case {
    kind: usize,
    method: Method,
    sub: usize,
    content_type: &'static str,
    query: &'static str,
    /// Which of a few names a create uses: new ones succeed, repeated ones already exist.
    name: u8,
    /// For updates and merge patches: edits of the current object; for JSON patches: ignored.
    edits: Vec<Edit>,
    body: Option<Body>,
}

fn case() -> impl Strategy<Value = Case> {
    let query = proptest::sample::select(
        &["", "", "?fieldValidation=Strict", "?fieldValidation=Ignore", "?dryRun=All", "?dryRun=All&fieldValidation=Strict",
            "?dryRun=bogus", "?fieldValidation=Warn"][..],
    );
    let kind = 0..KINDS.len();
    let body = prop_oneof![
        6 => Just(None),
        1 => proptest::collection::vec(json_patch_op(), 0..6).prop_map(|ops| Some(Body::Json(Value::Array(ops)))),
        1 => value().prop_map(|v| Some(Body::Json(v))),
        1 => "\\PC{0,40}".prop_map(|s| Some(Body::Raw(s))),
        1 => (100usize..200).prop_map(|d| Some(Body::Json(deep(d)))),
    ];
    let verb = proptest::sample::select(vec![
        (Method::POST, "application/json"),
        (Method::PUT, "application/json"),
        (Method::PATCH, MERGE),
        (Method::PATCH, STRATEGIC),
        (Method::PATCH, JSON_PATCH),
        (Method::PATCH, JSON_PATCH),
        (Method::PATCH, APPLY),
        // Always a dry run (below), so the objects under test stay.
        (Method::DELETE, "application/json"),
    ]);
    let ops = proptest::collection::vec(json_patch_op(), 1..6);
    (kind, verb, any::<usize>(), query, any::<u8>(), proptest::collection::vec(edit(), 0..4), body, ops).prop_map(
        |(kind, (method, content_type), sub, query, name, edits, body, ops)| {
            let body = match (content_type, body) {
                // A JSON patch is most often a list of operations.
                (JSON_PATCH, None) => Some(Body::Json(Value::Array(ops))),
                (_, b) => b,
            };
            let query = if method == Method::DELETE { "?dryRun=All" } else { query };
            Case { kind, method, sub, content_type, query, name, edits, body }
        },
    )
}

struct Fuzz {
    server: Server,
    rt: tokio::runtime::Runtime,
    /// How many answers of each status code, to show the fuzzer gets past validation.
    codes: std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
}

impl Fuzz {
    fn run(&self, c: &Case) -> Result<(), TestCaseError> {
        let kind = &KINDS[c.kind];
        let object = format!("{}/fz", kind.collection);
        let sub = if c.method == Method::POST || c.method == Method::DELETE { "" } else { kind.subresources[c.sub % kind.subresources.len()] };
        let apply = c.content_type == APPLY;
        let query = match (apply, c.query) {
            (true, "") => "?fieldManager=fuzz&force=true".to_string(),
            (true, q) => format!("{q}&fieldManager=fuzz&force=true"),
            (false, q) => q.to_string(),
        };
        let path = format!("{}{sub}{query}", if c.method == Method::POST { kind.collection } else { &object });
        self.rt.block_on(async {
            let base = match c.method {
                Method::POST => {
                    let mut seed = (kind.seed)();
                    seed["metadata"]["name"] = json!(format!("fz{}", c.name % 64));
                    seed
                }
                _ => {
                    let mut current = self.server.get(&format!("{object}{sub}")).await.body;
                    if apply && let Some(m) = current.get_mut("metadata").and_then(Value::as_object_mut) {
                        // An applied configuration carries no managedFields.
                        m.remove("managedFields");
                    }
                    current
                }
            };
            let body = match &c.body {
                Some(Body::Raw(s)) => s.clone(),
                Some(Body::Json(v)) => v.to_string(),
                None if c.method == Method::DELETE => {
                    // DeleteOptions with random fields.
                    apply_edits(json!({"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                        "preconditions": {"uid": "x"}, "propagationPolicy": "Orphan", "dryRun": []}), &c.edits).to_string()
                }
                None if c.method == Method::PATCH && !apply => {
                    // A merge patch made of the edits, applied to nothing: random fields only.
                    apply_edits(json!({"metadata": {}}), &c.edits).to_string()
                }
                None => apply_edits(base, &c.edits).to_string(),
            };
            let before = self.server.store.revision().await.expect("revision");
            let (user, groups) = if c.name % 2 == 0 { ("fuzz-admin", "system:masters") } else { ("fuzz-editor", "") };
            let request = self.server.http.request(c.method.clone(), self.server.url(&path))
                .header("content-type", c.content_type)
                .header(TEST_USER, user)
                .header(TEST_GROUPS, groups)
                .body(body.clone());
            let resp = request.send().await.map_err(|e| {
                TestCaseError::fail(format!("{} {path}: no response ({e}); body {body}", c.method))
            })?;
            let code = resp.status();
            if let Ok(mut codes) = self.codes.lock() {
                *codes.entry(code.as_u16()).or_default() += 1;
            }
            let text = resp.text().await.map_err(|e| TestCaseError::fail(format!("reading the response: {e}")))?;
            let after = self.server.store.revision().await.expect("revision");
            if code.is_server_error() {
                return Err(TestCaseError::fail(format!("{} {path} -> {code} {text}; body {body}", c.method)));
            }
            if (code.is_client_error() || c.query.contains("dryRun=All")) && after != before {
                return Err(TestCaseError::fail(format!(
                    "{} {path} -> {code} wrote revision {after} (was {before}); body {body}",
                    c.method
                )));
            }
            Ok(())
        })
    }
}

#[test]
fn random_writes_never_panic_never_5xx_and_refusals_write_nothing() {
    let seconds: u64 = std::env::var("SHEPHERD_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let server = rt.block_on(async {
        let s = start_issuing_tokens().await;
        for k in KINDS {
            s.create(k.collection, &(k.seed)()).await;
        }
        let edit = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "fuzz-editor"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "fuzz-editor"}]});
        s.create("/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings", &edit).await;
        s
    });
    let fuzz = Fuzz { server, rt, codes: Default::default() };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut cases = 0u64;
    // Batches of cases until the time is up; a failure is shrunk to a small request and shown.
    while Instant::now() < deadline {
        let mut runner = TestRunner::new(Config { cases: 64, failure_persistence: None, ..Config::default() });
        match runner.run(&case(), |c| fuzz.run(&c)) {
            Ok(()) => cases += 64,
            Err(TestError::Fail(why, c)) => panic!("after {cases} cases: {why}\nminimal case: {c:#?}"),
            Err(TestError::Abort(why)) => panic!("fuzzer aborted: {why}"),
        }
    }
    let (code, health) = fuzz.rt.block_on(async {
        let r = fuzz.server.get(PODS).await;
        (r.code, r.body)
    });
    assert!(code.is_success(), "the server still serves after {cases} cases: {health}");
    let codes = fuzz.codes.lock().map(|c| format!("{c:?}")).unwrap_or_default();
    eprintln!("{cases} fuzzed requests in {seconds} s (status codes: {codes}): no panic, no 5xx, no refused write");
}
