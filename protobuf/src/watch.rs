//! Watch streams in protobuf (`application/vnd.kubernetes.protobuf;stream=watch`), as
//! kube-apiserver writes them to kube-controller-manager's informers: each event is a frame, a
//! 4-byte big-endian length and a `meta.v1.WatchEvent` message in the raw encoding (no magic, no
//! envelope): `type` (1) and `object` (2), a `RawExtension` whose `raw` (1) is the object in the
//! full encoding of [`crate::encode`] (magic and `runtime.Unknown` envelope).

use serde_json::Value;

use super::{Error, bad, wire};

/// The media type of a watch stream in protobuf.
pub const WATCH_MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// One framed watch event: `kind` (`ADDED`, `MODIFIED`, `DELETED`, `BOOKMARK`, `ERROR`) of
/// `obj`, or `None` when `obj`'s kind has no protobuf form.
pub fn encode_watch_event(kind: &str, obj: &Value) -> Option<Vec<u8>> {
    let raw = super::encode(obj)?;
    let mut extension = Vec::new();
    wire::put_bytes(&mut extension, 1, &raw);
    let mut event = Vec::new();
    wire::put_bytes(&mut event, 1, kind.as_bytes());
    wire::put_bytes(&mut event, 2, &extension);
    let len = u32::try_from(event.len()).ok()?;
    let mut frame = len.to_be_bytes().to_vec();
    frame.extend(event);
    Some(frame)
}

/// A watch event's type and object (JSON form), from one frame's message (without its length).
///
/// Go writes every non-pointer field in protobuf, zeros included, where its JSON leaves
/// `omitempty` ones out: such a field decodes as `0` or `false` (`generation: 0`,
/// `hostNetwork: false`), which Kubernetes reads as the same object. The wire cannot tell them
/// from a pointer field set to zero (`automountServiceAccountToken: false`, `runAsUser: 0`),
/// which must stay, so none is dropped.
///
/// # Errors
/// 400 when the message or its object does not decode; 415 for an object of a kind without a
/// schema here.
pub fn decode_watch_event(message: &[u8]) -> Result<(String, Value), Error> {
    decode_watch_event_keeping(message, |_| &super::Keep::All)
}

/// [`decode_watch_event`], keeping of the object what `keep` says for its kind (`ERROR`
/// events carry a `Status`, bookmarks the watched kind).
///
/// # Errors
/// As [`decode_watch_event`].
pub fn decode_watch_event_keeping(
    message: &[u8],
    keep: impl Fn(&str) -> &'static super::Keep,
) -> Result<(String, Value), Error> {
    let kind = wire::bytes_field(message, 1)?.unwrap_or_default();
    let kind = String::from_utf8(kind).map_err(|_| bad("a watch event's type is not UTF-8"))?;
    let extension = wire::bytes_field(message, 2)?.unwrap_or_default();
    let raw = wire::bytes_field(&extension, 1)?.unwrap_or_default();
    let object_kind = kind_of(&raw)?;
    Ok((kind, super::decode_keeping(&raw, keep(&object_kind))?))
}

/// The frames of a watch stream as its bytes arrive: [`Frames::push`] the bytes read, then take
/// each whole frame's message with [`Frames::next_message`].
#[derive(Debug, Default)]
pub struct Frames {
    buf: Vec<u8>,
    start: usize,
}

/// Frames larger than this are refused (kube-apiserver's own objects are at most ~1.5 MiB in etcd;
/// a length beyond it is a broken stream, not an object to buffer).
const MAX_FRAME: usize = 64 << 20;

impl Frames {
    /// Append bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame's message, `Ok(None)` until one has arrived whole.
    ///
    /// # Errors
    /// A frame longer than 64 MiB: the stream is broken.
    pub fn next_message(&mut self) -> Result<Option<Vec<u8>>, Error> {
        let rest = &self.buf[self.start..];
        let Some(len) = rest.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        if len > MAX_FRAME {
            return Err(bad(format!("a watch frame of {len} bytes: the stream is broken")));
        }
        let Some(message) = rest.get(4..4 + len) else {
            return Ok(None);
        };
        let message = message.to_vec();
        self.start += 4 + len;
        if self.start > self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        Ok(Some(message))
    }

    /// Whether bytes of an unfinished frame are held (a stream that ends here was cut).
    pub fn is_partial(&self) -> bool {
        self.start < self.buf.len()
    }
}

/// The `kind` of an encoded object (its envelope's `typeMeta`), without decoding the object.
fn kind_of(raw: &[u8]) -> Result<String, Error> {
    let envelope = raw.strip_prefix(super::MAGIC).unwrap_or(raw);
    let type_meta = wire::bytes_field(envelope, 1)?.unwrap_or_default();
    let kind = wire::bytes_field(&type_meta, 2)?.unwrap_or_default();
    Ok(String::from_utf8_lossy(&kind).into_owned())
}
