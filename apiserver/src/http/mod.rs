//! The HTTP side: routing, auth, discovery, verbs, watch streams, tables, fault injection.

use std::{collections::HashMap, convert::Infallible, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Frame, Incoming},
    header::{self, HeaderValue},
    service::service_fn,
};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::{net::TcpListener, sync::watch};

use super::{
    ApiError, FaultError, Shared, patch,
    resources::ResourceType,
    selectors::{FieldSelector, LabelSelector},
    store::{DeleteOpts, EventKind, Op, Sub},
};

type Body = BoxBody<Bytes, Infallible>;

/// The largest request body accepted (like the real API server's 3 MiB).
const MAX_BODY: usize = 3 << 20;

pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
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

async fn connection<I>(io: I, shared: Arc<Shared>, mut stop: watch::Receiver<bool>)
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

fn full(code: StatusCode, body: Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error(e: &ApiError) -> Response<Body> {
    let mut r = full(
        StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        e.status(),
    );
    if let Some(secs) = e.retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

fn text(body: &'static str) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())).boxed());
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// A parsed resource request path.
#[derive(Debug, Default)]
struct Target {
    group: String,
    version: String,
    namespace: String,
    plural: String,
    name: Option<String>,
    sub: Option<String>,
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
        ["apis", g, v] => {
            let list = resource_list(&shared, g, v);
            if list["resources"].as_array().is_some_and(|r| r.is_empty()) {
                return error(&ApiError::new(
                    404,
                    "NotFound",
                    format!("the server could not find the requested resource ({g}/{v})"),
                ));
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
        ["openapi", ..] => {
            return error(&ApiError::new(
                404,
                "NotFound",
                "the embedded API server publishes OpenAPI v3 only",
            ));
        }
        _ => {}
    }
    let Some(target) = parse_target(&segs) else {
        return error(&ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        ));
    };
    record(&shared, &req, &target, &query);
    let Some(rt) = shared
        .store
        .find_type(&target.group, &target.version, &target.plural)
    else {
        return error(&ApiError::new(
            404,
            "NotFound",
            format!(
                "the server could not find the requested resource ({}/{} {})",
                target.group, target.version, target.plural
            ),
        ));
    };
    match serve_resource(&shared, req, &rt, target, &query).await {
        Ok(r) => r,
        Err(e) => error(&e),
    }
}

/// Remember the kind of request for [`super::ApiServer::audit`].
fn record(shared: &Shared, req: &Request<Incoming>, target: &Target, query: &HashMap<String, String>) {
    let watch = query.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = match (req.method().as_str(), target.name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (other, _) => other,
    };
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
        audit.insert(super::AuditRecord {
            user_agent,
            verb: verb.to_lowercase(),
            group: target.group.clone(),
            resource,
        });
    }
}

fn version() -> Value {
    json!({"major": "1", "minor": "32", "gitVersion": "v1.32.0+slinky-embedded", "gitCommit": "embedded",
           "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "n/a",
           "compiler": "rustc", "platform": "linux/amd64"})
}

fn group_list(shared: &Shared) -> Value {
    let mut groups: Vec<(String, String)> = shared
        .store
        .types()
        .into_iter()
        .filter(|t| !t.group.is_empty())
        .map(|t| (t.group, t.version))
        .collect();
    groups.sort();
    groups.dedup();
    let groups: Vec<Value> = groups
        .iter()
        .map(|(g, v)| {
            let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
            json!({"name": g, "versions": [gv], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(shared: &Shared, group: &str, version: &str) -> Value {
    let resources: Vec<Value> = shared
        .store
        .types()
        .into_iter()
        .filter(|t| t.group == group && t.version == version)
        .flat_map(|t| t.discovery())
        .collect();
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// `/openapi/v3`: one document per group-version.
fn openapi_root(shared: &Shared) -> Value {
    let mut paths = serde_json::Map::new();
    let rev = shared.store.revision();
    for t in shared.store.types() {
        let gv = if t.group.is_empty() {
            format!("api/{}", t.version)
        } else {
            format!("apis/{}/{}", t.group, t.version)
        };
        paths.insert(
            gv.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash={rev:016X}")}),
        );
    }
    json!({"paths": paths})
}

/// A minimal OpenAPI v3 document for a group-version: the PATCH operations with their GVK and
/// the `fieldValidation` parameter, which is what kubectl checks before it sends objects for
/// server-side validation. No schemas are published.
fn openapi_gv(shared: &Shared, gv: &str) -> Option<Value> {
    let (group, version) = match gv.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    let types: Vec<ResourceType> = shared
        .store
        .types()
        .into_iter()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if types.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for t in types {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if t.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", t.plural)
        } else {
            format!("{prefix}/{}/{{name}}", t.plural)
        };
        let param = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string"}});
        let op = json!({
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": t.kind},
            "x-kubernetes-action": "patch",
            "parameters": [param("dryRun"), param("fieldManager"), param("fieldValidation"), param("force")],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(path, json!({"patch": op}));
    }
    Some(
        json!({"openapi": "3.0.0", "info": {"title": "Kubernetes (slinky-host embedded)", "version": "v1.32.0"},
                "paths": paths, "components": {"schemas": {}}}),
    )
}

fn fault_error(e: FaultError, rt: &ResourceType, name: &str) -> ApiError {
    match e {
        FaultError::Conflict => ApiError::conflict(rt, name),
        FaultError::Internal => {
            ApiError::new(500, "InternalError", "Internal error occurred: injected fault")
        }
        FaultError::TooManyRequests(s) => {
            let mut e = ApiError::new(
                429,
                "TooManyRequests",
                "the server has received too many requests and has asked us to try again later",
            );
            e.retry_after = Some(s);
            e
        }
        FaultError::Timeout => ApiError::new(
            504,
            "Timeout",
            "Timeout: request did not complete within the allowed duration",
        ),
    }
}

fn manager_of(req_headers: &hyper::HeaderMap, query: &HashMap<String, String>) -> String {
    if let Some(m) = query.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.clone();
    }
    let ua = req_headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("unknown");
    ua.split('/').next().unwrap_or("unknown").to_string()
}

async fn read_body(req: Request<Incoming>) -> Result<(hyper::HeaderMap, Bytes), ApiError> {
    let (parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, MAX_BODY);
    let bytes = limited
        .collect()
        .await
        .map_err(|e| {
            ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("cannot read the request body: {e}"),
            )
        })?
        .to_bytes();
    Ok((parts.headers, bytes))
}

/// Refuse bodies that aren't JSON (kubectl's typed clients try protobuf first).
fn require_json(headers: &hyper::HeaderMap) -> Result<(), ApiError> {
    let ctype = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if ctype.starts_with("application/json") || ctype.starts_with("application/yaml") || ctype.is_empty() {
        Ok(())
    } else {
        Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!("the body content type {ctype:?} is not supported: send application/json"),
        ))
    }
}

fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

fn wants_table(headers: &hyper::HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

async fn serve_resource(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    rt: &ResourceType,
    target: Target,
    query: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let key = rt.key();
    let ns = if rt.namespaced {
        target.namespace.clone()
    } else {
        String::new()
    };
    if rt.namespaced && target.name.is_some() && ns.is_empty() {
        return Err(ApiError::new(
            404,
            "NotFound",
            "a namespaced object needs a namespace in the path",
        ));
    }
    let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = match (req.method().clone(), &target.name) {
        (Method::GET, None) if is_watch => "watch",
        (Method::GET, None) => "list",
        (Method::GET, Some(_)) => "get",
        (Method::POST, None) => "create",
        (Method::PUT, Some(_)) => "update",
        (Method::PATCH, Some(_)) => "patch",
        (Method::DELETE, Some(_)) => "delete",
        (Method::DELETE, None) => "deletecollection",
        (m, _) => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{m} is not supported on this path"),
            ));
        }
    };
    let sub = match target.sub.as_deref() {
        None => None,
        Some("status") if rt.status => Some("status"),
        Some("scale") if rt.scale.is_some() => Some("scale"),
        Some(other) => {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("{} has no subresource {other:?}", rt.qualified()),
            ));
        }
    };
    let fault_res = match sub {
        Some(s) => format!("{}/{s}", rt.plural),
        None => rt.plural.clone(),
    };
    let name = target.name.clone().unwrap_or_default();
    let decision = shared.faults.decide(verb, &fault_res);
    if let Some(d) = decision
        && !d.after
    {
        return Err(fault_error(d.error, rt, &name));
    }
    let table = wants_table(req.headers());
    let manager = manager_of(req.headers(), query);
    let dry_run = query.contains_key("dryRun");
    let store = &shared.store;
    let response = match verb {
        "watch" => return watch(shared.clone(), rt.clone(), ns, query, table),
        "list" => list(shared, rt, &ns, query, table)?,
        "get" => {
            let obj = store.get(&key, &ns, &name)?;
            match sub {
                Some("scale") => full(StatusCode::OK, to_scale(rt, &obj)),
                _ if table => full(StatusCode::OK, to_table(rt, &[obj], store.revision())),
                _ => full(StatusCode::OK, (*obj).clone()),
            }
        }
        "create" => {
            let (headers, body) = read_body(req).await?;
            require_json(&headers)?;
            let obj = parse_json(&body)?;
            let created = store.create(&key, &ns, obj, &manager, dry_run)?;
            full(StatusCode::CREATED, (*created).clone())
        }
        "update" => {
            let (headers, body) = read_body(req).await?;
            require_json(&headers)?;
            let obj = parse_json(&body)?;
            let updated = match sub {
                Some("scale") => write_scale(store, rt, &ns, &name, &manager, |_| Ok(obj))?,
                Some(_) => store.update(&key, &ns, &name, obj, Sub::Status, &manager)?,
                None => store.update(&key, &ns, &name, obj, Sub::Main, &manager)?,
            };
            full(StatusCode::OK, (*updated).clone())
        }
        "patch" => {
            let (headers, body) = read_body(req).await?;
            let ctype = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let ctype = ctype.split(';').next().unwrap_or("").trim().to_string();
            let patched = patch_object(shared, rt, &ns, &name, sub, &ctype, &body, &manager, query)?;
            full(StatusCode::OK, patched)
        }
        "delete" => {
            let (_, body) = read_body(req).await?;
            let opts = delete_opts(&body, query)?;
            let deleted = store.delete(&key, &ns, &name, &opts)?;
            full(StatusCode::OK, (*deleted).clone())
        }
        _ => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "deletecollection is not supported; delete objects one by one",
            ));
        }
    };
    if let Some(d) = decision {
        return Err(fault_error(d.error, rt, &name));
    }
    Ok(response)
}

fn delete_opts(body: &[u8], query: &HashMap<String, String>) -> Result<DeleteOpts, ApiError> {
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        parse_json(body)?
    };
    let s = |p: &str| opts.pointer(p).and_then(Value::as_str).map(str::to_string);
    let propagation = s("/propagationPolicy")
        .or_else(|| query.get("propagationPolicy").cloned())
        .or_else(|| match opts.get("orphanDependents").and_then(Value::as_bool) {
            Some(true) => Some("Orphan".into()),
            _ => None,
        });
    if let Some(p) = &propagation
        && !matches!(p.as_str(), "Background" | "Foreground" | "Orphan")
    {
        return Err(ApiError::bad_request(format!(
            "propagationPolicy {p:?} is not one of Background, Foreground, Orphan"
        )));
    }
    Ok(DeleteOpts {
        uid: s("/preconditions/uid"),
        resource_version: s("/preconditions/resourceVersion"),
        propagation,
        dry_run: opts.get("dryRun").is_some() || query.contains_key("dryRun"),
    })
}

#[allow(clippy::too_many_arguments, reason = "one call site; the request's parts")]
fn patch_object(
    shared: &Shared,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    sub: Option<&str>,
    ctype: &str,
    body: &[u8],
    manager: &str,
    query: &HashMap<String, String>,
) -> Result<Value, ApiError> {
    let store = &shared.store;
    let key = rt.key();
    if ctype == "application/apply-patch+yaml" || ctype == "application/apply-patch+json" {
        if !query.contains_key("fieldManager") {
            return Err(ApiError::bad_request(
                "PATCH with application/apply-patch+yaml requires the fieldManager parameter",
            ));
        }
        let config: Value = serde_yaml::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the apply configuration is not valid YAML/JSON: {e}"))
        })?;
        let force = matches!(query.get("force").map(String::as_str), Some("true" | "1"));
        let s = match sub {
            Some("status") => Sub::Status,
            Some(_) => {
                return Err(ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    "apply is not supported on the scale subresource",
                ));
            }
            None => Sub::Main,
        };
        return Ok((*store.apply(&key, ns, name, config, s, manager, force)?).clone());
    }
    let patch_doc: Value = parse_json(body)?;
    let apply_patch = |target: &mut Value| -> Result<(), ApiError> {
        match ctype {
            "application/merge-patch+json" => {
                json_patch::merge(target, &patch_doc);
                Ok(())
            }
            "application/json-patch+json" => {
                let p: json_patch::Patch = serde_json::from_value(patch_doc.clone())
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                json_patch::patch(target, &p).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the JSON patch could not be applied: {e}"),
                    )
                })
            }
            "application/strategic-merge-patch+json" if !rt.custom => {
                patch::strategic_merge(target, &patch_doc, &rt.plural);
                Ok(())
            }
            "application/strategic-merge-patch+json" => Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                "strategic merge patch is not supported for custom resources: use a merge patch",
            )),
            other => Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("the content type {other:?} is not supported for patches"),
            )),
        }
    };
    if sub == Some("scale") {
        let updated = write_scale(store, rt, ns, name, manager, |scale| {
            let mut scale = scale.clone();
            apply_patch(&mut scale)?;
            Ok(scale)
        })?;
        return Ok(to_scale(rt, &updated));
    }
    let s = if sub == Some("status") {
        Sub::Status
    } else {
        Sub::Main
    };
    let updated = store.modify(&key, ns, name, s, manager, Op::Update, |current, _| {
        let mut target = current.clone();
        apply_patch(&mut target)?;
        // A patch carries the precondition only if it sets resourceVersion itself.
        let patch_rv = patch_doc.pointer("/metadata/resourceVersion").cloned();
        if let Some(m) = target.get_mut("metadata").and_then(Value::as_object_mut) {
            match patch_rv {
                Some(rv) => m.insert("resourceVersion".into(), rv),
                None => m.remove("resourceVersion"),
            };
        }
        Ok(target)
    })?;
    Ok((*updated).clone())
}

fn json_path_get<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let pointer = format!("/{}", path.trim_start_matches('.').replace('.', "/"));
    obj.pointer(&pointer)
}

fn to_scale(rt: &ResourceType, obj: &Value) -> Value {
    let Some(paths) = &rt.scale else {
        return Value::Null;
    };
    let replicas = json_path_get(obj, &paths.spec_replicas)
        .cloned()
        .unwrap_or(json!(0));
    let status_replicas = json_path_get(obj, &paths.status_replicas)
        .cloned()
        .unwrap_or(json!(0));
    let mut status = json!({"replicas": status_replicas});
    if let Some(sel) = paths.label_selector.as_ref().and_then(|p| json_path_get(obj, p)) {
        status["selector"] = sel.clone();
    }
    let m = &obj["metadata"];
    json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
           "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"],
                        "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]},
           "spec": {"replicas": replicas}, "status": status})
}

fn write_scale(
    store: &super::Store,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    manager: &str,
    f: impl FnOnce(&Value) -> Result<Value, ApiError>,
) -> Result<Arc<Value>, ApiError> {
    store.modify(
        &rt.key(),
        ns,
        name,
        Sub::Main,
        manager,
        Op::Update,
        |current, rt| {
            let scale = f(&to_scale(rt, current))?;
            let replicas = scale
                .pointer("/spec/replicas")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            if replicas < 0 {
                return Err(ApiError::invalid(
                    rt,
                    name,
                    vec![(
                        "spec.replicas",
                        format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                    )],
                ));
            }
            let mut obj = current.clone();
            let paths = rt
                .scale
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("no scale subresource"))?;
            let segs: Vec<&str> = paths.spec_replicas.trim_start_matches('.').split('.').collect();
            let mut cur = &mut obj;
            for seg in &segs[..segs.len() - 1] {
                if !cur.get(*seg).is_some_and(Value::is_object) {
                    cur[*seg] = json!({});
                }
                cur = &mut cur[*seg];
            }
            cur[segs[segs.len() - 1]] = replicas.into();
            let rv = scale.pointer("/metadata/resourceVersion").cloned();
            if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                match rv {
                    Some(rv) if rv != "" => m.insert("resourceVersion".into(), rv),
                    _ => m.remove("resourceVersion"),
                };
            }
            Ok(obj)
        },
    )
}

fn age(created: Option<&str>) -> String {
    let Some(ts) = created.and_then(|c| c.parse::<k8s_openapi::jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = (k8s_openapi::jiff::Timestamp::now().as_second() - ts.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn to_table(rt: &ResourceType, objs: &[Arc<Value>], rev: u64) -> Value {
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}),
    ];
    let builtin: Vec<(&str, &str)> = match rt.plural.as_str() {
        "pods" => vec![("Status", ".status.phase"), ("Node", ".spec.nodeName")],
        "services" => vec![("Type", ".spec.type"), ("Cluster-IP", ".spec.clusterIP")],
        "namespaces" => vec![("Status", ".status.phase")],
        _ => vec![],
    };
    let mut paths: Vec<(String, String)> = builtin
        .iter()
        .map(|(n, p)| (n.to_string(), p.to_string()))
        .collect();
    for (name, ty, path) in &rt.columns {
        if ty == "date" || name == "Age" {
            continue;
        }
        paths.push((name.clone(), path.clone()));
    }
    for (name, _) in &paths {
        columns
            .push(json!({"name": name, "type": "string", "format": "", "description": name, "priority": 0}));
    }
    columns.push(json!({"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0}));
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let mut cells = vec![o["metadata"]["name"].clone()];
            for (_, path) in &paths {
                cells.push(json_path_get(o, path).cloned().unwrap_or(Value::String(String::new())));
            }
            cells.push(age(o.pointer("/metadata/creationTimestamp").and_then(Value::as_str)).into());
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rev.to_string()},
           "columnDefinitions": columns, "rows": rows})
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    rv: u64,
    ns: String,
    name: String,
}

fn filters(
    rt: &ResourceType,
    query: &HashMap<String, String>,
) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {e}")))?;
    let fields = FieldSelector::parse(
        query.get("fieldSelector").map(String::as_str).unwrap_or(""),
        &rt.plural,
    )
    .map_err(|e| ApiError::bad_request(format!("unable to parse fieldSelector: {e}")))?;
    Ok((labels, fields))
}

fn check_list_rv(current: u64, query: &HashMap<String, String>) -> Result<(), ApiError> {
    let rv = query
        .get("resourceVersion")
        .filter(|r| !r.is_empty() && *r != "0");
    let Some(rv) = rv else { return Ok(()) };
    let rv: u64 = rv
        .parse()
        .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {rv:?}")))?;
    match query.get("resourceVersionMatch").map(String::as_str) {
        Some("Exact") if rv != current => Err(ApiError::gone(format!(
            "the embedded API server serves lists at the latest resourceVersion ({current}) only; {rv} is not available"
        ))),
        _ if rv > current => Err(ApiError::new(
            504,
            "Timeout",
            format!("Too large resource version: {rv}, current: {current}"),
        )),
        _ => Ok(()),
    }
}

fn list(
    shared: &Shared,
    rt: &ResourceType,
    ns: &str,
    query: &HashMap<String, String>,
    table: bool,
) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = filters(rt, query)?;
    let limit: usize = query.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let token = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => {
            use base64::Engine;
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(c)
                .map_err(|_| ApiError::bad_request("invalid continue token"))?;
            Some(
                serde_json::from_slice::<ContinueToken>(&raw)
                    .map_err(|_| ApiError::bad_request("invalid continue token"))?,
            )
        }
        None => None,
    };
    let after = token.as_ref().map(|t| (t.ns.clone(), t.name.clone()));
    let filter = |o: &Value| labels.matches(o) && fields.matches(o);
    let (items, rev, remaining) = shared.store.list(&rt.key(), ns, &filter, after.as_ref(), limit)?;
    if token.is_none() {
        check_list_rv(rev, query)?;
    }
    if table {
        return Ok(full(StatusCode::OK, to_table(rt, &items, rev)));
    }
    let mut meta = json!({"resourceVersion": token.as_ref().map_or(rev, |t| t.rv).to_string()});
    if remaining > 0
        && let Some(last) = items.last()
    {
        use base64::Engine;
        let t = ContinueToken {
            rv: token.as_ref().map_or(rev, |t| t.rv),
            ns: last["metadata"]["namespace"].as_str().unwrap_or_default().into(),
            name: last["metadata"]["name"].as_str().unwrap_or_default().into(),
        };
        let raw = serde_json::to_vec(&t).unwrap_or_default();
        meta["continue"] = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(raw)
            .into();
        meta["remainingItemCount"] = remaining.into();
    }
    let items: Vec<Value> = items.iter().map(|o| (**o).clone()).collect();
    Ok(full(
        StatusCode::OK,
        json!({"apiVersion": rt.api_version(), "kind": format!("{}List", rt.kind), "metadata": meta, "items": items}),
    ))
}

fn watch_line(kind: &str, obj: Value) -> Bytes {
    let mut line = json!({"type": kind, "object": obj}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn watch(
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
