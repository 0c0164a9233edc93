//! Object validation: names and metadata, the Kubernetes schema (unknown fields and wrong JSON
//! types), fields Shepherd does not implement, and per-kind rules; every bad field is reported.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Event, Namespace, Node, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiError, Cause};
use crate::kinds::ResourceInfo;
use crate::quantity::{self, Quantity};
use crate::selector::LabelSelector;
use crate::volume_validation;

mod apps;
mod autoscaling;
mod batch;
mod rbac;
mod schema;

/// Where in an object an unsupported field sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// `spec` of a Pod, `spec.template.spec` of a Deployment or ReplicaSet.
    PodSpec,
    /// Each entry of a pod spec's `containers`.
    Container,
    /// Each entry of a container's `env`.
    EnvVar,
    /// A container's `livenessProbe` and `readinessProbe`.
    Probe,
    /// `spec` of a Service.
    ServiceSpec,
}

/// Real Kubernetes fields Shepherd does not implement (yet): setting one is a 422 rather than a
/// silently ignored wish. Remove a line when the feature lands.
const UNSUPPORTED: &[(Scope, &str)] = &[
    (Scope::PodSpec, "initContainers"),
    (Scope::PodSpec, "ephemeralContainers"),
    (Scope::PodSpec, "hostPID"),
    (Scope::PodSpec, "hostIPC"),
    (Scope::PodSpec, "securityContext.runAsNonRoot"),
    (Scope::PodSpec, "securityContext.fsGroup"),
    (Scope::PodSpec, "securityContext.fsGroupChangePolicy"),
    (Scope::PodSpec, "securityContext.supplementalGroups"),
    (Scope::PodSpec, "securityContext.supplementalGroupsPolicy"),
    (Scope::PodSpec, "securityContext.sysctls"),
    (Scope::PodSpec, "securityContext.seLinuxOptions"),
    (Scope::PodSpec, "securityContext.seLinuxChangePolicy"),
    (Scope::PodSpec, "securityContext.seccompProfile"),
    (Scope::PodSpec, "securityContext.appArmorProfile"),
    (Scope::PodSpec, "securityContext.windowsOptions"),
    (Scope::PodSpec, "affinity.podAffinity"),
    (Scope::PodSpec, "affinity.podAntiAffinity"),
    (Scope::PodSpec, "topologySpreadConstraints"),
    (Scope::PodSpec, "overhead"),
    (Scope::PodSpec, "runtimeClassName"),
    (Scope::PodSpec, "readinessGates"),
    (Scope::PodSpec, "resourceClaims"),
    (Scope::PodSpec, "schedulingGates"),
    (Scope::PodSpec, "dnsConfig"),
    (Scope::PodSpec, "hostAliases"),
    (Scope::Container, "volumeDevices"),
    (Scope::Container, "securityContext.runAsNonRoot"),
    (Scope::Container, "securityContext.seLinuxOptions"),
    (Scope::Container, "securityContext.seccompProfile"),
    (Scope::Container, "securityContext.appArmorProfile"),
    (Scope::Container, "securityContext.procMount"),
    (Scope::Container, "securityContext.windowsOptions"),
    (Scope::Container, "lifecycle.postStart"),
    (Scope::Container, "lifecycle.preStop.exec"),
    (Scope::Container, "lifecycle.preStop.httpGet"),
    (Scope::Container, "lifecycle.preStop.tcpSocket"),
    (Scope::Container, "lifecycle.stopSignal"),
    (Scope::Container, "startupProbe"),
    (Scope::Container, "resizePolicy"),
    (Scope::Probe, "grpc"),
    (Scope::ServiceSpec, "externalName"),
    (Scope::ServiceSpec, "loadBalancerIP"),
];

impl Scope {
    /// The OpenAPI definition this scope's fields belong to.
    fn definition(self) -> &'static str {
        match self {
            Scope::PodSpec => "io.k8s.api.core.v1.PodSpec",
            Scope::Container => "io.k8s.api.core.v1.Container",
            Scope::EnvVar => "io.k8s.api.core.v1.EnvVar",
            Scope::Probe => "io.k8s.api.core.v1.Probe",
            Scope::ServiceSpec => "io.k8s.api.core.v1.ServiceSpec",
        }
    }
}

/// The fields Shepherd refuses, as (OpenAPI definition name, dotted field path inside it): the
/// published OpenAPI documents leave them out, so that clients describe only what is served.
pub fn unsupported_fields() -> impl Iterator<Item = (&'static str, &'static str)> {
    UNSUPPORTED.iter().map(|(scope, field)| (scope.definition(), *field)).chain(volume_validation::UNSUPPORTED.iter().copied())
}

const NOT_SUPPORTED: &str = "not supported by Shepherd";

/// Total size of all annotation keys and values, as Kubernetes limits it.
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

const DNS1123_LABEL_RULE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \
     '-', start and end with an alphanumeric character, and be at most 63 characters";
const DNS1123_SUBDOMAIN_RULE: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
     characters, '-' or '.', start and end with an alphanumeric character, and be at most 253 characters";
const QUALIFIED_NAME_RULE: &str = "a qualified name must consist of alphanumeric characters, '-', '_' or '.', start \
     and end with an alphanumeric character, be at most 63 characters, with an optional DNS subdomain prefix and '/' \
     (e.g. 'example.com/MyName')";
const LABEL_VALUE_RULE: &str = "a valid label value must be an empty string or consist of alphanumeric characters, \
     '-', '_' or '.', start and end with an alphanumeric character, and be at most 63 characters";
const PORT_NAME_RULE: &str = "a port name must be at most 15 lower case alphanumeric characters or '-', contain at \
     least one letter, start and end with an alphanumeric character, and not contain '--'";
const PORT_RANGE_RULE: &str = "must be between 1 and 65535, inclusive";

const POD_UPDATE_RULE: &str = "pod updates may not change fields other than `spec.containers[*].image`, \
     `spec.activeDeadlineSeconds` and `spec.tolerations` (only additions to existing tolerations); \
     `spec.nodeName` is set through the binding subresource";

// ---------------------------------------------------------------------------------------------
// Name validators
// ---------------------------------------------------------------------------------------------

fn is_lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters: namespace and service names.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        && is_lower_alnum(b[0])
        && is_lower_alnum(b[b.len() - 1])
}

/// Dot-separated DNS-1123 labels, at most 253 characters: most object names.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(|part| {
        let b = part.as_bytes();
        !b.is_empty()
            && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
            && is_lower_alnum(b[0])
            && is_lower_alnum(b[b.len() - 1])
    })
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]` up to 63 characters, possibly empty.
fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() <= 63
        && (b.is_empty()
            || (b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))))
}

/// A label or annotation key: `name` or `prefix/name`, where the prefix is a DNS-1123 subdomain
/// and the name is 1 to 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    !name.is_empty() && is_name_part(name) && prefix.is_none_or(is_dns1123_subdomain)
}

/// A label value: empty, or up to 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn is_label_value(s: &str) -> bool {
    is_name_part(s)
}

/// An IANA service name, as container port names must be (`http`, `metrics-1`).
fn is_port_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 15
        && b.iter().all(|&c| is_lower_alnum(c) || c == b'-')
        && b.iter().any(u8::is_ascii_lowercase)
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
        && !s.contains("--")
}

// ---------------------------------------------------------------------------------------------
// Quantities
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

/// Validates an object of kind `res` as sent by a client, after defaulting.
pub fn validate(res: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    validate_as(res, obj, Schema::Check)
}

/// Whether validation reads the object against the Kubernetes schema (unknown fields, JSON
/// types) or knows it already fits: [`prune_unknown_fields`] just read it, and only known fields
/// of the right types were added since (defaults, server-owned metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    Check,
    AlreadyChecked,
}

/// [`validate`], skipping the schema check when it was already done.
pub fn validate_as(res: &ResourceInfo, obj: &Value, schema: Schema) -> Result<(), ApiError> {
    let causes = causes_for(res, obj, schema);
    finish(res, obj, causes)
}

/// Validates `new` as a replacement for the stored `old`: everything [`validate`] checks, plus the
/// fields that may not change after creation.
pub fn validate_update(res: &ResourceInfo, old: &Value, new: &Value) -> Result<(), ApiError> {
    validate_update_as(res, old, new, Schema::Check)
}

/// [`validate_update`], skipping the schema check when it was already done.
pub fn validate_update_as(res: &ResourceInfo, old: &Value, new: &Value, schema: Schema) -> Result<(), ApiError> {
    let mut c = causes_for(res, new, schema);
    for field in ["name", "namespace", "uid", "creationTimestamp"] {
        let path = format!("metadata.{field}");
        let sent = field_str(new, &path).unwrap_or("");
        let stored = field_str(old, &path).unwrap_or("");
        if !sent.is_empty() && sent != stored {
            c.push(Cause::invalid(path, format!("Invalid value: \"{sent}\": field is immutable")));
        }
    }
    // An object being deleted waits only for the finalizers it had then (the deletion itself may
    // add the propagation policy's; that path does not come through here).
    if field_value(old, "metadata.deletionTimestamp").is_some_and(|t| !t.is_null()) {
        let had = crate::meta::finalizers(old);
        let added: Vec<&str> = crate::meta::finalizers(new).into_iter().filter(|f| !had.contains(f)).collect();
        if !added.is_empty() {
            c.push(Cause::forbidden(
                "metadata.finalizers",
                format!("no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"),
            ));
        }
    }
    match res.kind {
        "Deployment" | "ReplicaSet" => {
            if let (Some(o), Some(n)) = (field_value(old, "spec.selector"), field_value(new, "spec.selector")) {
                let same = match (LabelSelector::from_k8s(o), LabelSelector::from_k8s(n)) {
                    (Ok(a), Ok(b)) => a == b,
                    _ => strip_nulls(o) == strip_nulls(n),
                };
                if !same {
                    c.push(Cause::invalid("spec.selector", format!("Invalid value: {}: field is immutable", n)));
                }
            }
        }
        "Pod" => {
            if let (Some(o), Some(n)) = (field_value(old, "spec"), field_value(new, "spec"))
                && !pod_spec_update_allowed(o, n)
            {
                c.push(Cause::forbidden("spec", POD_UPDATE_RULE));
            }
        }
        "EndpointSlice" => {
            let (stored, sent) = (field_str(old, "addressType"), field_str(new, "addressType"));
            if stored.is_some() && sent != stored {
                c.push(Cause::invalid("addressType", format!("Invalid value: \"{}\": field is immutable", sent.unwrap_or(""))));
            }
        }
        "ConfigMap" | "Secret" => crate::config_validation::validate_config_update(res.kind, old, new, &mut c),
        "Job" => batch::validate_job_update(old, new, &mut c),
        "DaemonSet" => apps::validate_daemon_set_update(old, new, &mut c),
        "StatefulSet" => apps::validate_stateful_set_update(old, new, &mut c),
        "RoleBinding" | "ClusterRoleBinding" => rbac::validate_binding_update(old, new, &mut c),
        "CertificateSigningRequest" if field_value(old, "spec") != field_value(new, "spec") => {
            c.push(Cause::forbidden("spec", "a CertificateSigningRequest's spec is immutable"));
        }
        // The pod CIDR is assigned once, from nothing (Kubernetes' `ValidateNodeUpdate`): routes
        // and pod addresses on the node were made from it.
        "Node" if !node_pod_cidrs(old).is_empty() && node_pod_cidrs(new) != node_pod_cidrs(old) => {
            c.push(Cause::forbidden("spec.podCIDRs", "node updates may not change podCIDR except from \"\" to valid"));
        }
        "Service" => {
            let stored = field_str(old, "spec.clusterIP").unwrap_or("");
            let sent = field_str(new, "spec.clusterIP").unwrap_or("");
            if !stored.is_empty() && !sent.is_empty() && sent != stored {
                c.push(Cause::invalid("spec.clusterIP", format!("Invalid value: \"{sent}\": field is immutable")));
            }
        }
        _ => {}
    }
    finish(res, new, c)
}

/// A Node's pod CIDRs: `spec.podCIDRs`, or the older single `spec.podCIDR` when only it is set.
fn node_pod_cidrs(node: &Value) -> Vec<&str> {
    let list: Vec<&str> = field_value(node, "spec.podCIDRs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !list.is_empty() {
        return list;
    }
    field_str(node, "spec.podCIDR").filter(|c| !c.is_empty()).into_iter().collect()
}

fn finish(res: &ResourceInfo, obj: &Value, causes: Vec<Cause>) -> Result<(), ApiError> {
    if causes.is_empty() {
        return Ok(());
    }
    let name = field_str(obj, "metadata.name")
        .filter(|n| !n.is_empty())
        .or_else(|| field_str(obj, "metadata.generateName"))
        .unwrap_or("");
    Err(ApiError::invalid(res.kind, name, causes))
}

fn causes_for(res: &ResourceInfo, obj: &Value, schema: Schema) -> Vec<Cause> {
    let mut c = Vec::new();
    if !obj.is_object() {
        c.push(Cause::invalid("", "an object must be a JSON object"));
        return c;
    }
    validate_metadata(res, obj, &mut c);
    if schema == Schema::Check {
        check_schema(res, obj, &mut c);
    }
    match res.kind {
        "Pod" => {
            check_unsupported_in_pod_spec(obj.get("spec"), "spec", &mut c);
            validate_pod_spec(obj.get("spec"), "spec", &mut c);
        }
        "Deployment" | "ReplicaSet" => {
            validate_workload(res, obj, &mut c);
        }
        "Service" => {
            check_unsupported(Scope::ServiceSpec, obj.get("spec"), "spec", &mut c);
            validate_service(obj, &mut c);
        }
        "Endpoints" => validate_endpoints(obj, &mut c),
        "EndpointSlice" => validate_endpoint_slice(obj, &mut c),
        "PodDisruptionBudget" => validate_pod_disruption_budget(obj, &mut c),
        "ConfigMap" => crate::config_validation::validate_config_map(obj, &mut c),
        "Secret" => crate::config_validation::validate_secret(obj, &mut c),
        "Job" => batch::validate_job(obj, &mut c),
        "CronJob" => batch::validate_cron_job(obj, &mut c),
        "DaemonSet" => apps::validate_daemon_set(obj, &mut c),
        "StatefulSet" => apps::validate_stateful_set(obj, &mut c),
        "ReplicationController" => apps::validate_replication_controller(obj, &mut c),
        "Role" | "ClusterRole" => rbac::validate_role(obj, res.namespaced, &mut c),
        "RoleBinding" | "ClusterRoleBinding" => rbac::validate_binding(obj, !res.namespaced, &mut c),
        "HorizontalPodAutoscaler" => autoscaling::validate_horizontal_pod_autoscaler(obj, &mut c),
        _ => {}
    }
    c
}

// ---------------------------------------------------------------------------------------------
// Field readers
// ---------------------------------------------------------------------------------------------
// Validation reads by the dotted field path its errors name (`spec.replicas`), not by JSON pointer
// (`crate::json`): one string serves as both the lookup and the field in the 422.

/// The non-null value at a dotted field path.
fn field_value<'a>(v: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(v, |v, k| v.get(k)).filter(|v| !v.is_null())
}

fn field_str<'a>(v: &'a Value, dotted: &str) -> Option<&'a str> {
    field_value(v, dotted).and_then(Value::as_str)
}

fn field_int(v: &Value, dotted: &str) -> Option<i64> {
    field_value(v, dotted).and_then(Value::as_i64)
}

fn join(base: &str, key: &str) -> String {
    if base.is_empty() { key.to_string() } else { format!("{base}.{key}") }
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), strip_nulls(v))).collect()),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

fn invalid_value(field: impl Into<String>, value: &Value, why: &str) -> Cause {
    Cause::invalid(field, format!("Invalid value: {value}: {why}"))
}

fn unsupported_value(field: impl Into<String>, value: &str, supported: &[&str]) -> Cause {
    let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
    Cause::not_supported(field, format!("Unsupported value: \"{value}\": supported values: {}", list.join(", ")))
}

fn check_one_of(v: &Value, key: &str, base: &str, supported: &[&str], c: &mut Vec<Cause>) {
    if let Some(s) = field_str(v, key)
        && !supported.contains(&s)
    {
        c.push(unsupported_value(join(base, key), s, supported));
    }
}

fn check_min(v: &Value, key: &str, base: &str, min: i64, c: &mut Vec<Cause>) {
    if let Some(n) = field_int(v, key)
        && n < min
    {
        c.push(invalid_value(join(base, key), &Value::from(n), &format!("must be greater than or equal to {min}")));
    }
}

// ---------------------------------------------------------------------------------------------
// Metadata
// ---------------------------------------------------------------------------------------------

fn validate_metadata(res: &ResourceInfo, obj: &Value, c: &mut Vec<Cause>) {
    let meta = obj.get("metadata").unwrap_or(&Value::Null);
    if !meta.is_object() && !meta.is_null() {
        return; // the schema check names the type error
    }
    let (name_ok, rule): (fn(&str) -> bool, &str) = match res.kind {
        "Namespace" | "Service" => (is_dns1123_label, DNS1123_LABEL_RULE),
        _ => (is_dns1123_subdomain, DNS1123_SUBDOMAIN_RULE),
    };
    let name = field_str(meta, "name").unwrap_or("");
    let generate = field_str(meta, "generateName").unwrap_or("");
    let path_segment = res.group == "rbac.authorization.k8s.io";
    if name.is_empty() {
        if generate.is_empty() {
            c.push(Cause::new("FieldValueRequired", "metadata.name", "name or generateName is required"));
        }
    } else if path_segment {
        if let Some(problem) = rbac::path_segment_name_problem(name) {
            c.push(invalid_value("metadata.name", &Value::from(name), problem));
        }
    } else if !name_ok(name) {
        c.push(invalid_value("metadata.name", &Value::from(name), rule));
    }
    if !generate.is_empty() && !path_segment {
        // A prefix may end in '-' (`web-`), which a random suffix then follows.
        let completed = match generate.strip_suffix('-') {
            Some(stem) => format!("{stem}a"),
            None => generate.to_string(),
        };
        if !name_ok(&completed) {
            c.push(invalid_value("metadata.generateName", &Value::from(generate), rule));
        }
    }
    if let Some(ns) = field_str(meta, "namespace").filter(|ns| !ns.is_empty()) {
        if !res.namespaced {
            c.push(Cause::forbidden("metadata.namespace", format!("not allowed on cluster-scoped {}", res.plural)));
        } else if !is_dns1123_label(ns) {
            c.push(invalid_value("metadata.namespace", &Value::from(ns), DNS1123_LABEL_RULE));
        }
    }
    validate_labels(meta.get("labels"), "metadata.labels", c);
    for f in meta.get("finalizers").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        if !is_qualified_name(f) {
            c.push(invalid_value("metadata.finalizers", &Value::from(f), QUALIFIED_NAME_RULE));
        }
    }
    if let Some(Value::Object(annotations)) = meta.get("annotations") {
        let mut total = 0;
        for (k, v) in annotations {
            total += k.len() + v.as_str().map_or(0, str::len);
            if !is_qualified_name(k) {
                c.push(invalid_value("metadata.annotations", &Value::from(k.as_str()), QUALIFIED_NAME_RULE));
            }
        }
        if total > ANNOTATIONS_MAX_BYTES {
            c.push(Cause::new(
                "FieldValueTooLong",
                "metadata.annotations",
                format!("Too long: may not be more than {ANNOTATIONS_MAX_BYTES} bytes (got {total})"),
            ));
        }
    }
}

/// A map of label keys to label values (`metadata.labels`, `spec.selector`, `nodeSelector`).
fn validate_labels(labels: Option<&Value>, path: &str, c: &mut Vec<Cause>) {
    let Some(Value::Object(labels)) = labels else { return };
    for (k, v) in labels {
        if !is_qualified_name(k) {
            c.push(invalid_value(path, &Value::from(k.as_str()), &format!("label key: {QUALIFIED_NAME_RULE}")));
        }
        if let Some(s) = v.as_str()
            && !is_label_value(s)
        {
            c.push(invalid_value(path, v, &format!("value of label \"{k}\": {LABEL_VALUE_RULE}")));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Schema: unknown fields and JSON type errors, judged by the k8s-openapi types (in place, see schema.rs)
// ---------------------------------------------------------------------------------------------

fn check_schema(res: &ResourceInfo, obj: &Value, c: &mut Vec<Cause>) {
    match schema::read(res, obj) {
        schema::Reading::NoSchema => {}
        schema::Reading::Fits(unknown) => {
            c.extend(unknown.iter().map(|u| Cause::not_supported(u.path.clone(), format!("unknown field \"{}\"", u.key()))));
        }
        schema::Reading::Doubt => check_schema_typed(res, obj, c),
    }
}

/// The schema check by the typed form, for objects the in-place walk does not vouch for: its
/// first error is the cause reported.
fn check_schema_typed(res: &ResourceInfo, obj: &Value, c: &mut Vec<Cause>) {
    match typed_form(res, obj) {
        Some(Ok(out)) => typed_input(res, obj, |input| unknown_fields(input, &out, "", c)),
        Some(Err(cause)) => c.push(cause),
        None => {}
    }
}

/// Removes the fields the Kubernetes schema of `res` does not know from `obj` and returns their
/// paths (`spec.containers[0].imagee`), for `fieldValidation` Warn and Ignore (Strict rejects
/// them). An object the schema cannot read at all (a wrong JSON type) is left as it is: its
/// validation names the field.
pub fn prune_unknown_fields(res: &ResourceInfo, obj: &mut Value) -> Vec<String> {
    prune_and_check(res, obj).0
}

/// [`prune_unknown_fields`], also saying whether the schema read the object: if it did, what is
/// left fits the schema and validation need not check it again.
pub fn prune_and_check(res: &ResourceInfo, obj: &mut Value) -> (Vec<String>, Schema) {
    match schema::read(res, obj) {
        schema::Reading::NoSchema => (Vec::new(), Schema::Check),
        schema::Reading::Fits(unknown) => {
            if !unknown.is_empty() {
                schema::prune(res, obj);
            }
            (unknown.into_iter().map(|u| u.path).collect(), Schema::AlreadyChecked)
        }
        schema::Reading::Doubt => prune_and_check_typed(res, obj),
    }
}

/// [`prune_and_check`] by the typed form, for objects the in-place walk does not vouch for; public
/// so that shepherd-bench can compare the two readings of the same object.
pub fn prune_and_check_typed(res: &ResourceInfo, obj: &mut Value) -> (Vec<String>, Schema) {
    let out = match typed_form(res, obj) {
        Some(Ok(out)) => out,
        _ => return (Vec::new(), Schema::Check),
    };
    let mut found = Vec::new();
    if let (Some(i), Some(o)) = (obj.as_object_mut(), out.as_object()) {
        // apiVersion and kind were checked by routing, and left out of the typed form.
        let keep = |k: &str| k == "apiVersion" || k == "kind";
        prune_object(i, o, "", &keep, &mut found);
    }
    (found, Schema::AlreadyChecked)
}

fn prune_object(
    input: &mut serde_json::Map<String, Value>,
    output: &serde_json::Map<String, Value>,
    path: &str,
    keep: &dyn Fn(&str) -> bool,
    found: &mut Vec<String>,
) {
    input.retain(|k, v| {
        if v.is_null() || keep(k) {
            return true;
        }
        let p = join(path, k);
        match output.get(k) {
            None | Some(Value::Null) => {
                found.push(p);
                false
            }
            Some(out) => {
                prune_value(v, out, &p, found);
                true
            }
        }
    });
}

fn prune_value(input: &mut Value, output: &Value, path: &str, found: &mut Vec<String>) {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => prune_object(i, o, path, &|_| false, found),
        (Value::Array(i), Value::Array(o)) => {
            for (n, (iv, ov)) in i.iter_mut().zip(o).enumerate() {
                prune_value(iv, ov, &format!("{path}[{n}]"), found);
            }
        }
        _ => {}
    }
}

/// Something done with the k8s-openapi type of a kind.
trait KindType {
    type Out;
    fn of<T: DeserializeOwned + Serialize + schemars::JsonSchema>(self) -> Self::Out;
}

/// Does `k` with the type of `res`: `None` for kinds without one.
fn for_kind<K: KindType>(res: &ResourceInfo, k: K) -> Option<K::Out> {
    use k8s_openapi::api as k8s;
    Some(match res.kind {
        "Pod" => k.of::<Pod>(),
        "Deployment" => k.of::<Deployment>(),
        "ReplicaSet" => k.of::<ReplicaSet>(),
        "Service" => k.of::<Service>(),
        "Endpoints" => k.of::<Endpoints>(),
        "Namespace" => k.of::<Namespace>(),
        "Node" => k.of::<Node>(),
        "Event" => k.of::<Event>(),
        "Lease" => k.of::<Lease>(),
        "EndpointSlice" => k.of::<EndpointSlice>(),
        "PodDisruptionBudget" => k.of::<PodDisruptionBudget>(),
        "ConfigMap" => k.of::<ConfigMap>(),
        "Secret" => k.of::<Secret>(),
        "ServiceAccount" => k.of::<ServiceAccount>(),
        "CustomResourceDefinition" if res.group == "apiextensions.k8s.io" => k.of::<CustomResourceDefinition>(),
        "Job" => k.of::<k8s::batch::v1::Job>(),
        "CronJob" => k.of::<k8s::batch::v1::CronJob>(),
        "DaemonSet" => k.of::<k8s::apps::v1::DaemonSet>(),
        "StatefulSet" => k.of::<k8s::apps::v1::StatefulSet>(),
        "ControllerRevision" => k.of::<k8s::apps::v1::ControllerRevision>(),
        "ReplicationController" => k.of::<k8s::core::v1::ReplicationController>(),
        "Role" => k.of::<k8s::rbac::v1::Role>(),
        "ClusterRole" => k.of::<k8s::rbac::v1::ClusterRole>(),
        "RoleBinding" => k.of::<k8s::rbac::v1::RoleBinding>(),
        "ClusterRoleBinding" => k.of::<k8s::rbac::v1::ClusterRoleBinding>(),
        "SubjectAccessReview" => k.of::<k8s::authorization::v1::SubjectAccessReview>(),
        "SelfSubjectAccessReview" => k.of::<k8s::authorization::v1::SelfSubjectAccessReview>(),
        "SelfSubjectRulesReview" => k.of::<k8s::authorization::v1::SelfSubjectRulesReview>(),
        "LocalSubjectAccessReview" => k.of::<k8s::authorization::v1::LocalSubjectAccessReview>(),
        "CertificateSigningRequest" => k.of::<k8s::certificates::v1::CertificateSigningRequest>(),
        "HorizontalPodAutoscaler" => k.of::<k8s::autoscaling::v2::HorizontalPodAutoscaler>(),
        _ => return None,
    })
}

struct RoundTrip<'a>(&'a Value);

impl KindType for RoundTrip<'_> {
    type Out = Result<Value, Cause>;
    fn of<T: DeserializeOwned + Serialize + schemars::JsonSchema>(self) -> Self::Out {
        round_trip::<T>(self.0)
    }
}

/// The object as the schema of `res` reads it: `None` for kinds without a schema, a cause for a
/// value the schema cannot read. The typed forms reject an apiVersion or kind other than their
/// own; routing already matched these, so the form is of a copy without them then.
fn typed_form(res: &ResourceInfo, obj: &Value) -> Option<Result<Value, Cause>> {
    typed_input(res, obj, |input| for_kind(res, RoundTrip(input)))
}

/// Calls `f` with the object as the typed forms read it: itself when it carries its own
/// apiVersion and kind (the usual case, without a copy), or a copy without them.
fn typed_input<R>(res: &ResourceInfo, obj: &Value, f: impl FnOnce(&Value) -> R) -> R {
    let own = |field: &str, expected: &str| obj.get(field).is_none_or(|v| v.as_str() == Some(expected));
    if own("apiVersion", &res.api_version()) && own("kind", res.kind) {
        return f(obj);
    }
    let mut copy = obj.clone();
    if let Some(m) = copy.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
    }
    f(&copy)
}

/// Deserializes into the typed form and serializes back; fields the type does not know vanish.
fn round_trip<T: DeserializeOwned + Serialize>(input: &Value) -> Result<Value, Cause> {
    let typed: T = serde_path_to_error::deserialize(input).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        Cause::invalid(path, e.inner().to_string())
    })?;
    serde_json::to_value(&typed).map_err(|e| Cause::invalid("", e.to_string()))
}

fn unknown_fields(input: &Value, output: &Value, path: &str, c: &mut Vec<Cause>) {
    match (input, output) {
        (Value::Object(i), Value::Object(o)) => {
            for (k, v) in i {
                if v.is_null() {
                    continue;
                }
                let p = join(path, k);
                match o.get(k) {
                    None | Some(Value::Null) => c.push(Cause::not_supported(p, format!("unknown field \"{k}\""))),
                    Some(out) => unknown_fields(v, out, &p, c),
                }
            }
        }
        (Value::Array(i), Value::Array(o)) => {
            for (n, (iv, ov)) in i.iter().zip(o).enumerate() {
                unknown_fields(iv, ov, &format!("{path}[{n}]"), c);
            }
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// Fields Shepherd does not implement
// ---------------------------------------------------------------------------------------------

/// A field counts as set when it asks for something: `false`, `""`, `{}` and `[]` are what
/// `kubectl get -o yaml` prints for "off", and rejecting them would only break round trips.
fn is_set(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => true,
    }
}

fn check_unsupported(scope: Scope, v: Option<&Value>, base: &str, c: &mut Vec<Cause>) {
    let Some(v) = v else { return };
    for (_, field) in UNSUPPORTED.iter().filter(|(s, _)| *s == scope) {
        if field_value(v, field).is_some_and(is_set) {
            c.push(Cause::forbidden(join(base, field), NOT_SUPPORTED));
        }
    }
}

fn check_unsupported_in_pod_spec(spec: Option<&Value>, base: &str, c: &mut Vec<Cause>) {
    let Some(spec) = spec else { return };
    check_unsupported(Scope::PodSpec, Some(spec), base, c);
    let Some(Value::Array(containers)) = spec.get("containers") else { return };
    for (i, ct) in containers.iter().enumerate() {
        let cp = format!("{base}.containers[{i}]");
        check_unsupported(Scope::Container, Some(ct), &cp, c);
        if let Some(Value::Array(env)) = ct.get("env") {
            for (j, e) in env.iter().enumerate() {
                check_unsupported(Scope::EnvVar, Some(e), &format!("{cp}.env[{j}]"), c);
            }
        }
        for probe in ["livenessProbe", "readinessProbe"] {
            check_unsupported(Scope::Probe, ct.get(probe), &join(&cp, probe), c);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Pods
// ---------------------------------------------------------------------------------------------

fn validate_pod_spec(spec: Option<&Value>, p: &str, c: &mut Vec<Cause>) {
    let Some(spec) = spec.filter(|s| !s.is_null()) else {
        c.push(Cause::required(p));
        return;
    };
    if !spec.is_object() {
        return;
    }
    match spec.get("containers") {
        Some(Value::Array(cs)) if !cs.is_empty() => {
            let mut names = BTreeSet::new();
            for (i, ct) in cs.iter().enumerate() {
                validate_container(ct, &format!("{p}.containers[{i}]"), &mut names, c);
            }
        }
        None | Some(Value::Null) | Some(Value::Array(_)) => {
            c.push(Cause::new("FieldValueRequired", join(p, "containers"), "Required value: at least one container"));
        }
        Some(_) => {}
    }
    let volumes = volume_validation::validate_volumes(spec, p, c);
    for (i, ct) in spec.get("containers").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let cp = format!("{p}.containers[{i}]");
        volume_validation::validate_volume_mounts(ct, &cp, &volumes, c);
        volume_validation::validate_env_from(ct, &cp, c);
    }
    if let Some(sa) = field_str(spec, "serviceAccountName")
        && !sa.is_empty()
        && !is_dns1123_subdomain(sa)
    {
        c.push(invalid_value(join(p, "serviceAccountName"), &Value::from(sa), DNS1123_SUBDOMAIN_RULE));
    }
    check_one_of(spec, "restartPolicy", p, &["Always", "OnFailure", "Never"], c);
    check_one_of(spec, "dnsPolicy", p, &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"], c);
    check_min(spec, "terminationGracePeriodSeconds", p, 0, c);
    check_min(spec, "activeDeadlineSeconds", p, 1, c);
    if let Some(node) = field_str(spec, "nodeName")
        && !node.is_empty()
        && !is_dns1123_subdomain(node)
    {
        c.push(invalid_value(join(p, "nodeName"), &Value::from(node), DNS1123_SUBDOMAIN_RULE));
    }
    validate_labels(spec.get("nodeSelector"), &join(p, "nodeSelector"), c);
    validate_security_context(spec.get("securityContext"), &join(p, "securityContext"), c);
}

/// The ids and flags of a pod's or container's `securityContext` (its other fields are refused
/// as unsupported).
fn validate_security_context(sc: Option<&Value>, p: &str, c: &mut Vec<Cause>) {
    let Some(sc) = sc.filter(|v| v.is_object()) else { return };
    for id in ["runAsUser", "runAsGroup"] {
        check_min(sc, id, p, 0, c);
        if let Some(n) = field_int(sc, id)
            && n > i64::from(i32::MAX)
        {
            c.push(invalid_value(join(p, id), &Value::from(n), "must be less than or equal to 2147483647"));
        }
    }
    for list in ["capabilities.add", "capabilities.drop"] {
        if let Some(Value::Array(names)) = field_value(sc, list) {
            for (i, name) in names.iter().enumerate() {
                if name.as_str().is_none_or(|n| n.is_empty() || !n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')) {
                    c.push(invalid_value(format!("{p}.{list}[{i}]"), name, "a capability name such as NET_ADMIN or ALL"));
                }
            }
        }
    }
}

fn validate_container(ct: &Value, p: &str, names: &mut BTreeSet<String>, c: &mut Vec<Cause>) {
    if !ct.is_object() {
        return;
    }
    match field_str(ct, "name").filter(|n| !n.is_empty()) {
        None => c.push(Cause::required(join(p, "name"))),
        Some(n) if !is_dns1123_label(n) => c.push(invalid_value(join(p, "name"), &Value::from(n), DNS1123_LABEL_RULE)),
        Some(n) if !names.insert(n.to_string()) => {
            c.push(Cause::new("FieldValueDuplicate", join(p, "name"), format!("Duplicate value: \"{n}\"")));
        }
        Some(_) => {}
    }
    match field_str(ct, "image") {
        None => c.push(Cause::required(join(p, "image"))),
        Some(i) if i.trim().is_empty() => c.push(Cause::required(join(p, "image"))),
        // No image reference holds whitespace; Kubernetes itself only refuses it at the ends and
        // leaves the rest to fail on the node, where the user sees it much later.
        Some(i) if i.chars().any(|ch| ch.is_whitespace() || ch.is_control()) => {
            c.push(invalid_value(join(p, "image"), &Value::from(i), "an image reference must not contain whitespace"));
        }
        Some(_) => {}
    }
    check_one_of(ct, "imagePullPolicy", p, &["Always", "IfNotPresent", "Never"], c);
    // A preStop hook that sleeps (the kubelet's `sleep` action): the only handler Shepherd runs;
    // the others are refused above as unsupported.
    if let Some(pre_stop) = ct.get("lifecycle").and_then(|l| l.get("preStop")).filter(|v| v.is_object()) {
        let hp = join(p, "lifecycle.preStop");
        let handlers = ["exec", "httpGet", "tcpSocket", "sleep"];
        if !handlers.iter().any(|h| pre_stop.get(h).is_some_and(|v| !v.is_null())) {
            c.push(Cause::new("FieldValueRequired", hp.clone(), "Required value: must specify a handler type"));
        }
        if let Some(sleep) = pre_stop.get("sleep").filter(|v| v.is_object()) {
            let sp = join(&hp, "sleep");
            match field_int(sleep, "seconds") {
                None => c.push(Cause::required(join(&sp, "seconds"))),
                Some(_) => check_min(sleep, "seconds", &sp, 0, c),
            }
        }
    }
    validate_security_context(ct.get("securityContext"), &join(p, "securityContext"), c);
    if let Some(Value::Array(ports)) = ct.get("ports") {
        let mut port_names = BTreeSet::new();
        for (j, port) in ports.iter().enumerate() {
            let pp = format!("{p}.ports[{j}]");
            match port.get("containerPort") {
                None | Some(Value::Null) => c.push(Cause::required(join(&pp, "containerPort"))),
                Some(v) => check_port_number(v, &join(&pp, "containerPort"), c),
            }
            if let Some(h) = field_int(port, "hostPort")
                && !(0..=65535).contains(&h)
            {
                c.push(invalid_value(join(&pp, "hostPort"), &Value::from(h), PORT_RANGE_RULE));
            }
            check_one_of(port, "protocol", &pp, &["TCP", "UDP", "SCTP"], c);
            if let Some(name) = field_str(port, "name").filter(|n| !n.is_empty()) {
                if !is_port_name(name) {
                    c.push(invalid_value(join(&pp, "name"), &Value::from(name), PORT_NAME_RULE));
                } else if !port_names.insert(name) {
                    c.push(Cause::new("FieldValueDuplicate", join(&pp, "name"), format!("Duplicate value: \"{name}\"")));
                }
            }
        }
    }
    if let Some(Value::Array(env)) = ct.get("env") {
        for (j, e) in env.iter().enumerate() {
            if e.is_object() && field_str(e, "name").is_none_or(str::is_empty) {
                c.push(Cause::required(format!("{p}.env[{j}].name")));
            }
            if let Some(from) = field_value(e, "valueFrom") {
                validate_env_source(e, from, &format!("{p}.env[{j}]"), c);
            }
        }
    }
    if let Some(r) = ct.get("resources") {
        validate_resources(r, &join(p, "resources"), c);
    }
    for (probe, liveness) in [("livenessProbe", true), ("readinessProbe", false)] {
        if let Some(pr) = field_value(ct, probe) {
            validate_probe(pr, &join(p, probe), liveness, c);
        }
    }
}

/// The pod fields the downward API gives an environment variable (Kubernetes' list for `env`).
const ENV_FIELD_PATHS: &[&str] = &["metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName",
    "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"];
const ENV_RESOURCES: &[&str] =
    &["limits.cpu", "limits.memory", "limits.ephemeral-storage", "requests.cpu", "requests.memory", "requests.ephemeral-storage"];

/// `env[].valueFrom`: one source, and no `value` beside it; the downward API's fields and resources.
fn validate_env_source(env: &Value, from: &Value, p: &str, c: &mut Vec<Cause>) {
    let vp = format!("{p}.valueFrom");
    if field_str(env, "value").is_some_and(|v| !v.is_empty()) {
        c.push(Cause::invalid(&vp, "Invalid value: \"\": may not be specified when `value` is not empty"));
    }
    let sources = ["fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef"];
    match sources.iter().filter(|s| field_value(from, s).is_some()).count() {
        0 => c.push(Cause::invalid(&vp, "Invalid value: \"\": must specify one of: `fieldRef`, `resourceFieldRef`, `configMapKeyRef` or `secretKeyRef`")),
        1 => {}
        _ => c.push(Cause::invalid(&vp, "Invalid value: \"\": may not have more than one field specified at a time")),
    }
    if let Some(field) = field_value(from, "fieldRef") {
        let fp = format!("{vp}.fieldRef.fieldPath");
        match field_str(field, "fieldPath") {
            None | Some("") => c.push(Cause::required(fp)),
            Some(path) => {
                let keyed = ["metadata.labels['", "metadata.annotations['"]
                    .iter()
                    .any(|prefix| path.strip_prefix(prefix).and_then(|k| k.strip_suffix("']")).is_some_and(|k| !k.is_empty()));
                if !keyed && !ENV_FIELD_PATHS.contains(&path) {
                    c.push(unsupported_value(fp, path, ENV_FIELD_PATHS));
                }
            }
        }
        if let Some(v) = field_str(field, "apiVersion").filter(|v| !v.is_empty() && *v != "v1") {
            c.push(unsupported_value(format!("{vp}.fieldRef.apiVersion"), v, &["v1"]));
        }
    }
    volume_validation::validate_key_ref(from, &vp, c);
    if let Some(res) = field_value(from, "resourceFieldRef") {
        let rp = format!("{vp}.resourceFieldRef.resource");
        match field_str(res, "resource") {
            None | Some("") => c.push(Cause::required(rp)),
            Some(r) if !ENV_RESOURCES.contains(&r) => c.push(unsupported_value(rp, r, ENV_RESOURCES)),
            Some(_) => {}
        }
        if let Some(d) = res.get("divisor").and_then(quantity::text)
            && !Quantity::parse(&d).is_ok_and(|q| q.is_positive())
        {
            c.push(invalid_value(format!("{vp}.resourceFieldRef.divisor"), &Value::from(d), "must be a positive quantity"));
        }
    }
}

fn check_port_number(v: &Value, path: &str, c: &mut Vec<Cause>) {
    if let Some(n) = v.as_i64()
        && !(1..=65535).contains(&n)
    {
        c.push(invalid_value(path, v, PORT_RANGE_RULE));
    }
}

/// A port given as a number or as the name of a container port (probes, `targetPort`).
fn check_port_ref(v: Option<&Value>, path: &str, c: &mut Vec<Cause>) {
    match v {
        None | Some(Value::Null) => c.push(Cause::required(path)),
        Some(Value::String(s)) if !is_port_name(s) => {
            c.push(invalid_value(path, &Value::from(s.as_str()), &format!("must be a port number or name; {PORT_NAME_RULE}")));
        }
        Some(n @ Value::Number(_)) => check_port_number(n, path, c),
        Some(_) => {}
    }
}

fn validate_resources(r: &Value, p: &str, c: &mut Vec<Cause>) {
    let mut parsed: [BTreeMap<&str, (i128, String)>; 2] = Default::default();
    for (slot, which) in ["requests", "limits"].into_iter().enumerate() {
        let Some(Value::Object(m)) = r.get(which) else { continue };
        for (k, v) in m {
            let Some(text) = quantity::text(v) else { continue };
            let value = match k.as_str() {
                "cpu" => quantity::cpu_millis(&text).map(i128::from),
                "memory" => quantity::memory_bytes(&text).map(i128::from),
                _ => Quantity::parse(&text).and_then(|q| {
                    if q.is_negative() { Err("must be greater than or equal to 0".into()) } else { q.scaled_ceil(3) }
                }),
            };
            match value {
                Ok(n) => {
                    parsed[slot].insert(k.as_str(), (n, text.into_owned()));
                }
                Err(e) => c.push(invalid_value(format!("{p}.{which}.{k}"), &Value::from(text.as_ref()), &e)),
            }
        }
    }
    let [requests, limits] = &parsed;
    for (k, (req, text)) in requests {
        if let Some((lim, lim_text)) = limits.get(k)
            && req > lim
        {
            c.push(invalid_value(
                format!("{p}.requests.{k}"),
                &Value::from(text.as_str()),
                &format!("must be less than or equal to {k} limit of {lim_text}"),
            ));
        }
    }
}

fn validate_probe(pr: &Value, p: &str, liveness: bool, c: &mut Vec<Cause>) {
    if !pr.is_object() {
        return;
    }
    let handlers: Vec<&str> =
        ["exec", "httpGet", "tcpSocket", "grpc"].into_iter().filter(|h| field_value(pr, h).is_some()).collect();
    match handlers.as_slice() {
        [] => c.push(Cause::new("FieldValueRequired", p, "must specify a handler type: exec, httpGet or tcpSocket")),
        [_] => {}
        [_, extra @ ..] => {
            for h in extra {
                c.push(Cause::forbidden(join(p, h), "may not specify more than 1 handler type"));
            }
        }
    }
    if let Some(exec) = field_value(pr, "exec")
        && exec.get("command").and_then(Value::as_array).is_none_or(Vec::is_empty)
    {
        c.push(Cause::required(format!("{p}.exec.command")));
    }
    if let Some(http) = field_value(pr, "httpGet") {
        check_port_ref(http.get("port"), &format!("{p}.httpGet.port"), c);
        check_one_of(http, "scheme", &join(p, "httpGet"), &["HTTP", "HTTPS"], c);
    }
    if let Some(tcp) = field_value(pr, "tcpSocket") {
        check_port_ref(tcp.get("port"), &format!("{p}.tcpSocket.port"), c);
    }
    check_min(pr, "initialDelaySeconds", p, 0, c);
    for key in ["timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold"] {
        check_min(pr, key, p, 1, c);
    }
    if liveness
        && let Some(n) = field_int(pr, "successThreshold")
        && n != 1
    {
        c.push(invalid_value(join(p, "successThreshold"), &Value::from(n), "must be 1"));
    }
}

// ---------------------------------------------------------------------------------------------
// Deployments and ReplicaSets
// ---------------------------------------------------------------------------------------------

fn validate_workload(res: &ResourceInfo, obj: &Value, c: &mut Vec<Cause>) {
    let Some(spec) = field_value(obj, "spec") else {
        c.push(Cause::required("spec"));
        return;
    };
    if !spec.is_object() {
        return;
    }
    let kind = res.kind.to_ascii_lowercase();
    check_min(spec, "replicas", "spec", 0, c);
    check_min(spec, "minReadySeconds", "spec", 0, c);

    apps::validate_selector_and_template(spec, &kind, c);

    if res.kind == "Deployment" {
        check_min(spec, "revisionHistoryLimit", "spec", 0, c);
        if let Some(deadline) = field_int(spec, "progressDeadlineSeconds") {
            let min_ready = field_int(spec, "minReadySeconds").unwrap_or(0);
            if deadline <= min_ready {
                c.push(invalid_value(
                    "spec.progressDeadlineSeconds",
                    &Value::from(deadline),
                    "must be greater than minReadySeconds",
                ));
            }
        }
        if let Some(strategy) = field_value(spec, "strategy") {
            validate_strategy(strategy, c);
        }
    }
}

/// Checks a `metav1.LabelSelector` field by field; returns it when it is usable for matching.
/// An empty selector is an error for `kind`, unless `kind` is empty.
fn selector_of(sel: &Value, p: &str, kind: &str, c: &mut Vec<Cause>) -> Option<LabelSelector> {
    let Value::Object(fields) = sel else { return None };
    let before = c.len();
    validate_labels(fields.get("matchLabels"), &join(p, "matchLabels"), c);
    if let Some(Value::Array(exprs)) = fields.get("matchExpressions") {
        for (i, e) in exprs.iter().enumerate() {
            let ep = format!("{p}.matchExpressions[{i}]");
            let key = field_str(e, "key").unwrap_or("");
            if key.is_empty() {
                c.push(Cause::required(join(&ep, "key")));
            } else if !is_qualified_name(key) {
                c.push(invalid_value(join(&ep, "key"), &Value::from(key), QUALIFIED_NAME_RULE));
            }
            let values = e.get("values").and_then(Value::as_array).map_or(0, Vec::len);
            match field_str(e, "operator") {
                None => c.push(Cause::required(join(&ep, "operator"))),
                Some("In" | "NotIn") if values == 0 => {
                    c.push(Cause::new("FieldValueRequired", join(&ep, "values"), "must be specified when `operator` is 'In' or 'NotIn'"));
                }
                Some("Exists" | "DoesNotExist") if values > 0 => {
                    c.push(Cause::forbidden(join(&ep, "values"), "may not be specified when `operator` is 'Exists' or 'DoesNotExist'"));
                }
                Some("In" | "NotIn" | "Exists" | "DoesNotExist") => {}
                Some(op) => c.push(unsupported_value(join(&ep, "operator"), op, &["In", "NotIn", "Exists", "DoesNotExist"])),
            }
            if let Some(Value::Array(vs)) = e.get("values") {
                for v in vs {
                    if v.as_str().is_some_and(|s| !is_label_value(s)) {
                        c.push(invalid_value(join(&ep, "values"), v, LABEL_VALUE_RULE));
                    }
                }
            }
        }
    }
    if c.len() > before {
        return None;
    }
    let known = Value::Object(
        fields.iter().filter(|(k, _)| *k == "matchLabels" || *k == "matchExpressions").map(|(k, v)| (k.clone(), v.clone())).collect(),
    );
    let parsed = match LabelSelector::from_k8s(&known) {
        Ok(s) => s,
        Err(e) => {
            c.push(Cause::invalid(p, e.to_string()));
            return None;
        }
    };
    // A shorthand map (`selector: {app: web}`) is already reported as unknown fields.
    let only_known = fields.len() == known.as_object().map_or(0, |m| m.len());
    if parsed.is_empty() && only_known && !kind.is_empty() {
        c.push(Cause::invalid(p, format!("Invalid value: {sel}: empty selector is invalid for {kind}")));
    }
    (!parsed.is_empty()).then_some(parsed)
}

enum Amount {
    Count(i64),
    Percent(i64),
}

fn int_or_percent(v: Option<&Value>, path: &str, c: &mut Vec<Cause>) -> Option<Amount> {
    let v = v.filter(|v| !v.is_null())?;
    let amount = match v {
        Value::Number(n) => n.as_i64().map(Amount::Count),
        Value::String(s) => s.strip_suffix('%').and_then(|d| d.parse::<u32>().ok()).map(|p| Amount::Percent(i64::from(p))),
        _ => return None,
    };
    match amount {
        Some(Amount::Count(n)) if n < 0 => {
            c.push(invalid_value(path, v, "must be greater than or equal to 0"));
            None
        }
        None => {
            c.push(invalid_value(path, v, "must be an integer or a percentage (e.g. '25%')"));
            None
        }
        some => some,
    }
}

fn validate_strategy(strategy: &Value, c: &mut Vec<Cause>) {
    let ty = field_str(strategy, "type");
    check_one_of(strategy, "type", "spec.strategy", &["RollingUpdate", "Recreate"], c);
    let Some(rolling) = field_value(strategy, "rollingUpdate") else { return };
    if ty == Some("Recreate") {
        c.push(Cause::forbidden("spec.strategy.rollingUpdate", "may not be specified when strategy `type` is 'Recreate'"));
        return;
    }
    let surge_path = "spec.strategy.rollingUpdate.maxSurge";
    let unavailable_path = "spec.strategy.rollingUpdate.maxUnavailable";
    let surge = int_or_percent(rolling.get("maxSurge"), surge_path, c);
    let unavailable = int_or_percent(rolling.get("maxUnavailable"), unavailable_path, c);
    if let Some(Amount::Percent(p)) = unavailable
        && p > 100
    {
        c.push(Cause::invalid(unavailable_path, format!("Invalid value: \"{p}%\": must not be greater than 100%")));
    }
    let zero = |a: &Option<Amount>| matches!(a, Some(Amount::Count(0) | Amount::Percent(0)));
    if zero(&surge) && zero(&unavailable) {
        c.push(Cause::invalid(unavailable_path, "may not be 0 when `maxSurge` is 0"));
    }
}

// ---------------------------------------------------------------------------------------------
// Services and Endpoints
// ---------------------------------------------------------------------------------------------

fn validate_service(obj: &Value, c: &mut Vec<Cause>) {
    let Some(spec) = field_value(obj, "spec") else {
        c.push(Cause::required("spec"));
        return;
    };
    if !spec.is_object() {
        return;
    }
    let ty = field_str(spec, "type").unwrap_or("ClusterIP");
    if !["ClusterIP", "NodePort", "LoadBalancer"].contains(&ty) {
        c.push(unsupported_value("spec.type", ty, &["ClusterIP", "NodePort", "LoadBalancer"]));
    }
    let cluster_ip = field_str(spec, "clusterIP").unwrap_or("");
    if !cluster_ip.is_empty() && cluster_ip != "None" && cluster_ip.parse::<IpAddr>().is_err() {
        c.push(invalid_value("spec.clusterIP", &Value::from(cluster_ip), "must be a valid IP address or \"None\""));
    }
    if cluster_ip == "None" && ty != "ClusterIP" {
        c.push(invalid_value("spec.clusterIP", &Value::from(cluster_ip), &format!("may not be set to 'None' for {ty} services")));
    }
    // The proxy sends every Service's traffic to all its ready endpoints, wherever they run.
    for policy in ["externalTrafficPolicy", "internalTrafficPolicy"] {
        if let Some(p) = field_str(spec, policy).filter(|p| *p != "Cluster") {
            let path = format!("spec.{policy}");
            match p {
                "Local" => c.push(Cause::forbidden(path, format!("{NOT_SUPPORTED}: traffic goes to every ready endpoint (Cluster)"))),
                other => c.push(unsupported_value(&path, other, &["Cluster", "Local"])),
            }
        }
    }
    let mut node_ports = BTreeSet::new();
    check_one_of(spec, "sessionAffinity", "spec", &["None", "ClientIP"], c);
    validate_labels(spec.get("selector"), "spec.selector", c);
    let ports = match spec.get("ports") {
        Some(Value::Array(ports)) => ports.as_slice(),
        Some(v) if !v.is_null() => return,
        _ => &[],
    };
    if ports.is_empty() && cluster_ip != "None" {
        c.push(Cause::required("spec.ports"));
    }
    let mut names = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let pp = format!("spec.ports[{i}]");
        match port.get("port") {
            None | Some(Value::Null) => c.push(Cause::required(join(&pp, "port"))),
            Some(v) => check_port_number(v, &join(&pp, "port"), c),
        }
        check_one_of(port, "protocol", &pp, &["TCP", "UDP", "SCTP"], c);
        match field_str(port, "name").filter(|n| !n.is_empty()) {
            None if ports.len() > 1 => c.push(Cause::required(join(&pp, "name"))),
            None => {}
            Some(n) if !is_dns1123_label(n) => c.push(invalid_value(join(&pp, "name"), &Value::from(n), DNS1123_LABEL_RULE)),
            Some(n) if !names.insert(n) => {
                c.push(Cause::new("FieldValueDuplicate", join(&pp, "name"), format!("Duplicate value: \"{n}\"")));
            }
            Some(_) => {}
        }
        if let Some(target) = port.get("targetPort").filter(|t| !t.is_null()) {
            check_port_ref(Some(target), &join(&pp, "targetPort"), c);
        }
        match (field_int(port, "nodePort").filter(|n| *n != 0), port.get("nodePort")) {
            (Some(_), _) if ty == "ClusterIP" => {
                c.push(Cause::forbidden(join(&pp, "nodePort"), "may not be used when `type` is 'ClusterIP'"));
            }
            (Some(n), Some(v)) => {
                check_port_number(v, &join(&pp, "nodePort"), c);
                // One Service may take a node port once per protocol.
                if !node_ports.insert((n, field_str(port, "protocol").unwrap_or("TCP"))) {
                    c.push(Cause::new("FieldValueDuplicate", join(&pp, "nodePort"), format!("Duplicate value: {n}")));
                }
            }
            _ => {}
        }
    }
}

fn validate_endpoints(obj: &Value, c: &mut Vec<Cause>) {
    let Some(Value::Array(subsets)) = obj.get("subsets") else { return };
    for (i, subset) in subsets.iter().enumerate() {
        let sp = format!("subsets[{i}]");
        for list in ["addresses", "notReadyAddresses"] {
            let Some(Value::Array(addrs)) = subset.get(list) else { continue };
            for (j, a) in addrs.iter().enumerate() {
                let ip = field_str(a, "ip").unwrap_or("");
                let path = format!("{sp}.{list}[{j}].ip");
                if ip.is_empty() {
                    c.push(Cause::required(path));
                } else if ip.parse::<IpAddr>().is_err() {
                    c.push(invalid_value(path, &Value::from(ip), "must be a valid IP address"));
                }
            }
        }
        let Some(Value::Array(ports)) = subset.get("ports") else { continue };
        for (j, port) in ports.iter().enumerate() {
            let pp = format!("{sp}.ports[{j}]");
            match port.get("port") {
                None | Some(Value::Null) => c.push(Cause::required(join(&pp, "port"))),
                Some(v) => check_port_number(v, &join(&pp, "port"), c),
            }
            check_one_of(port, "protocol", &pp, &["TCP", "UDP", "SCTP"], c);
        }
    }
}

/// Kubernetes' limits on one EndpointSlice.
const SLICE_MAX_ENDPOINTS: usize = 1000;
const SLICE_MAX_ADDRESSES: usize = 100;
const SLICE_MAX_PORTS: usize = 100;

fn validate_endpoint_slice(obj: &Value, c: &mut Vec<Cause>) {
    let address_type = field_str(obj, "addressType");
    match address_type {
        None => c.push(Cause::required("addressType")),
        Some("IPv4" | "IPv6" | "FQDN") => {}
        Some(t) => c.push(unsupported_value("addressType", t, &["IPv4", "IPv6", "FQDN"])),
    }
    if let Some(Value::Array(endpoints)) = obj.get("endpoints") {
        if endpoints.len() > SLICE_MAX_ENDPOINTS {
            c.push(Cause::new("FieldValueTooMany", "endpoints", format!("must have at most {SLICE_MAX_ENDPOINTS} items")));
        }
        for (i, ep) in endpoints.iter().enumerate() {
            let p = format!("endpoints[{i}].addresses");
            let addresses = ep.get("addresses").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
            if addresses.is_empty() {
                c.push(Cause::required(p.clone()));
            } else if addresses.len() > SLICE_MAX_ADDRESSES {
                c.push(Cause::new("FieldValueTooMany", p.clone(), format!("must have at most {SLICE_MAX_ADDRESSES} items")));
            }
            for (j, a) in addresses.iter().enumerate() {
                let text = a.as_str().unwrap_or("");
                let ok = match address_type {
                    Some("IPv4") => text.parse::<std::net::Ipv4Addr>().is_ok(),
                    Some("IPv6") => text.parse::<std::net::Ipv6Addr>().is_ok(),
                    Some("FQDN") => is_dns1123_subdomain(text),
                    _ => true,
                };
                if !ok {
                    let why = format!("must be a valid {} address", address_type.unwrap_or(""));
                    c.push(invalid_value(format!("{p}[{j}]"), a, &why));
                }
            }
            if let Some(node) = field_str(ep, "nodeName")
                && !is_dns1123_subdomain(node)
            {
                c.push(invalid_value(format!("endpoints[{i}].nodeName"), &Value::from(node), DNS1123_SUBDOMAIN_RULE));
            }
        }
    }
    let Some(Value::Array(ports)) = obj.get("ports") else { return };
    if ports.len() > SLICE_MAX_PORTS {
        c.push(Cause::new("FieldValueTooMany", "ports", format!("must have at most {SLICE_MAX_PORTS} items")));
    }
    let mut names = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let pp = format!("ports[{i}]");
        if let Some(v) = port.get("port").filter(|v| !v.is_null()) {
            check_port_number(v, &join(&pp, "port"), c);
        }
        check_one_of(port, "protocol", &pp, &["TCP", "UDP", "SCTP"], c);
        let name = field_str(port, "name").unwrap_or("");
        if !name.is_empty() && !is_dns1123_label(name) {
            c.push(invalid_value(join(&pp, "name"), &Value::from(name), DNS1123_LABEL_RULE));
        }
        if !names.insert(name) {
            c.push(Cause::new("FieldValueDuplicate", join(&pp, "name"), format!("Duplicate value: \"{name}\"")));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// PodDisruptionBudgets
// ---------------------------------------------------------------------------------------------

fn validate_pod_disruption_budget(obj: &Value, c: &mut Vec<Cause>) {
    let Some(spec) = field_value(obj, "spec") else { return };
    if !spec.is_object() {
        return;
    }
    let min = spec.get("minAvailable").filter(|v| !v.is_null());
    let max = spec.get("maxUnavailable").filter(|v| !v.is_null());
    if min.is_some() && max.is_some() {
        c.push(invalid_value("spec", spec, "minAvailable and maxUnavailable cannot be both set"));
    }
    for (field, amount) in [("spec.minAvailable", min), ("spec.maxUnavailable", max)] {
        if let Some(Amount::Percent(p)) = int_or_percent(amount, field, c)
            && p > 100
        {
            c.push(Cause::invalid(field, format!("Invalid value: \"{p}%\": must not be greater than 100%")));
        }
    }
    if let Some(sel) = field_value(spec, "selector") {
        // An empty selector is valid here: in policy/v1 it selects every pod of the namespace.
        selector_of(sel, "spec.selector", "", c);
    }
    check_one_of(spec, "unhealthyPodEvictionPolicy", "spec", &["IfHealthyBudget", "AlwaysAllow"], c);
}

// ---------------------------------------------------------------------------------------------
// Updates
// ---------------------------------------------------------------------------------------------

/// True when `new` differs from `old` only in what a pod update may change.
fn pod_spec_update_allowed(old: &Value, new: &Value) -> bool {
    let tolerations = |v: &Value| -> Vec<Value> {
        v.get("tolerations").and_then(Value::as_array).map(|a| a.iter().map(strip_nulls).collect()).unwrap_or_default()
    };
    let (old_tolerations, new_tolerations) = (tolerations(old), tolerations(new));
    if !old_tolerations.iter().all(|t| new_tolerations.contains(t)) {
        return false;
    }
    let masked = |v: &Value| -> Value {
        let mut v = strip_nulls(v);
        if let Some(m) = v.as_object_mut() {
            m.remove("activeDeadlineSeconds");
            m.remove("tolerations");
            if let Some(Value::Array(cs)) = m.get_mut("containers") {
                for ct in cs.iter_mut().filter_map(Value::as_object_mut) {
                    ct.remove("image");
                }
            }
        }
        v
    };
    masked(old) == masked(new)
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{
        DEPLOYMENT, ENDPOINTS, ENDPOINTSLICE, EVENT, LEASE, NAMESPACE, NODE, POD, PODDISRUPTIONBUDGET, REPLICASET, SERVICE,
    };
    use serde_json::json;

    /// The `(field, reason)` of every cause, or an empty list when the object is valid.
    fn causes(res: &ResourceInfo, obj: &Value) -> Vec<(String, &'static str)> {
        match validate(res, obj) {
            Ok(()) => Vec::new(),
            Err(ApiError::Invalid { causes, .. }) => causes.into_iter().map(|c| (c.field, c.reason)).collect(),
            Err(other) => panic!("expected 422, got {other:?}"),
        }
    }

    fn fields(res: &ResourceInfo, obj: &Value) -> Vec<String> {
        causes(res, obj).into_iter().map(|(f, _)| f).collect()
    }

    fn assert_reports(res: &ResourceInfo, obj: &Value, field: &str, reason: &str) {
        let got = causes(res, obj);
        assert!(got.iter().any(|(f, r)| f == field && *r == reason), "expected {reason} on {field}, got {got:?}");
    }

    fn seed_deployment() -> Value {
        json!({"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web"},"spec":{"replicas":3,
            "selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},
            "spec":{"containers":[{"name":"web","image":"minimal"}]}}}})
    }

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "namespace": "default"}, "spec": spec})
    }

    fn service(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": spec})
    }

    #[test]
    fn the_seed_objects_are_valid_before_and_after_defaulting() {
        let mut objects = vec![
            (&DEPLOYMENT, seed_deployment()),
            (&REPLICASET, {
                let mut rs = seed_deployment();
                rs["kind"] = json!("ReplicaSet");
                rs["metadata"]["name"] = json!("web-5d8f7c");
                rs
            }),
            (&POD, pod(json!({"containers": [{"name": "web", "image": "minimal", "ports": [{"containerPort": 8080, "name": "http"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": 1, "memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"port": "http", "path": "/healthz"}},
                "livenessProbe": {"tcpSocket": {"port": 8080}}, "env": [{"name": "MODE", "value": "demo"}]}],
                "hostNetwork": false, "securityContext": {}}))),
            (&SERVICE, service(json!({"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}))),
            (&NAMESPACE, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})),
            (&NODE, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1.example",
                "labels": {"kubernetes.io/hostname": "node-1"}}, "status": {"capacity": {"cpu": "2", "memory": "4Gi"}}})),
            (&LEASE, json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "node-1", "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40, "renewTime": "2025-01-01T00:00:00.000000Z"}})),
            (&EVENT, json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "web-0.17f3a", "namespace": "default"},
                "involvedObject": {"kind": "Pod", "name": "web-0"}, "reason": "Scheduled", "message": "assigned", "count": 1})),
            (&ENDPOINTS, json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": "default"},
                "subsets": [{"addresses": [{"ip": "10.0.0.5"}], "ports": [{"port": 8080, "protocol": "TCP"}]}]})),
        ];
        for (res, obj) in &mut objects {
            assert_eq!(validate(res, obj), Ok(()), "{} before defaulting", res.kind);
            crate::defaults::apply_defaults(res, obj);
            assert_eq!(validate(res, obj), Ok(()), "{} after defaulting", res.kind);
        }
    }

    #[test]
    fn an_image_reference_with_whitespace_is_refused_by_its_field() {
        for image in ["bad image", "web\t1", " minimal"] {
            let mut d = seed_deployment();
            d["spec"]["template"]["spec"]["containers"][0]["image"] = json!(image);
            let msg = validate(&DEPLOYMENT, &d).unwrap_err().to_string();
            assert!(msg.contains("spec.template.spec.containers[0].image: Invalid value") && msg.contains("whitespace"), "{msg}");
        }
    }

    #[test]
    fn every_bad_field_is_reported_in_one_error() {
        let mut d = seed_deployment();
        d["spec"]["replicas"] = json!(-1);
        d["spec"]["template"]["spec"]["containers"][0]["image"] = json!("");
        d["spec"]["template"]["spec"]["containers"][0]["ports"] = json!([{"containerPort": 70000}]);
        d["metadata"]["labels"] = json!({"bad key": "x"});
        let err = validate(&DEPLOYMENT, &d).unwrap_err();
        assert_eq!(err.code(), 422);
        let msg = err.to_string();
        assert!(msg.starts_with("Deployment \"web\" is invalid"), "{msg}");
        let got = fields(&DEPLOYMENT, &d);
        for f in [
            "spec.replicas",
            "spec.template.spec.containers[0].image",
            "spec.template.spec.containers[0].ports[0].containerPort",
            "metadata.labels",
        ] {
            assert!(got.iter().any(|g| g == f), "{f} missing from {got:?}");
        }
        assert_eq!(got.len(), 4, "{got:?}");
    }

    #[test]
    fn unknown_fields_are_named_with_their_full_path() {
        let mut d = seed_deployment();
        d["spec"]["template"]["spec"]["containers"][0]["imagePolicy"] = json!("Always");
        d["spec"]["replica"] = json!(2);
        d["metadata"]["label"] = json!({"a": "b"});
        d["spec"]["template"]["spec"]["nodeSelector"] = Value::Null;
        let got = causes(&DEPLOYMENT, &d);
        assert_eq!(got.len(), 3, "{got:?}");
        for f in ["spec.template.spec.containers[0].imagePolicy", "spec.replica", "metadata.label"] {
            assert!(got.contains(&(f.to_string(), "FieldValueNotSupported")), "{f}: {got:?}");
        }
        let err = validate(&DEPLOYMENT, &d).unwrap_err().to_status();
        assert!(err["message"].as_str().unwrap_or("").contains("unknown field \"imagePolicy\""), "{err}");
    }

    #[test]
    fn unknown_fields_are_pruned_by_path_and_known_ones_kept() {
        let mut p = pod(json!({"containers": [{"name": "c", "image": "i", "imagee": "x"}], "foo.bar": {"a": 1}}));
        p["metadata"]["labels"] = json!({"odd.key/x": "v"});
        let pruned = prune_unknown_fields(&POD, &mut p);
        assert_eq!(pruned, ["spec.containers[0].imagee", "spec.foo.bar"]);
        assert_eq!(p["spec"], json!({"containers": [{"name": "c", "image": "i"}]}));
        assert_eq!(p["metadata"]["labels"]["odd.key/x"], "v", "map keys are not fields");
        assert!(causes(&POD, &p).is_empty(), "{:?}", causes(&POD, &p));
        let mut wrong_type = pod(json!({"containers": "nope", "extra": 1}));
        assert!(prune_unknown_fields(&POD, &mut wrong_type).is_empty(), "left to validation");
    }

    #[test]
    fn a_shorthand_selector_is_rejected_as_an_unknown_field() {
        let mut d = seed_deployment();
        d["spec"]["selector"] = json!({"app": "web"});
        assert_eq!(causes(&DEPLOYMENT, &d), vec![("spec.selector.app".to_string(), "FieldValueNotSupported")]);
    }

    #[test]
    fn a_wrong_json_type_is_a_422_naming_the_field() {
        let p = pod(json!({"containers": [{"name": "web", "image": "minimal", "ports": [{"containerPort": "80"}]}]}));
        assert_reports(&POD, &p, "spec.containers[0].ports[0].containerPort", "FieldValueInvalid");
        let d = json!({"metadata": {"name": "web"}, "spec": {"replicas": "three"}});
        assert_reports(&DEPLOYMENT, &d, "spec.replicas", "FieldValueInvalid");
        for garbage in [json!([1, 2]), json!("pod"), json!({"spec": "x", "metadata": {"name": "a"}}), json!({"metadata": 7})] {
            assert_eq!(validate(&POD, &garbage).map_err(|e| e.code()), Err(422), "{garbage}");
        }
    }

    #[test]
    fn environment_variables_take_the_downward_api_and_refuse_what_it_lacks() {
        let env = |e: Value| pod(json!({"containers": [{"name": "web", "image": "minimal", "env": [e]}]}));
        for ok in [
            json!({"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
            json!({"name": "L", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}}),
            json!({"name": "M", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}}),
        ] {
            assert_eq!(causes(&POD, &env(ok.clone())), vec![], "{ok}");
        }
        let bad = |e: Value| causes(&POD, &env(e)).into_iter().map(|(f, _)| f).collect::<Vec<_>>();
        assert_eq!(bad(json!({"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}})),
            ["spec.containers[0].env[0].valueFrom.fieldRef.fieldPath"]);
        assert_eq!(bad(json!({"name": "X", "value": "v", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})),
            ["spec.containers[0].env[0].valueFrom"]);
        assert_eq!(bad(json!({"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}})),
            ["spec.containers[0].env[0].valueFrom.resourceFieldRef.resource"]);
        assert_eq!(bad(json!({"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "0"}}})),
            ["spec.containers[0].env[0].valueFrom.resourceFieldRef.divisor"]);
        assert_eq!(bad(json!({"name": "X", "valueFrom": {}})), ["spec.containers[0].env[0].valueFrom"]);
    }

    #[test]
    fn kubernetes_features_shepherd_lacks_are_refused_by_name() {
        let p = pod(json!({
            "containers": [{"name": "web", "image": "minimal",
                "volumeMounts": [{"name": "data", "mountPath": "/d", "mountPropagation": "Bidirectional"}],
                "startupProbe": {"exec": {"command": ["true"]}}}],
            "volumes": [{"name": "data", "nfs": {"server": "nfs.example", "path": "/"}}],
            "hostPID": true,
            "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "db"}}}]}},
        }));
        let got = causes(&POD, &p);
        for f in [
            "spec.volumes[0].nfs",
            "spec.hostPID",
            "spec.affinity.podAffinity",
            "spec.containers[0].volumeMounts[0].mountPropagation",
            "spec.containers[0].startupProbe",
        ] {
            assert!(got.contains(&(f.to_string(), "FieldValueForbidden")), "{f}: {got:?}");
        }
        assert_eq!(got.len(), 5, "{got:?}");

        let mut d = seed_deployment();
        d["spec"]["template"]["spec"]["initContainers"] = json!([{"name": "init", "image": "busybox"}]);
        assert_eq!(causes(&DEPLOYMENT, &d), vec![("spec.template.spec.initContainers".to_string(), "FieldValueForbidden")]);
    }

    #[test]
    fn a_pre_stop_hook_may_sleep_and_the_other_handlers_are_refused_by_name() {
        let with = |lifecycle: Value| pod(json!({"containers": [{"name": "web", "image": "busybox", "lifecycle": lifecycle}]}));
        assert_eq!(causes(&POD, &with(json!({"preStop": {"sleep": {"seconds": 5}}}))), vec![]);
        assert_eq!(fields(&POD, &with(json!({"preStop": {"sleep": {"seconds": -1}}}))), ["spec.containers[0].lifecycle.preStop.sleep.seconds"]);
        assert_eq!(fields(&POD, &with(json!({"preStop": {"sleep": {}}}))), ["spec.containers[0].lifecycle.preStop.sleep.seconds"]);
        assert_eq!(fields(&POD, &with(json!({"preStop": {}}))), ["spec.containers[0].lifecycle.preStop"]);
        let refused = with(json!({"postStart": {"exec": {"command": ["true"]}}, "preStop": {"httpGet": {"port": 80}}}));
        assert_eq!(
            causes(&POD, &refused),
            vec![
                ("spec.containers[0].lifecycle.postStart".to_string(), "FieldValueForbidden"),
                ("spec.containers[0].lifecycle.preStop.httpGet".to_string(), "FieldValueForbidden"),
            ]
        );
    }

    #[test]
    fn security_contexts_take_ids_flags_and_capabilities_and_refuse_the_rest_by_name() {
        let ok = pod(json!({"securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
            "containers": [{"name": "web", "image": "busybox", "securityContext": {"runAsUser": 0, "privileged": false,
                "readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}}]}));
        assert_eq!(causes(&POD, &ok), vec![]);
        let bad = pod(json!({"securityContext": {"runAsUser": -1, "fsGroup": 2000},
            "containers": [{"name": "web", "image": "busybox", "securityContext": {"runAsGroup": 3_000_000_000_i64,
                "seccompProfile": {"type": "RuntimeDefault"}, "capabilities": {"add": ["NET ADMIN"]}}}]}));
        let mut got = causes(&POD, &bad);
        got.sort();
        assert_eq!(
            got,
            vec![
                ("spec.containers[0].securityContext.capabilities.add[0]".to_string(), "FieldValueInvalid"),
                ("spec.containers[0].securityContext.runAsGroup".to_string(), "FieldValueInvalid"),
                ("spec.containers[0].securityContext.seccompProfile".to_string(), "FieldValueForbidden"),
                ("spec.securityContext.fsGroup".to_string(), "FieldValueForbidden"),
                ("spec.securityContext.runAsUser".to_string(), "FieldValueInvalid"),
            ]
        );
    }

    #[test]
    fn services_accept_cluster_ip_node_port_and_load_balancer_types_and_check_their_ports() {
        let s = service(json!({"type": "ExternalName", "ports": [{"port": 80}]}));
        assert_reports(&SERVICE, &s, "spec.type", "FieldValueNotSupported");
        let s = service(json!({"type": "LoadBalancer", "loadBalancerIP": "1.2.3.4", "ports": [{"port": 80}]}));
        assert_eq!(fields(&SERVICE, &s), vec!["spec.loadBalancerIP"]);
        assert_reports(&SERVICE, &s, "spec.loadBalancerIP", "FieldValueForbidden");
        let s = service(json!({"type": "ClusterIP", "ports": [{"port": 80, "nodePort": 30080}]}));
        assert_reports(&SERVICE, &s, "spec.ports[0].nodePort", "FieldValueForbidden");
        let s = service(json!({"type": "NodePort", "ports": [
            {"name": "a", "port": 80, "nodePort": 70000},
            {"name": "b", "port": 81, "nodePort": 30080},
            {"name": "c", "port": 82, "nodePort": 30080},
            {"name": "d", "port": 82, "nodePort": 30080, "protocol": "UDP"},
        ]}));
        assert_eq!(fields(&SERVICE, &s), vec!["spec.ports[0].nodePort", "spec.ports[2].nodePort"]);
        assert_reports(&SERVICE, &s, "spec.ports[2].nodePort", "FieldValueDuplicate");
        let s = service(json!({"type": "NodePort", "clusterIP": "None", "ports": [{"port": 80}]}));
        assert_reports(&SERVICE, &s, "spec.clusterIP", "FieldValueInvalid");
        let s = service(json!({"type": "NodePort", "externalTrafficPolicy": "Local", "ports": [{"port": 80}]}));
        assert_reports(&SERVICE, &s, "spec.externalTrafficPolicy", "FieldValueForbidden");
        let s = service(json!({"type": "NodePort", "externalTrafficPolicy": "Cluster", "internalTrafficPolicy": "Cluster",
            "ports": [{"port": 80}]}));
        assert_eq!(fields(&SERVICE, &s), Vec::<String>::new());
        let s = service(json!({"externalName": "example.com", "ports": [{"port": 80}]}));
        assert_reports(&SERVICE, &s, "spec.externalName", "FieldValueForbidden");

        let s = service(json!({"selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"},
            {"name": "http", "port": 443, "targetPort": 0},
            {"port": 0, "targetPort": "8080"},
        ]}));
        let got = fields(&SERVICE, &s);
        assert_eq!(
            got,
            vec!["spec.ports[1].name", "spec.ports[1].targetPort", "spec.ports[2].port", "spec.ports[2].name",
                "spec.ports[2].targetPort"]
        );
        assert_eq!(fields(&SERVICE, &service(json!({"selector": {"app": "web"}}))), vec!["spec.ports"]);
        assert_eq!(fields(&SERVICE, &service(json!({"clusterIP": "None"}))), Vec::<String>::new());
    }

    #[test]
    fn names_follow_the_rule_of_their_kind() {
        let ns = |name: &str| json!({"metadata": {"name": name}});
        assert_eq!(fields(&NAMESPACE, &ns("My_NS")), vec!["metadata.name"]);
        assert_eq!(fields(&NAMESPACE, &ns("a.b")), vec!["metadata.name"]);
        assert_eq!(fields(&SERVICE, &json!({"metadata": {"name": "a.b"}, "spec": {"ports": [{"port": 1}]}})), vec!["metadata.name"]);
        assert_eq!(fields(&NODE, &ns("node-1.example.com")), Vec::<String>::new());
        assert_eq!(fields(&NODE, &ns(&"a".repeat(254))), vec!["metadata.name"]);
        assert_eq!(fields(&NAMESPACE, &ns(&"a".repeat(64))), vec!["metadata.name"]);

        assert_eq!(fields(&NODE, &json!({"metadata": {"generateName": "node-"}})), Vec::<String>::new());
        assert_eq!(fields(&NODE, &json!({"metadata": {"generateName": "Node-"}})), vec!["metadata.generateName"]);
        assert_eq!(causes(&NODE, &json!({"metadata": {}})), vec![("metadata.name".to_string(), "FieldValueRequired")]);
        assert_eq!(causes(&NODE, &json!({})), vec![("metadata.name".to_string(), "FieldValueRequired")]);
        let p = json!({"metadata": {"name": "p", "namespace": "Team_A"}, "spec": {"containers": [{"name": "a", "image": "i"}]}});
        assert_eq!(fields(&POD, &p), vec!["metadata.namespace"]);
        assert_eq!(fields(&NODE, &json!({"metadata": {"name": "n", "namespace": "default"}})), vec!["metadata.namespace"]);
    }

    #[test]
    fn labels_and_annotations_are_checked() {
        let node = |meta: Value| json!({"metadata": meta});
        assert_eq!(fields(&NODE, &node(json!({"name": "n", "labels": {"example.com/role": "", "ok": "A-b_c.1"}}))), Vec::<String>::new());
        assert_eq!(fields(&NODE, &node(json!({"name": "n", "labels": {"-bad": "x", "good": "bad value"}}))).len(), 2);
        assert_eq!(fields(&NODE, &node(json!({"name": "n", "labels": {"Bad_Prefix/x": "y"}}))), vec!["metadata.labels"]);
        assert_eq!(fields(&NODE, &node(json!({"name": "n", "labels": {"k": "v".repeat(64)}}))), vec!["metadata.labels"]);
        assert_eq!(fields(&NODE, &node(json!({"name": "n", "annotations": {"note": "any text: /, spaces"}}))), Vec::<String>::new());
        assert_eq!(
            causes(&NODE, &node(json!({"name": "n", "annotations": {"big": "x".repeat(256 * 1024)}}))),
            vec![("metadata.annotations".to_string(), "FieldValueTooLong")]
        );
    }

    #[test]
    fn containers_need_unique_names_and_an_image() {
        let p = pod(json!({"containers": [{"name": "web", "image": "a"}, {"name": "web", "image": " "}, {"image": "b"},
            {"name": "Web", "image": "c"}]}));
        assert_eq!(
            causes(&POD, &p),
            vec![
                ("spec.containers[1].name".to_string(), "FieldValueDuplicate"),
                ("spec.containers[1].image".to_string(), "FieldValueRequired"),
                ("spec.containers[2].name".to_string(), "FieldValueRequired"),
                ("spec.containers[3].name".to_string(), "FieldValueInvalid"),
            ]
        );
        assert_eq!(fields(&POD, &pod(json!({"containers": []}))), vec!["spec.containers"]);
        assert_eq!(fields(&POD, &json!({"metadata": {"name": "p"}})), vec!["spec"]);
    }

    #[test]
    fn pod_level_fields_are_range_checked() {
        let p = pod(json!({"containers": [{"name": "a", "image": "i", "ports": [
                {"containerPort": 80, "protocol": "HTTP", "name": "web-server-port-1"}, {"containerPort": 81, "hostPort": 70000}]}],
            "restartPolicy": "Sometimes", "terminationGracePeriodSeconds": -1}));
        assert_eq!(
            fields(&POD, &p),
            vec![
                "spec.containers[0].ports[0].protocol",
                "spec.containers[0].ports[0].name",
                "spec.containers[0].ports[1].hostPort",
                "spec.restartPolicy",
                "spec.terminationGracePeriodSeconds",
            ]
        );
    }

    #[test]
    fn resource_quantities_must_parse_and_requests_may_not_exceed_limits() {
        let with = |resources: Value| pod(json!({"containers": [{"name": "a", "image": "i", "resources": resources}]}));
        let ok = with(json!({"requests": {"cpu": "0.5", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1073741824"}}));
        assert_eq!(fields(&POD, &ok), Vec::<String>::new());
        let bad = with(json!({"requests": {"cpu": "2", "memory": "12Xi", "nvidia.com/gpu": "-1"}, "limits": {"cpu": "1"}}));
        assert_eq!(
            fields(&POD, &bad),
            vec![
                "spec.containers[0].resources.requests.memory",
                "spec.containers[0].resources.requests.nvidia.com/gpu",
                "spec.containers[0].resources.requests.cpu",
            ]
        );
        let msg = validate(&POD, &bad).unwrap_err().to_string();
        assert!(msg.contains("must be less than or equal to cpu limit of 1"), "{msg}");
        // Limits the agent could not enforce as written never get past the API.
        let huge = with(json!({"limits": {"cpu": "10E", "memory": "8Ei"}}));
        let err = validate(&POD, &huge).unwrap_err();
        assert_eq!(err.code(), 422);
        let msg = err.to_string();
        for field in ["spec.containers[0].resources.limits.cpu", "spec.containers[0].resources.limits.memory"] {
            assert!(msg.contains(field), "{field} in {msg}");
        }
        assert!(msg.contains("quantity \"8Ei\" is too large"), "{msg}");
    }

    #[test]
    fn probes_need_exactly_one_handler_and_a_sensible_port() {
        let with = |probe: Value| pod(json!({"containers": [{"name": "a", "image": "i", "livenessProbe": probe}]}));
        assert_eq!(fields(&POD, &with(json!({"periodSeconds": 5}))), vec!["spec.containers[0].livenessProbe"]);
        assert_eq!(
            causes(&POD, &with(json!({"exec": {"command": ["true"]}, "tcpSocket": {"port": 80}}))),
            vec![("spec.containers[0].livenessProbe.tcpSocket".to_string(), "FieldValueForbidden")]
        );
        assert_eq!(
            fields(&POD, &with(json!({"httpGet": {"port": 0}, "periodSeconds": 0, "successThreshold": 2}))),
            vec![
                "spec.containers[0].livenessProbe.httpGet.port",
                "spec.containers[0].livenessProbe.periodSeconds",
                "spec.containers[0].livenessProbe.successThreshold",
            ]
        );
        assert_eq!(fields(&POD, &with(json!({"tcpSocket": {"port": "Not_A_Name"}}))), vec!["spec.containers[0].livenessProbe.tcpSocket.port"]);
        assert_eq!(fields(&POD, &with(json!({"exec": {"command": []}}))), vec!["spec.containers[0].livenessProbe.exec.command"]);
        assert_eq!(fields(&POD, &with(json!({"grpc": {"port": 9000}}))), vec!["spec.containers[0].livenessProbe.grpc"]);
    }

    #[test]
    fn workload_selectors_must_exist_and_match_the_template() {
        let mut d = seed_deployment();
        d["spec"]["selector"] = json!({"matchLabels": {"app": "api"}});
        assert_eq!(fields(&DEPLOYMENT, &d), vec!["spec.template.metadata.labels"]);
        d["spec"]["selector"] = json!({});
        assert_eq!(fields(&DEPLOYMENT, &d), vec!["spec.selector"]);
        d["spec"]["selector"] = json!({"matchExpressions": [{"key": "app", "operator": "Near", "values": ["web"]}]});
        assert_eq!(fields(&DEPLOYMENT, &d), vec!["spec.selector.matchExpressions[0].operator"]);
        d["spec"]["selector"] = json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "api"]}]});
        assert_eq!(fields(&DEPLOYMENT, &d), Vec::<String>::new());
        d["spec"].as_object_mut().map(|s| s.remove("selector"));
        assert_eq!(causes(&REPLICASET, &d), vec![("spec.selector".to_string(), "FieldValueRequired")]);
        d["spec"].as_object_mut().map(|s| s.remove("template"));
        assert_eq!(fields(&REPLICASET, &d), vec!["spec.selector", "spec.template"]);
    }

    #[test]
    fn deployment_strategy_and_timing_rules_are_enforced() {
        let with = |patch: Value| {
            let mut d = seed_deployment();
            if let (Some(spec), Value::Object(p)) = (d["spec"].as_object_mut(), patch) {
                spec.extend(p);
            }
            d
        };
        let rolling = |surge: Value, unavailable: Value| {
            with(json!({"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}}}))
        };
        assert_eq!(fields(&DEPLOYMENT, &rolling(json!("25%"), json!(0))), Vec::<String>::new());
        assert_eq!(fields(&DEPLOYMENT, &rolling(json!(0), json!("0%"))), vec!["spec.strategy.rollingUpdate.maxUnavailable"]);
        assert_eq!(fields(&DEPLOYMENT, &rolling(json!("25"), json!(-1))).len(), 2);
        assert_eq!(fields(&DEPLOYMENT, &rolling(json!(1), json!("150%"))), vec!["spec.strategy.rollingUpdate.maxUnavailable"]);
        let recreate = with(json!({"strategy": {"type": "Recreate", "rollingUpdate": {"maxSurge": 1}}}));
        assert_eq!(causes(&DEPLOYMENT, &recreate), vec![("spec.strategy.rollingUpdate".to_string(), "FieldValueForbidden")]);
        assert_eq!(fields(&DEPLOYMENT, &with(json!({"strategy": {"type": "BlueGreen"}}))), vec!["spec.strategy.type"]);
        assert_eq!(
            fields(&DEPLOYMENT, &with(json!({"minReadySeconds": 30, "progressDeadlineSeconds": 30, "revisionHistoryLimit": -1}))),
            vec!["spec.revisionHistoryLimit", "spec.progressDeadlineSeconds"]
        );
        let mut never = seed_deployment();
        never["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
        assert_eq!(causes(&DEPLOYMENT, &never), vec![("spec.template.spec.restartPolicy".to_string(), "FieldValueNotSupported")]);
    }

    #[test]
    fn endpoints_ports_and_addresses_are_checked() {
        let e = json!({"metadata": {"name": "web", "namespace": "default"}, "subsets": [
            {"addresses": [{"ip": "10.0.0.300"}], "ports": [{"port": 0}, {"port": 80, "protocol": "ICMP"}]}]});
        assert_eq!(
            fields(&ENDPOINTS, &e),
            vec!["subsets[0].addresses[0].ip", "subsets[0].ports[0].port", "subsets[0].ports[1].protocol"]
        );
    }

    #[test]
    fn endpoint_slices_check_the_address_type_their_addresses_and_ports() {
        let slice = |address_type: Value, address: &str, ports: Value| {
            json!({"metadata": {"name": "web-abc", "namespace": "default"}, "addressType": address_type,
                "endpoints": [{"addresses": [address], "conditions": {"ready": true}}], "ports": ports})
        };
        assert_eq!(fields(&ENDPOINTSLICE, &slice(json!("IPv4"), "10.0.0.1", json!([{"name": "http", "port": 80}]))), Vec::<String>::new());
        assert_eq!(fields(&ENDPOINTSLICE, &slice(json!("IPv4"), "fd00::1", json!([]))), vec!["endpoints[0].addresses[0]"]);
        assert_reports(&ENDPOINTSLICE, &slice(json!("IPX"), "10.0.0.1", json!([])), "addressType", "FieldValueNotSupported");
        assert_reports(&ENDPOINTSLICE, &slice(Value::Null, "10.0.0.1", json!([])), "addressType", "FieldValueRequired");
        let dup = slice(json!("IPv4"), "10.0.0.1", json!([{"name": "a", "port": 80}, {"name": "a", "port": 0}]));
        assert_eq!(causes(&ENDPOINTSLICE, &dup), vec![("ports[1].port".to_string(), "FieldValueInvalid"),
            ("ports[1].name".to_string(), "FieldValueDuplicate")]);
        let old = slice(json!("IPv4"), "10.0.0.1", json!([]));
        let new = slice(json!("IPv6"), "fd00::1", json!([]));
        assert!(matches!(validate_update(&ENDPOINTSLICE, &old, &new), Err(ApiError::Invalid { causes, .. })
            if causes.iter().any(|c| c.field == "addressType" && c.message.contains("immutable"))));
    }

    #[test]
    fn a_disruption_budget_takes_one_bound_as_a_count_or_a_percentage() {
        let pdb = |spec: Value| json!({"metadata": {"name": "web", "namespace": "default"}, "spec": spec});
        let sel = json!({"matchLabels": {"app": "web"}});
        assert_eq!(fields(&PODDISRUPTIONBUDGET, &pdb(json!({"minAvailable": 2, "selector": sel}))), Vec::<String>::new());
        assert_eq!(fields(&PODDISRUPTIONBUDGET, &pdb(json!({"maxUnavailable": "25%", "selector": {}}))), Vec::<String>::new());
        assert_eq!(fields(&PODDISRUPTIONBUDGET, &pdb(json!({"minAvailable": 1, "maxUnavailable": 1}))), vec!["spec"]);
        assert_eq!(fields(&PODDISRUPTIONBUDGET, &pdb(json!({"minAvailable": -1}))), vec!["spec.minAvailable"]);
        assert_eq!(fields(&PODDISRUPTIONBUDGET, &pdb(json!({"maxUnavailable": "half"}))), vec!["spec.maxUnavailable"]);
        assert_eq!(fields(&PODDISRUPTIONBUDGET, &pdb(json!({"minAvailable": "101%"}))), vec!["spec.minAvailable"]);
        assert_eq!(fields(&PODDISRUPTIONBUDGET, &pdb(json!({"unhealthyPodEvictionPolicy": "Sometimes"}))),
            vec!["spec.unhealthyPodEvictionPolicy"]);
    }

    #[test]
    fn name_validators_follow_kubernetes() {
        assert!(is_dns1123_label("web-0") && !is_dns1123_label("web.0") && !is_dns1123_label("-a") && !is_dns1123_label(""));
        assert!(is_dns1123_subdomain("a.b-c.d") && !is_dns1123_subdomain("a..b") && !is_dns1123_subdomain("A"));
        assert!(is_qualified_name("app.kubernetes.io/name") && is_qualified_name("A_b.c") && !is_qualified_name("a/b/c"));
        assert!(!is_qualified_name("example.com/") && !is_qualified_name(&"a".repeat(64)) && !is_qualified_name("/a"));
        assert!(is_label_value("") && is_label_value("v1.2_3") && !is_label_value("a b") && !is_label_value("-a"));
    }

    #[test]
    fn updates_may_not_change_identity_or_selectors() {
        let old = {
            let mut d = seed_deployment();
            d["metadata"]["uid"] = json!("1111");
            d["metadata"]["namespace"] = json!("default");
            d
        };
        let mut new = old.clone();
        new["spec"]["replicas"] = json!(5);
        assert_eq!(validate_update(&DEPLOYMENT, &old, &new), Ok(()));
        new["metadata"].as_object_mut().map(|m| m.remove("uid"));
        assert_eq!(validate_update(&DEPLOYMENT, &old, &new), Ok(()), "an omitted uid is copied by the server");
        new["metadata"]["uid"] = json!("2222");
        new["metadata"]["name"] = json!("web2");
        new["spec"]["selector"] = json!({"matchLabels": {"app": "web", "tier": "fe"}});
        new["spec"]["template"]["metadata"]["labels"]["tier"] = json!("fe");
        let err = validate_update(&DEPLOYMENT, &old, &new).unwrap_err();
        let ApiError::Invalid { causes, .. } = err else { panic!("expected 422") };
        let got: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
        assert_eq!(got, vec!["metadata.name", "metadata.uid", "spec.selector"]);
        assert!(causes.iter().all(|c| c.message.contains("immutable")));
    }

    #[test]
    fn pod_updates_may_change_only_images_deadlines_and_added_tolerations() {
        let old = pod(json!({"containers": [{"name": "a", "image": "v1"}], "restartPolicy": "Always",
            "tolerations": [{"key": "k", "operator": "Exists"}]}));
        let change = |f: &dyn Fn(&mut Value)| {
            let mut new = old.clone();
            f(&mut new["spec"]);
            validate_update(&POD, &old, &new).map_err(|e| match e {
                ApiError::Invalid { causes, .. } => causes.into_iter().map(|c| (c.field, c.reason)).collect::<Vec<_>>(),
                other => panic!("{other:?}"),
            })
        };
        assert_eq!(change(&|s| s["containers"][0]["image"] = json!("v2")), Ok(()));
        assert_eq!(change(&|s| s["activeDeadlineSeconds"] = json!(60)), Ok(()));
        assert_eq!(
            change(&|s| s["tolerations"].as_array_mut().into_iter().for_each(|t| t.push(json!({"key": "x", "operator": "Exists"})))),
            Ok(())
        );
        let forbidden = Err(vec![("spec".to_string(), "FieldValueForbidden")]);
        assert_eq!(change(&|s| s["tolerations"] = json!([])), forbidden);
        assert_eq!(change(&|s| s["restartPolicy"] = json!("Never")), forbidden);
        assert_eq!(change(&|s| s["nodeName"] = json!("node-1")), forbidden);
        assert_eq!(change(&|s| s["containers"][0]["ports"] = json!([{"containerPort": 80}])), forbidden);
    }

    #[test]
    fn a_service_keeps_its_cluster_ip() {
        let old = service(json!({"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}));
        let mut new = old.clone();
        new["spec"]["clusterIP"] = json!("10.96.0.11");
        assert_eq!(fields(&SERVICE, &new), Vec::<String>::new());
        let err = validate_update(&SERVICE, &old, &new).unwrap_err();
        assert!(err.to_string().contains("spec.clusterIP"), "{err}");
        new["spec"]["clusterIP"] = json!("10.96.0.10");
        assert_eq!(validate_update(&SERVICE, &old, &new), Ok(()));
    }

    #[test]
    fn a_node_pod_cidr_is_set_once_from_nothing() {
        let bare = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}});
        let mut assigned = bare.clone();
        assigned["spec"] = json!({"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]});
        assert_eq!(validate_update(&NODE, &bare, &assigned), Ok(()), "assigned from nothing");
        assert_eq!(validate_update(&NODE, &assigned, &assigned), Ok(()), "kept");
        let mut other = assigned.clone();
        other["spec"] = json!({"podCIDR": "10.244.2.0/24", "podCIDRs": ["10.244.2.0/24"]});
        let mut dropped = assigned.clone();
        dropped["spec"] = json!({"unschedulable": true});
        let mut only_old_field = bare.clone();
        only_old_field["spec"] = json!({"podCIDR": "10.244.1.0/24"});
        for (new, what) in [(&other, "changed"), (&dropped, "removed")] {
            match validate_update(&NODE, &assigned, new) {
                Err(ApiError::Invalid { causes, .. }) => {
                    assert_eq!(causes.len(), 1, "{what}: {causes:?}");
                    assert_eq!((causes[0].field.as_str(), causes[0].reason), ("spec.podCIDRs", "FieldValueForbidden"), "{what}");
                }
                got => panic!("{what}: expected 422, got {got:?}"),
            }
        }
        assert_eq!(validate_update(&NODE, &only_old_field, &assigned), Ok(()), "podCIDRs filled in from podCIDR");
        assert!(validate_update(&NODE, &only_old_field, &other).is_err(), "the single field counts as assigned");
    }

    pub(super) fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let key = prop_oneof![
            Just("metadata"), Just("name"), Just("labels"), Just("spec"), Just("containers"), Just("image"),
            Just("ports"), Just("containerPort"), Just("selector"), Just("matchLabels"), Just("matchExpressions"),
            Just("template"), Just("strategy"), Just("rollingUpdate"), Just("maxSurge"), Just("resources"),
            Just("requests"), Just("cpu"), Just("livenessProbe"), Just("httpGet"), Just("port"), Just("targetPort"),
            Just("subsets"), Just("operator"), Just("values"), Just("env"), Just("x"),
        ]
        .prop_map(str::to_string);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-zA-Z0-9%./-]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map(key.clone(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_json_never_panics_and_only_ever_yields_422(old in arb_json(), new in arb_json()) {
            for res in crate::kinds::ALL {
                let mut defaulted = new.clone();
                crate::defaults::apply_defaults(res, &mut defaulted);
                for result in [validate(res, &new), validate(res, &defaulted), validate_update(res, &old, &new)] {
                    if let Err(e) = result {
                        proptest::prop_assert_eq!(e.code(), 422);
                    }
                }
            }
        }
    }
}
