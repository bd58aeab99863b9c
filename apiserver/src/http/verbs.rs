//! The verbs: get, list, watch, create, update, patch (merge, JSON, strategic, apply), delete,
//! with fault injection before or after the request is served.

use std::{collections::HashMap, sync::Arc};

use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use serde_json::{Value, json};

use super::{
    Body, Target,
    body::{decode_body, parse_json, read_body, respond, wants_protobuf, wants_table},
    full,
    list::{list, to_table},
    scale::{to_scale, write_scale},
    watch::watch,
};
use crate::{
    ApiError, FaultError, Shared, patch,
    resources::ResourceType,
    store::{DeleteOpts, Op, Sub},
};

/// A Kubernetes verb, from the method, the path and the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    /// `GET` of one object.
    Get,
    /// `GET` of a collection.
    List,
    /// `GET` of a collection with `watch=true`.
    Watch,
    /// `POST` to a collection.
    Create,
    /// `PUT` of one object.
    Update,
    /// `PATCH` of one object.
    Patch,
    /// `DELETE` of one object.
    Delete,
    /// `DELETE` of a collection.
    DeleteCollection,
}

impl Verb {
    /// The verb of a request, or `None` for a method the API does not have on that path.
    pub(crate) fn of(method: &Method, named: bool, query: &HashMap<String, String>) -> Option<Self> {
        let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        Some(match (method, named) {
            (&Method::GET, false) if watch => Verb::Watch,
            (&Method::GET, false) => Verb::List,
            (&Method::GET, true) => Verb::Get,
            (&Method::POST, _) => Verb::Create,
            (&Method::PUT, true) => Verb::Update,
            (&Method::PATCH, true) => Verb::Patch,
            (&Method::DELETE, true) => Verb::Delete,
            (&Method::DELETE, false) => Verb::DeleteCollection,
            _ => return None,
        })
    }

    /// The name RBAC, audit records and fault rules use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
        }
    }
}

fn fault_error(e: FaultError, rt: &ResourceType, name: &str) -> ApiError {
    match e {
        FaultError::Conflict => ApiError::conflict(rt, name),
        FaultError::NotFound => ApiError::not_found(rt, name),
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
        FaultError::Invalid => ApiError::invalid(
            rt,
            name,
            vec![(
                "spec",
                "Invalid value: injected fault: the object is invalid".into(),
            )],
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

pub(super) async fn serve_resource(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    rt: &ResourceType,
    target: Target,
    query: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
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
    let Some(verb) = Verb::of(req.method(), target.name.is_some(), query) else {
        return Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{} is not supported on this path", req.method()),
        ));
    };
    let sub = subresource(rt, target.sub.as_deref())?;
    let fault_res = match sub {
        Some(s) => format!("{}/{s}", rt.plural),
        None => rt.plural.clone(),
    };
    let name = target.name.clone().unwrap_or_default();
    let decision = shared.faults.decide(verb.as_str(), &fault_res);
    if let Some(d) = decision
        && !d.after
    {
        return Err(fault_error(d.error, rt, &name));
    }
    let call = Call {
        named: target.name.is_some(),
        ns,
        name,
        sub,
        table: wants_table(req.headers()),
        pb: wants_protobuf(req.headers()),
        manager: manager_of(req.headers(), query),
        dry_run: query.contains_key("dryRun"),
        fault_res,
    };
    if verb == Verb::Watch {
        return watch(shared.clone(), rt.clone(), call.ns, query, call.table, call.pb);
    }
    let response = perform(shared, req, rt, verb, &call, query).await?;
    if let Some(d) = decision {
        return Err(fault_error(d.error, rt, &call.name));
    }
    Ok(response)
}

/// The subresource a path addresses, if the type has it.
fn subresource(rt: &ResourceType, sub: Option<&str>) -> Result<Option<&'static str>, ApiError> {
    Ok(match sub {
        None => None,
        Some("status") if rt.status => Some("status"),
        Some("scale") if rt.scale.is_some() => Some("scale"),
        Some("binding") if rt.group.is_empty() && rt.plural == "pods" => Some("binding"),
        Some(other) => {
            return Err(ApiError::new(
                404,
                "NotFound",
                format!("{} has no subresource {other:?}", rt.qualified()),
            ));
        }
    })
}

/// What a request addresses and how it wants the answer, read before its body.
struct Call {
    /// The namespace (`""` for cluster-scoped types or all namespaces).
    ns: String,
    /// The object's name (`""` for a collection).
    name: String,
    /// Whether the path names an object.
    named: bool,
    /// The subresource.
    sub: Option<&'static str>,
    /// The field manager of a write.
    manager: String,
    /// `dryRun`: don't persist.
    dry_run: bool,
    /// The client asked for a Table.
    table: bool,
    /// The client asked for protobuf.
    pb: bool,
    /// The resource as fault rules and holds name it (`pods`, `pods/status`).
    fault_res: String,
}

/// Serve every verb but watch (which streams, and takes no fault after it is served).
async fn perform(
    shared: &Arc<Shared>,
    req: Request<Incoming>,
    rt: &ResourceType,
    verb: Verb,
    call: &Call,
    query: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let key = rt.key();
    let store = &shared.store;
    let Call {
        ns,
        name,
        sub,
        manager,
        table,
        pb,
        ..
    } = call;
    let (sub, table, pb) = (*sub, *table, *pb);
    // A held write waits here with its body read, so a client that gives up meanwhile is seen
    // (its connection closes) and the request ends unserved.
    let read = |req| async move {
        let read = read_body(req).await?;
        shared
            .faults
            .while_request_held(verb.as_str(), &call.fault_res)
            .await;
        Ok::<_, ApiError>(read)
    };
    Ok(match verb {
        Verb::Watch => return watch(shared.clone(), rt.clone(), ns.clone(), query, table, pb),
        Verb::List => list(shared, rt, ns, query, table, pb)?,
        Verb::Get => {
            let obj = store.get(&key, ns, name)?;
            match sub {
                Some("scale") => full(StatusCode::OK, to_scale(rt, &obj)),
                _ if table => full(StatusCode::OK, to_table(rt, &[obj], store.revision())),
                _ => respond(StatusCode::OK, (*obj).clone(), pb),
            }
        }
        Verb::Create if sub == Some("binding") => bind(shared, req, ns, name).await?,
        Verb::Create if call.named => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("POST is not supported on {}/{name}", rt.qualified()),
            ));
        }
        Verb::Create => {
            let (headers, body) = read(req).await?;
            let obj = decode_body(&headers, &body, rt.custom)?;
            let created = store.create(&key, ns, obj, manager, call.dry_run)?;
            respond(StatusCode::CREATED, (*created).clone(), pb)
        }
        Verb::Update => {
            let (headers, body) = read(req).await?;
            let obj = decode_body(&headers, &body, rt.custom)?;
            let updated = match sub {
                Some("scale") => write_scale(store, rt, ns, name, manager, |_| Ok(obj))?,
                Some(_) => store.update(&key, ns, name, obj, Sub::Status, manager)?,
                None => store.update(&key, ns, name, obj, Sub::Main, manager)?,
            };
            respond(StatusCode::OK, (*updated).clone(), pb)
        }
        Verb::Patch => {
            let (headers, body) = read(req).await?;
            let ctype = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let ctype = ctype.split(';').next().unwrap_or("").trim().to_string();
            let patched = patch_object(shared, rt, ns, name, sub, &ctype, &body, manager, query)?;
            respond(StatusCode::OK, patched, pb)
        }
        Verb::Delete => {
            let (headers, body) = read(req).await?;
            let opts = delete_opts(&headers, &body, query)?;
            let deleted = store.delete(&key, ns, name, &opts)?;
            respond(StatusCode::OK, (*deleted).clone(), pb)
        }
        Verb::DeleteCollection => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                "deletecollection is not supported; delete objects one by one",
            ));
        }
    })
}

/// `POST pods/<name>/binding`: bind the pod to the Binding's target node.
async fn bind(
    shared: &Shared,
    req: Request<Incoming>,
    ns: &str,
    name: &str,
) -> Result<Response<Body>, ApiError> {
    let (headers, body) = read_body(req).await?;
    let binding = decode_body(&headers, &body, false)?;
    let node = binding
        .pointer("/target/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| {
            ApiError::new(
                422,
                "Invalid",
                format!("Binding.core \"{name}\" is invalid: target.name: Required value"),
            )
        })?;
    shared.store.bind(ns, name, node)?;
    Ok(full(
        StatusCode::CREATED,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

fn delete_opts(
    headers: &hyper::HeaderMap,
    body: &[u8],
    query: &HashMap<String, String>,
) -> Result<DeleteOpts, ApiError> {
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        decode_body(headers, body, false)?
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
    let grace_period = match opts.get("gracePeriodSeconds").and_then(Value::as_i64) {
        Some(g) => Some(g),
        None => match query.get("gracePeriodSeconds") {
            Some(g) => Some(
                g.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?,
            ),
            None => None,
        },
    };
    Ok(DeleteOpts {
        grace_period,
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
        let config: Value = serde_saphyr::from_slice(body).map_err(|e| {
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
