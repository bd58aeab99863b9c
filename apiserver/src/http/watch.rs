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
use crate::{ApiError, Shared, resources::ResourceType, store::EventKind};

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
) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = filters(&rt, query)?;
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
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let key = rt.key();
    let forced_gone = shared.faults.take_gone();
    tokio::spawn(async move {
        let matches = |o: &Value| {
            (ns.is_empty() || o["metadata"]["namespace"].as_str() == Some(ns.as_str()))
                && labels.matches(o)
                && fields.matches(o)
        };
        let render = |o: &Value| {
            if table {
                to_table(&rt, &[Arc::new(o.clone())], 0)
            } else {
                o.clone()
            }
        };
        let gone = |rev: u64| {
            watch_line(
                "ERROR",
                ApiError::gone(format!("too old resource version: {rev}")).status(),
            )
        };
        let mut revs = shared.store.subscribe();
        let mut closer = shared.faults.watch_closer();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        let mut pos = match rv {
            Some(rev) => rev,
            None => {
                // Start at the most recent: synthetic ADDED for what exists, then changes.
                let filter = |o: &Value| matches(o);
                let Ok((items, rev, _)) = shared.store.list(&key, "", &filter, None, 0) else {
                    return;
                };
                for item in items {
                    if tx.send(watch_line("ADDED", render(&item))).await.is_err() {
                        return;
                    }
                }
                rev
            }
        };
        if forced_gone {
            let _ = tx.send(gone(pos)).await;
            return;
        }
        loop {
            let (events, current) = match shared.store.events_since(&key, pos) {
                Ok(x) => x,
                Err(_) => {
                    let _ = tx.send(gone(pos)).await;
                    return;
                }
            };
            let delay = shared.faults.watch_delay();
            for e in events {
                let now_in = matches(&e.obj);
                let was_in = e.prev.as_ref().is_some_and(|p| matches(p));
                let kind = match (e.kind, was_in, now_in) {
                    (EventKind::Modified, false, true) if e.prev.is_some() => Some("ADDED"),
                    (EventKind::Modified, true, false) => Some("DELETED"),
                    (k, _, true) => Some(k.as_str()),
                    _ => None,
                };
                pos = e.rev;
                if let Some(kind) = kind {
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    let line = if table {
                        watch_line(kind, render(&e.obj))
                    } else {
                        let json = e.json.get_or_init(|| e.obj.to_string());
                        Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{json}}}\n"))
                    };
                    if tx.send(line).await.is_err() {
                        return;
                    }
                }
            }
            pos = pos.max(current);
            let sleep_until =
                deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                changed = revs.changed() => if changed.is_err() { return },
                _ = closer.changed() => return,
                _ = tokio::time::sleep_until(sleep_until) => return,
                _ = tokio::time::sleep(Duration::from_secs(5)), if bookmarks => {
                    let bm = json!({"kind": rt.kind, "apiVersion": rt.api_version(),
                                    "metadata": {"resourceVersion": pos.to_string()}});
                    if tx.send(watch_line("BOOKMARK", bm)).await.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed());
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut()
        .insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    Ok(r)
}
