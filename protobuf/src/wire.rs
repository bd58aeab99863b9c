//! The protobuf wire format: varints, keys, length-delimited and fixed-width fields.

use crate::{Error, bad};

fn truncated() -> Error {
    bad("the protobuf body is truncated or malformed")
}

/// Read a varint at `pos`.
fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, Error> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos).ok_or_else(truncated)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(truncated())
}

/// One field of a message.
#[derive(Debug, Clone, Copy)]
pub(super) struct Field<'a> {
    /// The field number.
    pub(super) number: u32,
    /// 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32.
    pub(super) wire_type: u8,
    payload: Payload<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Payload<'a> {
    Varint(u64),
    Fixed(u64),
    Bytes(&'a [u8]),
}

impl<'a> Field<'a> {
    /// A length-delimited payload.
    pub(super) fn bytes(&self) -> Result<&'a [u8], Error> {
        match self.payload {
            Payload::Bytes(b) => Ok(b),
            _ => Err(bad(format!(
                "protobuf field {} is not length-delimited",
                self.number
            ))),
        }
    }

    /// A varint payload.
    pub(super) fn varint(&self) -> Result<u64, Error> {
        match self.payload {
            Payload::Varint(v) => Ok(v),
            _ => Err(bad(format!("protobuf field {} is not a varint", self.number))),
        }
    }

    /// A fixed-width payload.
    pub(super) fn fixed(&self) -> Result<u64, Error> {
        match self.payload {
            Payload::Fixed(v) => Ok(v),
            _ => Err(bad(format!("protobuf field {} is not fixed-width", self.number))),
        }
    }
}

/// The fields of a message, in order.
pub(super) fn fields(buf: &[u8]) -> impl Iterator<Item = Result<Field<'_>, Error>> {
    let mut pos = 0;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || pos >= buf.len() {
            return None;
        }
        let next = (|| {
            let key = varint(buf, &mut pos)?;
            let number = u32::try_from(key >> 3).map_err(|_| truncated())?;
            let wire_type = (key & 7) as u8;
            let payload = match wire_type {
                0 => Payload::Varint(varint(buf, &mut pos)?),
                1 => {
                    let b = buf.get(pos..pos + 8).ok_or_else(truncated)?;
                    pos += 8;
                    Payload::Fixed(u64::from_le_bytes(b.try_into().map_err(|_| truncated())?))
                }
                2 => {
                    let len = usize::try_from(varint(buf, &mut pos)?).map_err(|_| truncated())?;
                    let b = buf
                        .get(pos..pos.checked_add(len).ok_or_else(truncated)?)
                        .ok_or_else(truncated)?;
                    pos += len;
                    Payload::Bytes(b)
                }
                5 => {
                    let b = buf.get(pos..pos + 4).ok_or_else(truncated)?;
                    pos += 4;
                    Payload::Fixed(u64::from(u32::from_le_bytes(
                        b.try_into().map_err(|_| truncated())?,
                    )))
                }
                _ => return Err(truncated()),
            };
            Ok(Field {
                number,
                wire_type,
                payload,
            })
        })();
        failed = next.is_err();
        Some(next)
    })
}

/// The last length-delimited field `number` of a message.
pub(super) fn bytes_field(buf: &[u8], number: u32) -> Result<Option<Vec<u8>>, Error> {
    let mut found = None;
    for f in fields(buf) {
        let f = f?;
        if f.number == number {
            found = Some(f.bytes()?.to_vec());
        }
    }
    Ok(found)
}

/// The last varint field `number` of a message.
pub(super) fn varint_field(buf: &[u8], number: u32) -> Result<Option<u64>, Error> {
    let mut found = None;
    for f in fields(buf) {
        let f = f?;
        if f.number == number {
            found = Some(f.varint()?);
        }
    }
    Ok(found)
}

/// The values of a packed repeated scalar field.
pub(super) fn packed(buf: &[u8], fixed64: bool) -> Result<Vec<u64>, Error> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        if fixed64 {
            let b = buf.get(pos..pos + 8).ok_or_else(truncated)?;
            pos += 8;
            out.push(u64::from_le_bytes(b.try_into().map_err(|_| truncated())?));
        } else {
            out.push(varint(buf, &mut pos)?);
        }
    }
    Ok(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Append a length-delimited field.
pub(super) fn put_bytes(out: &mut Vec<u8>, number: u32, bytes: &[u8]) {
    put_varint(out, (u64::from(number) << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Append a varint field.
pub(super) fn put_varint_field(out: &mut Vec<u8>, number: u32, v: u64) {
    put_varint(out, u64::from(number) << 3);
    put_varint(out, v);
}

/// Append a fixed64 field.
pub(super) fn put_fixed64_field(out: &mut Vec<u8>, number: u32, v: u64) {
    put_varint(out, (u64::from(number) << 3) | 1);
    out.extend_from_slice(&v.to_le_bytes());
}
