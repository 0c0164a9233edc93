//! The kinds Shepherd serves, and where each lives in the REST tree.

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
pub const LEASE: ResourceInfo = res("coordination.k8s.io", "Lease", "leases", "lease", true, &[], false, false);
pub const ENDPOINTSLICE: ResourceInfo =
    res("discovery.k8s.io", "EndpointSlice", "endpointslices", "endpointslice", true, &[], false, false);
pub const PODDISRUPTIONBUDGET: ResourceInfo =
    res("policy", "PodDisruptionBudget", "poddisruptionbudgets", "poddisruptionbudget", true, &["pdb"], true, false);

/// Every resource Shepherd serves, in discovery order.
pub const ALL: &[ResourceInfo] = &[NAMESPACE, NODE, POD, SERVICE, ENDPOINTS, EVENT, CONFIGMAP, SECRET, SERVICEACCOUNT,
    DEPLOYMENT, REPLICASET, LEASE, ENDPOINTSLICE, PODDISRUPTIONBUDGET];

/// The groups Shepherd serves besides core, in discovery order.
pub const GROUPS: &[&str] = &["apps", "coordination.k8s.io", "discovery.k8s.io", "policy"];

/// The resources in a category (`all`), in discovery order.
pub fn in_category(category: &str) -> impl Iterator<Item = &'static ResourceInfo> + '_ {
    ALL.iter().filter(move |r| r.categories.contains(&category))
}

/// Finds a resource by group and plural (`("apps", "deployments")`).
pub fn by_plural(group: &str, plural: &str) -> Option<&'static ResourceInfo> {
    ALL.iter().find(|r| r.group == group && r.plural == plural)
}

/// Finds a resource by `apiVersion` and `kind` as written in a manifest.
pub fn by_api_version_kind(api_version: &str, kind: &str) -> Option<&'static ResourceInfo> {
    ALL.iter().find(|r| r.kind == kind && r.api_version() == api_version)
}

/// Finds a resource by kind alone (`Deployment`), case-sensitive.
pub fn by_kind(kind: &str) -> Option<&'static ResourceInfo> {
    ALL.iter().find(|r| r.kind == kind)
}

/// Finds a resource the way kubectl resolves a name typed by a user: plural, singular, short
/// name, kind, or `plural.group`, case-insensitive.
pub fn resolve(name: &str) -> Option<&'static ResourceInfo> {
    let n = name.to_ascii_lowercase();
    ALL.iter().find(|r| {
        r.plural == n
            || r.singular == n
            || r.kind.to_ascii_lowercase() == n
            || r.short_names.contains(&n.as_str())
            || r.qualified_plural() == n
    })
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
            ("secrets", "Secret"), ("sa", "ServiceAccount")] {
            assert_eq!(resolve(typed).map(|r| r.kind), Some(kind), "{typed}");
        }
        assert!(resolve("widgets").is_none());
    }

    #[test]
    fn the_all_category_holds_what_kubectl_get_all_shows() {
        let all: Vec<&str> = in_category("all").map(|r| r.plural).collect();
        assert_eq!(all, ["pods", "services", "deployments", "replicasets"]);
    }

    #[test]
    fn keys_separate_namespaces_and_kinds() {
        assert_eq!(POD.key(Some("default"), "web-0"), "/registry/core/pods/default/web-0");
        assert_eq!(NODE.key(None, "n1"), "/registry/core/nodes/n1");
        assert_eq!(DEPLOYMENT.namespace_prefix("a"), "/registry/apps/deployments/a/");
        assert_eq!(DEPLOYMENT.api_version(), "apps/v1");
    }
}
