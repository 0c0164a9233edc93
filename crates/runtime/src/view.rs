//! A pod's fields that controllers scanning many pods read, taken out of the JSON once as the pod
//! enters the cache.
//!
//! A ReplicaSet's full pass, the Deployment controller's wait for old pods and the selectors of
//! Services walk hundreds or thousands of pods per reconcile, and each read through the `Value`
//! walks its maps again (a label selector builds a map of the pod's labels per match). A
//! `PodView` answers the same questions from a few flat fields, and is what a cache that keeps
//! pods in a compact form can hand out without parsing them.
//!
//! Every accessor gives what the matching `shepherd_api::{meta, pod}` reader gives on the object
//! the view was made from (pinned by this module's tests).

use std::time::Duration;

use jiff::Timestamp;
use serde_json::Value;
use shepherd_api::selector::LabelSelector;
use shepherd_api::{JsonPath, meta, pod};

/// The controlling owner reference (`controller: true`) of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRef {
    pub kind: Box<str>,
    pub name: Box<str>,
    pub uid: Box<str>,
}

/// The fields of one pod the scanning controllers read; see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    namespace: Box<str>,
    name: Box<str>,
    uid: Box<str>,
    /// Sorted by key; only string values, as label selectors see them.
    labels: Box<[(Box<str>, Box<str>)]>,
    /// The first owner reference marked `controller: true`, when it names a uid.
    controller: Option<OwnerRef>,
    node_name: Option<Box<str>>,
    phase: Box<str>,
    ready: bool,
    ready_since: Option<Timestamp>,
    deleting: bool,
}

impl PodView {
    /// Reads the view of a pod object.
    pub fn of(obj: &Value) -> PodView {
        let boxed = |s: &str| Box::<str>::from(s);
        let mut labels: Vec<(Box<str>, Box<str>)> = obj
            .at("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| Some((boxed(k), boxed(v.as_str()?)))).collect())
            .unwrap_or_default();
        labels.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let controller = meta::controller_ref(obj).and_then(|r| {
            let field = |f: &str| boxed(r.get(f).and_then(Value::as_str).unwrap_or(""));
            Some(OwnerRef { kind: field("kind"), name: field("name"), uid: boxed(r.get("uid")?.as_str()?) })
        });
        PodView {
            namespace: boxed(meta::namespace(obj).unwrap_or("")),
            name: boxed(meta::name(obj)),
            uid: boxed(meta::uid(obj)),
            labels: labels.into_boxed_slice(),
            controller,
            node_name: pod::node_name(obj).map(boxed),
            phase: boxed(pod::phase(obj)),
            ready: pod::is_ready(obj),
            ready_since: pod::ready_since(obj),
            deleting: meta::is_deleting(obj),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `None` for an empty namespace, as `meta::namespace`.
    pub fn namespace(&self) -> Option<&str> {
        Some(&*self.namespace).filter(|ns| !ns.is_empty())
    }

    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// The cache key: `namespace/name`, or `name` without a namespace.
    pub fn key(&self) -> String {
        match self.namespace() {
            Some(ns) => format!("{ns}/{}", self.name),
            None => self.name.to_string(),
        }
    }

    /// The value of label `key`, if the pod carries it as a string.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.binary_search_by(|(k, _)| (**k).cmp(key)).ok().map(|i| &*self.labels[i].1)
    }

    /// The labels, sorted by key.
    pub fn labels(&self) -> impl Iterator<Item = (&str, &str)> {
        self.labels.iter().map(|(k, v)| (&**k, &**v))
    }

    /// Whether `selector` matches the pod's labels, as `selector.matches_object(pod)`.
    pub fn matches(&self, selector: &LabelSelector) -> bool {
        selector.matches_with(|k| self.label(k))
    }

    /// The controlling owner reference.
    pub fn controller(&self) -> Option<&OwnerRef> {
        self.controller.as_ref()
    }

    /// The uid of the controlling owner, as `meta::controller_uid`.
    pub fn controller_uid(&self) -> Option<&str> {
        self.controller.as_ref().map(|c| &*c.uid)
    }

    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    pub fn is_scheduled(&self) -> bool {
        self.node_name.is_some()
    }

    /// `status.phase`, `Pending` when absent, as `pod::phase`.
    pub fn phase(&self) -> &str {
        &self.phase
    }

    /// Marked for deletion, as `meta::is_deleting`.
    pub fn is_deleting(&self) -> bool {
        self.deleting
    }

    /// Not terminating and not finished, as `pod::is_active`.
    pub fn is_active(&self) -> bool {
        !self.deleting && !matches!(&*self.phase, "Failed" | "Succeeded")
    }

    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// When the pod last became ready, as `pod::ready_since`.
    pub fn ready_since(&self) -> Option<Timestamp> {
        self.ready_since
    }

    /// As `pod::availability`: ready for at least `min_ready` at `at`, or how long until it is.
    pub fn availability(&self, min_ready: Duration, at: Timestamp) -> Result<bool, Duration> {
        if !self.ready {
            return Ok(false);
        }
        if min_ready.is_zero() {
            return Ok(true);
        }
        let Some(since) = self.ready_since else { return Ok(true) };
        let ready_for = Duration::try_from(at.duration_since(since)).unwrap_or(Duration::ZERO);
        if ready_for >= min_ready { Ok(true) } else { Err(min_ready - ready_for) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Every reader of the view against the `meta`/`pod` reader of the object it was made from.
    fn assert_reads_as(obj: &Value, step: &str) {
        let v = PodView::of(obj);
        assert_eq!(v.name(), meta::name(obj), "{step}: name");
        assert_eq!(v.namespace(), meta::namespace(obj), "{step}: namespace");
        assert_eq!(v.uid(), meta::uid(obj), "{step}: uid");
        assert_eq!(Some(v.key()), crate::cache::object_key(obj), "{step}: key");
        assert_eq!(v.controller_uid(), meta::controller_uid(obj), "{step}: controller uid");
        let owner = crate::cache::controller_owner(obj);
        if let Some((kind, name, uid)) = owner {
            let c = v.controller().expect("a controller");
            assert_eq!((&*c.kind, &*c.name, &*c.uid), (kind, name, uid), "{step}: controller");
        }
        assert_eq!(v.node_name(), pod::node_name(obj), "{step}: node");
        assert_eq!(v.is_scheduled(), pod::is_scheduled(obj), "{step}: scheduled");
        assert_eq!(v.phase(), pod::phase(obj), "{step}: phase");
        assert_eq!(v.is_deleting(), meta::is_deleting(obj), "{step}: deleting");
        assert_eq!(v.is_active(), pod::is_active(obj), "{step}: active");
        assert_eq!(v.is_ready(), pod::is_ready(obj), "{step}: ready");
        assert_eq!(v.ready_since(), pod::ready_since(obj), "{step}: ready since");
        let at: Timestamp = "2026-01-01T00:01:00Z".parse().expect("time");
        for secs in [0, 5, 30, 60, 600] {
            let min_ready = Duration::from_secs(secs);
            assert_eq!(v.availability(min_ready, at), pod::availability(obj, min_ready, at), "{step}: available {secs}s");
        }
        let labels = meta::labels(obj);
        for (k, value) in &labels {
            assert_eq!(v.label(k), value.as_str(), "{step}: label {k}");
        }
        assert_eq!(v.labels().count(), labels.values().filter(|l| l.is_string()).count(), "{step}: labels");
        assert_eq!(v.label("absent"), None);
        for sel in ["app=web", "app=web,tier=front", "app!=web", "tier in (front,back)", "!tier", "tier", "app notin (db)", ""] {
            let s = LabelSelector::parse(sel).expect("selector");
            assert_eq!(v.matches(&s), s.matches_object(obj), "{step}: selector {sel:?}");
        }
    }

    #[test]
    fn a_view_reads_as_the_pod_it_was_made_from_through_the_pods_life() {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web-3", "namespace": "default", "uid": "uid-3", "resourceVersion": "7",
                "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"app": "web", "tier": "front", "odd": 5}},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "100m"}}}]}});
        assert_reads_as(&pod, "created: no owner, no node, no status");
        pod["metadata"]["ownerReferences"] = json!([
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "cfg", "uid": "cm-1"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "rs-1", "controller": true},
        ]);
        assert_reads_as(&pod, "adopted by a ReplicaSet next to a non-controlling owner");
        pod["spec"]["nodeName"] = json!("node-4");
        pod["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]});
        assert_reads_as(&pod, "bound");
        pod["status"] = json!({"phase": "Running", "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:40Z"}]});
        assert_reads_as(&pod, "running and ready since 20s before the check");
        pod["status"]["conditions"][1] = json!({"type": "Ready", "status": "True"});
        assert_reads_as(&pod, "ready without a transition time");
        pod["status"]["conditions"][1] = json!({"type": "Ready", "status": "False", "lastTransitionTime": "2026-01-01T00:00:50Z"});
        assert_reads_as(&pod, "turned unready");
        pod["metadata"]["labels"] = json!({"app": "other"});
        assert_reads_as(&pod, "relabelled");
        pod["metadata"]["ownerReferences"] = json!([{"kind": "ReplicaSet", "name": "web-5d8f", "controller": true}]);
        assert_reads_as(&pod, "a controller reference without a uid");
        pod["metadata"]["ownerReferences"] = json!([]);
        assert_reads_as(&pod, "released");
        pod["status"]["phase"] = json!("Failed");
        assert_reads_as(&pod, "failed");
        pod["spec"]["nodeName"] = json!("");
        assert_reads_as(&pod, "an empty node name is no node");
        pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:59Z");
        assert_reads_as(&pod, "terminating");
        pod["metadata"]["deletionTimestamp"] = Value::Null;
        pod["status"]["phase"] = json!("Succeeded");
        assert_reads_as(&pod, "a null deletionTimestamp, succeeded");
        pod["metadata"]["namespace"] = json!("");
        assert_reads_as(&pod, "no namespace");
    }
}
