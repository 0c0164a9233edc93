//! Layout of the protobuf messages of `rbac.authorization.k8s.io/v1`, `authorization.k8s.io/v1` and
//! `authentication.k8s.io/v1`'s TokenRequest: field
//! numbers, JSON names and types, as Kubernetes' generated.proto files give them.

use super::Ty::*;
use super::{Message, one, rep};

const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta";
const LIST_META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta";

pub(super) static MESSAGES: &[Message] = &[
    Message { name: "k8s.io.api.rbac.v1.AggregationRule", fields: &[
        rep(1, "clusterRoleSelectors", Msg("k8s.io.apimachinery.pkg.apis.meta.v1.LabelSelector")),
    ] },
    Message { name: "k8s.io.api.rbac.v1.ClusterRole", fields: &[
        one(1, "metadata", Msg(META)),
        rep(2, "rules", Msg("k8s.io.api.rbac.v1.PolicyRule")),
        one(3, "aggregationRule", Msg("k8s.io.api.rbac.v1.AggregationRule")),
    ] },
    Message { name: "k8s.io.api.rbac.v1.ClusterRoleBinding", fields: &[
        one(1, "metadata", Msg(META)),
        rep(2, "subjects", Msg("k8s.io.api.rbac.v1.Subject")),
        one(3, "roleRef", Msg("k8s.io.api.rbac.v1.RoleRef")),
    ] },
    Message { name: "k8s.io.api.rbac.v1.ClusterRoleBindingList", fields: &[
        one(1, "metadata", Msg(LIST_META)),
        rep(2, "items", Msg("k8s.io.api.rbac.v1.ClusterRoleBinding")),
    ] },
    Message { name: "k8s.io.api.rbac.v1.ClusterRoleList", fields: &[
        one(1, "metadata", Msg(LIST_META)),
        rep(2, "items", Msg("k8s.io.api.rbac.v1.ClusterRole")),
    ] },
    Message { name: "k8s.io.api.rbac.v1.PolicyRule", fields: &[
        rep(1, "verbs", Str),
        rep(2, "apiGroups", Str),
        rep(3, "resources", Str),
        rep(4, "resourceNames", Str),
        rep(5, "nonResourceURLs", Str),
    ] },
    Message { name: "k8s.io.api.rbac.v1.Role", fields: &[
        one(1, "metadata", Msg(META)),
        rep(2, "rules", Msg("k8s.io.api.rbac.v1.PolicyRule")),
    ] },
    Message { name: "k8s.io.api.rbac.v1.RoleBinding", fields: &[
        one(1, "metadata", Msg(META)),
        rep(2, "subjects", Msg("k8s.io.api.rbac.v1.Subject")),
        one(3, "roleRef", Msg("k8s.io.api.rbac.v1.RoleRef")),
    ] },
    Message { name: "k8s.io.api.rbac.v1.RoleBindingList", fields: &[
        one(1, "metadata", Msg(LIST_META)),
        rep(2, "items", Msg("k8s.io.api.rbac.v1.RoleBinding")),
    ] },
    Message { name: "k8s.io.api.rbac.v1.RoleList", fields: &[
        one(1, "metadata", Msg(LIST_META)),
        rep(2, "items", Msg("k8s.io.api.rbac.v1.Role")),
    ] },
    Message { name: "k8s.io.api.rbac.v1.RoleRef", fields: &[
        one(1, "apiGroup", Str),
        one(2, "kind", Str),
        one(3, "name", Str),
    ] },
    Message { name: "k8s.io.api.rbac.v1.Subject", fields: &[
        one(1, "kind", Str),
        one(2, "apiGroup", Str),
        one(3, "name", Str),
        one(4, "namespace", Str),
    ] },
    Message { name: "k8s.io.api.authorization.v1.ExtraValue", fields: &[
        rep(1, "items", Str),
    ] },
    Message { name: "k8s.io.api.authorization.v1.LocalSubjectAccessReview", fields: &[
        one(1, "metadata", Msg(META)),
        one(2, "spec", Msg("k8s.io.api.authorization.v1.SubjectAccessReviewSpec")),
        one(3, "status", Msg("k8s.io.api.authorization.v1.SubjectAccessReviewStatus")),
    ] },
    Message { name: "k8s.io.api.authorization.v1.NonResourceAttributes", fields: &[
        one(1, "path", Str),
        one(2, "verb", Str),
    ] },
    Message { name: "k8s.io.api.authorization.v1.NonResourceRule", fields: &[
        rep(1, "verbs", Str),
        rep(2, "nonResourceURLs", Str),
    ] },
    Message { name: "k8s.io.api.authorization.v1.ResourceAttributes", fields: &[
        one(1, "namespace", Str),
        one(2, "verb", Str),
        one(3, "group", Str),
        one(4, "version", Str),
        one(5, "resource", Str),
        one(6, "subresource", Str),
        one(7, "name", Str),
    ] },
    Message { name: "k8s.io.api.authorization.v1.ResourceRule", fields: &[
        rep(1, "verbs", Str),
        rep(2, "apiGroups", Str),
        rep(3, "resources", Str),
        rep(4, "resourceNames", Str),
    ] },
    Message { name: "k8s.io.api.authorization.v1.SelfSubjectAccessReview", fields: &[
        one(1, "metadata", Msg(META)),
        one(2, "spec", Msg("k8s.io.api.authorization.v1.SelfSubjectAccessReviewSpec")),
        one(3, "status", Msg("k8s.io.api.authorization.v1.SubjectAccessReviewStatus")),
    ] },
    Message { name: "k8s.io.api.authorization.v1.SelfSubjectAccessReviewSpec", fields: &[
        one(1, "resourceAttributes", Msg("k8s.io.api.authorization.v1.ResourceAttributes")),
        one(2, "nonResourceAttributes", Msg("k8s.io.api.authorization.v1.NonResourceAttributes")),
    ] },
    Message { name: "k8s.io.api.authorization.v1.SelfSubjectRulesReview", fields: &[
        one(1, "metadata", Msg(META)),
        one(2, "spec", Msg("k8s.io.api.authorization.v1.SelfSubjectRulesReviewSpec")),
        one(3, "status", Msg("k8s.io.api.authorization.v1.SubjectRulesReviewStatus")),
    ] },
    Message { name: "k8s.io.api.authorization.v1.SelfSubjectRulesReviewSpec", fields: &[
        one(1, "namespace", Str),
    ] },
    Message { name: "k8s.io.api.authorization.v1.SubjectAccessReview", fields: &[
        one(1, "metadata", Msg(META)),
        one(2, "spec", Msg("k8s.io.api.authorization.v1.SubjectAccessReviewSpec")),
        one(3, "status", Msg("k8s.io.api.authorization.v1.SubjectAccessReviewStatus")),
    ] },
    Message { name: "k8s.io.api.authorization.v1.SubjectAccessReviewSpec", fields: &[
        one(1, "resourceAttributes", Msg("k8s.io.api.authorization.v1.ResourceAttributes")),
        one(2, "nonResourceAttributes", Msg("k8s.io.api.authorization.v1.NonResourceAttributes")),
        one(3, "user", Str),
        rep(4, "groups", Str),
        one(5, "extra", Map(&Msg("k8s.io.api.authorization.v1.ExtraValue"))),
        one(6, "uid", Str),
    ] },
    Message { name: "k8s.io.api.authorization.v1.SubjectAccessReviewStatus", fields: &[
        one(1, "allowed", Bool),
        one(2, "reason", Str),
        one(3, "evaluationError", Str),
        one(4, "denied", Bool),
    ] },
    Message { name: "k8s.io.api.authorization.v1.SubjectRulesReviewStatus", fields: &[
        rep(1, "resourceRules", Msg("k8s.io.api.authorization.v1.ResourceRule")),
        rep(2, "nonResourceRules", Msg("k8s.io.api.authorization.v1.NonResourceRule")),
        one(3, "incomplete", Bool),
        one(4, "evaluationError", Str),
    ] },
    Message { name: "k8s.io.api.authentication.v1.BoundObjectReference", fields: &[
        one(1, "kind", Str),
        one(2, "apiVersion", Str),
        one(3, "name", Str),
        one(4, "uid", Str),
    ] },
    Message { name: "k8s.io.api.authentication.v1.TokenRequest", fields: &[
        one(1, "metadata", Msg(META)),
        one(2, "spec", Msg("k8s.io.api.authentication.v1.TokenRequestSpec")),
        one(3, "status", Msg("k8s.io.api.authentication.v1.TokenRequestStatus")),
    ] },
    Message { name: "k8s.io.api.authentication.v1.TokenRequestSpec", fields: &[
        rep(1, "audiences", Str),
        one(4, "expirationSeconds", I64),
        one(3, "boundObjectRef", Msg("k8s.io.api.authentication.v1.BoundObjectReference")),
    ] },
    Message { name: "k8s.io.api.authentication.v1.TokenRequestStatus", fields: &[
        one(1, "token", Str),
        one(2, "expirationTimestamp", Msg("k8s.io.apimachinery.pkg.apis.meta.v1.Time")),
    ] },
];
