//! `metadata.managedFields`: one entry per field manager, operation and subresource, read from and
//! written back to an object.

use serde_json::{Value, json};

use super::fieldpath::Set;

/// Update entries beyond this many are merged, oldest first, into one `ancient-changes` entry, as in
/// Kubernetes, so that an object written by many clients does not grow without bound.
const MAX_UPDATE_MANAGERS: usize = 10;
const ANCIENT_CHANGES: &str = "ancient-changes";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    Apply,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// Who owns a set of fields, and since when.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) manager: String,
    pub(crate) operation: Operation,
    pub(crate) api_version: String,
    pub(crate) time: Option<String>,
    /// Empty for the main resource.
    pub(crate) subresource: String,
    pub(crate) set: Set,
    /// The entry as this server wrote it before, while nothing above has changed: written back
    /// as it is instead of being encoded again.
    pub(crate) written: Option<Value>,
}

/// Equal entries say the same; where the text came from does not matter.
impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (&self.manager, self.operation, &self.api_version, &self.time, &self.subresource, &self.set)
            == (&other.manager, other.operation, &other.api_version, &other.time, &other.subresource, &other.set)
    }
}

impl Entry {
    /// Whether `self` and `other` are the same manager: Kubernetes keys entries by manager,
    /// operation and subresource, and updates also by API version.
    pub(crate) fn is(&self, manager: &str, operation: Operation, subresource: &str, api_version: &str) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource == subresource
            && (operation == Operation::Apply || self.api_version == api_version)
    }

    /// How a conflict names this manager: `"kubectl-client-side-apply" using apps/v1`.
    pub(crate) fn describe(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if !self.subresource.is_empty() {
            s.push_str(&format!(" with subresource {:?}", self.subresource));
        }
        if self.operation == Operation::Update {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    fn to_json(&self) -> Value {
        let mut e = json!({
            "manager": self.manager,
            "operation": self.operation.as_str(),
            "apiVersion": self.api_version,
            "fieldsType": "FieldsV1",
            "fieldsV1": self.set.to_fields_v1(),
        });
        if let Some(t) = &self.time {
            e["time"] = json!(t);
        }
        if !self.subresource.is_empty() {
            e["subresource"] = json!(self.subresource);
        }
        e
    }

    fn from_json(v: &Value) -> Result<Entry, String> {
        let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let operation = match v.get("operation").and_then(Value::as_str) {
            Some("Apply") => Operation::Apply,
            Some("Update") => Operation::Update,
            other => return Err(format!("operation {other:?} is neither Apply nor Update")),
        };
        match v.get("fieldsType").and_then(Value::as_str) {
            None | Some("FieldsV1") => {}
            Some(t) => return Err(format!("fieldsType {t:?} is not FieldsV1")),
        }
        let set = match v.get("fieldsV1") {
            None | Some(Value::Null) => Set::new(),
            Some(f) => Set::from_fields_v1(f)?,
        };
        Ok(Entry {
            manager: text("manager"),
            operation,
            api_version: text("apiVersion"),
            time: v.get("time").and_then(Value::as_str).map(str::to_string),
            subresource: text("subresource"),
            set,
            written: None,
        })
    }
}

/// The entries of an object's `metadata.managedFields` (none if absent), or what is wrong with them.
pub(crate) fn decode(obj: &Value) -> Result<Vec<Entry>, String> {
    obj.get("metadata").and_then(|m| m.get("managedFields")).map_or(Ok(Vec::new()), decode_list)
}

/// The entries of a `managedFields` value (none if null), or what is wrong with them.
pub(crate) fn decode_list(fields: &Value) -> Result<Vec<Entry>, String> {
    match fields {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => a.iter().map(Entry::from_json).collect(),
        _ => Err("managedFields must be a list".into()),
    }
}

/// The entries of `fields`, a stored object's `managedFields` taken out of it, each keeping its
/// text for [`encode`] to write back while the entry stays as it is. Only for what this server
/// stored: a client's own text may not be in the form [`encode`] writes.
pub(crate) fn decode_stored(fields: Value) -> Vec<Entry> {
    let Value::Array(items) = fields else { return Vec::new() };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        match Entry::from_json(&item) {
            Ok(e) => out.push(Entry { written: Some(item), ..e }),
            Err(_) => return Vec::new(),
        }
    }
    out
}

/// Writes `entries` into the object's metadata, in Kubernetes' order (Apply before Update, then
/// oldest first), leaving out empty ones and capping the number of Update entries.
pub(crate) fn encode(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    cap_updates(&mut entries);
    entries.sort_by(|a, b| {
        (a.operation.as_str(), &a.time, &a.manager, &a.api_version, &a.subresource).cmp(&(
            b.operation.as_str(),
            &b.time,
            &b.manager,
            &b.api_version,
            &b.subresource,
        ))
    });
    let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else { return };
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        let items = entries.into_iter().map(|e| match e.written {
            Some(v) => v,
            None => e.to_json(),
        });
        meta.insert("managedFields".into(), Value::Array(items.collect()));
    }
}

fn cap_updates(entries: &mut Vec<Entry>) {
    let updates = entries.iter().filter(|e| e.operation == Operation::Update).count();
    if updates <= MAX_UPDATE_MANAGERS {
        return;
    }
    let mut order: Vec<usize> = (0..entries.len()).filter(|i| entries[*i].operation == Operation::Update).collect();
    order.sort_by(|a, b| entries[*a].time.cmp(&entries[*b].time));
    // The oldest entries, enough to bring the count back to the cap with the merged one.
    let oldest: Vec<usize> = order.into_iter().take(updates - MAX_UPDATE_MANAGERS + 1).collect();
    let mut merged = Entry {
        manager: ANCIENT_CHANGES.into(),
        operation: Operation::Update,
        api_version: entries[oldest[oldest.len() - 1]].api_version.clone(),
        time: entries[oldest[oldest.len() - 1]].time.clone(),
        subresource: String::new(),
        set: Set::new(),
        written: None,
    };
    for i in &oldest {
        merged.set = merged.set.union(&entries[*i].set);
    }
    let mut i = 0;
    entries.retain(|_| {
        i += 1;
        !oldest.contains(&(i - 1))
    });
    entries.push(merged);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::fieldpath::PathElement;

    fn entry(manager: &str, time: &str) -> Entry {
        let mut set = Set::new();
        set.insert(&[PathElement::Field("metadata".into()), PathElement::Field("labels".into()), PathElement::Field(manager.into())]);
        Entry {
            manager: manager.into(),
            operation: Operation::Update,
            api_version: "v1".into(),
            time: Some(time.into()),
            subresource: String::new(),
            set,
            written: None,
        }
    }

    #[test]
    fn entries_round_trip_and_apply_comes_first() {
        let mut obj = json!({"metadata": {"name": "x"}});
        let mut applied = entry("kubectl", "2026-01-02T00:00:00Z");
        applied.operation = Operation::Apply;
        applied.subresource = "status".into();
        encode(&mut obj, vec![entry("a", "2026-01-01T00:00:00Z"), applied.clone()]);
        let back = decode(&obj).expect("decode");
        assert_eq!(back[0], applied);
        assert_eq!(obj["metadata"]["managedFields"][0]["subresource"], "status");
        assert_eq!(obj["metadata"]["managedFields"][1]["fieldsType"], "FieldsV1");
        assert!(obj["metadata"]["managedFields"][1].get("subresource").is_none());
    }

    #[test]
    fn many_updaters_are_capped_by_merging_the_oldest() {
        let mut obj = json!({"metadata": {}});
        let entries: Vec<Entry> = (0..12).map(|i| entry(&format!("m{i:02}"), &format!("2026-01-01T00:00:{i:02}Z"))).collect();
        encode(&mut obj, entries);
        let back = decode(&obj).expect("decode");
        assert_eq!(back.len(), MAX_UPDATE_MANAGERS);
        let ancient = back.iter().find(|e| e.manager == ANCIENT_CHANGES).expect("merged entry");
        assert_eq!(ancient.set.paths().len(), 3, "the three oldest are merged");
        assert!(back.iter().any(|e| e.manager == "m11") && !back.iter().any(|e| e.manager == "m00"));
    }

    #[test]
    fn malformed_entries_are_named() {
        assert!(decode(&json!({"metadata": {"managedFields": [{"operation": "Patch"}]}})).is_err());
        assert!(decode(&json!({"metadata": {"managedFields": [{"operation": "Update", "fieldsType": "FieldsV2"}]}})).is_err());
        assert!(decode(&json!({"metadata": {"managedFields": {}}})).is_err());
    }
}
