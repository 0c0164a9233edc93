//! Objects for tests of code that carries objects through a representation (schemas, wire
//! formats): metadata with every field a client commonly sets, so that a conversion that drops or
//! reshapes one of them shows.

use serde_json::{Value, json};

/// `ObjectMeta` of a namespaced object with labels (one empty), an annotation, a controlling owner,
/// a finalizer and one `managedFields` entry.
pub fn full_meta(name: &str) -> Value {
    json!({"name": name, "namespace": "default", "uid": "6f1c1c4e-8a2e-4b8e-9d7a-2f4d1e0c9b11",
        "resourceVersion": "42", "generation": 3, "creationTimestamp": "2026-11-30T10:00:00Z",
        "labels": {"app": "web", "empty": ""}, "annotations": {"note": "x"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u-1",
            "controller": true, "blockOwnerDeletion": true}],
        "finalizers": ["example.com/hold"],
        "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
            "time": "2026-11-30T10:00:01Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}}]})
}
