//! The Kubernetes schema of each kind, walked over the decoded object where it lies.
//!
//! Reading an object through its k8s-openapi type and serializing it back (the round trip in the
//! parent module) builds two full copies of it to learn two things: whether every value has the
//! JSON type the schema gives it, and which fields the schema does not know. The same types
//! describe themselves as JSON schemas (k8s-openapi's `schemars` feature); compiled once, such a
//! description answers both questions while walking the `Value`, without building anything but
//! the paths of unknown fields.
//!
//! The walk only ever vouches for an object: where it cannot be sure that the typed form reads a
//! value as it would (a value of the wrong type, a null inside a list, a missing required field,
//! a definition of more than one form), it says [`Reading::Doubt`], and the typed form decides,
//! giving the cause and message it always gave. Leaf types with rules of their own (quantities,
//! timestamps, int-or-string, base64) are judged by their own `Deserialize`, on the borrowed value.

use std::collections::HashMap;
use std::fmt::Write;
use std::sync::OnceLock;

use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::{KindType, for_kind};
use crate::kinds::{self, ResourceInfo};

const REF_PREFIX: &str = "#/definitions/";

/// What the walk made of an object.
#[derive(Debug)]
pub(super) enum Reading {
    /// The kind has no schema: nothing to check.
    NoSchema,
    /// The typed form reads the object, dropping these fields (in the order the round trip
    /// found them).
    Fits(Vec<Unknown>),
    /// The walk cannot vouch for the object; the typed form decides.
    Doubt,
}

/// A field the schema does not know: its path (`spec.containers[0].imagee`) and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unknown {
    pub(super) path: String,
    key_at: usize,
}

impl Unknown {
    pub(super) fn key(&self) -> &str {
        &self.path[self.key_at..]
    }
}

enum Node {
    /// A k8s-openapi struct: fields it does not know are dropped, a null field is an absent one.
    /// `required` fields may be refused when missing (a few types do), so their absence is a doubt.
    Struct { fields: HashMap<String, usize>, required: Vec<String> },
    Array(usize),
    Map(usize),
    Str,
    Bool,
    Int32,
    Int64,
    Number,
    /// A type with rules of its own, asked directly.
    Leaf(fn(&Value) -> bool),
    /// Whatever the walk does not describe.
    Doubt,
}

struct Schemas {
    nodes: Vec<Node>,
    roots: HashMap<String, usize>,
}

fn reads_as<T: DeserializeOwned>(v: &Value) -> bool {
    T::deserialize(v).is_ok()
}

/// For the types that wrap any JSON value (`FieldsV1`, `RawExtension`, `JSON`): asking them would
/// only copy the value.
fn any_value(_: &Value) -> bool {
    true
}

/// Definitions whose values a type of its own reads: the schema says little (`type: object`,
/// `x-kubernetes-int-or-string`) or less than the type checks (a timestamp's syntax).
fn leaf_definition(name: &str) -> Option<fn(&Value) -> bool> {
    Some(match name {
        "io.k8s.apimachinery.pkg.api.resource.Quantity" => reads_as::<Quantity>,
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString" => reads_as::<IntOrString>,
        "io.k8s.apimachinery.pkg.apis.meta.v1.Time" => reads_as::<Time>,
        "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime" => reads_as::<MicroTime>,
        "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1"
        | "io.k8s.apimachinery.pkg.runtime.RawExtension"
        | "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSON" => any_value,
        _ => return None,
    })
}

struct RootName;

impl KindType for RootName {
    type Out = std::borrow::Cow<'static, str>;
    fn of<T: DeserializeOwned + serde::Serialize + JsonSchema>(self) -> Self::Out {
        T::schema_name()
    }
}

struct Describe<'a>(&'a mut SchemaGenerator);

impl KindType for Describe<'_> {
    type Out = ();
    fn of<T: DeserializeOwned + serde::Serialize + JsonSchema>(self) {
        self.0.subschema_for::<T>();
    }
}

fn schemas() -> &'static Schemas {
    static SCHEMAS: OnceLock<Schemas> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let mut settings = SchemaSettings::draft07();
        settings.transforms.clear();
        settings.meta_schema = None;
        let mut generator = settings.into_generator();
        let mut names = Vec::new();
        for res in kinds::ALL {
            for_kind(res, Describe(&mut generator));
            names.extend(for_kind(res, RootName));
        }
        let defs = generator.take_definitions(false);
        let mut c = Compiler { defs: &defs, nodes: Vec::new(), by_name: HashMap::new() };
        let mut roots = HashMap::new();
        for name in names {
            let root = c.definition(&name);
            roots.insert(name.into_owned(), root);
        }
        Schemas { nodes: c.nodes, roots }
    })
}

struct Compiler<'a> {
    defs: &'a Map<String, Value>,
    nodes: Vec<Node>,
    by_name: HashMap<String, usize>,
}

impl Compiler<'_> {
    fn push(&mut self, node: Node) -> usize {
        self.nodes.push(node);
        self.nodes.len() - 1
    }

    fn definition(&mut self, name: &str) -> usize {
        if let Some(&n) = self.by_name.get(name) {
            return n;
        }
        // Reserved before the body is compiled: definitions refer to themselves (JSONSchemaProps).
        let n = self.push(Node::Doubt);
        self.by_name.insert(name.to_string(), n);
        let node = match (leaf_definition(name), self.defs.get(name)) {
            (Some(leaf), _) => Node::Leaf(leaf),
            (None, Some(def)) => self.body(def),
            (None, None) => Node::Doubt,
        };
        self.nodes[n] = node;
        n
    }

    fn schema(&mut self, s: &Value) -> usize {
        if let Some(name) = s.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix(REF_PREFIX)) {
            return self.definition(name);
        }
        let node = self.body(s);
        self.push(node)
    }

    fn body(&mut self, s: &Value) -> Node {
        if ["$ref", "oneOf", "anyOf", "allOf", "x-kubernetes-int-or-string"].iter().any(|k| s.get(k).is_some()) {
            return Node::Doubt;
        }
        let format = s.get("format").and_then(Value::as_str);
        match (s.get("type").and_then(Value::as_str), format) {
            (Some("object"), None) => match (s.get("properties"), s.get("additionalProperties")) {
                (Some(Value::Object(props)), None) => {
                    let fields = props.iter().map(|(k, p)| (k.clone(), self.schema(p))).collect();
                    let required = match s.get("required") {
                        Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).map(str::to_string).collect(),
                        _ => Vec::new(),
                    };
                    Node::Struct { fields, required }
                }
                (None, Some(items)) if items.is_object() => Node::Map(self.schema(items)),
                // An object with no fields described: a free-form value or an empty struct.
                _ => Node::Doubt,
            },
            (Some("array"), None) => match s.get("items") {
                Some(items) if items.is_object() => Node::Array(self.schema(items)),
                _ => Node::Doubt,
            },
            (Some("string"), None) => Node::Str,
            (Some("string"), Some("byte")) => Node::Leaf(reads_as::<ByteString>),
            (Some("boolean"), None) => Node::Bool,
            (Some("integer"), Some("int32")) => Node::Int32,
            (Some("integer"), Some("int64")) => Node::Int64,
            (Some("number"), Some("double")) => Node::Number,
            _ => Node::Doubt,
        }
    }
}

/// Walks `obj` against the schema of `res`. Its `apiVersion` and `kind` were matched by routing
/// (the typed forms never see others), so they are not looked at.
pub(super) fn read(res: &ResourceInfo, obj: &Value) -> Reading {
    let Some(name) = for_kind(res, RootName) else { return Reading::NoSchema };
    let s = schemas();
    let Some(&root) = s.roots.get(name.as_ref()) else { return Reading::Doubt };
    let mut walk = Walk { nodes: &s.nodes, path: String::new(), unknown: Vec::new() };
    if walk.object(root, obj, true) { Reading::Fits(walk.unknown) } else { Reading::Doubt }
}

struct Walk<'a> {
    nodes: &'a [Node],
    /// The path of the value being looked at, grown and cut back as the walk goes.
    path: String,
    unknown: Vec<Unknown>,
}

impl Walk<'_> {
    fn enter_key(&mut self, key: &str) -> usize {
        let at = self.path.len();
        if at > 0 {
            self.path.push('.');
        }
        self.path.push_str(key);
        at
    }

    fn enter_index(&mut self, i: usize) -> usize {
        let at = self.path.len();
        let _ = write!(self.path, "[{i}]");
        at
    }

    fn object(&mut self, node: usize, v: &Value, top: bool) -> bool {
        let nodes = self.nodes;
        let Node::Struct { fields, required } = &nodes[node] else { return self.value(node, v) };
        let Value::Object(m) = v else { return false };
        if required.iter().any(|r| m.get(r).is_none_or(Value::is_null)) {
            return false;
        }
        for (k, fv) in m {
            if fv.is_null() || (top && (k == "apiVersion" || k == "kind")) {
                continue;
            }
            let at = self.enter_key(k);
            let ok = match fields.get(k) {
                Some(&f) => self.value(f, fv),
                None => {
                    let key_at = self.path.len() - k.len();
                    self.unknown.push(Unknown { path: self.path.clone(), key_at });
                    true
                }
            };
            self.path.truncate(at);
            if !ok {
                return false;
            }
        }
        true
    }

    fn value(&mut self, node: usize, v: &Value) -> bool {
        let nodes = self.nodes;
        match (&nodes[node], v) {
            (Node::Struct { .. }, _) => self.object(node, v, false),
            // A null in a list or as a map's value is read by the element type, which mostly refuses it.
            (_, Value::Null) => false,
            (&Node::Array(item), Value::Array(a)) => a.iter().enumerate().all(|(i, e)| {
                let at = self.enter_index(i);
                let ok = self.value(item, e);
                self.path.truncate(at);
                ok
            }),
            (&Node::Map(item), Value::Object(m)) => m.iter().all(|(k, e)| {
                let at = self.enter_key(k);
                let ok = self.value(item, e);
                self.path.truncate(at);
                ok
            }),
            (Node::Str, Value::String(_)) | (Node::Bool, Value::Bool(_)) | (Node::Number, Value::Number(_)) => true,
            (Node::Int32, Value::Number(n)) => n.as_i64().is_some_and(|i| i32::try_from(i).is_ok()),
            (Node::Int64, Value::Number(n)) => n.as_i64().is_some(),
            (Node::Leaf(reads), v) => reads(v),
            _ => false,
        }
    }
}

/// Removes the fields [`read`] found unknown in an object it vouched for.
pub(super) fn prune(res: &ResourceInfo, obj: &mut Value) {
    let Some(name) = for_kind(res, RootName) else { return };
    let s = schemas();
    if let Some(&root) = s.roots.get(name.as_ref()) {
        prune_node(&s.nodes, root, obj, true);
    }
}

fn prune_node(nodes: &[Node], node: usize, v: &mut Value, top: bool) {
    match (&nodes[node], v) {
        (Node::Struct { fields, .. }, Value::Object(m)) => m.retain(|k, fv| {
            if fv.is_null() || (top && (k == "apiVersion" || k == "kind")) {
                return true;
            }
            match fields.get(k) {
                Some(&f) => {
                    prune_node(nodes, f, fv, false);
                    true
                }
                None => false,
            }
        }),
        (&Node::Array(item), Value::Array(a)) => a.iter_mut().for_each(|e| prune_node(nodes, item, e, false)),
        (&Node::Map(item), Value::Object(m)) => m.values_mut().for_each(|e| prune_node(nodes, item, e, false)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{Reading, read};
    use crate::error::Cause;
    use crate::kinds::{self, ResourceInfo};
    use crate::validation::{Schema, check_schema, check_schema_typed, prune_and_check, prune_and_check_typed};

    /// What the schema check makes of an object: its causes, and what `fieldValidation` pruning
    /// reports, leaves and concludes.
    type Outcome = (Vec<Cause>, Vec<String>, Schema, Value);

    fn by_walk(res: &ResourceInfo, obj: &Value) -> Outcome {
        let mut c = Vec::new();
        check_schema(res, obj, &mut c);
        let mut pruned = obj.clone();
        let (unknown, schema) = prune_and_check(res, &mut pruned);
        (c, unknown, schema, pruned)
    }

    fn by_round_trip(res: &ResourceInfo, obj: &Value) -> Outcome {
        let mut c = Vec::new();
        check_schema_typed(res, obj, &mut c);
        let mut pruned = obj.clone();
        let (unknown, schema) = prune_and_check_typed(res, &mut pruned);
        (c, unknown, schema, pruned)
    }

    fn res_of(obj: &Value) -> &'static ResourceInfo {
        let kind = obj["kind"].as_str().unwrap_or("");
        kinds::ALL.iter().find(|r| r.kind == kind).unwrap_or_else(|| panic!("no kind {kind}"))
    }

    use crate::fixtures::full_meta as meta;

    fn pod_spec() -> Value {
        json!({
            "containers": [{
                "name": "web", "image": "minimal", "args": ["serve"], "command": ["/bin/app"],
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                "env": [{"name": "A", "value": "1"},
                    {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "b", "optional": false}}}],
                "envFrom": [{"secretRef": {"name": "creds"}}],
                "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": 1}},
                "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": true}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
                "livenessProbe": {"tcpSocket": {"port": 8080}, "initialDelaySeconds": 3},
                "securityContext": {"runAsUser": 1000, "capabilities": {"drop": ["ALL"]}},
                "imagePullPolicy": "IfNotPresent"}],
            "volumes": [{"name": "data", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "cfg", "configMap": {"name": "cfg", "defaultMode": 420, "items": [{"key": "a", "path": "a"}]}}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "nodeSelector": {"disk": "ssd"}, "serviceAccountName": "default", "nodeName": "node-1",
            "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                "tolerationSeconds": 300}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms":
                [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}},
        })
    }

    fn template() -> Value {
        json!({"metadata": {"labels": {"app": "web"}}, "spec": pod_spec()})
    }

    #[test]
    fn the_corpus_has_every_kind_with_a_schema() {
        let kinds: std::collections::BTreeSet<&str> = corpus().iter().map(|o| res_of(o).kind).collect();
        for res in kinds::ALL {
            let has_schema = !matches!(read(res, &json!({})), Reading::NoSchema);
            assert_eq!(kinds.contains(res.kind), has_schema, "{}", res.kind);
        }
    }

    /// A realistic object of every kind with a schema, as clients and controllers write them.
    fn corpus() -> Vec<Value> {
        let selector = json!({"matchLabels": {"app": "web"}});
        let conditions = json!([{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-30T10:00:03Z"}]);
        vec![
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta("web-0"), "spec": pod_spec(),
                "status": {"phase": "Running", "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}],
                    "startTime": "2026-11-30T10:00:02Z", "conditions": conditions,
                    "containerStatuses": [{"name": "web", "ready": true, "restartCount": 2, "image": "minimal",
                        "imageID": "sha256:abc", "state": {"running": {"startedAt": "2026-11-30T10:00:02Z"}},
                        "lastState": {"terminated": {"exitCode": 137, "finishedAt": "2026-11-30T09:59:00Z"}}}]}}),
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta("node-1"),
                "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40,
                    "acquireTime": "2026-11-30T10:00:00.000001Z", "renewTime": "2026-11-30T10:00:10.500000Z",
                    "leaseTransitions": 0}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta("web"),
                "spec": {"replicas": 2, "selector": selector, "template": template(),
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}}},
                "status": {"replicas": 2, "conditions": [{"type": "Available", "status": "True",
                    "lastUpdateTime": "2026-11-30T10:00:05Z", "lastTransitionTime": "2026-11-30T10:00:05Z"}]}}),
            json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta("web-1"),
                "spec": {"replicas": 2, "selector": selector, "template": template()}, "status": {"replicas": 2}}),
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta("agent"),
                "spec": {"selector": selector, "template": template(),
                    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}}}),
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": meta("db"),
                "spec": {"serviceName": "db", "replicas": 3, "selector": selector, "template": template(),
                    "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "1Gi"}}}}]}}),
            json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": meta("db-1"), "revision": 1,
                "data": {"spec": {"template": {"metadata": {"labels": {"app": "web"}}}, "x": null}}}),
            json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta("once"),
                "spec": {"backoffLimit": 2, "completions": 1, "template": template()},
                "status": {"succeeded": 1, "completionTime": "2026-11-30T10:01:00Z"}}),
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": meta("tick"),
                "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template()}}},
                "status": {"lastScheduleTime": "2026-11-30T10:00:00Z"}}),
            json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": meta("rc"),
                "spec": {"replicas": 1, "selector": {"app": "web"}, "template": template()}}),
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"},
                "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
                "spec": {"podCIDR": "10.1.0.0/24", "taints": [{"key": "k", "effect": "NoSchedule",
                    "timeAdded": "2026-11-30T10:00:00Z"}]},
                "status": {"capacity": {"cpu": "2", "memory": "24Gi"}, "allocatable": {"cpu": "1900m"},
                    "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                    "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-30T10:00:00Z",
                        "lastTransitionTime": "2026-11-30T09:00:00Z"}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": meta("web"),
                "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10",
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}, {"port": 81, "targetPort": "http"}]},
                "status": {"loadBalancer": {}}}),
            json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": meta("web"),
                "subsets": [{"addresses": [{"ip": "10.1.0.5", "targetRef": {"kind": "Pod", "name": "web-0"}}],
                    "ports": [{"name": "http", "port": 8080}]}]}),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": meta("web-abc"),
                "addressType": "IPv4", "endpoints": [{"addresses": ["10.1.0.5"], "conditions": {"ready": true}}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
            json!({"apiVersion": "v1", "kind": "Event", "metadata": meta("web.1"),
                "involvedObject": {"kind": "Pod", "namespace": "default", "name": "web-0"},
                "reason": "Started", "message": "m", "type": "Normal", "count": 3,
                "firstTimestamp": "2026-11-30T10:00:00Z", "eventTime": "2026-11-30T10:00:00.123456Z"}),
            json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": meta("web"),
                "spec": {"minAvailable": "50%", "selector": selector},
                "status": {"disruptedPods": {"web-0": "2026-11-30T10:00:00Z"}, "currentHealthy": 1,
                    "desiredHealthy": 1, "disruptionsAllowed": 0, "expectedPods": 2}}),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta("cfg"), "data": {"a": "1"},
                "binaryData": {"b": "AAE="}, "immutable": false}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("creds"), "type": "Opaque",
                "data": {"password": "aHVudGVyMg=="}, "stringData": {"user": "admin"}}),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta("builder"),
                "secrets": [{"name": "t"}], "automountServiceAccountToken": true}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta("r"),
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "c"},
                "rules": [{"nonResourceURLs": ["/healthz"], "verbs": ["get"]}],
                "aggregationRule": {"clusterRoleSelectors": [selector]}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta("rb"),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
                "subjects": [{"kind": "ServiceAccount", "name": "builder", "namespace": "default"}]}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "crb"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "c"},
                "subjects": [{"kind": "Group", "name": "system:nodes", "apiGroup": "rbac.authorization.k8s.io"}]}),
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview", "metadata": {},
                "spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"}}}),
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "metadata": {},
                "spec": {"namespace": "default"}}),
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "LocalSubjectAccessReview",
                "metadata": {"namespace": "default"}, "spec": {"uid": "1", "resourceAttributes": {"namespace": "default",
                    "verb": "list", "group": "apps", "resource": "deployments", "subresource": "scale"}}}),
            json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta("web"),
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                    "minReplicas": 1, "maxReplicas": 5, "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": 80}}}]}}),
            json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest", "metadata": {"name": "n"},
                "spec": {"request": "AAE=", "signerName": "kubernetes.io/kube-apiserver-client", "usages": ["client auth"],
                    "expirationSeconds": 3600}}),
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {},
                "spec": {"user": "u", "groups": ["g"], "resourceAttributes": {"verb": "get", "resource": "pods"},
                    "extra": {"k": ["v"]}}}),
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": "greetings.example.com"},
                "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "greetings", "kind": "Greeting"},
                    "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema":
                        {"type": "object", "properties": {"spec": {"type": "object",
                            "x-kubernetes-preserve-unknown-fields": true}}}}}]}}),
        ]
    }

    /// Values put in place of each value of the corpus, and added under a new key of each object.
    fn replacements() -> Vec<Value> {
        vec![
            Value::Null, json!(true), json!("x"), json!(""), json!("2026-11-30T10:00:00Z"), json!("AAE="), json!(0),
            json!(-1), json!(1.5), json!(2147483648_i64), json!(u64::MAX), json!(1e300), json!([]), json!([null]),
            json!(["x"]), json!({}), json!({"zz": 1}), json!({"name": "n"}),
        ]
    }

    /// Every value of `v` replaced in turn by each replacement, and each object given an unknown field.
    fn mutations(v: &Value) -> Vec<Value> {
        let mut paths = Vec::new();
        collect_paths(v, &mut Vec::new(), &mut paths);
        let mut out = Vec::new();
        for path in &paths {
            for r in replacements() {
                let mut copy = v.clone();
                if let Some(slot) = at(&mut copy, path) {
                    *slot = r;
                    out.push(copy);
                }
            }
            let mut copy = v.clone();
            if let Some(Value::Object(m)) = at(&mut copy, path) {
                m.insert("imagee".into(), json!("typo"));
                out.push(copy);
            }
        }
        out
    }

    #[derive(Clone)]
    enum Step {
        Key(String),
        Index(usize),
    }

    fn collect_paths(v: &Value, here: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
        out.push(here.clone());
        match v {
            Value::Object(m) => {
                for (k, c) in m {
                    here.push(Step::Key(k.clone()));
                    collect_paths(c, here, out);
                    here.pop();
                }
            }
            Value::Array(a) => {
                for (i, c) in a.iter().enumerate() {
                    here.push(Step::Index(i));
                    collect_paths(c, here, out);
                    here.pop();
                }
            }
            _ => {}
        }
    }

    fn at<'a>(v: &'a mut Value, path: &[Step]) -> Option<&'a mut Value> {
        path.iter().try_fold(v, |v, s| match s {
            Step::Key(k) => v.get_mut(k.as_str()),
            Step::Index(i) => v.get_mut(*i),
        })
    }

    #[test]
    fn the_walk_vouches_for_every_valid_object_of_the_corpus() {
        for obj in corpus() {
            let res = res_of(&obj);
            let (causes, unknown, schema, _) = by_round_trip(res, &obj);
            assert_eq!((causes, unknown, schema), (vec![], vec![], Schema::AlreadyChecked), "{} is valid", res.kind);
            assert!(matches!(read(res, &obj), Reading::Fits(ref u) if u.is_empty()), "{} is vouched for", res.kind);
        }
    }

    #[test]
    fn the_walk_and_the_round_trip_agree_on_the_corpus_and_every_mutation_of_it() {
        let mut compared = 0;
        let mut vouched = 0;
        for obj in corpus() {
            let res = res_of(&obj);
            let mut bare = obj.clone();
            if let Some(m) = bare.as_object_mut() {
                m.remove("apiVersion");
                m.remove("kind");
            }
            let mut foreign = bare.clone();
            foreign["apiVersion"] = json!("example.com/v9");
            foreign["kind"] = json!(7);
            let mut variants = mutations(&obj);
            variants.extend([bare, foreign]);
            for v in variants {
                assert_eq!(by_walk(res, &v), by_round_trip(res, &v), "{} {v}", res.kind);
                compared += 1;
                vouched += usize::from(matches!(read(res, &v), Reading::Fits(_)));
            }
        }
        // Most mutations break the type of one value: the walk leaves those to the typed form.
        assert!(compared > 10_000 && vouched > compared / 10, "{vouched} of {compared}");
    }

    proptest::proptest! {
        #[test]
        fn the_walk_and_the_round_trip_agree_on_arbitrary_json(obj in crate::validation::tests::arb_json()) {
            for res in kinds::ALL {
                proptest::prop_assert_eq!(by_walk(res, &obj), by_round_trip(res, &obj), "{}", res.kind);
            }
        }
    }
}
