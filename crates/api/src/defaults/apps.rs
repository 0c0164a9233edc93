//! Defaults of DaemonSets and StatefulSets (`apps/v1`) and ReplicationControllers (`v1`), as
//! Kubernetes fills them.

use serde_json::{Map, Value, json};

use super::{default_template, existing_spec, set_absent};

pub(super) fn default_daemon_set(obj: &mut Value) {
    if let Some(spec) = existing_spec(obj) {
        set_absent(spec, "revisionHistoryLimit", json!(10));
        if let Some(strategy) = strategy(spec) {
            set_absent(strategy, "type", json!("RollingUpdate"));
            if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate")
                && let Some(rolling) = object_entry(strategy, "rollingUpdate")
            {
                set_absent(rolling, "maxUnavailable", json!(1));
                set_absent(rolling, "maxSurge", json!(0));
            }
        }
    }
    default_template(obj);
}

pub(super) fn default_stateful_set(obj: &mut Value) {
    if let Some(spec) = existing_spec(obj) {
        set_absent(spec, "replicas", json!(1));
        set_absent(spec, "podManagementPolicy", json!("OrderedReady"));
        set_absent(spec, "revisionHistoryLimit", json!(10));
        if let Some(strategy) = strategy(spec) {
            set_absent(strategy, "type", json!("RollingUpdate"));
            if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate")
                && let Some(rolling) = object_entry(strategy, "rollingUpdate")
            {
                set_absent(rolling, "partition", json!(0));
            }
        }
        if let Some(retention) = object_entry(spec, "persistentVolumeClaimRetentionPolicy") {
            set_absent(retention, "whenDeleted", json!("Retain"));
            set_absent(retention, "whenScaled", json!("Retain"));
        }
    }
    default_template(obj);
}

/// A ReplicationController without a selector selects its template's labels, and takes them as
/// its own labels when it has none.
pub(super) fn default_replication_controller(obj: &mut Value) {
    let labels = obj.pointer("/spec/template/metadata/labels").filter(|l| l.as_object().is_some_and(|m| !m.is_empty())).cloned();
    if let Some(labels) = labels {
        if let Some(spec) = existing_spec(obj)
            && spec.get("selector").is_none_or(|s| s.as_object().is_none_or(Map::is_empty))
        {
            spec.insert("selector".into(), labels.clone());
        }
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut)
            && meta.get("labels").is_none_or(|l| l.as_object().is_none_or(Map::is_empty))
        {
            meta.insert("labels".into(), labels);
        }
    }
    if let Some(spec) = existing_spec(obj) {
        set_absent(spec, "replicas", json!(1));
    }
    default_template(obj);
}

fn strategy(spec: &mut Map<String, Value>) -> Option<&mut Map<String, Value>> {
    object_entry(spec, "updateStrategy")
}

/// The object under `key`, created empty when absent or null; `None` when it is something else.
fn object_entry<'a>(map: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    let slot = map.entry(key).or_insert(Value::Null);
    if slot.is_null() {
        *slot = json!({});
    }
    slot.as_object_mut()
}
