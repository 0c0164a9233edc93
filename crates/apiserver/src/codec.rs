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
use shepherd_store::{KeyValue, PackedKeyValue, Revision};

const HEAD: &[u8] = br#"{"metadata":{"resourceVersion":""#;

/// Encodes `obj` for storage. Its `metadata.resourceVersion`, if any, is not stored.
///
/// The result is allocated at its exact length: the store and its watch history keep it for as
/// long as the object or the event lives, and a buffer grown by doubling would keep up to twice
/// the object's size (at 10,000 pods, tens of MiB).
pub(crate) fn encode(obj: &Value) -> Result<Bytes, ApiError> {
    let Some(fields) = obj.as_object() else {
        return Err(ApiError::BadRequest("object must be a JSON object".into()));
    };
    SCRATCH.with_borrow_mut(|out| {
        out.clear();
        out.extend_from_slice(HEAD);
        out.push(b'"');
        let meta = fields.get("metadata").and_then(Value::as_object);
        for (k, v) in meta.into_iter().flatten().filter(|(k, _)| *k != "resourceVersion") {
            out.push(b',');
            write_entry(out, k, v)?;
        }
        out.push(b'}');
        for (k, v) in fields.iter().filter(|(k, _)| *k != "metadata") {
            out.push(b',');
            write_entry(out, k, v)?;
        }
        out.push(b'}');
        let bytes = Bytes::copy_from_slice(out);
        // A huge object's buffer is not kept for the thread's lifetime.
        if out.capacity() > SCRATCH_KEPT {
            *out = Vec::new();
        }
        Ok(bytes)
    })
}

/// Largest encoding buffer a thread keeps between objects.
const SCRATCH_KEPT: usize = 256 * 1024;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Appends `"key":value`.
fn write_entry(out: &mut Vec<u8>, key: &str, value: &Value) -> Result<(), ApiError> {
    let encoded = serde_json::to_writer(&mut *out, key).and_then(|()| {
        out.push(b':');
        serde_json::to_writer(&mut *out, value)
    });
    encoded.map_err(|e| ApiError::Internal(format!("encoding object: {e}")))
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

/// A listed object as a JSON value, with its resourceVersion.
pub(crate) fn decode_listed(kv: &PackedKeyValue) -> Result<Value, ApiError> {
    decode(&kv.unpack())
}

/// Whether `selection` selects the stored object (read straight from its stored text: no selector
/// reads the resourceVersion the text lacks).
pub(crate) fn selected(selection: &Selection, kv: &KeyValue) -> Result<bool, ApiError> {
    selection.matches_json(&kv.value).ok_or_else(|| ApiError::Internal(format!("stored object {} is not valid JSON", kv.key)))
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

    #[test]
    fn an_object_is_stored_as_its_json_with_an_empty_resource_version_first_and_no_spare_capacity() {
        let obj = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"a\"b": "c"}, "name": "web-0",
            "resourceVersion": "7", "uid": "u"}, "spec": {"containers": [{"name": "c", "image": "i"}]}, "status": {}});
        let bytes = encode(&obj).expect("encode");
        assert_eq!(
            std::str::from_utf8(&bytes).expect("utf-8"),
            r#"{"metadata":{"resourceVersion":"","labels":{"a\"b":"c"},"name":"web-0","uid":"u"},"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"image":"i","name":"c"}]},"status":{}}"#
        );
        let len = bytes.len();
        let owned = bytes.try_into_mut().expect("the only reference");
        assert_eq!(owned.capacity(), len, "the store keeps no slack beyond the object");
        let not_a_map = encode(&json!({"kind": "X", "metadata": "m"})).expect("encode");
        assert_eq!(&not_a_map[..], br#"{"metadata":{"resourceVersion":""},"kind":"X"}"#);
    }
}
