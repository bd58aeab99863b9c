//! Watches: events from a resourceVersion (or synthetic ADDED for what exists), selections
//! entering and leaving as ADDED/DELETED, bookmarks, timeouts, `410 Expired` past the window.

use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::{
    Response,
    body::Frame,
    header::{self, HeaderValue},
};
use serde_json::{Value, json};

use super::{
    Body,
    list::{filters, to_table},
};
use crate::{
    ApiError, FieldSelector, LabelSelector, Shared,
    resources::{ResKey, ResourceType},
    store::{Event, EventKind},
};

fn watch_line(kind: &str, obj: Value) -> Bytes {
    let mut line = json!({"type": kind, "object": obj}).to_string();
    line.push('\n');
    Bytes::from(line)
}

pub(super) fn watch(
    shared: Arc<Shared>,
    rt: ResourceType,
    ns: String,
    query: &HashMap<String, String>,
    table: bool,
    protobuf_wanted: bool,
) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = filters(&rt, query)?;
    // In protobuf (as kube-apiserver streams to informers) when the client prefers it and the
    // kind has a protobuf form; custom resources and Tables stream JSON.
    let protobuf = protobuf_wanted
        && !table
        && crate::protobuf::encode(&json!({"apiVersion": rt.api_version(), "kind": rt.kind})).is_some();
    let params = Params::of(query)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let forced_gone = shared.faults.take_gone(&rt.plural);
    let watcher = Watcher {
        key: rt.key(),
        shared,
        rt,
        ns,
        labels,
        fields,
        table,
        protobuf,
        tx,
    };
    tokio::spawn(watcher.run(params, forced_gone));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    let media_type = if protobuf {
        crate::protobuf::WATCH_MEDIA_TYPE
    } else {
        "application/json"
    };
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    r.headers_mut()
        .insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    Ok(r)
}

/// A watch request's options.
struct Params {
    /// `allowWatchBookmarks`.
    bookmarks: bool,
    /// `timeoutSeconds`.
    timeout: Option<Duration>,
    /// `resourceVersion` to start after (`None`: start at the most recent).
    rv: Option<u64>,
}

impl Params {
    fn of(query: &HashMap<String, String>) -> Result<Self, ApiError> {
        if matches!(query.get("sendInitialEvents").map(String::as_str), Some("true")) {
            return Err(ApiError::new(
                422,
                "Invalid",
                "sendInitialEvents (streaming lists) is not supported; list, then watch",
            ));
        }
        let bookmarks = matches!(
            query.get("allowWatchBookmarks").map(String::as_str),
            Some("true" | "1")
        );
        let timeout = query
            .get("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .map(Duration::from_secs);
        let rv: Option<u64> = match query
            .get("resourceVersion")
            .filter(|r| !r.is_empty() && *r != "0")
        {
            Some(r) => Some(
                r.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {r:?}")))?,
            ),
            None => None,
        };
        Ok(Params {
            bookmarks,
            timeout,
            rv,
        })
    }
}

/// One watch stream: what it selects and where its lines go.
struct Watcher {
    shared: Arc<Shared>,
    rt: ResourceType,
    key: ResKey,
    /// The namespace (`""`: all).
    ns: String,
    labels: LabelSelector,
    fields: FieldSelector,
    /// Objects as Table rows.
    table: bool,
    /// Events as protobuf frames ([`crate::protobuf::encode_watch_event`]), not JSON lines.
    protobuf: bool,
    tx: tokio::sync::mpsc::Sender<Bytes>,
}

/// The client went away.
struct Closed;

impl Watcher {
    /// Whether the watch selects `o`.
    fn matches(&self, o: &Value) -> bool {
        (self.ns.is_empty() || o["metadata"]["namespace"].as_str() == Some(self.ns.as_str()))
            && self.labels.matches(o)
            && self.fields.matches(o)
    }

    /// `o` as the client asked for it.
    fn render(&self, o: &Value) -> Value {
        if self.table {
            to_table(&self.rt, &[Arc::new(o.clone())], 0)
        } else {
            o.clone()
        }
    }

    /// One event in the stream's encoding.
    fn event(&self, kind: &str, obj: Value) -> Bytes {
        if self.protobuf
            && let Some(frame) = crate::protobuf::encode_watch_event(kind, &obj)
        {
            return Bytes::from(frame);
        }
        watch_line(kind, obj)
    }

    async fn send(&self, line: Bytes) -> Result<(), Closed> {
        self.tx.send(line).await.map_err(|_| Closed)
    }

    async fn send_gone(&self, rev: u64) {
        let status = ApiError::gone(format!("too old resource version: {rev}")).status();
        let _ = self.send(self.event("ERROR", status)).await;
    }

    /// Stream events until the client goes, the timeout passes or the watches are closed.
    async fn run(self, params: Params, forced_gone: bool) {
        let mut revs = self.shared.store.subscribe();
        let mut closer = self.shared.faults.watch_closer();
        let deadline = params.timeout.map(|t| tokio::time::Instant::now() + t);
        let mut pos = match params.rv {
            Some(rev) => rev,
            None => match self.send_existing().await {
                Some(rev) => rev,
                None => return,
            },
        };
        if forced_gone {
            self.send_gone(pos).await;
            return;
        }
        loop {
            let Ok((events, current)) = self.shared.store.events_since(&self.key, pos) else {
                self.send_gone(pos).await;
                return;
            };
            if self.send_events(events, &mut pos, &mut closer).await.is_err() {
                return;
            }
            pos = pos.max(current);
            let sleep_until =
                deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                changed = revs.changed() => if changed.is_err() { return },
                _ = closer.changed() => return,
                _ = tokio::time::sleep_until(sleep_until) => return,
                _ = tokio::time::sleep(Duration::from_secs(5)), if params.bookmarks => {
                    let bm = json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(),
                                    "metadata": {"resourceVersion": pos.to_string()}});
                    if self.send(self.event("BOOKMARK", bm)).await.is_err() {
                        return;
                    }
                }
                _ = self.tx.closed() => return,
            }
        }
    }

    /// Start at the most recent: synthetic ADDED for what exists. Returns the revision listed,
    /// or `None` when the list failed or the client went away.
    async fn send_existing(&self) -> Option<u64> {
        let filter = |o: &Value| self.matches(o);
        let (items, rev, _) = self.shared.store.list(&self.key, "", &filter, None, 0).ok()?;
        for item in items {
            self.send(self.event("ADDED", self.render(&item))).await.ok()?;
        }
        Some(rev)
    }

    /// Send the events the watch selects (objects entering or leaving the selection as ADDED or
    /// DELETED), moving `pos` past each. Closing the watches (`closer`) ends a held watch.
    async fn send_events(
        &self,
        events: Vec<Event>,
        pos: &mut u64,
        closer: &mut tokio::sync::watch::Receiver<u64>,
    ) -> Result<(), Closed> {
        let delay = self.shared.faults.watch_delay();
        for e in events {
            let now_in = self.matches(&e.obj);
            let was_in = e.prev.as_ref().is_some_and(|p| self.matches(p));
            let kind = match (e.kind, was_in, now_in) {
                (EventKind::Modified, false, true) if e.prev.is_some() => Some("ADDED"),
                (EventKind::Modified, true, false) => Some("DELETED"),
                (k, _, true) => Some(k.as_str()),
                _ => None,
            };
            *pos = e.rev;
            if let Some(kind) = kind {
                tokio::select! {
                    () = self.shared.faults.while_held(&self.rt.plural) => {}
                    _ = closer.changed() => return Err(Closed),
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                let line = if self.table || self.protobuf {
                    self.event(kind, self.render(&e.obj))
                } else {
                    let json = e.json.get_or_init(|| e.obj.to_string());
                    Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{json}}}\n"))
                };
                self.send(line).await?;
            }
        }
        Ok(())
    }
}
