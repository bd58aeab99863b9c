//! The pod watch in protobuf, as kube-controller-manager's informers watch: kube-apiserver
//! encodes each pod event once per encoding its watchers ask for, and in JSON (Go's reflective
//! `encoding/json`) that cost it about twice the CPU of protobuf in a 10,000-pod scale-up (the
//! scale bench's kube-apiserver profiles: 1.4 s of JSON encoding against 0.7 s of protobuf).
//!
//! kube's watcher reads JSON lines, so the client turns the stream back: a pod watch asks for
//! `application/vnd.kubernetes.protobuf;stream=watch` (JSON still accepted), and an answer in
//! protobuf has its frames decoded ([`slinky_protobuf::decode_watch_event`]) and handed on as the
//! JSON lines the watcher expects, with only the fields the pod cache keeps (the rest, most of a
//! pod's bytes, is skipped unread; see `reconcile::core::watch::slim`). A server that answers
//! JSON (a custom resource, an older or other server) is read as before. A stream that does not
//! decode ends the watch with the error (the watcher starts again), and pod watches go back to
//! JSON for the process's life, with a warning: a decoder gap never leaves the host blind.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use http_body_util::{BodyExt, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use slinky_protobuf::{Frames, Keep, decode_watch_event_keeping};
use tower::BoxError;

/// Whether pod watches ask for protobuf (off after a stream that did not decode).
static IN_PROTOBUF: AtomicBool = AtomicBool::new(true);

/// Watch events read in protobuf, in this process.
static EVENTS: AtomicU64 = AtomicU64::new(0);

/// How many watch events this process's clients have read in protobuf (and handed on as JSON).
pub fn events_in_protobuf() -> u64 {
    EVENTS.load(Ordering::Relaxed)
}

/// What a pod watch accepts: protobuf first, JSON as well.
const ACCEPT_WATCH: &str = "application/vnd.kubernetes.protobuf;stream=watch, application/json";

/// Whether `req` is a watch of pods that asks for JSON objects (not a metadata-only or Table
/// watch, which name their own `Accept`).
fn is_pod_watch<B>(req: &http::Request<B>) -> bool {
    let path = req.uri().path();
    req.method() == http::Method::GET
        && (path == "/api/v1/pods" || (path.starts_with("/api/v1/namespaces/") && path.ends_with("/pods")))
        && req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"))
        && req
            .headers()
            .get(ACCEPT)
            .is_none_or(|a| a.as_bytes() == b"application/json")
}

/// The request, asking for protobuf when it is a pod watch.
pub(super) fn ask<B>(mut req: http::Request<B>) -> http::Request<B> {
    if IN_PROTOBUF.load(Ordering::Relaxed) && is_pod_watch(&req) {
        req.headers_mut()
            .insert(ACCEPT, HeaderValue::from_static(ACCEPT_WATCH));
    }
    req
}

/// Whether a `Content-Type` is protobuf, and if so whether a watch stream (parameters compared
/// loosely: case and spaces aside).
fn protobuf_type(content_type: Option<&HeaderValue>) -> Option<bool> {
    let t = content_type?.to_str().ok()?.to_ascii_lowercase();
    let mut parts = t.split(';').map(str::trim);
    (parts.next()? == slinky_protobuf::MEDIA_TYPE)
        .then(|| parts.any(|p| p.replace(' ', "") == "stream=watch"))
}

/// The response, its protobuf watch stream turned into JSON lines, and an error answered in
/// protobuf (before a watch starts: a 403 of RBAC, a 400 of a bad selector) into its JSON
/// `Status`, which kube reads for the code and message.
pub(super) fn answer(res: http::Response<Incoming>) -> http::Response<UnsyncBoxBody<Bytes, BoxError>> {
    let kind = protobuf_type(res.headers().get(CONTENT_TYPE));
    let (mut parts, body) = res.into_parts();
    let body = match (kind, parts.status.is_success()) {
        (Some(true), true) => json_lines(body),
        (Some(_), false) => json_status(body),
        // JSON, and protobuf answers that succeeded (the pod creates' answers, which the host
        // asks for in protobuf and does not read): as they came.
        _ => return http::Response::from_parts(parts, body.map_err(BoxError::from).boxed_unsync()),
    };
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(http::header::CONTENT_LENGTH);
    http::Response::from_parts(parts, body)
}

/// A protobuf body (an error's `Status`) as its JSON form; one that does not decode as it came.
fn json_status(body: Incoming) -> UnsyncBoxBody<Bytes, BoxError> {
    let json = async move {
        let bytes = body.collect().await?.to_bytes();
        Ok::<_, BoxError>(Frame::data(match slinky_protobuf::decode(&bytes) {
            Ok(status) => Bytes::from(status.to_string()),
            Err(_) => bytes,
        }))
    };
    StreamBody::new(futures::stream::once(json)).boxed_unsync()
}

/// The watch events of a protobuf stream as JSON lines, a read's whole frames at a time.
fn json_lines(body: Incoming) -> UnsyncBoxBody<Bytes, BoxError> {
    let stream = futures::stream::unfold(Some((body, Frames::default())), |state| async move {
        let (mut body, mut frames) = state?;
        loop {
            match body.frame().await? {
                Ok(frame) => {
                    let Ok(data) = frame.into_data() else { continue };
                    frames.push(&data);
                    match lines(&mut frames) {
                        Ok(out) if out.is_empty() => {}
                        Ok(out) => return Some((Ok(Frame::data(Bytes::from(out))), Some((body, frames)))),
                        Err(e) => {
                            if IN_PROTOBUF.swap(false, Ordering::Relaxed) {
                                tracing::warn!(error = %e, "a pod watch in protobuf did not decode: pod watches are in JSON from now on");
                            }
                            return Some((Err(BoxError::from(e)), None));
                        }
                    }
                }
                Err(e) => return Some((Err(BoxError::from(e)), None)),
            }
        }
    });
    StreamBody::new(stream).boxed_unsync()
}

/// What is read of each object: of a pod, what the host's pod cache keeps (the pod watches
/// through this client are the cache's); of anything else (an `ERROR`'s Status), all of it.
fn kept(kind: &str) -> &'static Keep {
    if kind == "Pod" {
        &crate::reconcile::core::watch::slim::KEPT
    } else {
        &Keep::All
    }
}

/// Each whole frame in `frames` as a JSON line `{"type":…,"object":…}`.
fn lines(frames: &mut Frames) -> Result<Vec<u8>, slinky_protobuf::Error> {
    let mut out = Vec::new();
    while let Some(message) = frames.next_message()? {
        let (kind, object) = decode_watch_event_keeping(&message, kept)?;
        out.extend_from_slice(b"{\"type\":");
        out.extend_from_slice(serde_json::Value::String(kind).to_string().as_bytes());
        out.extend_from_slice(b",\"object\":");
        out.extend_from_slice(object.to_string().as_bytes());
        out.extend_from_slice(b"}\n");
        EVENTS.fetch_add(1, Ordering::Relaxed);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protobuf_answers_are_known_whatever_their_spacing() {
        let t = |s: &'static str| protobuf_type(Some(&HeaderValue::from_static(s)));
        assert_eq!(t("application/vnd.kubernetes.protobuf;stream=watch"), Some(true));
        assert_eq!(t("application/vnd.kubernetes.protobuf; stream=watch"), Some(true));
        assert_eq!(
            t("Application/VND.Kubernetes.Protobuf; Stream = Watch"),
            Some(true)
        );
        assert_eq!(t("application/vnd.kubernetes.protobuf"), Some(false));
        assert_eq!(t("application/json"), None);
        assert_eq!(protobuf_type(None), None);
    }

    #[test]
    fn only_a_pod_watch_of_whole_objects_asks_for_protobuf() {
        let req = |uri: &str, accept: Option<&str>| {
            let mut b = http::Request::get(uri);
            if let Some(a) = accept {
                b = b.header(ACCEPT, a);
            }
            b.body(()).unwrap_or_default()
        };
        for (uri, accept, want) in [
            ("/api/v1/pods?watch=true&resourceVersion=5", None, true),
            (
                "/api/v1/namespaces/slurm/pods?allowWatchBookmarks=true&watch=true",
                Some("application/json"),
                true,
            ),
            ("/api/v1/namespaces/slurm/pods?watch=1", None, true),
            ("/api/v1/namespaces/slurm/pods", None, false),
            ("/api/v1/namespaces/slurm/pods/x?watch=true", None, false),
            ("/api/v1/namespaces/slurm/configmaps?watch=true", None, false),
            (
                "/api/v1/pods?watch=true",
                Some("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
                false,
            ),
        ] {
            assert_eq!(is_pod_watch(&req(uri, accept)), want, "{uri} {accept:?}");
        }
    }

    #[test]
    fn frames_become_the_json_lines_of_the_same_events_with_the_kept_fields() -> anyhow::Result<()> {
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "n", "resourceVersion": "9", "labels": {"a": "b"}},
            "spec": {"nodeName": "w", "containers": [{"name": "c", "image": "x:1"}]},
            "status": {"phase": "Running"}});
        let mut frames = Frames::default();
        for kind in ["ADDED", "MODIFIED"] {
            frames.push(&slinky_protobuf::encode_watch_event(kind, &pod).unwrap_or_default());
        }
        let out = lines(&mut frames)?;
        // What the pod cache keeps of it (`slim::KEPT`): no containers.
        let mut pod = pod;
        pod["spec"].as_object_mut().map(|s| s.remove("containers"));
        let events: Vec<serde_json::Value> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(serde_json::from_slice)
            .collect::<Result<_, _>>()?;
        assert_eq!(
            events,
            [
                serde_json::json!({"type": "ADDED", "object": pod}),
                serde_json::json!({"type": "MODIFIED", "object": pod})
            ]
        );
        Ok(())
    }
}
