//! Writes: create (names, namespaces, defaults, validation), commit of an update (preconditions,
//! the status split, server-owned metadata, generation, managedFields, no-op detection). What a
//! body becomes on its way in is [`super::decode`]'s; the event log is [`super::event`]'s.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    EventKind, Inner, Op, Sub,
    decode::{canonical_quantities, decodable, drop_sidecars, update_defaults},
    managed::set_managed,
    meta_mut, meta_str, new_uid, now, same_content, spec_part, strip_server_fields,
};
use crate::{
    ApiError, patch,
    resources::{self, ResKey, ResourceType},
    schema, validation,
};

impl Inner {
    pub(super) fn rtype(&self, res: &ResKey) -> Result<ResourceType, ApiError> {
        self.types.get(res).cloned().ok_or_else(|| {
            ApiError::new(
                404,
                "NotFound",
                format!(
                    "the server could not find the requested resource ({})",
                    res.plural
                ),
            )
        })
    }

    pub(super) fn current(&self, res: &ResKey, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        let rt = self.rtype(res)?;
        self.objects
            .get(res)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt, name))
    }

    pub(super) fn create(
        &mut self,
        res: &ResKey,
        ns: &str,
        mut obj: Value,
        manager: &str,
        dry_run: bool,
        op: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let rt = self.rtype(res)?;
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let ns = if rt.namespaced { ns } else { "" };
        if rt.namespaced {
            self.namespace_accepts(&rt, ns, &obj)?;
        }
        let name = match (meta_str(&obj, "name"), meta_str(&obj, "generateName")) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{}", generated_suffix()),
            _ => String::new(),
        };
        meta_mut(&mut obj).insert("name".into(), name.clone().into());
        obj["apiVersion"] = rt.api_version().into();
        obj["kind"] = rt.kind.clone().into();
        // The creator owns what it sent, not what the server defaults.
        let owned = patch::field_set(&strip_server_fields(&obj), &rt.plural, false);
        decodable(&rt, &obj)?;
        self.defaults(&rt, &mut obj);
        if !self.sidecar_containers {
            drop_sidecars(&rt, &mut obj, None);
        }
        let errs = validation::validate(&rt, &obj, None);
        if !errs.is_empty() {
            return Err(validation::invalid(&rt, &name, &errs));
        }
        canonical_quantities(&rt, &mut obj);
        if let Some(schema) = &rt.schema {
            schema::default_and_validate(&rt, &name, schema, &mut obj, None)?;
        }
        let key = (ns.to_string(), name.clone());
        if self.objects.get(res).is_some_and(|m| m.contains_key(&key)) {
            return Err(ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", rt.qualified()),
            )
            .with_details(&rt, &name));
        }
        if rt.key().plural == "customresourcedefinitions" {
            let served =
                resources::from_crd(&obj).map_err(|e| ApiError::invalid(&rt, &name, vec![("spec", e)]))?;
            if dry_run {
                return Ok(Arc::new(obj));
            }
            obj["status"] = crd_status(&served);
            self.types.insert(served.key(), served);
        }
        let rev = self.rev + 1;
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), name.clone().into());
            if rt.namespaced {
                m.insert("namespace".into(), ns.into());
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), new_uid().into());
            m.insert("creationTimestamp".into(), now().into());
            m.insert("resourceVersion".into(), rev.to_string().into());
            m.remove("deletionTimestamp");
            m.remove("managedFields");
            if obj.get("spec").is_some() || rt.custom {
                meta_mut(&mut obj).insert("generation".into(), 1.into());
            }
        }
        set_managed(&mut obj, manager, op, &rt, &owned, false);
        if dry_run {
            return Ok(Arc::new(obj));
        }
        self.rev = rev;
        let obj = Arc::new(obj);
        self.put(res, key, obj.clone());
        self.push_event(res, EventKind::Added, obj.clone(), None);
        Ok(obj)
    }

    /// A namespaced object may be created in `ns` only when the object names no other
    /// namespace, and `ns` exists and is not being terminated.
    fn namespace_accepts(&self, rt: &ResourceType, ns: &str, obj: &Value) -> Result<(), ApiError> {
        match meta_str(obj, "namespace") {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the provided object ({n}) does not match the namespace sent on the request ({ns})"
                )));
            }
            _ => {}
        }
        let nskey = ResKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        let ns_obj = self
            .objects
            .get(&nskey)
            .and_then(|m| m.get(&(String::new(), ns.to_string())));
        match ns_obj {
            None => {
                return Err(ApiError::new(
                    404,
                    "NotFound",
                    format!("namespaces \"{ns}\" not found"),
                ));
            }
            Some(n) if n.pointer("/metadata/deletionTimestamp").is_some() => {
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        rt.qualified(),
                        meta_str(obj, "name").unwrap_or_default()
                    ),
                ));
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// Commit `new` over `current`: preconditions, status split, generation, managedFields,
    /// finalizer-driven deletion, no-op detection.
    pub(super) fn commit(
        &mut self,
        res: &ResKey,
        current: &Arc<Value>,
        mut new: Value,
        sub: Sub,
        manager: &str,
        op: Op,
    ) -> Result<Arc<Value>, ApiError> {
        let rt = self.rtype(res)?;
        let name = meta_str(current, "name").unwrap_or_default().to_string();
        preconditions(&rt, current, &new, &name)?;
        new["apiVersion"] = rt.api_version().into();
        new["kind"] = rt.kind.clone().into();
        let mut new = split_status(&rt, current, new, sub, op);
        keep_server_metadata(current, &mut new, op, sub);
        if sub == Sub::Main && op != Op::Server {
            decodable(&rt, &new)?;
            update_defaults(&rt, &mut new, current);
            if !self.sidecar_containers {
                drop_sidecars(&rt, &mut new, Some(current));
            }
            let errs = validation::validate(&rt, &new, Some(current));
            if !errs.is_empty() {
                return Err(validation::invalid(&rt, &name, &errs));
            }
            canonical_quantities(&rt, &mut new);
        }
        if let Some(schema) = &rt.schema {
            schema::default_and_validate(&rt, &name, schema, &mut new, Some(current))?;
        }
        // A Deployment's annotations count too: kube-apiserver bumps its generation for them,
        // since the Deployment controller copies them to its ReplicaSets (no pod restarts).
        let annotations_count = rt.group == "apps" && rt.plural == "deployments";
        let annotations = |o: &Value| {
            o.pointer("/metadata/annotations")
                .filter(|a| a.as_object().is_some_and(|m| !m.is_empty()))
                .cloned()
        };
        // None and {} are the same annotations (kube-apiserver's semantic equality).
        let annotations_changed = annotations_count && annotations(&new) != annotations(current);
        if (spec_part(&new) != spec_part(current) || annotations_changed)
            && current.pointer("/metadata/generation").is_some()
        {
            let g = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta_mut(&mut new).insert("generation".into(), (g + 1).into());
        }
        if op == Op::Update {
            let changed = patch::changed_fields(current, &new, &rt.plural, sub == Sub::Status);
            if !changed.is_empty() {
                set_managed(&mut new, manager, "Update", &rt, &changed, sub == Sub::Status);
            }
        }
        if same_content(current, &new) {
            return Ok(current.clone());
        }
        if rt.plural == "customresourcedefinitions" {
            let served =
                resources::from_crd(&new).map_err(|e| ApiError::invalid(&rt, &name, vec![("spec", e)]))?;
            self.types.insert(served.key(), served);
        }
        if finalized(&new) {
            let ns = meta_str(current, "namespace").unwrap_or_default().to_string();
            return self.remove(res, &ns, &name, new, "Background");
        }
        self.commit_raw(res, current, new, EventKind::Modified)
    }

    pub(super) fn commit_raw(
        &mut self,
        res: &ResKey,
        current: &Arc<Value>,
        mut new: Value,
        kind: EventKind,
    ) -> Result<Arc<Value>, ApiError> {
        self.rev += 1;
        meta_mut(&mut new).insert("resourceVersion".into(), self.rev.to_string().into());
        let key = (
            meta_str(current, "namespace").unwrap_or_default().to_string(),
            meta_str(current, "name").unwrap_or_default().to_string(),
        );
        let new = Arc::new(new);
        self.put(res, key, new.clone());
        self.push_event(res, kind, new.clone(), Some(current.clone()));
        Ok(new)
    }
}

/// What a write must agree with before anything else: a JSON object, the resourceVersion it
/// was computed from (when it names one), and the name on the URL.
fn preconditions(rt: &ResourceType, current: &Value, new: &Value, name: &str) -> Result<(), ApiError> {
    if !new.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    if let Some(rv) = meta_str(new, "resourceVersion").filter(|rv| !rv.is_empty())
        && Some(rv) != meta_str(current, "resourceVersion")
    {
        return Err(ApiError::conflict(rt, name));
    }
    if let Some(n) = meta_str(new, "name")
        && n != name
    {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    Ok(())
}

/// The status/spec split: a `/status` write changes only the status (and, for an apply, the
/// managedFields it computed); a write of the object leaves the status alone when the type has
/// a status subresource.
fn split_status(rt: &ResourceType, current: &Value, mut new: Value, sub: Sub, op: Op) -> Value {
    match sub {
        Sub::Status => {
            let status = new.get("status").cloned();
            let mut merged = current.clone();
            match status {
                Some(s) => merged["status"] = s,
                None => {
                    if let Value::Object(m) = &mut merged {
                        m.remove("status");
                    }
                }
            }
            if op == Op::Apply {
                // apply_to already computed managedFields on `new`.
                let mf = new.pointer("/metadata/managedFields").cloned();
                if let Some(mf) = mf {
                    meta_mut(&mut merged).insert("managedFields".into(), mf);
                }
            }
            merged
        }
        Sub::Main if rt.status => {
            match current.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Value::Object(m) = &mut new {
                        m.remove("status");
                    }
                }
            }
            new
        }
        Sub::Main => new,
    }
}

/// Server-owned metadata comes from the stored object. managedFields are computed for an apply;
/// a write of the object may set them itself, as kube-apiserver allows (`decodeLiveOrNew`): a
/// list with fields replaces them (how a client moves
/// fields from an Update entry to its Apply entry), an empty list or a list of one empty entry
/// clears them (`isResetManagedFields`), anything else keeps the stored ones.
fn keep_server_metadata(current: &Value, new: &mut Value, op: Op, sub: Sub) {
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "namespace",
        "name",
        "generation",
    ] {
        let old = current.pointer(&format!("/metadata/{f}")).cloned();
        let m = meta_mut(new);
        match old {
            Some(v) => m.insert(f.into(), v),
            None => m.remove(f),
        };
    }
    if op == Op::Apply {
        return;
    }
    let sent = new.pointer("/metadata/managedFields").cloned();
    let old_mf = current.pointer("/metadata/managedFields").cloned();
    let own = match (&sent, sub) {
        (Some(Value::Array(list)), Sub::Main) if op == Op::Update && sent != old_mf => {
            if list.is_empty()
                || (list.len() == 1 && list[0].as_object().is_some_and(serde_json::Map::is_empty))
            {
                Some(None)
            } else if list.iter().any(|e| {
                e.get("fieldsV1")
                    .is_some_and(|f| f.as_object().is_some_and(|o| !o.is_empty()))
            }) {
                Some(sent.clone())
            } else {
                None
            }
        }
        _ => None,
    };
    let mf = own.unwrap_or(old_mf);
    match mf {
        Some(v) => meta_mut(new).insert("managedFields".into(), v),
        None => meta_mut(new).remove("managedFields"),
    };
}

/// The last finalizer removed from an object being deleted: it goes, unless it is still in its
/// grace period (a terminating pod waits for its kubelet).
fn finalized(new: &Value) -> bool {
    let deleting = new.pointer("/metadata/deletionTimestamp").is_some()
        && new
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64)
            .is_none_or(|g| g == 0);
    let finalizers = new
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    deleting && !finalizers
}

fn crd_status(rt: &ResourceType) -> Value {
    json!({
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now()},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now()},
        ],
        "acceptedNames": {"plural": rt.plural, "singular": rt.singular, "kind": rt.kind, "shortNames": rt.short_names, "listKind": format!("{}List", rt.kind)},
        "storedVersions": [rt.version],
    })
}

/// Five random characters from the alphabet kube-apiserver's name generator uses (no vowels, no
/// look-alikes: a generated name never spells a word).
fn generated_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let hex = crate::random_hex();
    hex.as_bytes()
        .chunks(2)
        .take(5)
        .map(|pair| {
            let byte = u8::from_str_radix(std::str::from_utf8(pair).unwrap_or("0"), 16).unwrap_or(0);
            char::from(ALPHABET[usize::from(byte) % ALPHABET.len()])
        })
        .collect()
}
