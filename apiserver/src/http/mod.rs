//! The HTTP side: TLS connections, bearer-token auth, routing; discovery and OpenAPI
//! ([`discovery`]), request and response bodies ([`body`]), the verbs ([`verbs`]), lists and tables
//! ([`list`]), watches ([`watch`]) and the scale subresource ([`scale`]).

mod body;
mod discovery;
mod list;
mod scale;
mod verbs;
mod watch;

use std::{collections::HashMap, convert::Infallible, sync::Arc};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::{
    Request, Response, StatusCode,
    body::Incoming,
    header::{self, HeaderValue},
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch as signal};

use crate::{ApiError, Shared};
use discovery::{group_list, openapi_gv, openapi_root, resource_list, version};
use verbs::{Verb, serve_resource};

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// The largest request body accepted (like the real API server's 3 MiB).
pub(crate) const MAX_BODY: usize = 3 << 20;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: signal::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.changed() => return,
        };
        let (stream, _) = match accepted {
            Ok(s) => s,
            Err(error) => {
                tracing::warn!(%error, "embedded API server: accept failed");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            match shared.tls.as_ref().map(|t| t.acceptor.clone()) {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(tls) => connection(TokioIo::new(tls), shared, stop).await,
                    Err(error) => tracing::debug!(%error, "embedded API server: TLS handshake failed"),
                },
                None => connection(TokioIo::new(stream), shared, stop).await,
            }
        });
    }
}

async fn connection<I>(io: I, shared: Arc<Shared>, mut stop: signal::Receiver<bool>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(handle(shared, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = stop.changed() => conn.as_mut().graceful_shutdown(),
    }
}

pub(crate) fn full(code: StatusCode, body: Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

pub(crate) fn error(e: &ApiError) -> Response<Body> {
    error_in(e, false)
}

/// The Status of `e`, in protobuf when `protobuf_wanted`.
fn error_in(e: &ApiError, protobuf_wanted: bool) -> Response<Body> {
    let mut r = body::respond(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        e.status(),
        protobuf_wanted,
    );
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// kube-apiserver's answer for a path of a group it does not serve (no CRD of that group is
/// installed): its mux's plain-text 404, not a Status.
fn page_not_found() -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(b"404 page not found\n")).boxed());
    *r.status_mut() = StatusCode::NOT_FOUND;
    let headers = r.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    r
}

/// kube-apiserver's Status for an unknown version or resource of a group it serves.
fn not_found_resource() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// Whether any served type is of API group `group`.
fn group_served(shared: &Shared, group: &str) -> bool {
    shared.store.serves_group(group)
}

fn text(body: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// A parsed resource request path.
#[derive(Debug, Default)]
pub(crate) struct Target {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) namespace: String,
    pub(crate) plural: String,
    pub(crate) name: Option<String>,
    pub(crate) sub: Option<String>,
}

fn parse_target(segs: &[&str]) -> Option<Target> {
    let (group, version, rest) = match segs {
        ["api", v, rest @ ..] => (String::new(), v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (g.to_string(), v.to_string(), rest),
        _ => return None,
    };
    let mut t = Target {
        group,
        version,
        ..Default::default()
    };
    match rest {
        ["namespaces", ns, plural, tail @ ..] if !matches!(*plural, "status" | "finalize") => {
            t.namespace = ns.to_string();
            t.plural = plural.to_string();
            t.name = tail.first().map(|s| s.to_string());
            t.sub = tail.get(1).map(|s| s.to_string());
            if tail.len() > 2 {
                return None;
            }
        }
        [plural, tail @ ..] => {
            t.plural = plural.to_string();
            t.name = tail.first().map(|s| s.to_string());
            t.sub = tail.get(1).map(|s| s.to_string());
            if tail.len() > 2 {
                return None;
            }
        }
        [] => return None,
    }
    Some(t)
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if matches!(path.as_str(), "/healthz" | "/readyz" | "/livez") {
        return text("ok");
    }
    let authorized = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == shared.token);
    if !authorized {
        return error(&ApiError::new(401, "Unauthorized", "Unauthorized"));
    }
    let latency = shared.faults.latency();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let query: HashMap<String, String> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => return full(StatusCode::OK, version()),
        ["api"] => {
            return full(
                StatusCode::OK,
                json!({"kind": "APIVersions", "versions": ["v1"],
                       "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}]}),
            );
        }
        ["apis"] => return full(StatusCode::OK, group_list(&shared)),
        ["api", "v1"] => return full(StatusCode::OK, resource_list(&shared, "", "v1")),
        ["apis", g, ..] if !group_served(&shared, g) => return page_not_found(),
        ["apis", g] => {
            let groups = group_list(&shared);
            let group = groups["groups"]
                .as_array()
                .and_then(|gs| gs.iter().find(|x| x["name"] == *g))
                .cloned()
                .unwrap_or_default();
            let mut group = group;
            group["kind"] = "APIGroup".into();
            group["apiVersion"] = "v1".into();
            return full(StatusCode::OK, group);
        }
        ["apis", g, v] => {
            let list = resource_list(&shared, g, v);
            if list["resources"].as_array().is_some_and(|r| r.is_empty()) {
                return error(&not_found_resource());
            }
            return full(StatusCode::OK, list);
        }
        ["openapi", "v3"] => return full(StatusCode::OK, openapi_root(&shared)),
        ["openapi", "v3", rest @ ..] => {
            let gv = rest.join("/");
            return match openapi_gv(&shared, &gv) {
                Some(doc) => full(StatusCode::OK, doc),
                None => error(&ApiError::new(
                    404,
                    "NotFound",
                    format!("no OpenAPI document for {gv}"),
                )),
            };
        }
        ["openapi", "v2"] => {
            let wants = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|a| a.contains("application/com.github.proto-openapi.spec.v2"));
            let (media, bytes) = discovery::openapi_v2(wants);
            let mut r = Response::new(Full::new(Bytes::from(bytes)).boxed());
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
            return r;
        }
        ["openapi", ..] => {
            return error(&ApiError::new(
                404,
                "NotFound",
                "the embedded API server publishes OpenAPI v2 (without schemas) and v3 only",
            ));
        }
        _ => {}
    }
    let Some(target) = parse_target(&segs) else {
        return error(&not_found_resource());
    };
    record(&shared, &req, &target, &query);
    let Some(rt) = shared
        .store
        .find_type(&target.group, &target.version, &target.plural)
    else {
        return error(&not_found_resource());
    };
    // An error answers in protobuf to a client that prefers it, as kube-apiserver's do.
    let pb = body::wants_protobuf(req.headers());
    match serve_resource(&shared, req, &rt, target, &query).await {
        Ok(r) => r,
        Err(e) if pb => error_in(&e, true),
        Err(e) => error(&e),
    }
}

/// Remember the kind of request for [`super::ApiServer::audit`].
fn record(shared: &Shared, req: &Request<Incoming>, target: &Target, query: &HashMap<String, String>) {
    let verb = Verb::of(req.method(), target.name.is_some(), query);
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .unwrap_or("unknown")
        .to_string();
    let resource = match &target.sub {
        Some(sub) => format!("{}/{sub}", target.plural),
        None => target.plural.clone(),
    };
    if let Ok(mut audit) = shared.audit.lock() {
        audit.insert(crate::AuditRecord {
            user_agent,
            verb: verb.map_or_else(
                || req.method().as_str().to_lowercase(),
                |v| v.as_str().to_string(),
            ),
            group: target.group.clone(),
            resource,
        });
    }
}
