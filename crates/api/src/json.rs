//! Reading fields of JSON objects by RFC 6901 path without allocating: the one set of field
//! readers every crate uses on `serde_json::Value` objects.
//!
//! `serde_json::Value::pointer` un-escapes every path token into a fresh `String` (two
//! `str::replace` calls each), which made it the single hottest function of the control plane
//! when controllers walk thousands of pods. [`JsonPath::at`] reads the same RFC 6901 paths and
//! allocates only for the rare token that contains an escape.

use serde_json::{Map, Value};

/// RFC 6901 JSON Pointer lookup, the same answers as [`Value::pointer`].
pub trait JsonPath {
    /// The value at `pointer` (`""` is the whole value, `"/a/0/b"` a nested one).
    fn at(&self, pointer: &str) -> Option<&Value>;
}

/// The string at `pointer` in `v`; `""` when it is absent or not a string.
pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    opt_str_at(v, pointer).unwrap_or("")
}

/// The string at `pointer` in `v`, if there is one.
pub fn opt_str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.at(pointer).and_then(Value::as_str)
}

/// The integer at `pointer` in `v`; 0 when it is absent or not an `i64`.
pub fn int_at(v: &Value, pointer: &str) -> i64 {
    i64_at(v, pointer).unwrap_or(0)
}

/// The integer at `pointer` in `v`, if there is one that fits `i64`.
pub fn i64_at(v: &Value, pointer: &str) -> Option<i64> {
    v.at(pointer).and_then(Value::as_i64)
}

/// The boolean at `pointer` in `v`, if there is one.
pub fn bool_at(v: &Value, pointer: &str) -> Option<bool> {
    v.at(pointer).and_then(Value::as_bool)
}

/// The array at `pointer` in `v`; empty when it is absent or not an array.
pub fn array_at<'a>(v: &'a Value, pointer: &str) -> &'a [Value] {
    v.at(pointer).and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// The object at `pointer` in `v`, if there is one.
pub fn map_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a Map<String, Value>> {
    v.at(pointer).and_then(Value::as_object)
}

/// The strings of the array at `pointer` in `v`, skipping anything else.
pub fn strings_at<'a>(v: &'a Value, pointer: &str) -> impl Iterator<Item = &'a str> {
    array_at(v, pointer).iter().filter_map(Value::as_str)
}

impl JsonPath for Value {
    fn at(&self, pointer: &str) -> Option<&Value> {
        if pointer.is_empty() {
            return Some(self);
        }
        pointer.strip_prefix('/')?.split('/').try_fold(self, |value, token| {
            if token.contains('~') {
                step(value, &token.replace("~1", "/").replace("~0", "~"))
            } else {
                step(value, token)
            }
        })
    }
}

fn step<'a>(value: &'a Value, token: &str) -> Option<&'a Value> {
    match value {
        Value::Object(map) => map.get(token),
        Value::Array(items) => array_index(token).and_then(|i| items.get(i)),
        _ => None,
    }
}

/// A decimal array index as RFC 6901 allows it: no sign, no leading zero.
fn array_index(token: &str) -> Option<usize> {
    if token.starts_with('+') || (token.starts_with('0') && token.len() > 1) {
        return None;
    }
    token.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn answers_as_value_pointer_does() {
        let v = json!({
            "metadata": {"name": "web-0", "annotations": {"example.com/a~b": "x"}},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "": {"empty": 1},
        });
        for p in [
            "", "/", "/metadata", "/metadata/name", "/metadata/annotations/example.com~1a~0b", "/spec/containers/1/name",
            "/spec/containers/01/name", "/spec/containers/+1", "/spec/containers/2", "/spec/containers/-", "/missing/x",
            "metadata", "//empty", "/metadata/name/x",
        ] {
            assert_eq!(v.at(p), v.pointer(p), "path {p:?}");
        }
    }

    #[test]
    fn typed_readers_answer_none_or_empty_for_absent_and_mistyped_fields() {
        let v = json!({"m": {"s": "x", "n": 7, "b": true, "a": ["p", 1, "q"], "o": {"k": "v"}, "big": 1e300}});
        assert_eq!((str_at(&v, "/m/s"), str_at(&v, "/m/n"), str_at(&v, "/none")), ("x", "", ""));
        assert_eq!((opt_str_at(&v, "/m/s"), opt_str_at(&v, "/m/b")), (Some("x"), None));
        assert_eq!((i64_at(&v, "/m/n"), i64_at(&v, "/m/s"), i64_at(&v, "/m/big")), (Some(7), None, None));
        assert_eq!((int_at(&v, "/m/n"), int_at(&v, "/m/s")), (7, 0));
        assert_eq!((bool_at(&v, "/m/b"), bool_at(&v, "/m/n")), (Some(true), None));
        assert_eq!((array_at(&v, "/m/a").len(), array_at(&v, "/m/o").len()), (3, 0));
        assert_eq!(strings_at(&v, "/m/a").collect::<Vec<_>>(), ["p", "q"]);
        assert_eq!(map_at(&v, "/m/o").map(|m| m.len()), Some(1));
        assert_eq!(map_at(&v, "/m/a"), None);
    }

    proptest! {
        #[test]
        fn agrees_with_value_pointer_on_any_path(tokens in proptest::collection::vec("[a-c0-2~/+]{0,3}", 0..4)) {
            let v = json!({"a": {"b": [1, {"c": 2}], "~": {"/": 3}}, "0": [[4]], "": {"": 5}});
            let path: String = tokens.iter().map(|t| format!("/{t}")).collect();
            prop_assert_eq!(v.at(&path), v.pointer(&path));
        }
    }
}
