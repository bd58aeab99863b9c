//! Protobuf bodies to the objects' JSON form: the envelope, the messages by `schema.json`, and
//! Kubernetes' types with a JSON form of their own (times, durations, `IntOrString`, quantities,
//! embedded JSON, the CRD schema unions).

use serde_json::{Map, Value, json};

use super::{
    CRD_JSON, CRD_OR_ARRAY, CRD_OR_BOOL, CRD_OR_STRINGS, DURATION, Error, FIELDS_V1, INT_OR_STRING, Kind,
    MAGIC, MICRO_TIME, QUANTITY, RAW_EXTENSION, TIME, UNKNOWN, bad, crd_prefix, message_of, schema, wire,
};

/// Decode a protobuf request body into the object's JSON form (with `apiVersion` and `kind`).
///
/// # Errors
/// 400 when the body is not a Kubernetes protobuf envelope or its message does not decode;
/// 415 for a kind this server has no protobuf schema of.
pub fn decode(body: &[u8]) -> Result<Value, Error> {
    decode_keeping(body, &Keep::All)
}

/// Which fields of an object to decode ([`decode_keeping`]): the others are skipped unread,
/// which for a pod's containers and volumes is most of its bytes.
#[derive(Debug)]
pub enum Keep {
    /// Every field, at every depth.
    All,
    /// Only these fields (by JSON name), each kept as its own [`Keep`] says.
    Only(&'static [(&'static str, Keep)]),
    /// Every field but these (by JSON name).
    AllBut(&'static [&'static str]),
}

impl Keep {
    /// What is kept of field `json`, or `None` when it is skipped.
    fn child(&self, json: &str) -> Option<&Keep> {
        match self {
            Keep::All => Some(&Keep::All),
            Keep::Only(fields) => fields.iter().find(|(n, _)| *n == json).map(|(_, k)| k),
            Keep::AllBut(names) => (!names.contains(&json)).then_some(&Keep::All),
        }
    }
}

/// [`decode`], keeping only the fields `keep` names of the object (`apiVersion` and `kind`
/// always).
///
/// # Errors
/// As [`decode`].
pub fn decode_keeping(body: &[u8], keep: &Keep) -> Result<Value, Error> {
    let raw = body
        .strip_prefix(MAGIC)
        .ok_or_else(|| bad("the protobuf body does not start with the Kubernetes magic number"))?;
    // Only the envelope's typeMeta: its `raw` (the object's bytes) is read below, not decoded
    // as a bytes field (which would base64-encode the whole object first).
    let envelope = decode_message(raw, UNKNOWN, &Keep::Only(&[("typeMeta", Keep::All)]))?;
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
    let mut obj = decode_message(&inner, &message, keep)?;
    if let Value::Object(m) = &mut obj {
        m.insert("apiVersion".into(), api_version.into());
        m.insert("kind".into(), kind.into());
    }
    Ok(obj)
}

fn decode_message(buf: &[u8], message: &str, keep: &Keep) -> Result<Value, Error> {
    let specs = schema().messages.get(message).map_or(&[][..], Vec::as_slice);
    let mut out = Map::new();
    for field in wire::fields(buf) {
        let field = field?;
        let Some(spec) = specs.iter().find(|s| s.number == field.number) else {
            continue; // a field newer than our schema: ignored, like an unknown JSON field
        };
        // A Go embedded struct's fields are the object's own: the same `keep` applies.
        let keep_field = if spec.kind == Kind::Inline {
            keep
        } else {
            match keep.child(&spec.json) {
                Some(k) => k,
                None => continue,
            }
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
                    Some(v) => scalar_or_message(&v, value_kind, spec.message.as_deref(), &Keep::All)?,
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
                if let Value::Object(inner) = decode_message(field.bytes()?, msg, keep_field)? {
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
                    scalar_or_message(&field, kind, spec.message.as_deref(), keep_field)?
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
    keep: &Keep,
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
        Kind::Message | Kind::Inline => {
            special_or_message(field.bytes()?, message.unwrap_or_default(), keep)?
        }
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
fn special_or_message(buf: &[u8], message: &str, keep: &Keep) -> Result<Option<Value>, Error> {
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
                &Keep::All,
            )?),
            None => Some(Value::Bool(wire::varint_field(buf, 1)?.unwrap_or(0) != 0)),
        },
        CRD_OR_ARRAY | CRD_OR_STRINGS => match wire::bytes_field(buf, 1)? {
            Some(schema) => Some(decode_message(
                &schema,
                &format!("{}JsonSchemaProps", crd_prefix()),
                &Keep::All,
            )?),
            None => {
                let mut items = Vec::new();
                for f in wire::fields(buf) {
                    let f = f?;
                    if f.number == 2 {
                        items.push(if message == CRD_OR_ARRAY {
                            decode_message(
                                f.bytes()?,
                                &format!("{}JsonSchemaProps", crd_prefix()),
                                &Keep::All,
                            )?
                        } else {
                            String::from_utf8_lossy(f.bytes()?).into_owned().into()
                        });
                    }
                }
                Some(Value::Array(items))
            }
        },
        _ => Some(decode_message(buf, message, keep)?),
    })
}

/// A duration as Go prints one (`1h2m3s`, `1.5s`, `0s`).
pub(crate) fn go_duration(nanos: i64) -> String {
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
