//! Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`) of the built-in kinds,
//! translated to and from their JSON form: the host's pod creates (as kube-controller-manager
//! sends them), and in the embedded API server what kubectl's generators (`create
//! namespace|configmap|secret|service|deployment`, `run`, `expose`) and client-go's typed clients
//! send, and what they may ask back.
//!
//! A body is the magic `k8s\0` and a `runtime.Unknown` envelope (`typeMeta`, `raw`) whose `raw` is
//! the object's message. The messages' field numbers, wire types and JSON names come from
//! `schema.json`, generated from the [k8s-pb](https://crates.io/crates/k8s-pb) crate (kube-rs's
//! prost bindings of Kubernetes' `.proto` files) with JSON names from k8s-openapi, by
//! `cargo run -p slinky-apiserver --example protobuf_schema`. The wire format itself (varints,
//! length-delimited fields) is a few lines here.
//!
//! Kubernetes' own types map to JSON as kube-apiserver maps them: `Time`/`MicroTime` to RFC 3339
//! strings, `IntOrString` to a number or a string, `Quantity` to its string, `RawExtension`,
//! `FieldsV1` and CRD `JSON` to embedded JSON, Go embedded structs (`Volume`'s `VolumeSource`,
//! `Probe`'s `ProbeHandler`) inline. Go writes every non-pointer field, so empty strings and zero
//! times decode as absent, as they would through Go's JSON encoding.

mod decode;
mod exact;
mod watch;
mod wire;

pub use decode::{Keep, decode, decode_keeping};
pub use exact::encode_exact;
pub use watch::{
    Frames, WATCH_MEDIA_TYPE, decode_watch_event, decode_watch_event_keeping, encode_watch_event,
};

use std::{collections::HashMap, sync::OnceLock};

use serde_json::{Value, json};

/// The protobuf media type.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The four bytes every Kubernetes protobuf body starts with.
const MAGIC: &[u8] = b"k8s\0";

const UNKNOWN: &str = "apimachinery.pkg.runtime.Unknown";
const TYPE_META: &str = "apimachinery.pkg.runtime.TypeMeta";
const TIME: &str = "apimachinery.pkg.apis.meta.v1.Time";
const MICRO_TIME: &str = "apimachinery.pkg.apis.meta.v1.MicroTime";
const DURATION: &str = "apimachinery.pkg.apis.meta.v1.Duration";
const INT_OR_STRING: &str = "apimachinery.pkg.util.intstr.IntOrString";
const QUANTITY: &str = "apimachinery.pkg.api.resource.Quantity";
const RAW_EXTENSION: &str = "apimachinery.pkg.runtime.RawExtension";
const FIELDS_V1: &str = "apimachinery.pkg.apis.meta.v1.FieldsV1";
const DELETE_OPTIONS: &str = "apimachinery.pkg.apis.meta.v1.DeleteOptions";
const STATUS: &str = "apimachinery.pkg.apis.meta.v1.Status";
const CRD_JSON: &str = "apiextensions_apiserver.pkg.apis.apiextensions.v1.Json";
const CRD_OR_ARRAY: &str = "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaPropsOrArray";
const CRD_OR_BOOL: &str = "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaPropsOrBool";
const CRD_OR_STRINGS: &str = "apiextensions_apiserver.pkg.apis.apiextensions.v1.JsonSchemaPropsOrStringArray";

/// A field's wire kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    String,
    Bool,
    Int32,
    Int64,
    Double,
    Bytes,
    Message,
    /// A Go embedded struct: a message whose fields are inline in the parent's JSON.
    Inline,
    Map,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "string" => Kind::String,
            "bool" => Kind::Bool,
            "int32" => Kind::Int32,
            "int64" => Kind::Int64,
            "double" => Kind::Double,
            "bytes" => Kind::Bytes,
            "message" => Kind::Message,
            "inline" => Kind::Inline,
            "map" => Kind::Map,
            _ => return None,
        })
    }
}

/// One field of a message.
#[derive(Debug, Clone)]
struct FieldSpec {
    number: u32,
    json: String,
    kind: Kind,
    message: Option<String>,
    repeated: bool,
    /// A map's value kind (its key is a string).
    map_value: Option<Kind>,
}

/// The messages and which message each `apiVersion`/`kind` is.
#[derive(Debug, Default)]
struct Schema {
    kinds: HashMap<String, String>,
    messages: HashMap<String, Vec<FieldSpec>>,
}

fn schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        let doc: Value = serde_json::from_str(include_str!("schema.json")).unwrap_or_default();
        let kinds = doc["kinds"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        let messages = doc["messages"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(name, fields)| {
                let specs = fields
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|f| {
                        Some(FieldSpec {
                            number: u32::try_from(f[0].as_u64()?).ok()?,
                            json: f[1].as_str()?.to_string(),
                            kind: Kind::parse(f[2].as_str()?)?,
                            message: f[3].as_str().map(str::to_string),
                            repeated: f[4].as_bool().unwrap_or(false),
                            map_value: f[5].as_str().and_then(Kind::parse),
                        })
                    })
                    .collect();
                (name.clone(), specs)
            })
            .collect();
        Schema { kinds, messages }
    })
}

/// The message of `apiVersion`/`kind` (lists: `<Kind>List`; `DeleteOptions` in any version).
fn message_of(api_version: &str, kind: &str) -> Option<String> {
    let s = schema();
    if kind == "DeleteOptions" {
        return Some(DELETE_OPTIONS.into());
    }
    if kind == "Status" && api_version == "v1" {
        // The API server's errors, in protobuf for a client that prefers it.
        return Some(STATUS.into());
    }
    if let Some(m) = s.kinds.get(&format!("{api_version} {kind}")) {
        return Some(m.clone());
    }
    let item = kind.strip_suffix("List")?;
    let list = format!("{}List", s.kinds.get(&format!("{api_version} {item}"))?);
    s.messages.contains_key(&list).then_some(list)
}

/// Why a body does not decode: an HTTP status (400, or 415 for a kind without a schema), its
/// reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// 400 or 415.
    pub code: u16,
    /// `BadRequest` or `UnsupportedMediaType`.
    pub reason: &'static str,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

fn bad(message: impl Into<String>) -> Error {
    Error {
        code: 400,
        reason: "BadRequest",
        message: message.into(),
    }
}

/// The media type of an OpenAPI v2 document in protobuf (gnostic's `openapi_v2.Document`), the
/// only form client-go's `OpenAPISchema()` reads. Clients ask for it as `…spec.v2@v1.0+protobuf`
/// (kube-openapi's deprecated name); the answer is labelled with the name Go's `mime` parses.
pub const OPENAPI_V2_MEDIA_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// An OpenAPI v2 `Document` (gnostic's `OpenAPIv2.proto`) with `swagger: "2.0"`, an `info`
/// (`title`, `version`), and empty `paths` and `definitions`: no schemas, as the v3 documents.
pub fn openapi_v2_document(title: &str, version: &str) -> Vec<u8> {
    let mut info = Vec::new();
    wire::put_bytes(&mut info, 1, title.as_bytes());
    wire::put_bytes(&mut info, 2, version.as_bytes());
    let mut doc = Vec::new();
    wire::put_bytes(&mut doc, 1, b"2.0");
    wire::put_bytes(&mut doc, 2, &info);
    wire::put_bytes(&mut doc, 8, &[]);
    wire::put_bytes(&mut doc, 9, &[]);
    doc
}

/// Encode a JSON object (with `apiVersion` and `kind`) as a protobuf body, or `None` when its
/// kind has no protobuf schema (custom resources).
pub fn encode(obj: &Value) -> Option<Vec<u8>> {
    let api_version = obj.get("apiVersion").and_then(Value::as_str)?;
    let kind = obj.get("kind").and_then(Value::as_str)?;
    let message = message_of(api_version, kind)?;
    let raw = encode_message(obj, &message);
    let type_meta = encode_message(&json!({"apiVersion": api_version, "kind": kind}), TYPE_META);
    let mut envelope = Vec::new();
    wire::put_bytes(&mut envelope, 1, &type_meta);
    wire::put_bytes(&mut envelope, 2, &raw);
    wire::put_bytes(&mut envelope, 3, b"");
    wire::put_bytes(&mut envelope, 4, b"");
    let mut out = MAGIC.to_vec();
    out.extend(envelope);
    Some(out)
}

fn crd_prefix() -> &'static str {
    "apiextensions_apiserver.pkg.apis.apiextensions.v1."
}

fn parse_go_duration(s: &str) -> i64 {
    let mut total = 0f64;
    let mut num = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() || c == '.' || c == '-' {
            num.push(c);
            continue;
        }
        let mut unit = c.to_string();
        if c == 'm' && chars.peek() == Some(&'s') {
            unit.push('s');
            chars.next();
        }
        let n: f64 = num.parse().unwrap_or(0.0);
        num.clear();
        total += n * match unit.as_str() {
            "h" => 3.6e12,
            "m" => 6e10,
            "s" => 1e9,
            "ms" => 1e6,
            "us" | "µ" => 1e3,
            _ => 1.0,
        };
    }
    total as i64
}

fn encode_message(obj: &Value, message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let specs = schema().messages.get(message).map_or(&[][..], Vec::as_slice);
    for spec in specs {
        if spec.kind == Kind::Inline {
            let inner = encode_message(obj, spec.message.as_deref().unwrap_or_default());
            wire::put_bytes(&mut out, spec.number, &inner);
            continue;
        }
        let Some(value) = obj.get(&spec.json).filter(|v| !v.is_null()) else {
            continue;
        };
        match (spec.kind, value) {
            (Kind::Map, Value::Object(m)) => {
                for (k, v) in m {
                    let mut entry = Vec::new();
                    wire::put_bytes(&mut entry, 1, k.as_bytes());
                    encode_value(
                        &mut entry,
                        2,
                        spec.map_value.unwrap_or(Kind::String),
                        spec.message.as_deref(),
                        v,
                    );
                    wire::put_bytes(&mut out, spec.number, &entry);
                }
            }
            (_, Value::Array(items)) if spec.repeated => {
                for item in items {
                    encode_value(&mut out, spec.number, spec.kind, spec.message.as_deref(), item);
                }
            }
            _ => encode_value(&mut out, spec.number, spec.kind, spec.message.as_deref(), value),
        }
    }
    out
}

fn encode_value(out: &mut Vec<u8>, number: u32, kind: Kind, message: Option<&str>, v: &Value) {
    use base64::Engine;
    match kind {
        Kind::String => wire::put_bytes(out, number, v.as_str().unwrap_or_default().as_bytes()),
        Kind::Bytes => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap_or_default())
                .unwrap_or_default();
            wire::put_bytes(out, number, &bytes);
        }
        Kind::Bool => wire::put_varint_field(out, number, u64::from(v.as_bool().unwrap_or(false))),
        Kind::Int32 | Kind::Int64 => wire::put_varint_field(out, number, v.as_i64().unwrap_or(0) as u64),
        Kind::Double => wire::put_fixed64_field(out, number, v.as_f64().unwrap_or(0.0).to_bits()),
        Kind::Message | Kind::Inline | Kind::Map => {
            let inner = encode_special_or_message(v, message.unwrap_or_default());
            wire::put_bytes(out, number, &inner);
        }
    }
}

fn encode_special_or_message(v: &Value, message: &str) -> Vec<u8> {
    let mut out = Vec::new();
    match message {
        TIME | MICRO_TIME => {
            if let Some(ts) = v
                .as_str()
                .and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok())
            {
                wire::put_varint_field(&mut out, 1, ts.as_second() as u64);
                let nanos = if message == MICRO_TIME {
                    ts.subsec_nanosecond()
                } else {
                    0
                };
                wire::put_varint_field(&mut out, 2, nanos as i64 as u64);
            }
        }
        DURATION => wire::put_varint_field(&mut out, 1, parse_go_duration(v.as_str().unwrap_or("0s")) as u64),
        INT_OR_STRING => match v {
            Value::String(s) => {
                wire::put_varint_field(&mut out, 1, 1);
                wire::put_varint_field(&mut out, 2, 0);
                wire::put_bytes(&mut out, 3, s.as_bytes());
            }
            other => {
                wire::put_varint_field(&mut out, 1, 0);
                wire::put_varint_field(&mut out, 2, other.as_i64().unwrap_or(0) as u64);
                wire::put_bytes(&mut out, 3, b"");
            }
        },
        QUANTITY => {
            let s = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            wire::put_bytes(&mut out, 1, s.as_bytes());
        }
        RAW_EXTENSION | FIELDS_V1 | CRD_JSON => wire::put_bytes(&mut out, 1, v.to_string().as_bytes()),
        CRD_OR_BOOL => match v {
            Value::Bool(b) => wire::put_varint_field(&mut out, 1, u64::from(*b)),
            schema => {
                wire::put_varint_field(&mut out, 1, 1);
                let inner = encode_message(schema, &format!("{}JsonSchemaProps", crd_prefix()));
                wire::put_bytes(&mut out, 2, &inner);
            }
        },
        CRD_OR_ARRAY | CRD_OR_STRINGS => match v {
            Value::Array(items) => {
                for item in items {
                    if message == CRD_OR_ARRAY {
                        let inner = encode_message(item, &format!("{}JsonSchemaProps", crd_prefix()));
                        wire::put_bytes(&mut out, 2, &inner);
                    } else {
                        wire::put_bytes(&mut out, 2, item.as_str().unwrap_or_default().as_bytes());
                    }
                }
            }
            schema => {
                let inner = encode_message(schema, &format!("{}JsonSchemaProps", crd_prefix()));
                wire::put_bytes(&mut out, 1, &inner);
            }
        },
        _ => out = encode_message(v, message),
    }
    out
}

#[cfg(test)]
mod tests;
