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

mod exact;
mod wire;

pub use exact::encode_exact;

use std::{collections::HashMap, sync::OnceLock};

use serde_json::{Map, Value, json};

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

/// Decode a protobuf request body into the object's JSON form (with `apiVersion` and `kind`).
///
/// # Errors
/// 400 when the body is not a Kubernetes protobuf envelope or its message does not decode;
/// 415 for a kind this server has no protobuf schema of.
pub fn decode(body: &[u8]) -> Result<Value, Error> {
    let raw = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("the protobuf body does not start with the Kubernetes magic number"))?;
    let envelope = decode_message(raw, UNKNOWN)?;
    let api_version = envelope
        .pointer("/typeMeta/apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let kind = envelope
        .pointer("/typeMeta/kind")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let message = message_of(api_version, kind).ok_or_else(|| Error {
        code: 415,
        reason: "UnsupportedMediaType",
        message: format!("no protobuf schema for {api_version:?} {kind:?}: send application/json"),
    })?;
    let inner = wire::bytes_field(raw, 2)?.unwrap_or_default();
    let mut obj = decode_message(&inner, &message)?;
    if let Value::Object(m) = &mut obj {
        m.insert("apiVersion".into(), api_version.into());
        m.insert("kind".into(), kind.into());
    }
    Ok(obj)
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

fn decode_message(buf: &[u8], message: &str) -> Result<Value, Error> {
    let specs = schema().messages.get(message).map_or(&[][..], Vec::as_slice);
    let mut out = Map::new();
    for field in wire::fields(buf) {
        let field = field?;
        let Some(spec) = specs.iter().find(|s| s.number == field.number) else {
            continue; // a field newer than our schema: ignored, like an unknown JSON field
        };
        match spec.kind {
            Kind::Map => {
                let entry = field.bytes()?;
                let key = wire::bytes_field(entry, 1)?.unwrap_or_default();
                let key = String::from_utf8_lossy(&key).into_owned();
                let value_kind = spec.map_value.unwrap_or(Kind::String);
                let value = match wire::fields(entry).filter_map(Result::ok).find(|f| f.number == 2) {
                    // A map keeps empty strings (a ConfigMap key with an empty value).
                    Some(v) if value_kind == Kind::String => {
                        Some(Value::String(String::from_utf8_lossy(v.bytes()?).into_owned()))
                    }
                    Some(v) => scalar_or_message(&v, value_kind, spec.message.as_deref())?,
                    None if value_kind == Kind::Bytes || value_kind == Kind::String => {
                        Some(Value::String(String::new()))
                    }
                    None => Some(json!({})),
                };
                let map = out.entry(spec.json.clone()).or_insert_with(|| json!({}));
                if let (Value::Object(m), Some(v)) = (map, value) {
                    m.insert(key, v);
                }
            }
            Kind::Inline => {
                let msg = spec.message.as_deref().unwrap_or_default();
                if let Value::Object(inner) = decode_message(field.bytes()?, msg)? {
                    out.extend(inner);
                }
            }
            kind => {
                let values = if spec.repeated
                    && field.wire_type == 2
                    && !matches!(kind, Kind::String | Kind::Bytes | Kind::Message)
                {
                    wire::packed(field.bytes()?, kind == Kind::Double)?
                        .into_iter()
                        .map(|v| scalar(kind, v))
                        .collect()
                } else {
                    scalar_or_message(&field, kind, spec.message.as_deref())?
                        .into_iter()
                        .collect::<Vec<_>>()
                };
                if spec.repeated {
                    let list = out.entry(spec.json.clone()).or_insert_with(|| json!([]));
                    if let Value::Array(a) = list {
                        a.extend(values);
                    }
                } else if let Some(v) = values.into_iter().next() {
                    out.insert(spec.json.clone(), v);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

fn scalar(kind: Kind, v: u64) -> Value {
    match kind {
        Kind::Bool => Value::Bool(v != 0),
        // int32 travels sign-extended to 64 bits.
        Kind::Int32 => json!(v as i64 as i32),
        Kind::Double => json!(f64::from_bits(v)),
        _ => json!(v as i64),
    }
}

/// One decoded value, or `None` for a zero value Go's JSON would leave out.
fn scalar_or_message(
    field: &wire::Field<'_>,
    kind: Kind,
    message: Option<&str>,
) -> Result<Option<Value>, Error> {
    use base64::Engine;
    Ok(match kind {
        Kind::String => {
            let s = String::from_utf8_lossy(field.bytes()?).into_owned();
            (!s.is_empty()).then_some(Value::String(s))
        }
        Kind::Bytes => Some(
            base64::engine::general_purpose::STANDARD
                .encode(field.bytes()?)
                .into(),
        ),
        Kind::Message | Kind::Inline => special_or_message(field.bytes()?, message.unwrap_or_default())?,
        Kind::Double => Some(scalar(kind, field.fixed()?)),
        Kind::Map => None,
        _ => Some(scalar(kind, field.varint()?)),
    })
}

fn raw_json(buf: &[u8], number: u32) -> Result<Option<Value>, Error> {
    let raw = wire::bytes_field(buf, number)?.unwrap_or_default();
    if raw.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(&raw)
        .map(Some)
        .map_err(|e| bad(format!("embedded JSON in a protobuf body does not parse: {e}")))
}

fn timestamp(buf: &[u8], micro: bool) -> Result<Option<Value>, Error> {
    let secs = wire::varint_field(buf, 1)?.unwrap_or(0) as i64;
    let nanos = wire::varint_field(buf, 2)?.unwrap_or(0) as i64 as i32;
    if secs == 0 && nanos == 0 {
        return Ok(None); // Go's zero time: `null`, left out
    }
    let ts = k8s_openapi::jiff::Timestamp::new(secs, nanos)
        .map_err(|e| bad(format!("a protobuf time is out of range: {e}")))?;
    let format = if micro {
        "%Y-%m-%dT%H:%M:%S%.6fZ"
    } else {
        "%Y-%m-%dT%H:%M:%SZ"
    };
    Ok(Some(ts.strftime(format).to_string().into()))
}

/// Kubernetes' types with a JSON form of their own, else the message as an object.
fn special_or_message(buf: &[u8], message: &str) -> Result<Option<Value>, Error> {
    Ok(match message {
        TIME => timestamp(buf, false)?,
        MICRO_TIME => timestamp(buf, true)?,
        DURATION => {
            let nanos = wire::varint_field(buf, 1)?.unwrap_or(0) as i64;
            Some(go_duration(nanos).into())
        }
        INT_OR_STRING => {
            let string = wire::varint_field(buf, 1)?.unwrap_or(0) == 1;
            if string {
                let s = wire::bytes_field(buf, 3)?.unwrap_or_default();
                Some(String::from_utf8_lossy(&s).into_owned().into())
            } else {
                let n = wire::varint_field(buf, 2)?.unwrap_or(0) as i64 as i32;
                (n != 0).then(|| json!(n))
            }
        }
        QUANTITY => {
            let s = wire::bytes_field(buf, 1)?.unwrap_or_default();
            Some(String::from_utf8_lossy(&s).into_owned().into())
        }
        RAW_EXTENSION | FIELDS_V1 | CRD_JSON => raw_json(buf, 1)?,
        CRD_OR_BOOL => match wire::bytes_field(buf, 2)? {
            Some(schema) => Some(decode_message(
                &schema,
                &format!("{}JsonSchemaProps", crd_prefix()),
            )?),
            None => Some(Value::Bool(wire::varint_field(buf, 1)?.unwrap_or(0) != 0)),
        },
        CRD_OR_ARRAY | CRD_OR_STRINGS => match wire::bytes_field(buf, 1)? {
            Some(schema) => Some(decode_message(
                &schema,
                &format!("{}JsonSchemaProps", crd_prefix()),
            )?),
            None => {
                let mut items = Vec::new();
                for f in wire::fields(buf) {
                    let f = f?;
                    if f.number == 2 {
                        items.push(if message == CRD_OR_ARRAY {
                            decode_message(f.bytes()?, &format!("{}JsonSchemaProps", crd_prefix()))?
                        } else {
                            String::from_utf8_lossy(f.bytes()?).into_owned().into()
                        });
                    }
                }
                Some(Value::Array(items))
            }
        },
        _ => Some(decode_message(buf, message)?),
    })
}

fn crd_prefix() -> &'static str {
    "apiextensions_apiserver.pkg.apis.apiextensions.v1."
}

/// A duration as Go prints one (`1h2m3s`, `1.5s`, `0s`).
fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".into();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let n = nanos.unsigned_abs();
    let (h, rest) = (n / 3_600_000_000_000, n % 3_600_000_000_000);
    let (m, rest) = (rest / 60_000_000_000, rest % 60_000_000_000);
    let secs = rest as f64 / 1e9;
    let mut s = sign.to_string();
    if h > 0 {
        s.push_str(&format!("{h}h"));
    }
    if h > 0 || m > 0 {
        s.push_str(&format!("{m}m"));
    }
    s.push_str(&format!("{secs}s"));
    s
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
