//! The Kubernetes protobuf encoding (`application/vnd.kubernetes.protobuf`), converted to and from the
//! Kubernetes JSON that Shepherd keeps, driven by the message layouts in `schema.rs`.
//!
//! A body is the magic `k8s\0` followed by a `runtime.Unknown` whose `typeMeta` names the kind and whose
//! `raw` is the object's message. Watch streams frame `meta.v1.WatchEvent` messages with a 4-byte
//! big-endian length; each event's object is a complete body of its own.
//!
//! Go's encoder writes every non-pointer field, set or not, while its JSON leaves out the zero of
//! `omitempty` fields. Decoding follows the JSON: empty strings are unset, the zero of the known
//! non-pointer `omitempty` fields (`GO_OMITEMPTY`) is left out, a zero time is `null`, and any other
//! zero number or `false` is kept, as it may be a set pointer (`replicas: 0`).

mod negotiate;
mod schema;
mod schema_certificates;
mod schema_rbac;

pub(crate) use negotiate::{Accept, respond};

use std::collections::HashMap;
use std::sync::LazyLock;

use base64::Engine as _;
use serde_json::{Map, Number, Value};

/// The media type of the protobuf encoding.
pub(crate) const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The media type of a protobuf watch stream.
pub(crate) const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

const MAGIC: &[u8] = b"k8s\0";

/// The protobuf package of each API group Shepherd serves; the version comes from `apiVersion`.
/// Every kind of a listed group is encodable if `schema.rs` has its message: a new group is one line
/// here (and one in the generator's package list).
const GROUP_PACKAGES: &[(&str, &str)] = &[
    ("", "k8s.io.api.core"),
    ("apps", "k8s.io.api.apps"),
    ("coordination.k8s.io", "k8s.io.api.coordination"),
    ("autoscaling", "k8s.io.api.autoscaling"),
    ("batch", "k8s.io.api.batch"),
    ("policy", "k8s.io.api.policy"),
    ("discovery.k8s.io", "k8s.io.api.discovery"),
    ("rbac.authorization.k8s.io", "k8s.io.api.rbac"),
    ("authorization.k8s.io", "k8s.io.api.authorization"),
    ("certificates.k8s.io", "k8s.io.api.certificates"),
    ("authentication.k8s.io", "k8s.io.api.authentication"),
];

/// Kinds of `meta.k8s.io/v1` that every group version also serves (`apps/v1` DeleteOptions).
const META_KINDS: &[&str] =
    &["Status", "DeleteOptions", "WatchEvent", "CreateOptions", "UpdateOptions", "PatchOptions"];
const META: &str = "k8s.io.apimachinery.pkg.apis.meta.v1";

/// Non-pointer Go fields tagged `omitempty`: Go writes their zero to protobuf but never to JSON, so
/// their zero is left out as Kubernetes' JSON leaves it out. Other zero numbers and `false` are kept:
/// they may be a set pointer (`replicas: 0`, `automountServiceAccountToken: false`). Without this,
/// a template sent as protobuf would differ from the same template sent as JSON, and so would its hash.
const GO_OMITEMPTY: &[(&str, &[&str])] = &[
    ("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta", &["generation"]),
    ("k8s.io.api.core.v1.Container", &["stdin", "stdinOnce", "tty"]),
    ("k8s.io.api.core.v1.EphemeralContainerCommon", &["stdin", "stdinOnce", "tty"]),
    ("k8s.io.api.core.v1.ContainerPort", &["hostPort"]),
    ("k8s.io.api.core.v1.VolumeMount", &["readOnly"]),
    (
        "k8s.io.api.core.v1.Probe",
        &["initialDelaySeconds", "timeoutSeconds", "periodSeconds", "successThreshold", "failureThreshold"],
    ),
    ("k8s.io.api.core.v1.PodSpec", &["hostNetwork", "hostPID", "hostIPC"]),
    ("k8s.io.api.core.v1.ServiceSpec", &["healthCheckNodePort", "publishNotReadyAddresses"]),
    ("k8s.io.api.core.v1.ServicePort", &["nodePort"]),
    ("k8s.io.api.core.v1.Event", &["count"]),
    ("k8s.io.api.apps.v1.DeploymentSpec", &["minReadySeconds", "paused"]),
    (
        "k8s.io.api.apps.v1.DeploymentStatus",
        &[
            "observedGeneration",
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
            "unavailableReplicas",
        ],
    ),
    ("k8s.io.api.apps.v1.ReplicaSetSpec", &["minReadySeconds"]),
    (
        "k8s.io.api.apps.v1.ReplicaSetStatus",
        &["fullyLabeledReplicas", "readyReplicas", "availableReplicas", "observedGeneration"],
    ),
];

fn omitted_when_zero(msg: &Message, json: &str, v: &Value) -> bool {
    let zero = v.as_i64() == Some(0) || v.as_bool() == Some(false);
    zero && GO_OMITEMPTY.iter().any(|(m, fields)| *m == msg.name && fields.contains(&json))
}

const TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime";
const FIELDS_V1: &str = "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1";
const QUANTITY: &str = "k8s.io.apimachinery.pkg.api.resource.Quantity";
const INT_OR_STRING: &str = "k8s.io.apimachinery.pkg.util.intstr.IntOrString";
const RAW_EXTENSION: &str = "k8s.io.apimachinery.pkg.runtime.RawExtension";

/// Why a protobuf body could not be read or an object could not be written.
#[derive(Debug, thiserror::Error, PartialEq)]
pub(crate) enum ProtobufError {
    #[error("protobuf body does not start with the Kubernetes magic prefix \"k8s\\0\"")]
    NoMagic,
    #[error("protobuf body is truncated or malformed: {0}")]
    Malformed(String),
    #[error("protobuf body of kind {kind:?} in {api_version:?} is not a kind this server can decode")]
    UnknownKind { api_version: String, kind: String },
    #[error("{0}")]
    Unencodable(String),
}

type Result<T> = std::result::Result<T, ProtobufError>;

/// Wire value types: what a field holds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Ty {
    Str,
    Bytes,
    Bool,
    I32,
    I64,
    /// `double`: the generator emits it, though no message of today's packages has one.
    #[allow(dead_code)]
    F64,
    /// A message, by full proto name.
    Msg(&'static str),
    /// `map<string, T>`.
    Map(&'static Ty),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Label {
    One,
    Repeated,
    /// An embedded Go struct: its fields are spread into the enclosing JSON object.
    Inline,
}

#[derive(Debug)]
pub(crate) struct Field {
    num: u32,
    json: &'static str,
    ty: Ty,
    label: Label,
}

#[derive(Debug)]
pub(crate) struct Message {
    name: &'static str,
    fields: &'static [Field],
}

pub(crate) const fn one(num: u32, json: &'static str, ty: Ty) -> Field {
    Field { num, json, ty, label: Label::One }
}
pub(crate) const fn rep(num: u32, json: &'static str, ty: Ty) -> Field {
    Field { num, json, ty, label: Label::Repeated }
}
pub(crate) const fn inline(num: u32, json: &'static str, ty: Ty) -> Field {
    Field { num, json, ty, label: Label::Inline }
}

static BY_NAME: LazyLock<HashMap<&'static str, &'static Message>> =
    LazyLock::new(|| schema::MESSAGES.iter().chain(schema_rbac::MESSAGES).chain(schema_certificates::MESSAGES).map(|m| (m.name, m)).collect());

fn message(name: &str) -> Result<&'static Message> {
    BY_NAME.get(name).copied().ok_or_else(|| ProtobufError::Unencodable(format!("no protobuf layout for {name}")))
}

/// The message of a kind, if it has a protobuf form.
fn message_of_kind(api_version: &str, kind: &str) -> Option<&'static Message> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    if META_KINDS.contains(&kind) {
        return BY_NAME.get(format!("{META}.{kind}").as_str()).copied();
    }
    let package = GROUP_PACKAGES.iter().find(|(g, _)| *g == group)?.1;
    BY_NAME.get(format!("{package}.{version}.{kind}").as_str()).copied()
}

// ---------------------------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------------------------

/// Whether a body is in the protobuf encoding.
pub(crate) fn is_protobuf(body: &[u8]) -> bool {
    body.starts_with(MAGIC)
}

/// Reads a protobuf request body into the Kubernetes JSON of its object, `apiVersion` and `kind` included.
pub(crate) fn decode(body: &[u8]) -> Result<Value> {
    let rest = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoMagic)?;
    let unknown = read_fields(rest)?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (num, v) in unknown {
        match (num, v) {
            (1, Wire::Len(type_meta)) => {
                for (n, tv) in read_fields(type_meta)? {
                    match (n, tv) {
                        (1, Wire::Len(s)) => api_version = utf8(s)?,
                        (2, Wire::Len(s)) => kind = utf8(s)?,
                        _ => {}
                    }
                }
            }
            (2, Wire::Len(r)) => raw = r,
            (3, Wire::Len(enc)) if !enc.is_empty() => {
                return Err(ProtobufError::Malformed(format!("content encoding {:?} is not supported", utf8(enc)?)));
            }
            _ => {}
        }
    }
    let msg = message_of_kind(&api_version, &kind)
        .ok_or_else(|| ProtobufError::UnknownKind { api_version: api_version.clone(), kind: kind.clone() })?;
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), Value::String(api_version));
    obj.insert("kind".into(), Value::String(kind));
    decode_into(msg, raw, &mut obj)?;
    Ok(Value::Object(obj))
}

/// Writes an object (with `apiVersion` and `kind`) as a protobuf body. `None` when its kind has no
/// protobuf form, so the caller answers in JSON as Kubernetes does for such types.
pub(crate) fn encode(obj: &Value) -> Option<Result<Vec<u8>>> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str)?;
    let kind = obj.get("kind").and_then(Value::as_str)?;
    let msg = message_of_kind(api_version, kind)?;
    Some(encode_with(msg, api_version, kind, obj))
}

fn encode_with(msg: &'static Message, api_version: &str, kind: &str, obj: &Value) -> Result<Vec<u8>> {
    let mut raw = Vec::new();
    encode_message(msg, obj, &mut raw)?;
    let mut type_meta = Vec::new();
    put_bytes(&mut type_meta, 1, api_version.as_bytes());
    put_bytes(&mut type_meta, 2, kind.as_bytes());
    let mut out = Vec::with_capacity(raw.len() + 64);
    out.extend_from_slice(MAGIC);
    put_bytes(&mut out, 1, &type_meta);
    put_bytes(&mut out, 2, &raw);
    put_bytes(&mut out, 3, b"");
    put_bytes(&mut out, 4, b"");
    Ok(out)
}

/// One frame of a protobuf watch stream: a length-prefixed `WatchEvent` whose object is a full body.
pub(crate) fn watch_frame(event_type: &str, object: &Value) -> Result<Vec<u8>> {
    let body = encode(object).unwrap_or_else(|| {
        Err(ProtobufError::Unencodable(format!(
            "{} has no protobuf form",
            object.get("kind").and_then(Value::as_str).unwrap_or("an object without kind")
        )))
    })?;
    let mut raw_ext = Vec::with_capacity(body.len() + 8);
    put_bytes(&mut raw_ext, 1, &body);
    let mut event = Vec::with_capacity(raw_ext.len() + 24);
    put_bytes(&mut event, 1, event_type.as_bytes());
    put_bytes(&mut event, 2, &raw_ext);
    let len = u32::try_from(event.len()).map_err(|_| ProtobufError::Unencodable("watch event over 4 GiB".into()))?;
    let mut frame = Vec::with_capacity(event.len() + 4);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&event);
    Ok(frame)
}

// ---------------------------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Wire<'a> {
    Varint(u64),
    Fixed64(u64),
    Len(&'a [u8]),
    /// Skipped: no Kubernetes message has 32-bit fixed fields.
    Fixed32,
}

fn malformed(what: impl Into<String>) -> ProtobufError {
    ProtobufError::Malformed(what.into())
}

fn read_varint(buf: &mut &[u8]) -> Result<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&b, rest) = buf.split_first().ok_or_else(|| malformed("a varint runs past the end"))?;
        *buf = rest;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(malformed("a varint is longer than 10 bytes"))
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> Result<&'a [u8]> {
    if buf.len() < n {
        return Err(malformed(format!("a field needs {n} bytes but only {} remain", buf.len())));
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

/// Splits a message into its fields, in wire order.
fn read_fields(mut buf: &[u8]) -> Result<Vec<(u32, Wire<'_>)>> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let key = read_varint(&mut buf)?;
        let num = u32::try_from(key >> 3).map_err(|_| malformed("a field number is out of range"))?;
        if num == 0 {
            return Err(malformed("field number 0"));
        }
        let value = match key & 7 {
            0 => Wire::Varint(read_varint(&mut buf)?),
            1 => Wire::Fixed64(u64::from_le_bytes(take(&mut buf, 8)?.try_into().map_err(|_| malformed("fixed64"))?)),
            2 => {
                let len = usize::try_from(read_varint(&mut buf)?).map_err(|_| malformed("a length is out of range"))?;
                Wire::Len(take(&mut buf, len)?)
            }
            5 => {
                take(&mut buf, 4)?;
                Wire::Fixed32
            }
            w => return Err(malformed(format!("field {num} has unsupported wire type {w}"))),
        };
        out.push((num, value));
    }
    Ok(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7f) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_key(out: &mut Vec<u8>, num: u32, wire: u8) {
    put_varint(out, (u64::from(num) << 3) | u64::from(wire));
}

fn put_bytes(out: &mut Vec<u8>, num: u32, bytes: &[u8]) {
    put_key(out, num, 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn utf8(b: &[u8]) -> Result<String> {
    String::from_utf8(b.to_vec()).map_err(|_| malformed("a string field is not UTF-8"))
}

// ---------------------------------------------------------------------------------------------
// Protobuf -> JSON
// ---------------------------------------------------------------------------------------------

/// Decodes the fields of `msg` from `buf` into `obj`. Unknown field numbers are skipped, as
/// Kubernetes does; a known field with the wrong wire type is an error.
fn decode_into(msg: &'static Message, buf: &[u8], obj: &mut Map<String, Value>) -> Result<()> {
    for (num, wire) in read_fields(buf)? {
        let Some(field) = msg.fields.iter().find(|f| f.num == num) else { continue };
        let wrong = || malformed(format!("field {} of {} has the wrong wire type", field.json, short(msg.name)));
        match (field.label, field.ty) {
            (Label::Inline, Ty::Msg(name)) => {
                let Wire::Len(b) = wire else { return Err(wrong()) };
                decode_into(message(name)?, b, obj)?;
            }
            (_, Ty::Map(value_ty)) => {
                let Wire::Len(b) = wire else { return Err(wrong()) };
                let (k, v) = decode_map_entry(value_ty, b)?;
                let entry = obj.entry(field.json).or_insert_with(|| Value::Object(Map::new()));
                if let (Value::Object(m), Some(v)) = (entry, v) {
                    m.insert(k, v);
                }
            }
            (Label::Repeated, ty) => {
                let entry = obj.entry(field.json).or_insert_with(|| Value::Array(Vec::new()));
                let Value::Array(items) = entry else { return Err(wrong()) };
                match (ty, wire) {
                    // Packed scalars: one length-delimited run of varints.
                    (Ty::I32 | Ty::I64 | Ty::Bool, Wire::Len(mut b)) => {
                        while !b.is_empty() {
                            let v = read_varint(&mut b)?;
                            items.push(scalar_json(ty, Wire::Varint(v)).ok_or_else(wrong)?);
                        }
                    }
                    // An empty string is an element of a list (`args: [""]`), not an unset field.
                    (Ty::Str, Wire::Len(b)) => items.push(Value::String(utf8(b)?)),
                    _ => items.push(decode_value(ty, wire, &wrong)?.unwrap_or(Value::Null)),
                }
            }
            (_, ty) => match decode_value(ty, wire, &wrong)?.filter(|v| !omitted_when_zero(msg, field.json, v)) {
                Some(v) => {
                    obj.insert(field.json.to_string(), v);
                }
                None => {
                    obj.remove(field.json);
                }
            },
        }
    }
    Ok(())
}

fn short(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

fn scalar_json(ty: Ty, wire: Wire<'_>) -> Option<Value> {
    Some(match (ty, wire) {
        (Ty::Bool, Wire::Varint(v)) => Value::Bool(v != 0),
        (Ty::I32, Wire::Varint(v)) => Value::Number((v as i32).into()),
        (Ty::I64, Wire::Varint(v)) => Value::Number((v as i64).into()),
        (Ty::F64, Wire::Fixed64(v)) => Value::Number(Number::from_f64(f64::from_bits(v))?),
        _ => return None,
    })
}

/// One value; `None` for what JSON leaves out (an empty string).
fn decode_value(ty: Ty, wire: Wire<'_>, wrong: &dyn Fn() -> ProtobufError) -> Result<Option<Value>> {
    match (ty, wire) {
        (Ty::Str, Wire::Len(b)) => {
            let s = utf8(b)?;
            Ok((!s.is_empty()).then_some(Value::String(s)))
        }
        (Ty::Bytes, Wire::Len(b)) => Ok(Some(Value::String(base64_encode(b)))),
        (Ty::Msg(name), Wire::Len(b)) => decode_message_value(name, b),
        (Ty::Str | Ty::Bytes | Ty::Msg(_) | Ty::Map(_), _) => Err(wrong()),
        (ty, wire) => scalar_json(ty, wire).map(Some).ok_or_else(wrong),
    }
}

fn decode_message_value(name: &'static str, b: &[u8]) -> Result<Option<Value>> {
    match name {
        TIME | MICRO_TIME => {
            let (mut seconds, mut nanos) = (0i64, 0i32);
            for (n, w) in read_fields(b)? {
                match (n, w) {
                    (1, Wire::Varint(v)) => seconds = v as i64,
                    (2, Wire::Varint(v)) => nanos = v as i32,
                    _ => {}
                }
            }
            if b.is_empty() {
                // Go's zero time, which its JSON writes as `null` (`template.metadata.creationTimestamp`);
                // an unset pointer is no field at all.
                return Ok(Some(Value::Null));
            }
            Ok(Some(Value::String(format_time(seconds, nanos, name == MICRO_TIME)?)))
        }
        QUANTITY => {
            let mut s = String::new();
            for (n, w) in read_fields(b)? {
                if let (1, Wire::Len(v)) = (n, w) {
                    s = utf8(v)?;
                }
            }
            Ok(Some(Value::String(s)))
        }
        INT_OR_STRING => {
            let (mut is_string, mut int, mut string) = (false, 0i32, String::new());
            for (n, w) in read_fields(b)? {
                match (n, w) {
                    (1, Wire::Varint(v)) => is_string = v == 1,
                    (2, Wire::Varint(v)) => int = v as i32,
                    (3, Wire::Len(v)) => string = utf8(v)?,
                    _ => {}
                }
            }
            Ok(Some(if is_string { Value::String(string) } else { Value::Number(int.into()) }))
        }
        FIELDS_V1 | RAW_EXTENSION => {
            let mut raw: &[u8] = &[];
            for (n, w) in read_fields(b)? {
                if let (1, Wire::Len(v)) = (n, w) {
                    raw = v;
                }
            }
            if raw.is_empty() {
                return Ok(None);
            }
            if raw.starts_with(MAGIC) {
                return decode(raw).map(Some);
            }
            serde_json::from_slice(raw)
                .map(Some)
                .map_err(|e| malformed(format!("embedded {} is not JSON: {e}", short(name))))
        }
        _ => {
            let mut obj = Map::new();
            decode_into(message(name)?, b, &mut obj)?;
            Ok(Some(Value::Object(obj)))
        }
    }
}

fn decode_map_entry(value_ty: &Ty, b: &[u8]) -> Result<(String, Option<Value>)> {
    let (mut key, mut value) = (String::new(), None);
    for (n, w) in read_fields(b)? {
        match (n, w) {
            (1, Wire::Len(k)) => key = utf8(k)?,
            (2, w) => value = decode_value(*value_ty, w, &|| malformed("a map value has the wrong wire type"))?,
            _ => {}
        }
    }
    // A map value that is an empty string is still an entry (`labels: {a: ""}`).
    let value = value.or(match value_ty {
        Ty::Str | Ty::Bytes => Some(Value::String(String::new())),
        _ => None,
    });
    Ok((key, value))
}

fn format_time(seconds: i64, nanos: i32, micro: bool) -> Result<String> {
    let ts = jiff::Timestamp::new(seconds, if micro { nanos } else { 0 })
        .map_err(|e| malformed(format!("time out of range: {e}")))?;
    let format = if micro { "%Y-%m-%dT%H:%M:%S.%6fZ" } else { "%Y-%m-%dT%H:%M:%SZ" };
    Ok(ts.strftime(format).to_string())
}

// ---------------------------------------------------------------------------------------------
// JSON -> protobuf
// ---------------------------------------------------------------------------------------------

fn unencodable(field: &Field, what: &str) -> ProtobufError {
    ProtobufError::Unencodable(format!("field {} {what}", field.json))
}

/// Encodes the fields of `msg` found in `obj`. Fields the message does not have are dropped (the
/// encoding has no place for them); `null` is absent.
fn encode_message(msg: &'static Message, obj: &Value, out: &mut Vec<u8>) -> Result<()> {
    let Value::Object(map) = obj else {
        return Err(ProtobufError::Unencodable(format!("{} must be a JSON object", short(msg.name))));
    };
    for field in msg.fields {
        if field.label == Label::Inline {
            let Ty::Msg(name) = field.ty else { continue };
            let mut inner = Vec::new();
            encode_message(message(name)?, obj, &mut inner)?;
            put_bytes(out, field.num, &inner);
            continue;
        }
        let Some(value) = map.get(field.json).filter(|v| !v.is_null()) else { continue };
        match (field.label, field.ty) {
            (_, Ty::Map(value_ty)) => {
                let Value::Object(entries) = value else { return Err(unencodable(field, "must be an object")) };
                for (k, v) in entries {
                    let mut entry = Vec::new();
                    put_bytes(&mut entry, 1, k.as_bytes());
                    if !v.is_null() {
                        encode_value(field, *value_ty, 2, v, &mut entry)?;
                    }
                    put_bytes(out, field.num, &entry);
                }
            }
            (Label::Repeated, ty) => {
                let Value::Array(items) = value else { return Err(unencodable(field, "must be a list")) };
                for item in items {
                    encode_value(field, ty, field.num, item, out)?;
                }
            }
            (_, ty) => encode_value(field, ty, field.num, value, out)?,
        }
    }
    Ok(())
}

fn encode_value(field: &Field, ty: Ty, num: u32, v: &Value, out: &mut Vec<u8>) -> Result<()> {
    match ty {
        Ty::Str => match v {
            Value::String(s) => put_bytes(out, num, s.as_bytes()),
            _ => return Err(unencodable(field, "must be a string")),
        },
        Ty::Bytes => {
            let s = v.as_str().ok_or_else(|| unencodable(field, "must be a base64 string"))?;
            put_bytes(out, num, &base64_decode(s).ok_or_else(|| unencodable(field, "is not valid base64"))?);
        }
        Ty::Bool => {
            let b = v.as_bool().ok_or_else(|| unencodable(field, "must be a boolean"))?;
            put_key(out, num, 0);
            put_varint(out, u64::from(b));
        }
        Ty::I32 => {
            let n = v
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .ok_or_else(|| unencodable(field, "must be a 32-bit integer"))?;
            put_key(out, num, 0);
            put_varint(out, i64::from(n) as u64);
        }
        Ty::I64 => {
            let n = v.as_i64().ok_or_else(|| unencodable(field, "must be an integer"))?;
            put_key(out, num, 0);
            put_varint(out, n as u64);
        }
        Ty::F64 => {
            let n = v.as_f64().ok_or_else(|| unencodable(field, "must be a number"))?;
            put_key(out, num, 1);
            out.extend_from_slice(&n.to_bits().to_le_bytes());
        }
        Ty::Map(_) => return Err(unencodable(field, "is a map inside a map")),
        Ty::Msg(name) => {
            let mut inner = Vec::new();
            encode_message_value(field, name, v, &mut inner)?;
            put_bytes(out, num, &inner);
        }
    }
    Ok(())
}

fn encode_message_value(field: &Field, name: &'static str, v: &Value, out: &mut Vec<u8>) -> Result<()> {
    match name {
        TIME | MICRO_TIME => {
            let s = v.as_str().ok_or_else(|| unencodable(field, "must be an RFC 3339 time"))?;
            let ts: jiff::Timestamp =
                s.parse().map_err(|e| unencodable(field, &format!("is not an RFC 3339 time: {e}")))?;
            put_key(out, 1, 0);
            put_varint(out, ts.as_second() as u64);
            put_key(out, 2, 0);
            put_varint(out, i64::from(ts.subsec_nanosecond()) as u64);
        }
        QUANTITY => match v {
            Value::String(s) => put_bytes(out, 1, s.as_bytes()),
            Value::Number(n) => put_bytes(out, 1, n.to_string().as_bytes()),
            _ => return Err(unencodable(field, "must be a quantity")),
        },
        INT_OR_STRING => match v {
            Value::String(s) => {
                put_key(out, 1, 0);
                put_varint(out, 1);
                put_bytes(out, 3, s.as_bytes());
            }
            Value::Number(_) => {
                let n = v
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| unencodable(field, "must be a 32-bit integer"))?;
                put_key(out, 1, 0);
                put_varint(out, 0);
                put_key(out, 2, 0);
                put_varint(out, i64::from(n) as u64);
            }
            _ => return Err(unencodable(field, "must be an integer or a string")),
        },
        FIELDS_V1 | RAW_EXTENSION => {
            let raw = serde_json::to_vec(v).map_err(|e| unencodable(field, &e.to_string()))?;
            put_bytes(out, 1, &raw);
        }
        _ => encode_message(message(name)?, v, out)?,
    }
    Ok(())
}

fn base64_encode(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(s).ok()
}

#[cfg(test)]
mod tests;
