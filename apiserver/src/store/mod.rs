//! The object store: one global, monotonically increasing revision (like etcd's), objects per
//! resource type, a bounded event log for watches, and the write semantics (preconditions,
//! generation, status/spec split, managedFields, finalizers, garbage collection, namespaces,
//! CRDs). Everything happens under one lock, so every write is atomic.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::{
    ApiError,
    patch::{self, FieldPath},
    resources::{self, ResKey, ResourceType},
    schema,
};

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    /// The object (status changes are ignored when the type has a status subresource).
    Main,
    /// `/status`: only status changes.
    Status,
}

/// A watch event kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Added => "ADDED",
            EventKind::Modified => "MODIFIED",
            EventKind::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug, Clone)]
pub struct Event {
    /// The revision of the change.
    pub rev: u64,
    /// The resource type.
    pub res: ResKey,
    /// What happened.
    pub kind: EventKind,
    /// The object after the change (before it, for deletions).
    pub obj: Arc<Value>,
    /// The object before the change, for modifications.
    pub prev: Option<Arc<Value>>,
    /// The object's JSON, serialized once for every watcher.
    pub json: Arc<std::sync::OnceLock<String>>,
}

/// Delete options (`DeleteOptions` body and query).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `Background` (default), `Foreground` or `Orphan`.
    pub propagation: Option<String>,
    /// Don't persist.
    pub dry_run: bool,
}

type ObjKey = (String, String);

struct Inner {
    rev: u64,
    types: BTreeMap<ResKey, ResourceType>,
    objects: HashMap<ResKey, BTreeMap<ObjKey, Arc<Value>>>,
    events: VecDeque<Event>,
    window: usize,
    /// Events at or below this revision may have been dropped from the log.
    compacted: u64,
    next_ip: u32,
    /// The write-ahead log, with `--state-dir`.
    wal: Option<std::fs::File>,
}

/// The store. Cheap to share (`Arc`).
pub struct Store {
    inner: Mutex<Inner>,
    revision: watch::Sender<u64>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn new_uid() -> String {
    let h = super::random_hex();
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// The object without metadata and status: what `generation` tracks.
fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Value::Object(m) = &mut v {
        m.remove("metadata");
        m.remove("status");
        m.remove("apiVersion");
        m.remove("kind");
    }
    v
}

/// Objects equal but for resourceVersion/managedFields timestamps: a no-op write.
fn same_content(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        let m = meta_mut(&mut v);
        m.remove("resourceVersion");
        m.remove("managedFields");
        v
    };
    strip(a) == strip(b)
}

impl Store {
    /// A store serving the built-in types, keeping `window` events for watches.
    pub fn new(window: usize) -> Arc<Self> {
        match Self::open(window, None) {
            Ok(s) => s,
            Err(_) => unreachable!("a store without a state directory does no I/O"),
        }
    }

    /// A store that persists to `state_dir` when given: a snapshot plus a write-ahead log of
    /// JSON lines, one per change. On open the snapshot is loaded, the log replayed (a torn last
    /// line, from a crash mid-write, is dropped), and both compacted into a new snapshot written
    /// atomically (temp file + rename).
    ///
    /// # Errors
    /// I/O errors of the state directory, or a snapshot that is not ours.
    pub fn open(window: usize, state_dir: Option<&std::path::Path>) -> std::io::Result<Arc<Self>> {
        let types = resources::builtins().into_iter().map(|t| (t.key(), t)).collect();
        let mut inner = Inner {
            rev: 1,
            types,
            objects: HashMap::new(),
            events: VecDeque::new(),
            window: window.max(1),
            compacted: 1,
            next_ip: 1,
            wal: None,
        };
        if let Some(dir) = state_dir {
            inner.load(dir)?;
        }
        let rev = inner.rev;
        let (revision, _) = watch::channel(rev);
        let store = Arc::new(Store {
            inner: Mutex::new(inner),
            revision,
        });
        let nskey = ResKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            if store.get(&nskey, "", ns).is_err() {
                let _ = store.create(&nskey, "", json!({"metadata": {"name": ns}}), "embedded", false);
            }
        }
        Ok(store)
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Subscribe to revision changes (for watches).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// The current revision.
    pub fn revision(&self) -> u64 {
        self.lock().rev
    }

    /// Change the event window (tests use a tiny one to force `410 Gone`).
    pub fn set_window(&self, window: usize) {
        let mut g = self.lock();
        g.window = window.max(1);
        g.trim();
    }

    /// All served types.
    pub fn types(&self) -> Vec<ResourceType> {
        self.lock().types.values().cloned().collect()
    }

    /// Find a served type by group, version and plural.
    pub fn find_type(&self, group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        self.lock()
            .types
            .values()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
            .cloned()
    }

    /// Get one object.
    ///
    /// # Errors
    /// 404 when absent.
    pub fn get(&self, res: &ResKey, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        let g = self.lock();
        let rt = g.rtype(res)?;
        g.objects
            .get(res)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt, name))
    }

    /// List objects (namespace `""` = all) matching `filter`, sorted by namespace and name, after
    /// `after` (exclusive), at most `limit` (0 = all). Returns the items, the revision, and the
    /// number of matching items left.
    pub fn list(
        &self,
        res: &ResKey,
        ns: &str,
        filter: &dyn Fn(&Value) -> bool,
        after: Option<&ObjKey>,
        limit: usize,
    ) -> Result<(Vec<Arc<Value>>, u64, usize), ApiError> {
        let g = self.lock();
        g.rtype(res)?;
        let mut items = Vec::new();
        let mut remaining = 0;
        if let Some(objs) = g.objects.get(res) {
            let start = match after {
                Some(k) => std::ops::Bound::Excluded(k.clone()),
                None => std::ops::Bound::Unbounded,
            };
            for ((ons, _), obj) in objs.range((start, std::ops::Bound::Unbounded)) {
                if (!ns.is_empty() && ons != ns) || !filter(obj) {
                    continue;
                }
                if limit == 0 || items.len() < limit {
                    items.push(obj.clone());
                } else {
                    remaining += 1;
                }
            }
        }
        Ok((items, g.rev, remaining))
    }

    /// Events of `res` after `rev`, or `Err(compacted)` when some may be gone (410).
    pub fn events_since(&self, res: &ResKey, rev: u64) -> Result<(Vec<Event>, u64), u64> {
        let g = self.lock();
        if rev < g.compacted {
            return Err(g.compacted);
        }
        let start = g.events.partition_point(|e| e.rev <= rev);
        let evs = g
            .events
            .range(start..)
            .filter(|e| &e.res == res)
            .cloned()
            .collect();
        Ok((evs, g.rev))
    }

    /// Create an object.
    ///
    /// # Errors
    /// 409 AlreadyExists, 404 for a missing namespace, 422 for invalid objects.
    pub fn create(
        &self,
        res: &ResKey,
        ns: &str,
        obj: Value,
        manager: &str,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let mut g = self.lock();
        let out = g.create(res, ns, obj, manager, dry_run, "Update")?;
        drop(g);
        self.notify();
        Ok(out)
    }

    /// Replace an object (`PUT`), honouring a resourceVersion precondition.
    ///
    /// # Errors
    /// 404, 409 Conflict on a stale resourceVersion, 422.
    pub fn update(
        &self,
        res: &ResKey,
        ns: &str,
        name: &str,
        obj: Value,
        sub: Sub,
        manager: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let mut g = self.lock();
        let current = g.current(res, ns, name)?;
        let out = g.commit(res, &current, obj, sub, manager, Op::Update)?;
        drop(g);
        self.notify();
        Ok(out)
    }

    /// Read-modify-write atomically: `f` gets the current object and returns the new one (or an
    /// error). `op` says how managedFields are updated.
    ///
    /// # Errors
    /// What `f` or the commit returns.
    #[allow(
        clippy::too_many_arguments,
        reason = "the parts of a write request, each distinct"
    )]
    pub fn modify(
        &self,
        res: &ResKey,
        ns: &str,
        name: &str,
        sub: Sub,
        manager: &str,
        op: Op,
        f: impl FnOnce(&Value, &ResourceType) -> Result<Value, ApiError>,
    ) -> Result<Arc<Value>, ApiError> {
        let mut g = self.lock();
        let current = g.current(res, ns, name)?;
        let rt = g.rtype(res)?;
        let new = f(&current, &rt)?;
        let out = g.commit(res, &current, new, sub, manager, op)?;
        drop(g);
        self.notify();
        Ok(out)
    }

    /// Server-side apply: create when absent, else merge with field ownership.
    ///
    /// # Errors
    /// 409 Conflict listing the fields another manager owns (unless `force`), 422.
    #[allow(
        clippy::too_many_arguments,
        reason = "the parts of an apply request, each distinct"
    )]
    pub fn apply(
        &self,
        res: &ResKey,
        ns: &str,
        name: &str,
        config: Value,
        sub: Sub,
        manager: &str,
        force: bool,
    ) -> Result<Arc<Value>, ApiError> {
        let mut g = self.lock();
        let rt = g.rtype(res)?;
        let existing = g
            .objects
            .get(res)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned();
        let out = match existing {
            None if sub == Sub::Main => {
                let mut obj = strip_server_fields(&config);
                meta_mut(&mut obj).insert("name".into(), name.into());
                g.create(res, ns, obj, manager, false, "Apply")?
            }
            None => return Err(ApiError::not_found(&rt, name)),
            Some(current) => {
                let new = apply_to(&current, &config, &rt, manager, force, sub == Sub::Status)?;
                g.commit(res, &current, new, sub, manager, Op::Apply)?
            }
        };
        drop(g);
        self.notify();
        Ok(out)
    }

    /// Delete an object (finalizers, preconditions, propagation).
    ///
    /// # Errors
    /// 404, 409 on a failed precondition.
    pub fn delete(
        &self,
        res: &ResKey,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Arc<Value>, ApiError> {
        let mut g = self.lock();
        let out = g.delete(res, ns, name, opts)?;
        drop(g);
        self.notify();
        Ok(out)
    }

    fn notify(&self) {
        let rev = self.lock().rev;
        self.revision.send_replace(rev);
    }
}

/// The object without server-set metadata.
fn strip_server_fields(v: &Value) -> Value {
    let mut v = v.clone();
    let m = meta_mut(&mut v);
    for f in [
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
        "deletionTimestamp",
    ] {
        m.remove(f);
    }
    v
}

/// How a write updates managedFields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// PUT/PATCH: the changed fields move to the manager.
    Update,
    /// Server-side apply: already computed by [`apply_to`].
    Apply,
    /// A write by the server itself (no ownership change).
    Server,
}

/// The managedFields entries of an object, as (manager, operation, subresource, fields).
fn managed(obj: &Value) -> Vec<(String, String, String, BTreeSet<FieldPath>)> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|entries| {
            entries
                .iter()
                .map(|e| {
                    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                    (
                        s("manager"),
                        s("operation"),
                        s("subresource"),
                        patch::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn write_managed(
    obj: &mut Value,
    entries: Vec<(String, String, String, BTreeSet<FieldPath>)>,
    rt: &ResourceType,
) {
    let time = now();
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|(_, _, _, set)| !set.is_empty())
        .map(|(manager, op, sub, set)| {
            let mut e = json!({"manager": manager, "operation": op, "apiVersion": rt.api_version(),
                "time": time, "fieldsType": "FieldsV1", "fieldsV1": patch::to_fields_v1(&set)});
            if !sub.is_empty() {
                e["subresource"] = sub.into();
            }
            e
        })
        .collect();
    let m = meta_mut(obj);
    if list.is_empty() {
        m.remove("managedFields");
    } else {
        m.insert("managedFields".into(), Value::Array(list));
    }
}

/// Give `set` to `manager` (operation `op`), taking the fields away from every other manager.
fn set_managed(
    obj: &mut Value,
    manager: &str,
    op: &str,
    rt: &ResourceType,
    set: &BTreeSet<FieldPath>,
    status: bool,
) {
    let sub = if status { "status" } else { "" };
    let mut entries = managed(obj);
    for (m, o, s, fields) in entries.iter_mut() {
        if !(m == manager && o == op && s == sub) {
            fields.retain(|f| !set.contains(f));
        }
    }
    match entries
        .iter_mut()
        .find(|(m, o, s, _)| m == manager && o == op && s == sub)
    {
        Some(e) if op == "Apply" => e.3 = set.clone(),
        Some(e) => e.3.extend(set.iter().cloned()),
        None => entries.push((manager.to_string(), op.to_string(), sub.to_string(), set.clone())),
    }
    write_managed(obj, entries, rt);
}

/// Server-side apply of `config` by `manager` onto `current`.
fn apply_to(
    current: &Value,
    config: &Value,
    rt: &ResourceType,
    manager: &str,
    force: bool,
    status: bool,
) -> Result<Value, ApiError> {
    let config = strip_server_fields(config);
    let new_set = patch::field_set(&config, &rt.plural, status);
    let sub = if status { "status" } else { "" };
    let entries = managed(current);
    let previous: BTreeSet<FieldPath> = entries
        .iter()
        .filter(|(m, o, s, _)| m == manager && o == "Apply" && s == sub)
        .flat_map(|(_, _, _, f)| f.iter().cloned())
        .collect();
    // Conflicts: fields another manager owns whose value this config changes.
    let mut conflicts: Vec<(String, String)> = Vec::new();
    for (m, _, _, fields) in &entries {
        if m == manager {
            continue;
        }
        for path in fields.intersection(&new_set) {
            if patch::get_path(current, path) != patch::get_path(&config, path) {
                conflicts.push((m.clone(), patch::display_path(path)));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        let detail: Vec<String> = conflicts
            .iter()
            .map(|(m, p)| format!("conflict with {m:?}: {p}"))
            .collect();
        return Err(ApiError::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {} conflict{}: {}",
                conflicts.len(),
                if conflicts.len() == 1 { "" } else { "s" },
                detail.join(", ")
            ),
        ));
    }
    let mut obj = current.clone();
    // Fields this manager applied before and no longer applies are removed, unless another
    // manager also owns them.
    let others: BTreeSet<&FieldPath> = entries
        .iter()
        .filter(|(m, ..)| m != manager)
        .flat_map(|e| e.3.iter())
        .collect();
    for path in previous.difference(&new_set) {
        if !others.contains(path) {
            patch::remove_path(&mut obj, path);
        }
    }
    let mut body = config.clone();
    if let Value::Object(m) = &mut body {
        m.remove("apiVersion");
        m.remove("kind");
        if status {
            m.retain(|k, _| k == "status");
        }
    }
    patch::apply_merge(&mut obj, &body, &rt.plural, "");
    // Ownership: this manager owns exactly new_set; forced conflicts are taken from others.
    let mut entries = entries;
    let taken: BTreeSet<String> = if force {
        conflicts.iter().map(|(_, p)| p.clone()).collect()
    } else {
        BTreeSet::new()
    };
    for (m, _, _, fields) in entries.iter_mut() {
        if m != manager {
            fields.retain(|f| !(new_set.contains(f) && taken.contains(&patch::display_path(f))));
        }
    }
    match entries
        .iter_mut()
        .find(|(m, o, s, _)| m == manager && o == "Apply" && s == sub)
    {
        Some(e) => e.3 = new_set,
        None => entries.push((manager.to_string(), "Apply".into(), sub.to_string(), new_set)),
    }
    write_managed(&mut obj, entries, rt);
    Ok(obj)
}

impl Inner {
    fn rtype(&self, res: &ResKey) -> Result<ResourceType, ApiError> {
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

    fn current(&self, res: &ResKey, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        let rt = self.rtype(res)?;
        self.objects
            .get(res)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt, name))
    }

    fn trim(&mut self) {
        while self.events.len() > self.window {
            if let Some(e) = self.events.pop_front() {
                self.compacted = e.rev;
            }
        }
    }

    fn push_event(&mut self, res: &ResKey, kind: EventKind, obj: Arc<Value>, prev: Option<Arc<Value>>) {
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

    fn create(
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
        self.objects
            .entry(res.clone())
            .or_default()
            .insert(key, obj.clone());
        self.push_event(res, EventKind::Added, obj.clone(), None);
        Ok(obj)
    }

    /// Server-side defaults for the built-in types the host uses.
    fn defaults(&mut self, rt: &ResourceType, obj: &mut Value) {
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
    fn commit(
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

    fn commit_raw(
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
        self.objects
            .entry(res.clone())
            .or_default()
            .insert(key, new.clone());
        self.push_event(res, kind, new.clone(), Some(current.clone()));
        Ok(new)
    }

    fn delete(
        &mut self,
        res: &ResKey,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Arc<Value>, ApiError> {
        let rt = self.rtype(res)?;
        let current = self.current(res, ns, name)?;
        if let Some(uid) = &opts.uid
            && Some(uid.as_str()) != meta_str(&current, "uid")
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&current, "uid").unwrap_or_default()
                ),
            )
            .with_details(&rt, name));
        }
        if let Some(rv) = &opts.resource_version
            && Some(rv.as_str()) != meta_str(&current, "resourceVersion")
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&current, "resourceVersion").unwrap_or_default()
                ),
            )
            .with_details(&rt, name));
        }
        if opts.dry_run {
            return Ok(current);
        }
        let propagation = opts.propagation.clone().unwrap_or_else(|| "Background".into());
        let has_finalizers = current
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers || rt.plural == "namespaces" {
            if current.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(current);
            }
            let mut marked = (*current).clone();
            meta_mut(&mut marked).insert("deletionTimestamp".into(), now().into());
            meta_mut(&mut marked).insert("deletionGracePeriodSeconds".into(), 0.into());
            if rt.plural == "namespaces" {
                marked["status"] = json!({"phase": "Terminating"});
                let out = self.commit_raw(res, &current, marked, EventKind::Modified)?;
                // Empty the namespace, then remove it (our "namespace controller" is synchronous).
                self.empty_namespace(name);
                let latest = self.current(res, ns, name)?;
                let mut done = (*latest).clone();
                meta_mut(&mut done).remove("finalizers");
                return self.remove(res, "", name, done, &propagation).or(Ok(out));
            }
            return self.commit_raw(res, &current, marked, EventKind::Modified);
        }
        self.remove(res, ns, name, (*current).clone(), &propagation)
    }

    /// Remove an object for good, then collect its dependents.
    fn remove(
        &mut self,
        res: &ResKey,
        ns: &str,
        name: &str,
        last: Value,
        propagation: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let uid = meta_str(&last, "uid").unwrap_or_default().to_string();
        if propagation == "Foreground" {
            self.collect_dependents(&uid, "Background");
        }
        let key = (ns.to_string(), name.to_string());
        let removed = self.objects.get_mut(res).and_then(|m| m.remove(&key));
        if removed.is_none() {
            return Err(ApiError::not_found(&self.rtype(res)?, name));
        }
        self.rev += 1;
        let mut last = last;
        meta_mut(&mut last).insert("resourceVersion".into(), self.rev.to_string().into());
        let last = Arc::new(last);
        self.push_event(res, EventKind::Deleted, last.clone(), None);
        if res.plural == "customresourcedefinitions"
            && let Ok(served) = resources::from_crd(&last)
        {
            let k = served.key();
            let names: Vec<ObjKey> = self
                .objects
                .get(&k)
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
            for (ons, oname) in names {
                let _ = self.delete(&k, &ons, &oname, &DeleteOpts::default());
            }
            self.types.remove(&k);
        }
        if propagation != "Foreground" {
            self.collect_dependents(&uid, propagation);
        }
        Ok(last)
    }

    /// Garbage collection: dependents whose owner `uid` is gone are deleted when no other owner
    /// remains (or orphaned: the reference removed).
    fn collect_dependents(&mut self, uid: &str, propagation: &str) {
        if uid.is_empty() {
            return;
        }
        let mut dependents = Vec::new();
        for (res, objs) in &self.objects {
            for ((ns, name), obj) in objs {
                let owners = obj.pointer("/metadata/ownerReferences").and_then(Value::as_array);
                if owners.is_some_and(|o| {
                    o.iter()
                        .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid))
                }) {
                    dependents.push((res.clone(), ns.clone(), name.clone(), obj.clone()));
                }
            }
        }
        for (res, ns, name, obj) in dependents {
            let owners: Vec<Value> = obj
                .pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let remaining: Vec<Value> = owners
                .into_iter()
                .filter(|r| r.get("uid").and_then(Value::as_str) != Some(uid))
                .filter(|r| self.uid_exists(r.get("uid").and_then(Value::as_str).unwrap_or_default()))
                .collect();
            if propagation == "Orphan" || !remaining.is_empty() {
                let mut updated = (*obj).clone();
                if remaining.is_empty() {
                    meta_mut(&mut updated).remove("ownerReferences");
                } else {
                    meta_mut(&mut updated).insert("ownerReferences".into(), Value::Array(remaining));
                }
                let _ = self.commit_raw(&res, &obj, updated, EventKind::Modified);
            } else {
                let _ = self.delete(
                    &res,
                    &ns,
                    &name,
                    &DeleteOpts {
                        propagation: Some("Background".into()),
                        ..Default::default()
                    },
                );
            }
        }
    }

    fn uid_exists(&self, uid: &str) -> bool {
        !uid.is_empty()
            && self
                .objects
                .values()
                .any(|objs| objs.values().any(|o| meta_str(o, "uid") == Some(uid)))
    }

    fn empty_namespace(&mut self, ns: &str) {
        let mut victims = Vec::new();
        for (res, objs) in &self.objects {
            for (ons, name) in objs.keys() {
                if ons == ns {
                    victims.push((res.clone(), name.clone()));
                }
            }
        }
        for (res, name) in victims {
            // Finalizers are honoured elsewhere; a namespace deletion removes its content.
            let current = self.current(&res, ns, &name);
            if let Ok(cur) = current {
                let mut last = (*cur).clone();
                meta_mut(&mut last).remove("finalizers");
                let _ = self.remove(&res, ns, &name, last, "Background");
            }
        }
    }
}

const SNAPSHOT: &str = "snapshot.json";
const WAL: &str = "wal.jsonl";

impl Inner {
    /// Put or remove an object while loading state (no events, no checks).
    fn restore(&mut self, res: ResKey, op: &str, obj: Value) {
        let key = (
            meta_str(&obj, "namespace").unwrap_or_default().to_string(),
            meta_str(&obj, "name").unwrap_or_default().to_string(),
        );
        if res.plural == "customresourcedefinitions"
            && res.group == "apiextensions.k8s.io"
            && let Ok(served) = resources::from_crd(&obj)
        {
            if op == "delete" {
                self.types.remove(&served.key());
                self.objects.remove(&served.key());
            } else {
                self.types.insert(served.key(), served);
            }
        }
        if op == "delete" {
            if let Some(m) = self.objects.get_mut(&res) {
                m.remove(&key);
            }
        } else {
            self.objects.entry(res).or_default().insert(key, Arc::new(obj));
        }
    }

    fn load(&mut self, dir: &std::path::Path) -> std::io::Result<()> {
        use std::io::{BufRead, Write};
        std::fs::create_dir_all(dir)?;
        let snapshot = dir.join(SNAPSHOT);
        if snapshot.is_file() {
            let v: Value = serde_json::from_slice(&std::fs::read(&snapshot)?).map_err(|e| {
                std::io::Error::other(format!("{}: not a state snapshot: {e}", snapshot.display()))
            })?;
            self.rev = v["rev"].as_u64().unwrap_or(1);
            let mut items: Vec<&Value> = v["objects"]
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            // CRDs first, so their resources are served when their objects are restored.
            items.sort_by_key(|i| i["plural"] != "customresourcedefinitions");
            for item in items {
                let res = ResKey {
                    group: item["group"].as_str().unwrap_or_default().into(),
                    plural: item["plural"].as_str().unwrap_or_default().into(),
                };
                self.restore(res, "put", item["obj"].clone());
            }
        }
        let wal_path = dir.join(WAL);
        if wal_path.is_file() {
            let file = std::fs::File::open(&wal_path)?;
            for line in std::io::BufReader::new(file).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    tracing::warn!(path = %wal_path.display(), "dropping a torn record at the end of the write-ahead log");
                    break;
                };
                let rev = v["rev"].as_u64().unwrap_or(0);
                if rev <= self.rev && snapshot.is_file() {
                    continue;
                }
                let res = ResKey {
                    group: v["group"].as_str().unwrap_or_default().into(),
                    plural: v["plural"].as_str().unwrap_or_default().into(),
                };
                self.restore(res, v["op"].as_str().unwrap_or("put"), v["obj"].clone());
                self.rev = self.rev.max(rev);
            }
        }
        self.compacted = self.rev;
        self.next_ip = 1 + self.objects.values().map(|m| m.len() as u32).sum::<u32>();
        // Compact: a new snapshot (atomically), then an empty log.
        let objects: Vec<Value> = self
            .objects
            .iter()
            .flat_map(|(res, m)| {
                m.values()
                    .map(move |o| json!({"group": res.group, "plural": res.plural, "obj": &**o}))
            })
            .collect();
        let tmp = dir.join(format!("{SNAPSHOT}.tmp"));
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(
                json!({"rev": self.rev, "objects": objects})
                    .to_string()
                    .as_bytes(),
            )?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &snapshot)?;
        let wal = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&wal_path)?;
        wal.sync_all()?;
        self.wal = Some(std::fs::OpenOptions::new().append(true).open(&wal_path)?);
        Ok(())
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
