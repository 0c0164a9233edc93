//! Validation of RBAC objects (`rbac.authorization.k8s.io/v1`), with Kubernetes' field paths and messages.

use serde_json::Value;

use super::{field_str, field_value, invalid_value, unsupported_value};
use crate::error::Cause;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// RBAC names are path segments, not DNS names: `system:node` is a valid role name.
pub(super) fn path_segment_name_problem(name: &str) -> Option<&'static str> {
    if name == "." || name == ".." {
        Some("may not be '.' or '..'")
    } else if name.contains('/') {
        Some("may not contain '/'")
    } else if name.contains('%') {
        Some("may not contain '%'")
    } else {
        None
    }
}

/// A Role's or ClusterRole's rules; `namespaced` rules cannot name non-resource URLs.
pub(super) fn validate_role(obj: &Value, namespaced: bool, c: &mut Vec<Cause>) {
    let Some(rules) = field_value(obj, "rules") else { return };
    let Some(rules) = rules.as_array() else { return };
    for (i, rule) in rules.iter().enumerate() {
        let base = format!("rules[{i}]");
        let list = |key: &str| rule.get(key).and_then(Value::as_array).filter(|l| !l.is_empty());
        if list("verbs").is_none() {
            c.push(Cause::required(format!("{base}.verbs")));
        }
        match list("nonResourceURLs") {
            Some(urls) => {
                let shown = Value::Array(urls.clone());
                if namespaced {
                    c.push(invalid_value(
                        format!("{base}.nonResourceURLs"),
                        &shown,
                        "namespaced rules cannot apply to non-resource URLs",
                    ));
                } else if list("apiGroups").is_some() || list("resources").is_some() {
                    c.push(invalid_value(
                        format!("{base}.nonResourceURLs"),
                        &shown,
                        "rules cannot apply to both regular resources and non-resource URLs",
                    ));
                }
            }
            None => {
                if list("apiGroups").is_none() {
                    c.push(Cause::required(format!("{base}.apiGroups")));
                }
                if list("resources").is_none() {
                    c.push(Cause::required(format!("{base}.resources")));
                }
            }
        }
    }
}

/// A RoleBinding's or ClusterRoleBinding's role reference and subjects.
pub(super) fn validate_binding(obj: &Value, cluster: bool, c: &mut Vec<Cause>) {
    let kinds: &[&str] = if cluster { &["ClusterRole"] } else { &["Role", "ClusterRole"] };
    match field_value(obj, "roleRef") {
        None => c.push(Cause::required("roleRef")),
        Some(role_ref) => {
            let group = field_str(role_ref, "apiGroup").unwrap_or("");
            if group != RBAC_GROUP {
                c.push(unsupported_value("roleRef.apiGroup", group, &[RBAC_GROUP]));
            }
            let kind = field_str(role_ref, "kind").unwrap_or("");
            if !kinds.contains(&kind) {
                c.push(unsupported_value("roleRef.kind", kind, kinds));
            }
            match field_str(role_ref, "name").unwrap_or("") {
                "" => c.push(Cause::required("roleRef.name")),
                name => {
                    if let Some(problem) = path_segment_name_problem(name) {
                        c.push(invalid_value("roleRef.name", &Value::from(name), problem));
                    }
                }
            }
        }
    }
    let Some(subjects) = field_value(obj, "subjects").and_then(Value::as_array) else { return };
    for (i, s) in subjects.iter().enumerate() {
        let base = format!("subjects[{i}]");
        let name = field_str(s, "name").unwrap_or("");
        if name.is_empty() {
            c.push(Cause::required(format!("{base}.name")));
        }
        let group = field_str(s, "apiGroup").unwrap_or("");
        match field_str(s, "kind").unwrap_or("") {
            "ServiceAccount" => {
                if !group.is_empty() {
                    c.push(unsupported_value(format!("{base}.apiGroup"), group, &[""]));
                }
                if cluster && field_str(s, "namespace").unwrap_or("").is_empty() {
                    c.push(Cause::required(format!("{base}.namespace")));
                }
            }
            "User" | "Group" => {
                if group != RBAC_GROUP {
                    c.push(unsupported_value(format!("{base}.apiGroup"), group, &[RBAC_GROUP]));
                }
            }
            kind => c.push(unsupported_value(format!("{base}.kind"), kind, &["ServiceAccount", "User", "Group"])),
        }
    }
}

/// A binding's `roleRef` is fixed at creation: a different role is a different binding.
pub(super) fn validate_binding_update(old: &Value, new: &Value, c: &mut Vec<Cause>) {
    if let (Some(o), Some(n)) = (field_value(old, "roleRef"), field_value(new, "roleRef"))
        && o != n
    {
        c.push(invalid_value("roleRef", n, "cannot change roleRef"));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::kinds;
    use crate::validation::{validate, validate_update};

    fn fields(r: Result<(), crate::ApiError>) -> Vec<String> {
        match r {
            Err(crate::ApiError::Invalid { causes, .. }) => {
                causes.into_iter().map(|c| format!("{}: {}", c.field, c.message)).collect()
            }
            other => panic!("expected 422, got {other:?}"),
        }
    }

    #[test]
    fn role_names_may_hold_colons_and_rules_name_what_is_missing() {
        let ok = json!({"metadata": {"name": "system:node"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            {"nonResourceURLs": ["/healthz"], "verbs": ["get"]}]});
        validate(&kinds::CLUSTERROLE, &ok).expect("valid");
        let bad = json!({"metadata": {"name": "r", "namespace": "default"}, "rules": [{"resources": ["pods"]},
            {"nonResourceURLs": ["/healthz"], "verbs": ["get"]}]});
        assert_eq!(
            fields(validate(&kinds::ROLE, &bad)),
            [
                "rules[0].verbs: Required value",
                "rules[0].apiGroups: Required value",
                "rules[1].nonResourceURLs: Invalid value: [\"/healthz\"]: namespaced rules cannot apply to non-resource URLs",
            ]
        );
    }

    #[test]
    fn bindings_take_only_users_groups_and_service_accounts_and_keep_their_role() {
        let binding = json!({"metadata": {"name": "b", "namespace": "default"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "bob"},
                {"kind": "Robot", "name": "r2"}]});
        assert_eq!(
            fields(validate(&kinds::ROLEBINDING, &binding)),
            [
                "subjects[1].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\""
            ]
        );
        let mut fine = binding.clone();
        fine["subjects"] = json!([{"kind": "ServiceAccount", "name": "default", "namespace": "default"}]);
        let mut other_role = fine.clone();
        other_role["roleRef"]["name"] = json!("edit");
        assert_eq!(
            fields(validate_update(&kinds::ROLEBINDING, &fine, &other_role)),
            [
                "roleRef: Invalid value: {\"apiGroup\":\"rbac.authorization.k8s.io\",\"kind\":\"ClusterRole\",\"name\":\"edit\"}: \
             cannot change roleRef"
            ]
        );
        let cluster = json!({"metadata": {"name": "b"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "x"},
            "subjects": [{"kind": "ServiceAccount", "name": "default"}]});
        assert_eq!(
            fields(validate(&kinds::CLUSTERROLEBINDING, &cluster)),
            [
                "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                "subjects[0].namespace: Required value"
            ]
        );
    }
}
