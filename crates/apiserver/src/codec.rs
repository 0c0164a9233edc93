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

/// The same without `metadata.managedFields`.
pub(crate) fn decode_listed_without_managed_fields(kv: &PackedKeyValue) -> Result<Value, ApiError> {
    let kv = kv.unpack();
    from_slice_without_managed_fields(&render(&kv))
        .map_err(|e| ApiError::Internal(format!("stored object {} is not valid JSON: {e}", kv.key)))
}

/// JSON text of an object decoded without its `metadata.managedFields`, which are read past
/// rather than built: for an informer, whose cache drops them, they are most of what decoding a
/// small object allocates. Anything else decodes as `serde_json::from_slice` would.
pub(crate) fn from_slice_without_managed_fields(text: &[u8]) -> serde_json::Result<Value> {
    use serde::de::DeserializeSeed as _;
    let mut de = serde_json::Deserializer::from_slice(text);
    let value = Skipping { at: Depth::Object }.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// The `Visitor` methods that turn JSON scalars into a `Value`, for visitors that build a `Value`
/// and differ only in how they read objects and lists.
macro_rules! scalar_visits {
    () => {
        fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
            Ok(Value::Bool(v))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
            Ok(Value::from(v))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
            Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
        }
        fn visit_str<E>(self, v: &str) -> Result<Value, E> {
            Ok(Value::String(v.to_string()))
        }
        fn visit_string<E>(self, v: String) -> Result<Value, E> {
            Ok(Value::String(v))
        }
        fn visit_unit<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
        fn visit_none<E>(self) -> Result<Value, E> {
            Ok(Value::Null)
        }
    };
}
pub(crate) use scalar_visits;

#[derive(Clone, Copy, PartialEq)]
enum Depth {
    /// The object itself: its `metadata` is read with the skip.
    Object,
    /// Its `metadata`: `managedFields` is skipped.
    Metadata,
}

struct Skipping {
    at: Depth,
}

impl<'de> serde::de::DeserializeSeed<'de> for Skipping {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Skipping {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = match (self.at, key.as_str()) {
                (Depth::Object, "metadata") => map.next_value_seed(Skipping { at: Depth::Metadata })?,
                (Depth::Metadata, "managedFields") => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                    continue;
                }
                _ => map.next_value()?,
            };
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    scalar_visits!();
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
    fn an_object_decoded_without_its_managed_fields_is_the_object_less_those() {
        let texts = [
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"a":"b"},"managedFields":[{"manager":"m",
                "fieldsV1":{"f:spec":{}}}],"annotations":{"managedFields":"kept"}},"spec":{"metadata":{"managedFields":1},
                "n":-3,"u":18446744073709551615,"f":0.25,"t":true,"z":null,"l":[1,"x",{"y":[]}]}}"#,
            r#"{"metadata":null,"managedFields":[1]}"#,
            r#"{"kind":"Status","code":404}"#,
            r#"[1,2]"#,
            r#""text""#,
        ];
        for text in texts {
            let mut whole: Value = serde_json::from_str(text).expect("json");
            if let Some(m) = whole.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
            }
            assert_eq!(from_slice_without_managed_fields(text.as_bytes()).expect("decode"), whole, "{text}");
        }
        assert!(from_slice_without_managed_fields(br#"{"metadata":{"managedFields":[}}"#).is_err(), "what is skipped is still checked");
        assert!(from_slice_without_managed_fields(br#"{"a":1} x"#).is_err(), "trailing text is refused");
    }

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
