//! What a request asks to do, as authorization sees it: Kubernetes' request attributes read from the method,
//! path and query (verb, API group, resource, subresource, namespace, name, or a non-resource path).

use axum::http::Method;

/// The attributes of one request (Kubernetes' `RequestInfo` plus the path).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`; for a
    /// non-resource request the lower-case method (`get`, `post`...).
    pub verb: String,
    /// False for paths outside the REST tree of resources (`/healthz`, `/api`, `/openapi/v2`).
    pub resource_request: bool,
    pub path: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
}

/// Subresources of a namespace, which `namespaces/{name}/{x}` names instead of a resource inside it.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

impl Attributes {
    /// The attributes of a request for `path` with the raw `query` string.
    pub fn of(method: &Method, path: &str, query: Option<&str>) -> Attributes {
        let non_resource = || Attributes {
            verb: method.as_str().to_ascii_lowercase(),
            resource_request: false,
            path: path.to_string(),
            ..Attributes::default()
        };
        let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
        let (group, version, mut rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return non_resource(),
        };
        if rest.is_empty() {
            // `/api/v1`, `/apis/apps/v1`: discovery of a group version.
            return non_resource();
        }
        let mut attrs = Attributes {
            resource_request: true,
            path: path.to_string(),
            api_group: group.to_string(),
            api_version: version.to_string(),
            ..Attributes::default()
        };
        let mut verb = match *method {
            Method::POST => "create",
            Method::GET | Method::HEAD => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_string();
        // The old `/watch/` prefix of the path.
        if rest.first() == Some(&"watch") {
            rest = &rest[1..];
            verb = "watch".into();
        }
        if let ["namespaces", ns, tail @ ..] = rest {
            attrs.namespace = ns.to_string();
            if !tail.is_empty() && !NAMESPACE_SUBRESOURCES.contains(&tail[0]) {
                rest = tail;
            }
        }
        let query = parse_query(query);
        let param = |key: &str| query.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        attrs.resource = rest.first().map(|s| s.to_string()).unwrap_or_default();
        attrs.name = rest.get(1).map(|s| s.to_string()).unwrap_or_default();
        attrs.subresource = rest.get(2).map(|s| s.to_string()).unwrap_or_default();
        if rest.len() > 3 {
            attrs.subresource.clear();
        }
        if attrs.name.is_empty() {
            verb = match verb.as_str() {
                "get" if matches!(param("watch"), Some("true" | "1")) => "watch".into(),
                "get" => "list".into(),
                "delete" => "deletecollection".into(),
                _ => verb,
            };
            // A list or watch narrowed to one name is authorized as that name.
            if matches!(verb.as_str(), "list" | "watch")
                && let Some(selector) = param("fieldSelector")
                && let Some(name) = named_by(selector)
            {
                attrs.name = name.to_string();
            }
        }
        attrs.verb = verb;
        attrs
    }

    /// The list or watch of `resource` as `verb`, narrowed to one object when `field_selector`
    /// names it (`metadata.name=NAME`), as a request with that query is.
    pub fn of_collection(
        verb: &str,
        res: &shepherd_api::kinds::ResourceInfo,
        namespace: Option<&str>,
        field_selector: Option<&str>,
    ) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            path: String::new(),
            api_group: res.group.into(),
            api_version: res.version.into(),
            namespace: if res.namespaced { namespace.unwrap_or_default().into() } else { String::new() },
            resource: res.plural.into(),
            subresource: String::new(),
            name: field_selector.and_then(named_by).unwrap_or_default().into(),
        }
    }

    /// `pods` or `pods/log`, as rules name a resource.
    pub fn resource_with_subresource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

/// The decoded key-value pairs of a query string.
fn parse_query(query: Option<&str>) -> Vec<(String, String)> {
    let Some(query) = query else { return Vec::new() };
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The object a field selector names with `metadata.name=NAME` (or `==`), if it names one.
fn named_by(selector: &str) -> Option<&str> {
    selector.split(',').find_map(|term| term.strip_prefix("metadata.name==").or_else(|| term.strip_prefix("metadata.name=")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (method, path with query, verb, group, namespace, resource, subresource, name), from what
    /// kubectl sends for everyday commands.
    type Case = (
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
        &'static str,
    );
    const KUBECTL: &[Case] = &[
        ("GET", "/api/v1/namespaces/default/pods?limit=500", "list", "", "default", "pods", "", ""),
        ("GET", "/api/v1/pods?limit=500", "list", "", "", "pods", "", ""),
        ("GET", "/api/v1/namespaces/default/pods/web-0", "get", "", "default", "pods", "", "web-0"),
        (
            "GET",
            "/api/v1/namespaces/default/pods?fieldSelector=metadata.name%3Dweb-0&watch=true",
            "watch",
            "",
            "default",
            "pods",
            "",
            "web-0",
        ),
        ("GET", "/api/v1/watch/namespaces/default/pods", "watch", "", "default", "pods", "", ""),
        (
            "GET",
            "/api/v1/namespaces/default/pods/web-0/log?container=c&follow=true",
            "get",
            "",
            "default",
            "pods",
            "log",
            "web-0",
        ),
        (
            "POST",
            "/api/v1/namespaces/default/pods/web-0/exec?command=sh&stdin=true",
            "create",
            "",
            "default",
            "pods",
            "exec",
            "web-0",
        ),
        ("POST", "/api/v1/namespaces/default/pods/web-0/binding", "create", "", "default", "pods", "binding", "web-0"),
        (
            "POST",
            "/apis/apps/v1/namespaces/default/deployments?fieldManager=kubectl-client-side-apply",
            "create",
            "apps",
            "default",
            "deployments",
            "",
            "",
        ),
        (
            "PATCH",
            "/apis/apps/v1/namespaces/prod/deployments/web/scale",
            "patch",
            "apps",
            "prod",
            "deployments",
            "scale",
            "web",
        ),
        ("PUT", "/api/v1/namespaces/default/pods/web-0/status", "update", "", "default", "pods", "status", "web-0"),
        ("DELETE", "/api/v1/namespaces/default/pods/web-0", "delete", "", "default", "pods", "", "web-0"),
        (
            "DELETE",
            "/api/v1/namespaces/default/pods?labelSelector=app%3Dweb",
            "deletecollection",
            "",
            "default",
            "pods",
            "",
            "",
        ),
        ("GET", "/api/v1/nodes/n1", "get", "", "", "nodes", "", "n1"),
        ("PATCH", "/api/v1/nodes/n1/status", "patch", "", "", "nodes", "status", "n1"),
        ("GET", "/api/v1/namespaces", "list", "", "", "namespaces", "", ""),
        ("GET", "/api/v1/namespaces/prod", "get", "", "prod", "namespaces", "", "prod"),
        ("PUT", "/api/v1/namespaces/prod/finalize", "update", "", "prod", "namespaces", "finalize", "prod"),
        (
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            "create",
            "authorization.k8s.io",
            "",
            "selfsubjectaccessreviews",
            "",
            "",
        ),
        (
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
            "create",
            "rbac.authorization.k8s.io",
            "default",
            "rolebindings",
            "",
            "",
        ),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1",
            "get",
            "coordination.k8s.io",
            "kube-node-lease",
            "leases",
            "",
            "n1",
        ),
    ];

    #[test]
    fn kubectl_paths_read_as_kubernetes_reads_them() {
        for &(method, target, verb, group, ns, resource, sub, name) in KUBECTL {
            let (path, query) = target.split_once('?').map_or((target, None), |(p, q)| (p, Some(q)));
            let a = Attributes::of(&method.parse().expect("method"), path, query);
            assert!(a.resource_request, "{target}");
            assert_eq!(
                (
                    a.verb.as_str(),
                    a.api_group.as_str(),
                    a.namespace.as_str(),
                    a.resource.as_str(),
                    a.subresource.as_str(),
                    a.name.as_str()
                ),
                (verb, group, ns, resource, sub, name),
                "{method} {target}"
            );
        }
    }

    #[test]
    fn paths_outside_the_resource_tree_are_non_resource_urls_with_the_method_as_verb() {
        for path in [
            "/healthz",
            "/version",
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps/v1",
            "/openapi/v2",
            "/metrics",
            "/openapi/v3/apis/apps/v1",
            "/dashboard/index.html",
        ] {
            let a = Attributes::of(&Method::GET, path, None);
            assert!(!a.resource_request, "{path}");
            assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", path));
        }
        assert_eq!(Attributes::of(&Method::POST, "/healthz", None).verb, "post");
    }

    proptest::proptest! {
        #[test]
        fn any_path_and_query_reads_without_panicking(path in "(/[a-z%0-9.:]{0,8}){0,8}/?", query in "[a-z%=&+.0-9]{0,40}") {
            for method in [Method::GET, Method::POST, Method::DELETE, Method::PATCH] {
                let a = Attributes::of(&method, &path, Some(&query));
                proptest::prop_assert!(!a.verb.is_empty());
            }
        }
    }

    #[test]
    fn query_values_are_percent_decoded_and_malformed_escapes_kept() {
        assert_eq!(decode("metadata.name%3Dweb-0"), "metadata.name=web-0");
        assert_eq!(decode("a%2"), "a%2");
        assert_eq!(decode("%zz+x"), "%zz x");
    }
}
