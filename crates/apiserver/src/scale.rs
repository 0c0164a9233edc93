//! The `scale` subresource: the `autoscaling/v1` Scale view of Deployments, ReplicaSets,
//! StatefulSets, ReplicationControllers and custom objects whose definition asks for one, read
//! and written by `kubectl scale`, the HorizontalPodAutoscaler and anyone else through one path.

use serde_json::{Value, json};
use shepherd_api::kinds::ResourceInfo;
use shepherd_api::{ApiError, JsonPath, LabelSelector};
use shepherd_store::KeyValue;

use crate::codec;
use crate::patch::apply_json_patch;
use crate::service::{ApiService, PatchType, parse_resource_version};
use crate::write_options::WriteOptions;

/// The answer for a kind that serves no Scale, as Kubernetes gives it for an unknown subresource.
fn not_served(res: &ResourceInfo) -> ApiError {
    ApiError::NotFound {
        kind: format!("{}/scale", res.plural),
        name: String::new(),
        message: format!("the server could not find the requested resource ({} has no scale subresource)", res.plural),
    }
}

impl ApiService {
    /// `GET .../{name}/scale`.
    pub async fn get_scale(&self, res: &ResourceInfo, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        if !res.has_scale {
            return Err(not_served(res));
        }
        scale_of_kv(res, &self.get(res, ns, name).await?)
    }

    /// `PUT .../{name}/scale`: the Scale's `spec.replicas` becomes the object's; its
    /// `metadata.resourceVersion`, when set, is a precondition.
    pub async fn update_scale(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        scale: &Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        if !res.has_scale {
            return Err(not_served(res));
        }
        let replicas = scale_replicas(scale, name)?;
        let rv = parse_resource_version(scale.at("/metadata/resourceVersion").and_then(Value::as_str).unwrap_or(""))?;
        let kv = self
            .mutate(res, ns, name, rv, "scale", opts, |old| {
                let mut new = old.clone();
                set_replicas(res, &mut new, replicas)?;
                Ok(new)
            })
            .await?;
        scale_of_kv(res, &kv)
    }

    /// `PATCH .../{name}/scale`: a merge or JSON patch of the Scale view.
    pub async fn patch_scale(
        &self,
        res: &ResourceInfo,
        ns: Option<&str>,
        name: &str,
        patch_type: PatchType,
        patch: &Value,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        if !res.has_scale {
            return Err(not_served(res));
        }
        let kv = self
            .mutate(res, ns, name, None, "scale", opts, |old| {
                let mut scale = scale_of(res, old);
                if patch_type == PatchType::Json {
                    apply_json_patch(&mut scale, patch)?;
                } else {
                    if !patch.is_object() {
                        return Err(ApiError::BadRequest("a merge patch must be a JSON object".into()));
                    }
                    json_patch::merge(&mut scale, patch);
                }
                if !scale.is_object() || scale.get("metadata").is_some_and(|m| !m.is_object() && !m.is_null()) {
                    return Err(ApiError::BadRequest("the patched Scale must be an object with object metadata".into()));
                }
                let mut new = old.clone();
                set_replicas(res, &mut new, scale_replicas(&scale, name)?)?;
                Ok(new)
            })
            .await?;
        scale_of_kv(res, &kv)
    }
}

fn scale_of_kv(res: &ResourceInfo, kv: &KeyValue) -> Result<Value, ApiError> {
    Ok(scale_of(res, &codec::decode(kv)?))
}

/// Sets the replicas a Scale asks for: through the definition's path for a custom object,
/// `spec.replicas` otherwise.
fn set_replicas(res: &ResourceInfo, obj: &mut Value, replicas: i64) -> Result<(), ApiError> {
    if !crate::crd::set_replicas(res, obj, replicas)? {
        obj["spec"]["replicas"] = json!(replicas);
    }
    Ok(())
}

/// The `autoscaling/v1` Scale view of `obj`. `status.selector` is the pod selector in the string
/// syntax (`app=web,tier in (a,b)`), which is what an autoscaler lists pods with.
pub(crate) fn scale_of(res: &ResourceInfo, obj: &Value) -> Value {
    if let Some(scale) = crate::crd::scale_view(res, obj) {
        return scale;
    }
    let selector = obj.at("/spec/selector").cloned().unwrap_or(Value::Null);
    // A ReplicationController's selector is the label map itself.
    let selector = if res.kind == "ReplicationController" { json!({"matchLabels": selector}) } else { selector };
    // Stored objects passed validation; a selector that still does not parse selects nothing.
    let selector = LabelSelector::from_k8s(&selector).map(|s| s.to_string()).unwrap_or_default();
    let replicas = |p: &str| obj.at(p).and_then(Value::as_i64).unwrap_or(0);
    crate::crd::scale_body(obj, replicas("/spec/replicas"), replicas("/status/replicas"), &selector)
}

/// The replicas a Scale asks for; the error names the scaled object, as Kubernetes' does.
fn scale_replicas(scale: &Value, name: &str) -> Result<i64, ApiError> {
    match scale.at("/spec/replicas") {
        Some(Value::Number(n)) if n.as_i64().is_some_and(|r| r >= 0) => Ok(n.as_i64().unwrap_or(0)),
        Some(v) => Err(ApiError::invalid("Scale", name, vec![shepherd_api::Cause::invalid(
            "spec.replicas",
            format!("Invalid value: {v}: must be a whole number greater than or equal to 0"),
        )])),
        None => Err(ApiError::invalid("Scale", name, vec![shepherd_api::Cause::required("spec.replicas")])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shepherd_api::kinds;

    #[test]
    fn a_scale_s_selector_is_the_string_form_of_match_labels_and_match_expressions() {
        let sts = json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}},
            "status": {"replicas": 2}});
        let scale = scale_of(&kinds::STATEFULSET, &sts);
        assert_eq!(scale["spec"]["replicas"], 3);
        assert_eq!(scale["status"], json!({"replicas": 2, "selector": "app=web,tier in (a,b)"}));
        let rc = json!({"metadata": {"name": "web"}, "spec": {"replicas": 1, "selector": {"app": "web"}}});
        assert_eq!(scale_of(&kinds::REPLICATIONCONTROLLER, &rc)["status"]["selector"], "app=web");
    }

    #[test]
    fn a_scale_without_whole_non_negative_replicas_is_refused_naming_the_field() {
        for bad in [json!({"spec": {"replicas": -1}}), json!({"spec": {"replicas": "3"}}), json!({"spec": {}})] {
            let e = scale_replicas(&bad, "web").unwrap_err();
            assert!(e.to_string().contains("spec.replicas"), "{bad}: {e}");
        }
        assert_eq!(scale_replicas(&json!({"spec": {"replicas": 0}}), "web").ok(), Some(0));
    }
}
