//! Writes: create (names, namespaces, defaults, validation), commit of an update (preconditions,
//! the status split, server-owned metadata, generation, managedFields, no-op detection) and the
//! event log.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    Event, EventKind, Inner, Op, Sub, managed::set_managed, meta_mut, meta_str, new_uid, now, same_content,
    spec_part, strip_server_fields,
};
use crate::{
    ApiError, patch,
    resources::{self, ResKey, ResourceType},
    schema,
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

    pub(super) fn trim(&mut self) {
        while self.events.len() > self.window {
            if let Some(e) = self.events.pop_front() {
                self.compacted = e.rev;
            }
        }
    }

    pub(super) fn push_event(
        &mut self,
        res: &ResKey,
        kind: EventKind,
        obj: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) {
        if let Some(wal) = self.wal.as_mut() {
            use std::io::Write;
            let op = if kind == EventKind::Deleted {
                "delete"
            } else {
                "put"
            };
            let mut line =
                json!({"rev": self.rev, "group": res.group, "plural": res.plural, "op": op, "obj": &*obj})
                    .to_string();
            line.push('\n');
            if let Err(error) = wal.write_all(line.as_bytes()) {
                tracing::error!(%error, "cannot append to the write-ahead log; persistence is off from now on");
                self.wal = None;
            }
        }
        self.events.push_back(Event {
            rev: self.rev,
            res: res.clone(),
            kind,
            obj,
            prev,
            json: Arc::default(),
        });
        self.trim();
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
            match meta_str(&obj, "namespace") {
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
                            meta_str(&obj, "name").unwrap_or_default()
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        let name = match (meta_str(&obj, "name"), meta_str(&obj, "generateName")) {
            (Some(n), _) if !n.is_empty() => n.to_string(),
            (_, Some(prefix)) if !prefix.is_empty() => format!("{prefix}{}", &new_uid()[..5]),
            _ => {
                return Err(ApiError::invalid(
                    &rt,
                    "",
                    vec![("metadata.name", "name or generateName is required".into())],
                ));
            }
        };
        if let Err(why) =
            slinky_api::validation::first_error(slinky_api::validation::dns1123_subdomain(&name))
        {
            return Err(ApiError::invalid(
                &rt,
                &name,
                vec![("metadata.name", format!("Invalid value: {name:?}: {why}"))],
            ));
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
        obj["apiVersion"] = rt.api_version().into();
        obj["kind"] = rt.kind.clone().into();
        // The creator owns what it sent, not what the server defaults.
        let owned = patch::field_set(&strip_server_fields(&obj), &rt.plural, false);
        self.defaults(&rt, &mut obj);
        if let Some(schema) = &rt.schema {
            schema::default_and_validate(&rt, &name, schema, &mut obj)?;
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

    /// Server-side defaults for the built-in types the host uses.
    pub(super) fn defaults(&mut self, rt: &ResourceType, obj: &mut Value) {
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "namespaces") => {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
                obj["status"] = json!({"phase": "Active"});
            }
            ("", "pods") => {
                if obj.pointer("/status/phase").is_none() {
                    obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
                }
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.entry("restartPolicy").or_insert("Always".into());
                    spec.entry("dnsPolicy").or_insert("ClusterFirst".into());
                    spec.entry("schedulerName").or_insert("default-scheduler".into());
                    spec.entry("terminationGracePeriodSeconds").or_insert(30.into());
                }
            }
            ("", "services") => {
                let ip = self.next_ip;
                self.next_ip += 1;
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.entry("type").or_insert("ClusterIP".into());
                    spec.entry("sessionAffinity").or_insert("None".into());
                    if spec
                        .get("clusterIP")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        let addr = format!("10.96.{}.{}", ip / 250, ip % 250 + 1);
                        spec.insert("clusterIP".into(), addr.clone().into());
                        spec.insert("clusterIPs".into(), json!([addr]));
                    }
                    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
                        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                            p.entry("protocol").or_insert("TCP".into());
                            if let Some(port) = p.get("port").cloned() {
                                p.entry("targetPort").or_insert(port);
                            }
                        }
                    }
                }
                obj["status"] = json!({"loadBalancer": {}});
            }
            _ => {}
        }
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
        if !new.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        if let Some(rv) = meta_str(&new, "resourceVersion").filter(|rv| !rv.is_empty())
            && Some(rv) != meta_str(current, "resourceVersion")
        {
            return Err(ApiError::conflict(&rt, &name));
        }
        if let Some(n) = meta_str(&new, "name")
            && n != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        new["apiVersion"] = rt.api_version().into();
        new["kind"] = rt.kind.clone().into();
        match sub {
            Sub::Status => {
                let status = new.get("status").cloned();
                let mut merged = (**current).clone();
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
                new = merged;
            }
            Sub::Main if rt.status => match current.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Value::Object(m) = &mut new {
                        m.remove("status");
                    }
                }
            },
            Sub::Main => {}
        }
        // Server-owned metadata comes from the stored object.
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "namespace",
            "name",
            "generation",
        ] {
            let old = current.pointer(&format!("/metadata/{f}")).cloned();
            let m = meta_mut(&mut new);
            match old {
                Some(v) => m.insert(f.into(), v),
                None => m.remove(f),
            };
        }
        if op != Op::Apply {
            let old_mf = current.pointer("/metadata/managedFields").cloned();
            match old_mf {
                Some(v) => meta_mut(&mut new).insert("managedFields".into(), v),
                None => meta_mut(&mut new).remove("managedFields"),
            };
        }
        if let Some(schema) = &rt.schema {
            schema::default_and_validate(&rt, &name, schema, &mut new)?;
        }
        if spec_part(&new) != spec_part(current) && current.pointer("/metadata/generation").is_some() {
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
        // The last finalizer removed from an object being deleted: it goes.
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
        let finalizers = new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if deleting && !finalizers {
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
