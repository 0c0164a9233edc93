//! How objects are kept in the store, and how they are turned back into wire JSON.
//!
//! An object is stored as its wire JSON with `metadata.resourceVersion` first and empty:
//! `{"metadata":{"resourceVersion":"",...},...}`. The revision is only known once the store has
//! committed the write, so it is spliced in when the object is read: one copy, no parse. This
//! keeps a list of ten thousand pods a matter of memcpy rather than ten thousand JSON parses.

use bytes::Bytes;
use serde_json::Value;
use shepherd_api::ApiError;
use shepherd_api::selector::Selection;
use shepherd_store::{KeyValue, Revision};

const HEAD: &[u8] = br#"{"metadata":{"resourceVersion":""#;

/// Encodes `obj` for storage. Its `metadata.resourceVersion`, if any, is not stored.
pub(crate) fn encode(obj: &Value) -> Result<Bytes, ApiError> {
    let Some(fields) = obj.as_object() else {
        return Err(ApiError::BadRequest("object must be a JSON object".into()));
    };
    let mut meta = fields.get("metadata").and_then(Value::as_object).cloned().unwrap_or_default();
    meta.remove("resourceVersion");
    let meta_json = to_vec(&Value::Object(meta))?;
    let mut out = Vec::with_capacity(meta_json.len() + 256);
    out.extend_from_slice(HEAD);
    out.push(b'"');
    // `meta_json` is `{}` or `{"k":v,...}`: keep what follows its opening brace.
    if meta_json.len() > 2 {
        out.push(b',');
    }
    out.extend_from_slice(&meta_json[1..]);
    for (k, v) in fields {
        if k == "metadata" {
            continue;
        }
        out.push(b',');
        out.extend_from_slice(&to_vec(&Value::String(k.clone()))?);
        out.push(b':');
        out.extend_from_slice(&to_vec(v)?);
    }
    out.push(b'}');
    Ok(Bytes::from(out))
}

/// Appends the wire JSON of a stored object, with its resourceVersion, to `out`.
pub(crate) fn render_into(kv: &KeyValue, out: &mut Vec<u8>) {
    render_at(&kv.value, kv.mod_revision, out)
}

/// Renders stored bytes as they stood at `revision`.
pub(crate) fn render_at(value: &[u8], revision: Revision, out: &mut Vec<u8>) {
    if let Some(rest) = value.strip_prefix(HEAD) {
        out.extend_from_slice(HEAD);
        out.extend_from_slice(revision.to_string().as_bytes());
        out.extend_from_slice(rest);
    } else {
        // Not written by this codec: pass it through untouched.
        out.extend_from_slice(value);
    }
}

pub(crate) fn render(kv: &KeyValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(kv.value.len() + 20);
    render_into(kv, &mut out);
    out
}

/// The stored object as a JSON value, with its resourceVersion.
pub(crate) fn decode(kv: &KeyValue) -> Result<Value, ApiError> {
    serde_json::from_slice(&render(kv))
        .map_err(|e| ApiError::Internal(format!("stored object {} is not valid JSON: {e}", kv.key)))
}

/// Whether `selection` selects the stored object (read straight from its stored text: no selector
/// reads the resourceVersion the text lacks).
pub(crate) fn selected(selection: &Selection, kv: &KeyValue) -> Result<bool, ApiError> {
    selection.matches_json(&kv.value).ok_or_else(|| ApiError::Internal(format!("stored object {} is not valid JSON", kv.key)))
}

fn to_vec(v: &Value) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(v).map_err(|e| ApiError::Internal(format!("encoding object: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stored_objects_read_back_with_their_revision() {
        let obj = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-0", "resourceVersion": "7",
            "annotations": {"resourceVersion": ""}}, "spec": {"containers": []}});
        let bytes = encode(&obj).expect("encode");
        let kv = KeyValue { key: "k".into(), value: bytes, create_revision: 3, mod_revision: 42 };
        let back = decode(&kv).expect("decode");
        assert_eq!(back["metadata"]["resourceVersion"], "42");
        assert_eq!(back["metadata"]["name"], "web-0");
        assert_eq!(back["metadata"]["annotations"]["resourceVersion"], "");
        assert_eq!(back["spec"], obj["spec"]);
        let bare = encode(&json!({"kind": "X"})).expect("encode");
        let kv = KeyValue { key: "k".into(), value: bare, create_revision: 1, mod_revision: 1 };
        assert_eq!(decode(&kv).expect("decode"), json!({"kind": "X", "metadata": {"resourceVersion": "1"}}));
    }
}
