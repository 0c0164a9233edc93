//! RBAC: policy rules, and the roles and bindings of the store indexed by subject, so that deciding a request
//! reads only the bindings of its user and groups.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};

use shepherd_api::LabelSelector;

use super::request_info::Attributes;
use crate::auth::UserInfo;

/// One rule of a Role or ClusterRole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyRule {
    pub verbs: Vec<String>,
    pub api_groups: Vec<String>,
    pub resources: Vec<String>,
    pub resource_names: Vec<String>,
    pub non_resource_urls: Vec<String>,
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

fn has(list: &[String], want: &str) -> bool {
    list.iter().any(|x| x == want || x == "*")
}

impl PolicyRule {
    pub fn from_json(v: &Value) -> PolicyRule {
        PolicyRule {
            verbs: strings(v, "verbs"),
            api_groups: strings(v, "apiGroups"),
            resources: strings(v, "resources"),
            resource_names: strings(v, "resourceNames"),
            non_resource_urls: strings(v, "nonResourceURLs"),
        }
    }

    /// The rule as a Role stores it (empty lists left out).
    pub fn to_json(&self) -> Value {
        let mut v = json!({"verbs": self.verbs});
        for (key, list) in [
            ("apiGroups", &self.api_groups),
            ("resources", &self.resources),
            ("resourceNames", &self.resource_names),
            ("nonResourceURLs", &self.non_resource_urls),
        ] {
            if !list.is_empty() || (key == "apiGroups" && self.non_resource_urls.is_empty()) {
                v[key] = json!(list);
            }
        }
        v
    }

    /// A resource rule: verbs on resources of groups.
    pub fn resources(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
        let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        PolicyRule { verbs: own(verbs), api_groups: own(groups), resources: own(resources), ..PolicyRule::default() }
    }

    /// A non-resource rule: verbs on URLs (a trailing `*` matches any rest).
    pub fn urls(urls: &[&str], verbs: &[&str]) -> PolicyRule {
        let own = |l: &[&str]| l.iter().map(|s| s.to_string()).collect();
        PolicyRule { verbs: own(verbs), non_resource_urls: own(urls), ..PolicyRule::default() }
    }

    pub fn named(mut self, names: &[&str]) -> PolicyRule {
        self.resource_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn allows(&self, a: &Attributes) -> bool {
        self.allows_as(a, &combined_resource(a))
    }

    /// [`PolicyRule::allows`] with `a`'s `resource/subresource` made once by a caller that tries many rules.
    fn allows_as(&self, a: &Attributes, combined: &str) -> bool {
        if a.resource_request {
            self.allows_resource(&a.verb, &a.api_group, combined, &a.subresource, &a.name)
        } else {
            self.allows_url(&a.verb, &a.path)
        }
    }

    fn allows_resource(&self, verb: &str, group: &str, combined: &str, subresource: &str, name: &str) -> bool {
        has(&self.verbs, verb)
            && has(&self.api_groups, group)
            && self.resources.iter().any(|r| {
                r == "*"
                    || r == combined
                    || (!subresource.is_empty() && r.strip_prefix("*/").is_some_and(|s| s == subresource))
            })
            && (self.resource_names.is_empty() || (!name.is_empty() && self.resource_names.iter().any(|n| n == name)))
    }

    fn allows_url(&self, verb: &str, path: &str) -> bool {
        has(&self.verbs, verb)
            && self
                .non_resource_urls
                .iter()
                .any(|u| u == "*" || u == path || u.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix)))
    }

    /// Whether this rule grants everything `other` grants: each (verb, group, resource, name) or
    /// (verb, URL) of `other` is allowed here. A `*` asked for is covered only by a `*` held.
    pub fn covers(&self, other: &PolicyRule) -> bool {
        other.simple_rules().iter().all(|s| self.covers_simple(s))
    }

    fn covers_simple(&self, s: &PolicyRule) -> bool {
        let verb = &s.verbs[0];
        if let Some(url) = s.non_resource_urls.first() {
            return self.allows_url(verb, url);
        }
        let (group, resource) = (&s.api_groups[0], &s.resources[0]);
        let subresource = resource.split_once('/').map_or("", |(_, sub)| sub);
        let name = s.resource_names.first().map_or("", String::as_str);
        self.allows_resource(verb, group, resource, subresource, name)
    }

    /// The rule broken into rules of one verb, group, resource and name (or one verb and URL).
    pub fn simple_rules(&self) -> Vec<PolicyRule> {
        let mut out = Vec::new();
        for verb in &self.verbs {
            for url in &self.non_resource_urls {
                out.push(PolicyRule {
                    verbs: vec![verb.clone()],
                    non_resource_urls: vec![url.clone()],
                    ..Default::default()
                });
            }
            for group in &self.api_groups {
                for resource in &self.resources {
                    let one = |names: Vec<String>| PolicyRule {
                        verbs: vec![verb.clone()],
                        api_groups: vec![group.clone()],
                        resources: vec![resource.clone()],
                        resource_names: names,
                        non_resource_urls: Vec::new(),
                    };
                    if self.resource_names.is_empty() {
                        out.push(one(Vec::new()));
                    } else {
                        out.extend(self.resource_names.iter().map(|n| one(vec![n.clone()])));
                    }
                }
            }
        }
        out
    }

    /// Kubernetes' compact form, as its escalation errors list missing rules.
    pub fn compact(&self) -> String {
        let quoted = |l: &[String]| l.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(" ");
        let mut parts = Vec::new();
        for (label, list) in [
            ("APIGroups", &self.api_groups),
            ("Resources", &self.resources),
            ("ResourceNames", &self.resource_names),
            ("NonResourceURLs", &self.non_resource_urls),
            ("Verbs", &self.verbs),
        ] {
            if !list.is_empty() {
                parts.push(format!("{label}:[{}]", quoted(list)));
            }
        }
        format!("{{{}}}", parts.join(", "))
    }
}

/// A binding's subject as the index keys it: a user (ServiceAccounts are users named
/// `system:serviceaccount:NS:NAME`) or a group.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    User(String),
    Group(String),
}

fn subject_of(subject: &Value, binding_namespace: Option<&str>) -> Option<Subject> {
    let name = subject.get("name").and_then(Value::as_str)?;
    match subject.get("kind").and_then(Value::as_str)? {
        "User" => Some(Subject::User(name.to_string())),
        "Group" => Some(Subject::Group(name.to_string())),
        "ServiceAccount" => {
            let ns =
                subject.get("namespace").and_then(Value::as_str).filter(|n| !n.is_empty()).or(binding_namespace)?;
            Some(Subject::User(format!("system:serviceaccount:{ns}:{name}")))
        }
        _ => None,
    }
}

/// `resource/subresource` as rules name it; borrowed when there is no subresource (most requests).
fn combined_resource(a: &Attributes) -> std::borrow::Cow<'_, str> {
    if a.subresource.is_empty() {
        std::borrow::Cow::Borrowed(a.resource.as_str())
    } else {
        std::borrow::Cow::Owned(format!("{}/{}", a.resource, a.subresource))
    }
}

/// The groups a ServiceAccount is in by being one, besides those its credentials name.
fn service_account_groups(user: &UserInfo) -> Vec<String> {
    let Some((ns, _)) = user.name.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')) else {
        return Vec::new();
    };
    ["system:serviceaccounts".to_string(), format!("system:serviceaccounts:{ns}")]
        .into_iter()
        .filter(|g| !user.in_group(g))
        .collect()
}

#[derive(Debug, Clone)]
struct Binding {
    /// None for a ClusterRoleBinding.
    namespace: Option<String>,
    role_kind: String,
    role_name: String,
    subjects: Vec<Subject>,
}

/// The RBAC objects of the store, indexed for authorization.
#[derive(Debug, Default)]
pub struct RbacIndex {
    /// Roles by namespace, then name (looked up by `&str`, without allocating).
    roles: HashMap<String, HashMap<String, Arc<[PolicyRule]>>>,
    /// The rules each ClusterRole grants: its own, and for an aggregated one those of the roles it
    /// selects. Recomputed when any ClusterRole changes, so a request reads it as is.
    cluster_roles: HashMap<String, Arc<[PolicyRule]>>,
    cluster_role_sources: HashMap<String, ClusterRoleSource>,
    /// Bindings by store key.
    bindings: HashMap<String, Binding>,
    /// User and group names to the store keys of the bindings naming them. Carries the per-request
    /// cost: a request reads only its own user's and groups' entries.
    by_user: HashMap<String, HashSet<String>>,
    by_group: HashMap<String, HashSet<String>>,
}

/// A ClusterRole as stored: what aggregation reads.
#[derive(Debug)]
struct ClusterRoleSource {
    rules: Arc<[PolicyRule]>,
    labels: BTreeMap<String, String>,
    /// `aggregationRule.clusterRoleSelectors`; None for a role that aggregates nothing.
    selectors: Option<Vec<LabelSelector>>,
}

impl ClusterRoleSource {
    fn of(obj: &Value) -> ClusterRoleSource {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object).into_iter().flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
            .collect();
        let selectors = obj.pointer("/aggregationRule/clusterRoleSelectors").and_then(Value::as_array).map(|list| {
            // A selector that cannot be read selects nothing, rather than everything.
            list.iter().filter_map(|s| LabelSelector::from_k8s(s).ok()).collect()
        });
        ClusterRoleSource { rules: rules_of(obj), labels, selectors }
    }
}

fn rules_of(obj: &Value) -> Arc<[PolicyRule]> {
    obj.get("rules").and_then(Value::as_array).into_iter().flatten().map(PolicyRule::from_json).collect()
}

fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj.get("metadata").and_then(|m| m.get(key)).and_then(Value::as_str).unwrap_or("")
}

impl RbacIndex {
    /// Takes in a stored object (`obj` None: the key was deleted).
    pub fn apply(&mut self, key: &str, kind: &str, obj: Option<&Value>) {
        match kind {
            "roles" | "clusterroles" => {
                let Some((ns, name)) = key_parts(key, kind == "roles") else { return };
                match (kind, obj) {
                    ("roles", Some(o)) => {
                        self.roles.entry(ns.to_string()).or_default().insert(name.to_string(), rules_of(o));
                    }
                    ("roles", None) => {
                        if let Some(in_ns) = self.roles.get_mut(ns) {
                            in_ns.remove(name);
                            if in_ns.is_empty() {
                                self.roles.remove(ns);
                            }
                        }
                    }
                    (_, Some(o)) => {
                        self.cluster_role_sources.insert(name.to_string(), ClusterRoleSource::of(o));
                        self.aggregate();
                    }
                    (_, None) => {
                        self.cluster_role_sources.remove(name);
                        self.aggregate();
                    }
                }
            }
            "rolebindings" | "clusterrolebindings" => {
                if let Some(old) = self.bindings.remove(key) {
                    for s in &old.subjects {
                        let (map, name) = match s {
                            Subject::User(n) => (&mut self.by_user, n),
                            Subject::Group(n) => (&mut self.by_group, n),
                        };
                        if let Some(set) = map.get_mut(name) {
                            set.remove(key);
                            if set.is_empty() {
                                map.remove(name);
                            }
                        }
                    }
                }
                let Some(o) = obj else { return };
                let namespace = (kind == "rolebindings").then(|| meta_str(o, "namespace").to_string());
                let subjects: Vec<Subject> = o
                    .get("subjects")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|s| subject_of(s, namespace.as_deref()))
                    .collect();
                for s in &subjects {
                    let (map, name) = match s {
                        Subject::User(n) => (&mut self.by_user, n),
                        Subject::Group(n) => (&mut self.by_group, n),
                    };
                    map.entry(name.clone()).or_default().insert(key.to_string());
                }
                let role =
                    |k: &str| o.get("roleRef").and_then(|r| r.get(k)).and_then(Value::as_str).unwrap_or("").to_string();
                self.bindings.insert(
                    key.to_string(),
                    Binding { namespace, role_kind: role("kind"), role_name: role("name"), subjects },
                );
            }
            _ => {}
        }
    }

    /// Recomputes what each ClusterRole grants (Kubernetes' aggregation: the rules of every ClusterRole
    /// whose labels a selector of `aggregationRule` matches join the aggregating role's).
    fn aggregate(&mut self) {
        let mut granted = HashMap::with_capacity(self.cluster_role_sources.len());
        for (name, source) in &self.cluster_role_sources {
            let rules = match &source.selectors {
                None => source.rules.clone(),
                Some(selectors) => {
                    let mut rules: Vec<PolicyRule> = source.rules.to_vec();
                    let mut selected: Vec<(&String, &ClusterRoleSource)> = self.cluster_role_sources.iter()
                        .filter(|(other, s)| *other != name && selectors.iter().any(|sel| sel.matches(&s.labels)))
                        .collect();
                    selected.sort_by_key(|(other, _)| *other);
                    for (_, s) in selected {
                        for r in s.rules.iter() {
                            if !rules.contains(r) {
                                rules.push(r.clone());
                            }
                        }
                    }
                    rules.into()
                }
            };
            granted.insert(name.clone(), rules);
        }
        self.cluster_roles = granted;
    }

    /// The rules a role reference (`kind` Role or ClusterRole) grants in `namespace` (a RoleBinding's;
    /// None for a ClusterRoleBinding).
    pub fn role_rules(&self, kind: &str, name: &str, namespace: Option<&str>) -> Option<Arc<[PolicyRule]>> {
        match kind {
            "ClusterRole" => self.cluster_roles.get(name).cloned(),
            "Role" => self.roles.get(namespace?)?.get(name).cloned(),
            _ => None,
        }
    }

    /// Calls `f` with the rules of every binding of `user` that applies in `namespace` (`""`: only
    /// cluster-wide bindings) until it returns true.
    fn any_rules(&self, user: &UserInfo, namespace: &str, mut f: impl FnMut(&[PolicyRule]) -> bool) -> bool {
        let implicit = service_account_groups(user);
        let bindings = std::iter::once(self.by_user.get(&user.name))
            .chain(user.groups.iter().chain(&implicit).map(|g| self.by_group.get(g)))
            .flatten()
            .flatten()
            .filter_map(|k| self.bindings.get(k));
        for b in bindings {
            if b.namespace.as_deref().is_some_and(|ns| ns != namespace) {
                continue;
            }
            let Some(rules) = self.role_rules(&b.role_kind, &b.role_name, b.namespace.as_deref()) else { continue };
            if f(&rules) {
                return true;
            }
        }
        false
    }

    /// Whether a binding of `user` allows the request.
    pub fn allows(&self, user: &UserInfo, a: &Attributes) -> bool {
        let combined = combined_resource(a);
        self.any_rules(user, &a.namespace, |rules| rules.iter().any(|r| r.allows_as(a, &combined)))
    }

    /// Every rule `user` holds in `namespace`, cluster-wide ones included.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<PolicyRule> {
        let mut out: Vec<PolicyRule> = Vec::new();
        self.any_rules(user, namespace, |rules| {
            for r in rules {
                if !out.contains(r) {
                    out.push(r.clone());
                }
            }
            false
        });
        out
    }

    /// The rules of `wanted` that `user` does not hold in `namespace`, as simple rules.
    pub fn not_held(&self, user: &UserInfo, namespace: &str, wanted: &[PolicyRule]) -> Vec<PolicyRule> {
        let held = self.rules_for(user, namespace);
        wanted.iter().flat_map(PolicyRule::simple_rules).filter(|s| !held.iter().any(|h| h.covers(s))).collect()
    }

    pub fn binding_count(&self) -> usize {
        self.bindings.len()
    }
}

/// (namespace, name) of a store key `/registry/<group>/<plural>/[<ns>/]<name>`.
fn key_parts(key: &str, namespaced: bool) -> Option<(&str, &str)> {
    let mut parts = key.rsplitn(3, '/');
    let name = parts.next()?;
    if namespaced { Some((parts.next()?, name)) } else { Some(("", name)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Method;

    fn attrs(method: Method, path: &str) -> Attributes {
        let (p, q) = path.split_once('?').map_or((path, None), |(p, q)| (p, Some(q)));
        Attributes::of(&method, p, q)
    }

    #[test]
    fn rules_match_subresources_wildcards_names_and_url_prefixes() {
        let logs = PolicyRule::resources(&[""], &["pods", "pods/log"], &["get"]);
        assert!(logs.allows(&attrs(Method::GET, "/api/v1/namespaces/d/pods/p/log")));
        assert!(!logs.allows(&attrs(Method::POST, "/api/v1/namespaces/d/pods/p/exec")));
        assert!(!logs.allows(&attrs(Method::GET, "/api/v1/namespaces/d/pods/p/status")));
        let statuses = PolicyRule::resources(&["*"], &["*/status"], &["update"]);
        assert!(statuses.allows(&attrs(Method::PUT, "/apis/apps/v1/namespaces/d/deployments/x/status")));
        assert!(!statuses.allows(&attrs(Method::PUT, "/apis/apps/v1/namespaces/d/deployments/x")));
        let one = PolicyRule::resources(&[""], &["configmaps"], &["get", "update"]).named(&["settings"]);
        assert!(one.allows(&attrs(Method::GET, "/api/v1/namespaces/d/configmaps/settings")));
        assert!(!one.allows(&attrs(Method::GET, "/api/v1/namespaces/d/configmaps/other")));
        assert!(!one.allows(&attrs(Method::GET, "/api/v1/namespaces/d/configmaps")), "a list has no name");
        let health = PolicyRule::urls(&["/healthz", "/openapi/*"], &["get"]);
        assert!(health.allows(&attrs(Method::GET, "/healthz")));
        assert!(health.allows(&attrs(Method::GET, "/openapi/v3/apis/apps/v1")));
        assert!(!health.allows(&attrs(Method::GET, "/metrics")));
    }

    #[test]
    fn a_rule_covers_only_what_it_grants_and_a_wildcard_asked_for_needs_a_wildcard_held() {
        let all = PolicyRule::resources(&["*"], &["*"], &["*"]);
        let edit = PolicyRule::resources(&["", "apps"], &["pods", "deployments"], &["get", "create"]);
        assert!(all.covers(&edit));
        assert!(!edit.covers(&all));
        assert!(edit.covers(&PolicyRule::resources(&["apps"], &["deployments"], &["get"]).named(&["web"])));
        assert!(!edit.covers(&PolicyRule::resources(&["apps"], &["deployments"], &["delete"])));
        assert_eq!(
            PolicyRule::resources(&["*"], &["*"], &["*"]).compact(),
            r#"{APIGroups:["*"], Resources:["*"], Verbs:["*"]}"#
        );
    }

    #[test]
    fn an_aggregated_cluster_role_grants_what_the_roles_its_selectors_match_grant() {
        let mut index = RbacIndex::default();
        let key = |n: &str| format!("/registry/rbac.authorization.k8s.io/clusterroles/{n}");
        index.apply(&key("view"), "clusterroles", Some(&json!({"metadata": {"name": "view"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]})));
        let widgets = json!({"metadata": {"name": "widget-viewer", "labels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
            "rules": [{"apiGroups": ["example.com"], "resources": ["widgets"], "verbs": ["get"]}]});
        index.apply(&key("widget-viewer"), "clusterroles", Some(&widgets));
        index.apply("/registry/rbac.authorization.k8s.io/clusterrolebindings/v", "clusterrolebindings", Some(&json!({
            "metadata": {"name": "v"}, "roleRef": {"kind": "ClusterRole", "name": "view"}, "subjects": [{"kind": "User", "name": "bob"}]})));
        let bob = UserInfo::new("bob", Vec::<String>::new());
        assert!(index.allows(&bob, &attrs(Method::GET, "/apis/example.com/v1/namespaces/d/widgets/w")));
        assert!(index.allows(&bob, &attrs(Method::GET, "/api/v1/namespaces/d/pods/p")));
        index.apply(&key("widget-viewer"), "clusterroles", None);
        assert!(!index.allows(&bob, &attrs(Method::GET, "/apis/example.com/v1/namespaces/d/widgets/w")));
    }

    #[test]
    fn bindings_grant_their_roles_to_users_groups_and_service_accounts_in_their_scope() {
        let mut index = RbacIndex::default();
        let rb = "/registry/rbac.authorization.k8s.io/rolebindings/dev/readers";
        index.apply(
            "/registry/rbac.authorization.k8s.io/roles/dev/reader",
            "roles",
            Some(&json!({"metadata": {"name": "reader", "namespace": "dev"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})),
        );
        index.apply(
            rb,
            "rolebindings",
            Some(&json!({"metadata": {"name": "readers", "namespace": "dev"},
            "roleRef": {"kind": "Role", "name": "reader"},
            "subjects": [{"kind": "User", "name": "bob"}, {"kind": "Group", "name": "qa"},
                {"kind": "ServiceAccount", "name": "robot"}]})),
        );
        let list_dev = attrs(Method::GET, "/api/v1/namespaces/dev/pods");
        assert!(index.allows(&UserInfo::new("bob", Vec::<String>::new()), &list_dev));
        assert!(index.allows(&UserInfo::new("carol", ["qa"]), &list_dev));
        assert!(index.allows(&UserInfo::new("system:serviceaccount:dev:robot", ["system:serviceaccounts"]), &list_dev));
        assert!(!index.allows(&UserInfo::new("system:serviceaccount:prod:robot", Vec::<String>::new()), &list_dev));
        assert!(
            !index.allows(
                &UserInfo::new("bob", Vec::<String>::new()),
                &attrs(Method::GET, "/api/v1/namespaces/prod/pods")
            )
        );
        assert!(!index.allows(&UserInfo::new("bob", Vec::<String>::new()), &attrs(Method::GET, "/api/v1/pods")));
        index.apply(rb, "rolebindings", None);
        assert!(!index.allows(&UserInfo::new("bob", Vec::<String>::new()), &list_dev));
        assert!(index.by_user.is_empty() && index.by_group.is_empty(), "a deleted binding leaves nothing behind");
    }
}
