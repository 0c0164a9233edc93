//! The OpenAPI v2 document in gnostic's protobuf form (`openapi.v2.Document`), which kubectl asks for.
//!
//! Only the messages and fields Shepherd's document uses are declared; the field numbers are those of
//! gnostic's published `OpenAPIv2.proto`. A decoder that knows the whole schema reads these bytes as is.

// The messages mirror the wire schema and are built once per process: boxing variants would buy nothing.
#![allow(clippy::large_enum_variant)]

use serde_json::{Map, Value};

#[derive(Clone, PartialEq, prost::Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub swagger: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(message, optional, tag = "8")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "9")]
    pub definitions: Option<Definitions>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "2")]
    pub path: Vec<NamedPathItem>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedPathItem {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<PathItem>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PathItem {
    #[prost(message, optional, tag = "2")]
    pub get: Option<Operation>,
    #[prost(message, optional, tag = "3")]
    pub put: Option<Operation>,
    #[prost(message, optional, tag = "4")]
    pub post: Option<Operation>,
    #[prost(message, optional, tag = "5")]
    pub delete: Option<Operation>,
    #[prost(message, optional, tag = "8")]
    pub patch: Option<Operation>,
    #[prost(message, repeated, tag = "9")]
    pub parameters: Vec<ParametersItem>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Operation {
    #[prost(string, repeated, tag = "1")]
    pub tags: Vec<String>,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "5")]
    pub operation_id: String,
    #[prost(string, repeated, tag = "6")]
    pub produces: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub consumes: Vec<String>,
    #[prost(message, repeated, tag = "8")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, optional, tag = "9")]
    pub responses: Option<Responses>,
    #[prost(string, repeated, tag = "10")]
    pub schemes: Vec<String>,
    #[prost(message, repeated, tag = "13")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ParametersItem {
    #[prost(oneof = "parameters_item::Oneof", tags = "1")]
    pub oneof: Option<parameters_item::Oneof>,
}

pub mod parameters_item {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Parameter(super::Parameter),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Parameter {
    #[prost(oneof = "parameter::Oneof", tags = "1, 2")]
    pub oneof: Option<parameter::Oneof>,
}

pub mod parameter {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        BodyParameter(super::BodyParameter),
        #[prost(message, tag = "2")]
        NonBodyParameter(super::NonBodyParameter),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyParameter {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub r#in: String,
    #[prost(bool, tag = "4")]
    pub required: bool,
    #[prost(message, optional, tag = "5")]
    pub schema: Option<Schema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NonBodyParameter {
    #[prost(oneof = "non_body_parameter::Oneof", tags = "3, 4")]
    pub oneof: Option<non_body_parameter::Oneof>,
}

pub mod non_body_parameter {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "3")]
        QueryParameterSubSchema(super::QueryParameterSubSchema),
        #[prost(message, tag = "4")]
        PathParameterSubSchema(super::PathParameterSubSchema),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct QueryParameterSubSchema {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "6")]
    pub r#type: String,
    #[prost(bool, tag = "20")]
    pub unique_items: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PathParameterSubSchema {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "5")]
    pub r#type: String,
    #[prost(bool, tag = "19")]
    pub unique_items: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Responses {
    #[prost(message, repeated, tag = "1")]
    pub response_code: Vec<NamedResponseValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedResponseValue {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<ResponseValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseValue {
    #[prost(oneof = "response_value::Oneof", tags = "1")]
    pub oneof: Option<response_value::Oneof>,
}

pub mod response_value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Response(super::Response),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(message, optional, tag = "2")]
    pub schema: Option<SchemaItem>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SchemaItem {
    #[prost(oneof = "schema_item::Oneof", tags = "1")]
    pub oneof: Option<schema_item::Oneof>,
}

pub mod schema_item {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Schema(super::Schema),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Definitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedSchema {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Schema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Schema {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(string, tag = "3")]
    pub title: String,
    #[prost(string, tag = "4")]
    pub description: String,
    #[prost(message, optional, tag = "5")]
    pub default: Option<Any>,
    #[prost(double, tag = "7")]
    pub maximum: f64,
    #[prost(double, tag = "9")]
    pub minimum: f64,
    #[prost(bool, tag = "16")]
    pub unique_items: bool,
    #[prost(string, repeated, tag = "19")]
    pub required: Vec<String>,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(message, optional, boxed, tag = "21")]
    pub additional_properties: Option<Box<AdditionalPropertiesItem>>,
    #[prost(message, optional, tag = "22")]
    pub r#type: Option<TypeItem>,
    #[prost(message, optional, tag = "23")]
    pub items: Option<ItemsItem>,
    #[prost(message, repeated, tag = "24")]
    pub all_of: Vec<Schema>,
    #[prost(message, optional, tag = "25")]
    pub properties: Option<Properties>,
    #[prost(bool, tag = "27")]
    pub read_only: bool,
    #[prost(message, optional, tag = "30")]
    pub example: Option<Any>,
    #[prost(message, repeated, tag = "31")]
    pub vendor_extension: Vec<NamedAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AdditionalPropertiesItem {
    #[prost(oneof = "additional_properties_item::Oneof", tags = "1, 2")]
    pub oneof: Option<additional_properties_item::Oneof>,
}

pub mod additional_properties_item {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Oneof {
        #[prost(message, tag = "1")]
        Schema(super::Schema),
        #[prost(bool, tag = "2")]
        Boolean(bool),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeItem {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema: Vec<Schema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedAny {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Any>,
}

/// A value gnostic could not type: carried as YAML text (JSON is YAML).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Any {
    #[prost(string, tag = "2")]
    pub yaml: String,
}

/// Converts the JSON form of the v2 document. Keys this conversion does not carry are collected in
/// `dropped` (as `where: key`) so that a test can insist both forms say the same.
pub fn document(doc: &Value, dropped: &mut Vec<String>) -> Document {
    let mut paths = Vec::new();
    for (name, item) in obj(doc.get("paths")) {
        paths.push(NamedPathItem { name: name.clone(), value: Some(path_item(item, name, dropped)) });
    }
    let definitions = obj(doc.get("definitions"))
        .iter()
        .map(|(name, s)| NamedSchema { name: name.clone(), value: Some(schema(s, name, dropped)) })
        .collect();
    Document {
        swagger: text(doc, "swagger"),
        info: doc.get("info").map(|i| Info { title: text(i, "title"), version: text(i, "version") }),
        paths: Some(Paths { path: paths }),
        definitions: Some(Definitions { additional_properties: definitions }),
    }
}

fn obj(v: Option<&Value>) -> &Map<String, Value> {
    static EMPTY: std::sync::LazyLock<Map<String, Value>> = std::sync::LazyLock::new(Map::new);
    v.and_then(Value::as_object).unwrap_or(&EMPTY)
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_string()
}

fn texts(v: &Value, key: &str) -> Vec<String> {
    v.get(key).and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(String::from).collect()
}

fn any(v: &Value) -> Any {
    Any { yaml: v.to_string() }
}

fn extensions(v: &Value) -> Vec<NamedAny> {
    obj(Some(v))
        .iter()
        .filter(|(k, _)| k.starts_with("x-"))
        .map(|(k, v)| NamedAny { name: k.clone(), value: Some(any(v)) })
        .collect()
}

fn path_item(v: &Value, at: &str, dropped: &mut Vec<String>) -> PathItem {
    let mut item = PathItem::default();
    for (key, value) in obj(Some(v)) {
        match key.as_str() {
            "get" => item.get = Some(operation(value, at, dropped)),
            "put" => item.put = Some(operation(value, at, dropped)),
            "post" => item.post = Some(operation(value, at, dropped)),
            "delete" => item.delete = Some(operation(value, at, dropped)),
            "patch" => item.patch = Some(operation(value, at, dropped)),
            "parameters" => item.parameters = parameters(value, at, dropped),
            _ => dropped.push(format!("{at}: {key}")),
        }
    }
    item
}

fn operation(v: &Value, at: &str, dropped: &mut Vec<String>) -> Operation {
    for key in obj(Some(v)).keys() {
        let known =
            ["tags", "description", "operationId", "produces", "consumes", "parameters", "responses", "schemes"];
        if !known.contains(&key.as_str()) && !key.starts_with("x-") {
            dropped.push(format!("{at}: {key}"));
        }
    }
    let responses = obj(v.get("responses"))
        .iter()
        .map(|(code, r)| NamedResponseValue {
            name: code.clone(),
            value: Some(ResponseValue {
                oneof: Some(response_value::Oneof::Response(Response {
                    description: text(r, "description"),
                    schema: r.get("schema").map(|s| SchemaItem {
                        oneof: Some(schema_item::Oneof::Schema(schema(s, at, dropped))),
                    }),
                })),
            }),
        })
        .collect();
    Operation {
        tags: texts(v, "tags"),
        description: text(v, "description"),
        operation_id: text(v, "operationId"),
        produces: texts(v, "produces"),
        consumes: texts(v, "consumes"),
        parameters: v.get("parameters").map(|p| parameters(p, at, dropped)).unwrap_or_default(),
        responses: Some(Responses { response_code: responses }),
        schemes: texts(v, "schemes"),
        vendor_extension: extensions(v),
    }
}

fn parameters(v: &Value, at: &str, dropped: &mut Vec<String>) -> Vec<ParametersItem> {
    let params = v.as_array().map(Vec::as_slice).unwrap_or_default();
    params
        .iter()
        .map(|p| {
            for key in obj(Some(p)).keys() {
                if !["name", "in", "description", "required", "type", "uniqueItems", "schema"].contains(&key.as_str()) {
                    dropped.push(format!("{at}: parameter {key}"));
                }
            }
            let required = p.get("required").and_then(Value::as_bool).unwrap_or(false);
            let unique_items = p.get("uniqueItems").and_then(Value::as_bool).unwrap_or(false);
            let parameter = match p.get("in").and_then(Value::as_str) {
                Some("body") => parameter::Oneof::BodyParameter(BodyParameter {
                    description: text(p, "description"),
                    name: text(p, "name"),
                    r#in: "body".into(),
                    required,
                    schema: p.get("schema").map(|s| schema(s, at, dropped)),
                }),
                Some("path") => parameter::Oneof::NonBodyParameter(NonBodyParameter {
                    oneof: Some(non_body_parameter::Oneof::PathParameterSubSchema(PathParameterSubSchema {
                        required,
                        r#in: "path".into(),
                        description: text(p, "description"),
                        name: text(p, "name"),
                        r#type: text(p, "type"),
                        unique_items,
                    })),
                }),
                _ => parameter::Oneof::NonBodyParameter(NonBodyParameter {
                    oneof: Some(non_body_parameter::Oneof::QueryParameterSubSchema(QueryParameterSubSchema {
                        required,
                        r#in: text(p, "in"),
                        description: text(p, "description"),
                        name: text(p, "name"),
                        r#type: text(p, "type"),
                        unique_items,
                    })),
                }),
            };
            ParametersItem { oneof: Some(parameters_item::Oneof::Parameter(Parameter { oneof: Some(parameter) })) }
        })
        .collect()
}

fn schema(v: &Value, at: &str, dropped: &mut Vec<String>) -> Schema {
    let mut s = Schema::default();
    for (key, value) in obj(Some(v)) {
        match key.as_str() {
            "$ref" => s.r#ref = value.as_str().unwrap_or_default().to_string(),
            "format" => s.format = value.as_str().unwrap_or_default().to_string(),
            "title" => s.title = value.as_str().unwrap_or_default().to_string(),
            "description" => s.description = value.as_str().unwrap_or_default().to_string(),
            "default" => s.default = Some(any(value)),
            "maximum" => s.maximum = value.as_f64().unwrap_or_default(),
            "minimum" => s.minimum = value.as_f64().unwrap_or_default(),
            "uniqueItems" => s.unique_items = value.as_bool().unwrap_or_default(),
            "required" => s.required = texts(v, "required"),
            "enum" => s.r#enum = value.as_array().into_iter().flatten().map(any).collect(),
            "additionalProperties" => {
                let item = match value {
                    Value::Bool(b) => additional_properties_item::Oneof::Boolean(*b),
                    other => additional_properties_item::Oneof::Schema(schema(other, at, dropped)),
                };
                s.additional_properties = Some(Box::new(AdditionalPropertiesItem { oneof: Some(item) }));
            }
            "type" => {
                let value = match value {
                    Value::String(t) => vec![t.clone()],
                    _ => texts(v, "type"),
                };
                s.r#type = Some(TypeItem { value });
            }
            "items" => {
                let items = match value {
                    Value::Array(a) => a.iter().map(|i| schema(i, at, dropped)).collect(),
                    one => vec![schema(one, at, dropped)],
                };
                s.items = Some(ItemsItem { schema: items });
            }
            "allOf" => s.all_of = value.as_array().into_iter().flatten().map(|i| schema(i, at, dropped)).collect(),
            "properties" => {
                let props = obj(Some(value))
                    .iter()
                    .map(|(name, p)| NamedSchema { name: name.clone(), value: Some(schema(p, at, dropped)) })
                    .collect();
                s.properties = Some(Properties { additional_properties: props });
            }
            "readOnly" => s.read_only = value.as_bool().unwrap_or_default(),
            "example" => s.example = Some(any(value)),
            k if k.starts_with("x-") => s.vendor_extension.push(NamedAny { name: k.into(), value: Some(any(value)) }),
            _ => dropped.push(format!("{at}: {key}")),
        }
    }
    s
}
