//! ServiceAccount credentials: the `serviceaccounts/{name}/token` subresource (TokenRequest), and the
//! admission step that gives each new pod its account's token as Kubernetes' `kube-api-access-*` volume.

pub mod token;

use serde_json::{Value, json};
use shepherd_api::{ApiError, Cause, JsonPath, kinds, str_at};

use crate::auth::UserInfo;
use crate::service::{ApiService, now_rfc3339};
pub use token::{DEFAULT_ISSUER, ObjectRef, ServiceAccountTokens, TokenSpec, generate_key_pem, looks_like_jwt};

/// Where the token, the CA and the namespace appear in every container.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The ConfigMap holding the cluster CA in every namespace.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
/// The lifetime of a mounted token (Kubernetes: an hour and seven seconds, so that it is told apart).
const MOUNTED_TOKEN_SECONDS: i64 = 3607;
/// A TokenRequest's lifetime when it asks for none.
const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;
/// Kubernetes' longest TokenRequest lifetime.
const MAX_EXPIRATION_SECONDS: i64 = 1 << 32;

fn invalid(name: &str, causes: Vec<Cause>) -> ApiError {
    ApiError::invalid("TokenRequest.authentication.k8s.io", name, causes)
}

/// A TokenRequest's `spec`, checked.
struct Request {
    audiences: Vec<String>,
    expiration_seconds: i64,
    /// The pod the token is bound to: its name and, when given, its uid.
    pod: Option<(String, String)>,
}

fn parse_request(name: &str, body: &Value, tokens: &ServiceAccountTokens) -> Result<Request, ApiError> {
    if !body.is_object() {
        return Err(ApiError::BadRequest("request body must be a JSON object".into()));
    }
    match body.get("apiVersion").and_then(Value::as_str) {
        None | Some("" | "authentication.k8s.io/v1") => {}
        Some(v) => {
            return Err(ApiError::BadRequest(format!(
                "the API version in the data ({v}) does not match the expected API version (authentication.k8s.io/v1)"
            )));
        }
    }
    match body.get("kind").and_then(Value::as_str) {
        None | Some("" | "TokenRequest") => {}
        Some(k) => {
            return Err(ApiError::BadRequest(format!(
                "the kind in the data ({k}) does not match the expected kind (TokenRequest)"
            )));
        }
    }
    let spec = body.get("spec").cloned().unwrap_or(Value::Null);
    let mut causes = Vec::new();
    let mut audiences = Vec::new();
    match spec.get("audiences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, a) in list.iter().enumerate() {
                match a.as_str() {
                    Some(a) if !a.is_empty() => audiences.push(a.to_string()),
                    _ => causes.push(Cause::invalid(
                        format!("spec.audiences[{i}]"),
                        "Invalid value: must be a non-empty string",
                    )),
                }
            }
        }
        Some(_) => causes.push(Cause::invalid("spec.audiences", "Invalid value: must be a list of strings")),
    }
    if audiences.is_empty() {
        audiences = tokens.default_audiences().to_vec();
    }
    let expiration_seconds = match spec.get("expirationSeconds") {
        None | Some(Value::Null) => DEFAULT_EXPIRATION_SECONDS,
        Some(v) => match v.as_i64() {
            Some(s) if s < tokens.min_expiration_seconds() => {
                let least = match tokens.min_expiration_seconds() {
                    token::MIN_EXPIRATION_SECONDS => "10 minutes".to_string(),
                    s => format!("{s} seconds"),
                };
                causes.push(Cause::invalid(
                    "spec.expirationSeconds",
                    format!("Invalid value: {s}: may not specify a duration less than {least}"),
                ));
                0
            }
            Some(s) if s > MAX_EXPIRATION_SECONDS => {
                causes.push(Cause::invalid(
                    "spec.expirationSeconds",
                    format!("Invalid value: {s}: may not specify a duration larger than 2^32 seconds"),
                ));
                0
            }
            Some(s) => s,
            None => {
                causes
                    .push(Cause::invalid("spec.expirationSeconds", format!("Invalid value: {v}: must be an integer")));
                0
            }
        },
    };
    let pod = match spec.get("boundObjectRef").filter(|r| !r.is_null()) {
        None => None,
        Some(r) => {
            match str_at(r, "/kind") {
                "Pod" => {}
                other => causes.push(Cause::not_supported(
                    "spec.boundObjectRef.kind",
                    format!("Unsupported value: {}: supported values: \"Pod\"", Value::from(other)),
                )),
            }
            match str_at(r, "/apiVersion") {
                "" | "v1" => {}
                other => causes.push(Cause::not_supported(
                    "spec.boundObjectRef.apiVersion",
                    format!("Unsupported value: {}: supported values: \"v1\"", Value::from(other)),
                )),
            }
            let pod = str_at(r, "/name");
            if pod.is_empty() {
                causes.push(Cause::required("spec.boundObjectRef.name"));
            }
            Some((pod.to_string(), str_at(r, "/uid").to_string()))
        }
    };
    if !causes.is_empty() {
        return Err(invalid(name, causes));
    }
    Ok(Request { audiences, expiration_seconds, pod })
}

/// `POST .../serviceaccounts/{name}/token`: a token for the account, bound to a pod when asked. A node
/// (`requester`, when it is one) may ask only for tokens bound to pods it runs, with their uid, as
/// Kubernetes' NodeRestriction admission allows.
pub(crate) async fn create_token(
    svc: &ApiService,
    requester: Option<&UserInfo>,
    namespace: &str,
    name: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    let Some(tokens) = svc.service_account_tokens.as_deref() else {
        return Err(ApiError::ServiceUnavailable(
            "this server issues no service account tokens (it runs without TLS and a signing key)".into(),
        ));
    };
    let request = parse_request(name, body, tokens)?;
    let sa = crate::codec::decode(&svc.get(&kinds::SERVICEACCOUNT, Some(namespace), name).await?)?;
    let sa_ref = ObjectRef { name: name.to_string(), uid: str_at(&sa, "/metadata/uid").to_string() };
    let node = requester.and_then(UserInfo::node_name);
    let mut pod_ref = None;
    let mut node_ref = None;
    if let Some((pod_name, wanted_uid)) = &request.pod {
        let pod = crate::codec::decode(&svc.get(&kinds::POD, Some(namespace), pod_name).await?)?;
        let uid = str_at(&pod, "/metadata/uid");
        if !wanted_uid.is_empty() && wanted_uid != uid {
            return Err(ApiError::conflict(
                "pods",
                pod_name,
                &format!(
                    "the UID in the bound object reference ({wanted_uid}) does not match the UID in record. The \
                     object might have been deleted and then recreated"
                ),
            ));
        }
        // A mirror pod runs with no account at all: no token binds to it.
        let account = match str_at(&pod, "/spec/serviceAccountName") {
            "" if !shepherd_api::pod::is_mirror(&pod) => "default",
            a => a,
        };
        if account != name {
            return Err(ApiError::BadRequest(format!(
                "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
            )));
        }
        let bound_node = str_at(&pod, "/spec/nodeName");
        if !bound_node.is_empty() {
            node_ref = Some(ObjectRef { name: bound_node.to_string(), uid: String::new() });
        }
        pod_ref = Some(ObjectRef { name: pod_name.clone(), uid: uid.to_string() });
    }
    if let Some(node) = node {
        let refused =
            |why: &str| ApiError::Forbidden(format!("serviceaccounts {name:?} is forbidden: node {node:?} {why}"));
        match (&request.pod, &pod_ref, &node_ref) {
            (None, _, _) => return Err(refused("requested a token not bound to a pod")),
            (Some((_, uid)), _, _) if uid.is_empty() => {
                return Err(refused("requested a token with a pod binding without a uid"));
            }
            (_, _, Some(bound)) if bound.name == node => {}
            _ => return Err(refused("requested a token bound to a pod scheduled on a different node")),
        }
    }
    let (token, exp) = tokens.issue(&TokenSpec {
        namespace,
        service_account: sa_ref,
        audiences: request.audiences.clone(),
        expiration_seconds: request.expiration_seconds,
        pod: pod_ref.clone(),
        node: node_ref,
    })?;
    let expires = jiff::Timestamp::from_second(i64::try_from(exp).unwrap_or(i64::MAX))
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .map_err(|e| ApiError::Internal(format!("token expiry: {e}")))?;
    let mut spec = json!({"audiences": request.audiences, "expirationSeconds": request.expiration_seconds});
    if let Some(pod) = &pod_ref {
        spec["boundObjectRef"] = json!({"kind": "Pod", "apiVersion": "v1", "name": pod.name, "uid": pod.uid});
    }
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": now_rfc3339()},
        "spec": spec,
        "status": {"token": token, "expirationTimestamp": expires},
    }))
}

/// The ServiceAccount admission step for a new pod: unless the pod or its account sets
/// `automountServiceAccountToken: false`, adds the `kube-api-access-*` projected volume (the token,
/// the cluster CA, the namespace) and mounts it read-only in every container that does not already
/// mount something there. Does nothing when this server issues no tokens, and for mirror pods.
pub(crate) async fn mount_token(svc: &ApiService, namespace: &str, pod: &mut Value) -> Result<(), ApiError> {
    if svc.service_account_tokens.is_none()
        || shepherd_api::pod::is_mirror(pod)
        || pod.at("/spec/automountServiceAccountToken").and_then(Value::as_bool) == Some(false)
    {
        return Ok(());
    }
    let account = match str_at(pod, "/spec/serviceAccountName") {
        "" => "default",
        a => a,
    }
    .to_string();
    match svc.get(&kinds::SERVICEACCOUNT, Some(namespace), &account).await {
        Ok(kv) => {
            let sa = crate::codec::decode(&kv)?;
            if sa.get("automountServiceAccountToken").and_then(Value::as_bool) == Some(false) {
                return Ok(());
            }
        }
        // A missing `default` account is made a moment after its namespace; other accounts are
        // checked to exist by the caller.
        Err(e) if e.code() == 404 => {}
        Err(e) => return Err(e),
    }
    add_token_volume(pod);
    Ok(())
}

/// Adds the token volume and its mounts to `pod` (see [`mount_token`]).
fn add_token_volume(pod: &mut Value) {
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return };
    let mounts_there = |c: &Value| {
        c.get("volumeMounts")
            .and_then(Value::as_array)
            .is_some_and(|ms| ms.iter().any(|m| str_at(m, "/mountPath").trim_end_matches('/') == MOUNT_PATH))
    };
    let wanting = ["initContainers", "containers"]
        .iter()
        .flat_map(|list| spec.get(*list).and_then(Value::as_array).into_iter().flatten())
        .any(|c| !mounts_there(c));
    if !wanting {
        return;
    }
    let volume_name = format!("kube-api-access-{}", crate::service::random_suffix());
    let volume = json!({"name": volume_name, "projected": {"defaultMode": 0o644, "sources": [
        {"serviceAccountToken": {"expirationSeconds": MOUNTED_TOKEN_SECONDS, "path": "token"}},
        {"configMap": {"name": ROOT_CA_CONFIG_MAP, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}});
    match spec.get_mut("volumes").and_then(Value::as_array_mut) {
        Some(volumes) => volumes.push(volume),
        None => {
            spec.insert("volumes".into(), json!([volume]));
        }
    }
    for list in ["initContainers", "containers"] {
        for c in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            if mounts_there(c) {
                continue;
            }
            // A container that is not an object is left for validation to refuse.
            let Some(c) = c.as_object_mut() else { continue };
            let mount = json!({"name": volume_name, "readOnly": true, "mountPath": MOUNT_PATH});
            match c.get_mut("volumeMounts") {
                Some(Value::Array(ms)) => ms.push(mount),
                None | Some(Value::Null) => {
                    c.insert("volumeMounts".into(), json!([mount]));
                }
                Some(_) => {} // not a list: validation refuses it as written
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_volume_is_mounted_in_every_container_that_has_nothing_at_its_path() {
        let mut pod = json!({"spec": {"containers": [
            {"name": "a"},
            {"name": "b", "volumeMounts": [{"name": "own", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount/"}]},
        ], "volumes": [{"name": "own", "emptyDir": {}}]}});
        add_token_volume(&mut pod);
        let volume = &pod["spec"]["volumes"][1];
        let name = volume["name"].as_str().unwrap();
        assert!(name.starts_with("kube-api-access-") && name.len() == "kube-api-access-".len() + 5, "{name}");
        assert_eq!(volume["projected"]["sources"][0]["serviceAccountToken"]["path"], "token");
        assert_eq!(volume["projected"]["sources"][1]["configMap"]["name"], "kube-root-ca.crt");
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"][0],
            json!({"name": name, "readOnly": true, "mountPath": MOUNT_PATH})
        );
        assert_eq!(pod["spec"]["containers"][1]["volumeMounts"].as_array().unwrap().len(), 1, "its own mount is kept");
    }

    #[test]
    fn containers_of_the_wrong_shape_are_left_for_validation_to_refuse() {
        for containers in [json!([1]), json!(["x", null, [true]]), json!([{"name": "a", "volumeMounts": 7}])] {
            let mut pod = json!({"spec": {"containers": containers.clone(), "volumes": "no"}});
            add_token_volume(&mut pod);
            if containers[0].is_object() {
                assert_eq!(pod["spec"]["containers"][0]["volumeMounts"], 7, "a wrong volumeMounts is not replaced");
            } else {
                assert_eq!(pod["spec"]["containers"], containers, "a container that is not an object is left as it was");
            }
        }
    }

    #[test]
    fn a_token_request_below_the_minimum_lifetime_or_bound_to_a_secret_names_the_field() {
        let tokens = ServiceAccountTokens::new(&generate_key_pem().unwrap(), DEFAULT_ISSUER, vec![]).unwrap();
        let body = json!({"spec": {"expirationSeconds": 60, "boundObjectRef": {"kind": "Secret", "name": "s"}}});
        let err = parse_request("bot", &body, &tokens).err().unwrap().to_string();
        assert!(
            err.contains("spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"),
            "{err}"
        );
        assert!(err.contains("spec.boundObjectRef.kind: Unsupported value: \"Secret\""), "{err}");
        let ok = parse_request("bot", &json!({"spec": {}}), &tokens).ok().unwrap();
        assert_eq!((ok.audiences, ok.expiration_seconds), (vec![DEFAULT_ISSUER.to_string()], 3600));
        assert!(parse_request("bot", &json!({"kind": "Pod"}), &tokens).is_err());
    }
}
