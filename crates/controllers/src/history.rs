//! ControllerRevisions: the templates a DaemonSet or StatefulSet has run, recorded as Kubernetes
//! records them, so `kubectl rollout history` lists them and `kubectl rollout undo` goes back.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};
use shepherd_api::JsonPath;
use shepherd_api::{ApiError, ResourceInfo, kinds};
use shepherd_api::{meta, opt_str_at};
use shepherd_runtime::{Cache, Client, DeleteParams};

use crate::podutil;

/// The label naming the template revision a daemon or stateful pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// The revisions of one owner, read from the manager's ControllerRevision cache.
pub(crate) struct History<'a> {
    pub client: &'a Arc<dyn Client>,
    pub revisions: &'a Cache,
    pub owner: &'a Value,
    pub owner_kind: &'static ResourceInfo,
}

impl History<'_> {
    /// The ControllerRevision `name`, if recorded.
    pub fn get(&self, name: &str) -> Option<Arc<Value>> {
        let ns = meta::namespace(self.owner).unwrap_or("default");
        self.revisions.get(&format!("{ns}/{name}"))
    }

    /// Records `template` as the ControllerRevision `name` (labelled with `hash`) once, numbered
    /// after the owner's newest; then drops the oldest beyond `revisionHistoryLimit` that neither
    /// a pod nor `keep` names.
    pub async fn record(&self, name: &str, hash: &str, template: &Value, keep: &[&str], pods: &[Arc<Value>]) -> Result<(), ApiError> {
        let owned = self.revisions.by_controller_uid(meta::uid(self.owner));
        if self.get(name).is_none() {
            let ns = meta::namespace(self.owner).unwrap_or("default");
            let number = owned.iter().filter_map(|r| r.at("/revision").and_then(Value::as_i64)).max().unwrap_or(0) + 1;
            let mut labels = self.owner.at("/spec/selector/matchLabels").and_then(Value::as_object).cloned().unwrap_or_default();
            labels.insert(REVISION_LABEL.into(), json!(hash));
            let revision = json!({
                "apiVersion": "apps/v1", "kind": "ControllerRevision",
                "metadata": {"name": name, "namespace": ns, "labels": labels,
                    "ownerReferences": [podutil::owner_reference_to(self.owner, self.owner_kind)]},
                "data": {"spec": {"template": template}},
                "revision": number,
            });
            match self.client.create(&kinds::CONTROLLERREVISION, Some(ns), revision).await {
                Ok(_) => {}
                Err(e) if e.is_already_exists() => {}
                Err(e) => return Err(e),
            }
        }
        self.prune(&owned, name, keep, pods).await
    }

    async fn prune(&self, owned: &[Arc<Value>], current: &str, keep: &[&str], pods: &[Arc<Value>]) -> Result<(), ApiError> {
        let limit = self.owner.at("/spec/revisionHistoryLimit").and_then(Value::as_u64).unwrap_or(10) as usize;
        let in_use: HashSet<&str> = pods.iter().filter_map(|p| opt_str_at(p, &format!("/metadata/labels/{REVISION_LABEL}"))).collect();
        let mut old: Vec<&Arc<Value>> = owned
            .iter()
            .filter(|r| {
                let n = meta::name(r);
                let hash = opt_str_at(r, &format!("/metadata/labels/{REVISION_LABEL}")).unwrap_or("");
                n != current && !keep.contains(&n) && !in_use.contains(n) && !in_use.contains(hash)
            })
            .collect();
        if old.len() <= limit {
            return Ok(());
        }
        old.sort_by_key(|r| r.at("/revision").and_then(Value::as_i64).unwrap_or(0));
        for r in &old[..old.len() - limit] {
            match self.client.delete(&kinds::CONTROLLERREVISION, meta::namespace(r), meta::name(r), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
