//! The kinds Shepherd serves, and where each lives in the REST tree: a static table of built-in
//! kinds, and a registry of the custom kinds that CustomResourceDefinitions add while it runs.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, RwLock};

use serde_json::Value;

use crate::json::str_at;

/// One servable resource: its kind, where it is mounted and what it supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceInfo {
    /// API group; empty for the core group (`/api/v1`).
    pub group: &'static str,
    pub version: &'static str,
    pub kind: &'static str,
    /// Lower-case plural used in paths (`pods`).
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    /// Groupings a user can ask for by one name (`kubectl get all`).
    pub categories: &'static [&'static str],
    /// Has a `status` subresource: the main resource ignores status writes, `/status` only writes status.
    pub has_status: bool,
    /// Has a `scale` subresource (`autoscaling/v1` Scale).
    pub has_scale: bool,
}

impl ResourceInfo {
    /// `v1` or `apps/v1`, as written in `apiVersion`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `PodList`.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }

    /// `pods` or `deployments.apps`, as kubectl names a resource.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The store key prefix of this resource: `/registry/apps/deployments/`.
    pub fn key_prefix(&self) -> String {
        let group = if self.group.is_empty() { "core" } else { self.group };
        format!("/registry/{}/{}/", group, self.plural)
    }

    /// The store key prefix of one namespace (namespaced kinds only).
    pub fn namespace_prefix(&self, namespace: &str) -> String {
        format!("{}{}/", self.key_prefix(), namespace)
    }

    /// The store key of one object; `namespace` is ignored for cluster-scoped kinds.
    pub fn key(&self, namespace: Option<&str>, name: &str) -> String {
        match (self.namespaced, namespace) {
            (true, Some(ns)) => format!("{}{}/{}", self.key_prefix(), ns, name),
            _ => format!("{}{}", self.key_prefix(), name),
        }
    }
}

#[allow(clippy::too_many_arguments)] // a table row constructor; named fields would bury the table
const fn res(
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    namespaced: bool,
    short_names: &'static [&'static str],
    has_status: bool,
    has_scale: bool,
) -> ResourceInfo {
    ResourceInfo { group, version: "v1", kind, plural, singular, namespaced, short_names, categories: &[], has_status, has_scale }
}

impl ResourceInfo {
    const fn in_categories(self, categories: &'static [&'static str]) -> Self {
        ResourceInfo { categories, ..self }
    }
}

pub const NAMESPACE: ResourceInfo = res("", "Namespace", "namespaces", "namespace", false, &["ns"], true, false);
pub const NODE: ResourceInfo = res("", "Node", "nodes", "node", false, &["no"], true, false);
pub const POD: ResourceInfo =
    res("", "Pod", "pods", "pod", true, &["po"], true, false).in_categories(&["all"]);
pub const SERVICE: ResourceInfo =
    res("", "Service", "services", "service", true, &["svc"], true, false).in_categories(&["all"]);
pub const ENDPOINTS: ResourceInfo = res("", "Endpoints", "endpoints", "endpoints", true, &["ep"], false, false);
pub const EVENT: ResourceInfo = res("", "Event", "events", "event", true, &["ev"], false, false);
pub const CONFIGMAP: ResourceInfo = res("", "ConfigMap", "configmaps", "configmap", true, &["cm"], false, false);
pub const SECRET: ResourceInfo = res("", "Secret", "secrets", "secret", true, &[], false, false);
pub const SERVICEACCOUNT: ResourceInfo =
    res("", "ServiceAccount", "serviceaccounts", "serviceaccount", true, &["sa"], false, false);
pub const DEPLOYMENT: ResourceInfo =
    res("apps", "Deployment", "deployments", "deployment", true, &["deploy"], true, true).in_categories(&["all"]);
pub const REPLICASET: ResourceInfo =
    res("apps", "ReplicaSet", "replicasets", "replicaset", true, &["rs"], true, true).in_categories(&["all"]);
pub const REPLICATIONCONTROLLER: ResourceInfo =
    res("", "ReplicationController", "replicationcontrollers", "replicationcontroller", true, &["rc"], true, true)
        .in_categories(&["all"]);
/// The namespace of the node agents' heartbeat Leases, one per node, named after it.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
pub const LEASE: ResourceInfo = res("coordination.k8s.io", "Lease", "leases", "lease", true, &[], false, false);
pub const ENDPOINTSLICE: ResourceInfo =
    res("discovery.k8s.io", "EndpointSlice", "endpointslices", "endpointslice", true, &[], false, false);
pub const PODDISRUPTIONBUDGET: ResourceInfo =
    res("policy", "PodDisruptionBudget", "poddisruptionbudgets", "poddisruptionbudget", true, &["pdb"], true, false);
pub const JOB: ResourceInfo = res("batch", "Job", "jobs", "job", true, &[], true, false).in_categories(&["all"]);
pub const CRONJOB: ResourceInfo =
    res("batch", "CronJob", "cronjobs", "cronjob", true, &["cj"], true, false).in_categories(&["all"]);
pub const DAEMONSET: ResourceInfo =
    res("apps", "DaemonSet", "daemonsets", "daemonset", true, &["ds"], true, false).in_categories(&["all"]);
pub const STATEFULSET: ResourceInfo =
    res("apps", "StatefulSet", "statefulsets", "statefulset", true, &["sts"], true, true).in_categories(&["all"]);
pub const CONTROLLERREVISION: ResourceInfo =
    res("apps", "ControllerRevision", "controllerrevisions", "controllerrevision", true, &[], false, false);
pub const CUSTOMRESOURCEDEFINITION: ResourceInfo = res("apiextensions.k8s.io", "CustomResourceDefinition",
    "customresourcedefinitions", "customresourcedefinition", false, &["crd", "crds"], true, false)
    .in_categories(&["api-extensions"]);
// RBAC (`rbac.authorization.k8s.io/v1`) and the access reviews (`authorization.k8s.io/v1`, create only,
// never stored).
pub const ROLE: ResourceInfo = res("rbac.authorization.k8s.io", "Role", "roles", "role", true, &[], false, false);
pub const CLUSTERROLE: ResourceInfo =
    res("rbac.authorization.k8s.io", "ClusterRole", "clusterroles", "clusterrole", false, &[], false, false);
pub const ROLEBINDING: ResourceInfo =
    res("rbac.authorization.k8s.io", "RoleBinding", "rolebindings", "rolebinding", true, &[], false, false);
pub const CLUSTERROLEBINDING: ResourceInfo = res("rbac.authorization.k8s.io", "ClusterRoleBinding",
    "clusterrolebindings", "clusterrolebinding", false, &[], false, false);
pub const SUBJECTACCESSREVIEW: ResourceInfo = res("authorization.k8s.io", "SubjectAccessReview",
    "subjectaccessreviews", "subjectaccessreview", false, &[], false, false);
pub const SELFSUBJECTACCESSREVIEW: ResourceInfo = res("authorization.k8s.io", "SelfSubjectAccessReview",
    "selfsubjectaccessreviews", "selfsubjectaccessreview", false, &[], false, false);
pub const SELFSUBJECTRULESREVIEW: ResourceInfo = res("authorization.k8s.io", "SelfSubjectRulesReview",
    "selfsubjectrulesreviews", "selfsubjectrulesreview", false, &[], false, false);
pub const LOCALSUBJECTACCESSREVIEW: ResourceInfo = res("authorization.k8s.io", "LocalSubjectAccessReview",
    "localsubjectaccessreviews", "localsubjectaccessreview", true, &[], false, false);

/// Whether `res` is a review: answered from the request, created only, never stored.
/// `certificates.k8s.io/v1`: a request for a certificate signed by the cluster CA; its conditions are
/// written through `/approval`, its certificate through `/status`.
pub const CERTIFICATESIGNINGREQUEST: ResourceInfo = res("certificates.k8s.io", "CertificateSigningRequest",
    "certificatesigningrequests", "certificatesigningrequest", false, &["csr"], true, false);

pub fn is_review(res: &ResourceInfo) -> bool {
    res.group == "authorization.k8s.io"
}
pub const HORIZONTALPODAUTOSCALER: ResourceInfo = ResourceInfo {
    version: "v2",
    ..res("autoscaling", "HorizontalPodAutoscaler", "horizontalpodautoscalers", "horizontalpodautoscaler", true, &["hpa"],
        true, false)
        .in_categories(&["all"])
};

/// `autoscaling/v1` HorizontalPodAutoscalers: a view of the stored `autoscaling/v2` objects,
/// converted on each request (so not in [`ALL`], which lists what is stored).
pub const HORIZONTALPODAUTOSCALER_V1: ResourceInfo = ResourceInfo { version: "v1", ..HORIZONTALPODAUTOSCALER };
/// Versions served only by conversion to a stored one.
pub const CONVERTED: &[ResourceInfo] = &[HORIZONTALPODAUTOSCALER_V1];

/// `metrics.k8s.io/v1beta1`: read-only views of the usage node agents report, kept in memory by
/// the API server and never in the store (so they are not in [`ALL`]).
pub const NODE_METRICS: ResourceInfo =
    ResourceInfo { version: "v1beta1", ..res("metrics.k8s.io", "NodeMetrics", "nodes", "", false, &[], false, false) };
pub const POD_METRICS: ResourceInfo =
    ResourceInfo { version: "v1beta1", ..res("metrics.k8s.io", "PodMetrics", "pods", "", true, &[], false, false) };
/// The metrics resources, in discovery order.
pub const METRICS: &[ResourceInfo] = &[NODE_METRICS, POD_METRICS];

/// Every resource Shepherd serves, in discovery order.
pub const ALL: &[ResourceInfo] = &[NAMESPACE, NODE, POD, SERVICE, ENDPOINTS, EVENT, CONFIGMAP, SECRET, SERVICEACCOUNT,
    DEPLOYMENT, REPLICASET, LEASE, ENDPOINTSLICE, PODDISRUPTIONBUDGET, CUSTOMRESOURCEDEFINITION, JOB, CRONJOB,
    DAEMONSET, STATEFULSET, CONTROLLERREVISION, REPLICATIONCONTROLLER, HORIZONTALPODAUTOSCALER,
    ROLE, CLUSTERROLE, ROLEBINDING, CLUSTERROLEBINDING,
    SUBJECTACCESSREVIEW, SELFSUBJECTACCESSREVIEW, SELFSUBJECTRULESREVIEW, LOCALSUBJECTACCESSREVIEW,
    CERTIFICATESIGNINGREQUEST];

/// The groups Shepherd serves besides core, in discovery order.
pub const GROUPS: &[&str] = &["apps", "coordination.k8s.io", "discovery.k8s.io", "policy", "apiextensions.k8s.io", "batch",
    "autoscaling", "rbac.authorization.k8s.io", "authorization.k8s.io", "certificates.k8s.io"];

/// Every resource served now: the built-in ones, then the custom ones (ordered by group,
/// version and plural).
pub fn all() -> Vec<&'static ResourceInfo> {
    let mut out: Vec<&'static ResourceInfo> = ALL.iter().collect();
    out.extend(read_registry().served.values().map(|e| e.info));
    out
}

/// The resources in a category (`all`), in discovery order.
pub fn in_category(category: &str) -> impl Iterator<Item = &'static ResourceInfo> + '_ {
    all().into_iter().filter(move |r| r.categories.contains(&category))
}

/// Finds a resource by group and plural (`("apps", "deployments")`); of a custom resource
/// served in several versions, the storage version.
pub fn by_plural(group: &str, plural: &str) -> Option<&'static ResourceInfo> {
    ALL.iter().find(|r| r.group == group && r.plural == plural).or_else(|| {
        let reg = read_registry();
        let mut versions = reg.served.values().filter(|e| e.info.group == group && e.info.plural == plural);
        let first = versions.next()?;
        Some(std::iter::once(first).chain(versions).find(|e| e.custom.storage).unwrap_or(first).info)
    })
}

/// Finds a resource by group, version and plural, as a request path names it.
pub fn by_group_version_plural(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    ALL.iter().find(|r| r.group == group && r.version == version && r.plural == plural).or_else(|| {
        read_registry().served.get(&(group.to_string(), version.to_string(), plural.to_string())).map(|e| e.info)
    })
}

/// Finds a resource by `apiVersion` and `kind` as written in a manifest.
pub fn by_api_version_kind(api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    ALL.iter()
        .find(|r| r.kind == kind && r.api_version() == api_version)
        .or_else(|| read_registry().served.values().map(|e| e.info).find(|r| r.kind == kind && r.api_version() == api_version))
}

/// Finds a resource by kind alone (`Deployment`), case-sensitive.
pub fn by_kind(kind: &str) -> Option<&'static ResourceInfo> {
    ALL.iter().find(|r| r.kind == kind).or_else(|| by_plural_of_kind(kind))
}

fn by_plural_of_kind(kind: &str) -> Option<&'static ResourceInfo> {
    let info = read_registry().served.values().map(|e| e.info).find(|r| r.kind == kind)?;
    by_plural(info.group, info.plural)
}

/// Finds a resource the way kubectl resolves a name typed by a user: plural, singular, short
/// name, kind, or `plural.group`, case-insensitive. Built-in kinds win over custom ones.
pub fn resolve(name: &str) -> Option<&'static ResourceInfo> {
    let n = name.to_ascii_lowercase();
    let matches = |r: &ResourceInfo| {
        r.plural == n
            || r.singular == n
            || r.kind.to_ascii_lowercase() == n
            || r.short_names.contains(&n.as_str())
            || r.qualified_plural() == n
    };
    ALL.iter().find(|r| matches(r)).or_else(|| {
        let info = read_registry().served.values().map(|e| e.info).find(|r| matches(r))?;
        by_plural(info.group, info.plural)
    })
}

// ---------------------------------------------------------------------------------------------
// Custom kinds
// ---------------------------------------------------------------------------------------------

/// A custom resource as a CustomResourceDefinition describes one served version of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CustomResource {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub has_status: bool,
    pub has_scale: bool,
}

/// What a custom resource version carries besides its place in the REST tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CustomVersion {
    /// The CustomResourceDefinition that defines it (`widgets.example.com`).
    pub definition: String,
    /// `openAPIV3Schema` of this version; none means anything goes (only for definitions
    /// stored before a schema was required).
    pub schema: Option<Value>,
    /// `additionalPrinterColumns`, as written in the definition.
    pub printer_columns: Vec<Value>,
    /// `subresources.scale`: `specReplicasPath`, `statusReplicasPath`, `labelSelectorPath`.
    pub scale: Option<Value>,
    /// Whether this is the version objects are stored in.
    pub storage: bool,
    /// The storage version, as objects carry it in `apiVersion`.
    pub storage_api_version: String,
}

struct CustomEntry {
    info: &'static ResourceInfo,
    custom: Arc<CustomVersion>,
}

#[derive(Default)]
struct Registry {
    /// Served custom versions by (group, version, plural).
    served: BTreeMap<(String, String, String), CustomEntry>,
    /// Every `ResourceInfo` ever made for a custom resource. Handed out as `&'static`, so never
    /// freed: a definition re-created or updated with the same names reuses its allocation, and
    /// only a change of names, scope or subresources allocates (and leaks) a new one.
    interned: HashMap<CustomResource, &'static ResourceInfo>,
}

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(Default::default);

fn read_registry() -> std::sync::RwLockReadGuard<'static, Registry> {
    // The registry holds no invariant a panicking writer could break half-way.
    REGISTRY.read().unwrap_or_else(|e| e.into_inner())
}

fn write_registry() -> std::sync::RwLockWriteGuard<'static, Registry> {
    REGISTRY.write().unwrap_or_else(|e| e.into_inner())
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

fn leak_list(list: &[String]) -> &'static [&'static str] {
    Box::leak(list.iter().map(|s| leak(s)).collect::<Vec<_>>().into_boxed_slice())
}

impl Registry {
    fn intern(&mut self, c: &CustomResource) -> &'static ResourceInfo {
        if let Some(info) = self.interned.get(c) {
            return info;
        }
        let info: &'static ResourceInfo = Box::leak(Box::new(ResourceInfo {
            group: leak(&c.group),
            version: leak(&c.version),
            kind: leak(&c.kind),
            plural: leak(&c.plural),
            singular: leak(&c.singular),
            namespaced: c.namespaced,
            short_names: leak_list(&c.short_names),
            categories: leak_list(&c.categories),
            has_status: c.has_status,
            has_scale: c.has_scale,
        }));
        self.interned.insert(c.clone(), info);
        info
    }
}

/// Serves the versions a definition lists (replacing what it served before), and stops serving
/// those it no longer lists.
pub fn register_custom(definition: &str, versions: Vec<(CustomResource, CustomVersion)>) {
    let mut reg = write_registry();
    reg.served.retain(|_, e| e.custom.definition != definition);
    for (c, v) in versions {
        let info = reg.intern(&c);
        reg.served.insert((c.group, c.version, c.plural), CustomEntry { info, custom: Arc::new(v) });
    }
}


fn versions(def: &Value) -> &[Value] {
    def.pointer("/spec/versions").and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

/// The served versions a CustomResourceDefinition (as JSON) defines, ready for [`register_custom`].
pub fn custom_resources_of(def: &Value) -> Vec<(CustomResource, CustomVersion)> {
    let name = str_at(def, "/metadata/name");
    let group = str_at(def, "/spec/group");
    let names = def.pointer("/spec/names").cloned().unwrap_or(Value::Null);
    let kind = str_at(&names, "/kind");
    let storage = versions(def).iter().find(|v| v["storage"] == true).map(|v| str_at(v, "/name")).unwrap_or("");
    versions(def)
        .iter()
        .filter(|v| v["served"] == true)
        .map(|v| {
            let subresources = v.get("subresources");
            let resource = CustomResource {
                group: group.to_string(),
                version: str_at(v, "/name").to_string(),
                kind: kind.to_string(),
                plural: str_at(&names, "/plural").to_string(),
                singular: match str_at(&names, "/singular") {
                    "" => kind.to_ascii_lowercase(),
                    s => s.to_string(),
                },
                namespaced: str_at(def, "/spec/scope") == "Namespaced",
                short_names: strings(names.get("shortNames")),
                categories: strings(names.get("categories")),
                has_status: subresources.and_then(|s| s.get("status")).is_some_and(|s| !s.is_null()),
                has_scale: subresources.and_then(|s| s.get("scale")).is_some_and(|s| !s.is_null()),
            };
            let custom = CustomVersion {
                definition: name.to_string(),
                schema: v.pointer("/schema/openAPIV3Schema").cloned(),
                printer_columns: v.get("additionalPrinterColumns").and_then(Value::as_array).cloned().unwrap_or_default(),
                scale: subresources.and_then(|s| s.get("scale")).filter(|s| !s.is_null()).cloned(),
                storage: str_at(v, "/name") == storage,
                storage_api_version: format!("{group}/{storage}"),
            };
            (resource, custom)
        })
        .collect()
}

/// Stops serving every version of a definition.
pub fn unregister_custom(definition: &str) {
    write_registry().served.retain(|_, e| e.custom.definition != definition);
}

/// What a custom resource's definition says of the version `res` is; none for built-in kinds
/// and for resources no longer served.
pub fn custom(res: &ResourceInfo) -> Option<Arc<CustomVersion>> {
    if ALL.iter().any(|r| r.group == res.group) {
        return None;
    }
    read_registry()
        .served
        .get(&(res.group.to_string(), res.version.to_string(), res.plural.to_string()))
        .map(|e| e.custom.clone())
}

/// Whether `res` is a custom resource (served or not any more).
pub fn is_custom(res: &ResourceInfo) -> bool {
    !ALL.iter().any(|r| r.group == res.group && r.plural == res.plural)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_accepts_the_names_kubectl_users_type() {
        for (typed, kind) in [("po", "Pod"), ("pods", "Pod"), ("Pod", "Pod"), ("deploy", "Deployment"),
            ("deployments.apps", "Deployment"), ("rs", "ReplicaSet"), ("svc", "Service"), ("no", "Node"),
            ("ep", "Endpoints"), ("ev", "Event"), ("ns", "Namespace"), ("lease", "Lease"),
            ("endpointslices", "EndpointSlice"), ("pdb", "PodDisruptionBudget"), ("cm", "ConfigMap"),
            ("secrets", "Secret"), ("sa", "ServiceAccount"), ("jobs.batch", "Job"), ("cj", "CronJob"),
            ("ds", "DaemonSet"), ("sts", "StatefulSet"),
            ("rc", "ReplicationController"), ("hpa", "HorizontalPodAutoscaler")] {
            assert_eq!(resolve(typed).map(|r| r.kind), Some(kind), "{typed}");
        }
        assert!(resolve("widgets").is_none());
    }

    #[test]
    fn the_all_category_holds_what_kubectl_get_all_shows() {
        let all: Vec<&str> = in_category("all").map(|r| r.plural).collect();
        assert_eq!(all, ["pods", "services", "deployments", "replicasets", "jobs", "cronjobs", "daemonsets", "statefulsets",
            "replicationcontrollers", "horizontalpodautoscalers"]);
    }

    fn gadget_definition(short: &str) -> Value {
        serde_json::json!({"metadata": {"name": "gadgets.kinds.example.com"}, "spec": {
            "group": "kinds.example.com", "scope": "Namespaced",
            "names": {"plural": "gadgets", "kind": "Gadget", "shortNames": [short]},
            "versions": [{"name": "v1beta1", "served": true, "storage": false},
                {"name": "v1", "served": true, "storage": true}, {"name": "v1alpha1", "served": false, "storage": false}]}})
    }

    #[test]
    fn custom_kinds_resolve_beside_built_in_ones_and_re_registering_reuses_their_allocation() {
        register_custom("gadgets.kinds.example.com", custom_resources_of(&gadget_definition("gd")));
        let v1 = by_group_version_plural("kinds.example.com", "v1", "gadgets").expect("v1 served");
        assert_eq!((v1.kind, v1.singular, v1.namespaced), ("Gadget", "gadget", true));
        assert!(by_group_version_plural("kinds.example.com", "v1alpha1", "gadgets").is_none());
        assert!(std::ptr::eq(by_plural("kinds.example.com", "gadgets").expect("by plural"), v1), "the storage version");
        assert!(std::ptr::eq(resolve("gd").expect("short name"), v1));
        assert_eq!(by_api_version_kind("kinds.example.com/v1beta1", "Gadget").map(|r| r.version), Some("v1beta1"));
        assert!(custom(v1).is_some_and(|c| c.storage && c.storage_api_version == "kinds.example.com/v1"));
        assert_eq!(resolve("po").map(|r| r.kind), Some("Pod"));

        register_custom("gadgets.kinds.example.com", custom_resources_of(&gadget_definition("gd")));
        assert!(std::ptr::eq(by_group_version_plural("kinds.example.com", "v1", "gadgets").expect("again"), v1));
        register_custom("gadgets.kinds.example.com", custom_resources_of(&gadget_definition("gdt")));
        assert!(resolve("gd").is_none() && resolve("gdt").is_some());

        unregister_custom("gadgets.kinds.example.com");
        assert!(by_plural("kinds.example.com", "gadgets").is_none());
        assert!(custom(v1).is_none() && is_custom(v1));
    }

    #[test]
    fn keys_separate_namespaces_and_kinds() {
        assert_eq!(POD.key(Some("default"), "web-0"), "/registry/core/pods/default/web-0");
        assert_eq!(NODE.key(None, "n1"), "/registry/core/nodes/n1");
        assert_eq!(DEPLOYMENT.namespace_prefix("a"), "/registry/apps/deployments/a/");
        assert_eq!(DEPLOYMENT.api_version(), "apps/v1");
    }
}
