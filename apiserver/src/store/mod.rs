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

mod delete;
mod managed;
mod persist;
mod write;

use crate::{
    ApiError, convert,
    resources::{self, ResKey, ResourceType},
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
    /// `gracePeriodSeconds` (pods: a bound pod terminates for this long; 0 deletes at once).
    pub grace_period: Option<i64>,
    /// Don't persist.
    pub dry_run: bool,
}

type ObjKey = (String, String);

/// A read-modify-write step: the current object (and its type) to the new one.
type Modifier<'a> = Box<dyn FnOnce(&Value, &ResourceType) -> Result<Value, ApiError> + 'a>;

struct Inner {
    rev: u64,
    types: BTreeMap<ResKey, ResourceType>,
    /// Every object, by type, then namespace and name. Changed only through [`Inner::put`] and
    /// [`Inner::take`], which keep the indexes below in step.
    objects: HashMap<ResKey, BTreeMap<ObjKey, Arc<Value>>>,
    /// Where each uid lives.
    by_uid: HashMap<String, (ResKey, ObjKey)>,
    /// Owner uid → the objects whose `ownerReferences` name it (the garbage collector's index).
    owned_by: HashMap<String, BTreeSet<(ResKey, ObjKey)>>,
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

pub(crate) fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub(crate) fn new_uid() -> String {
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

pub(crate) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

pub(crate) fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

/// The object without metadata and status: what `generation` tracks.
pub(crate) fn spec_part(obj: &Value) -> Value {
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
pub(crate) fn same_content(a: &Value, b: &Value) -> bool {
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
            by_uid: HashMap::new(),
            owned_by: HashMap::new(),
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
        if let Some(storage) = convert::storage_of(res) {
            return self
                .get(&storage, ns, name)
                .map(|o| Arc::new(convert::to_view(&o)));
        }
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
        if let Some(storage) = convert::storage_of(res) {
            let seen = |o: &Value| filter(&convert::to_view(o));
            let (items, rev, remaining) = self.list(&storage, ns, &seen, after, limit)?;
            let items = items.iter().map(|o| Arc::new(convert::to_view(o))).collect();
            return Ok((items, rev, remaining));
        }
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
        if let Some(storage) = convert::storage_of(res) {
            let (events, rev) = self.events_since(&storage, rev)?;
            let events = events
                .into_iter()
                .map(|e| Event {
                    res: res.clone(),
                    obj: Arc::new(convert::to_view(&e.obj)),
                    prev: e.prev.map(|p| Arc::new(convert::to_view(&p))),
                    json: Arc::default(),
                    ..e
                })
                .collect();
            return Ok((events, rev));
        }
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
        if let Some(storage) = convert::storage_of(res) {
            let out = self.create(&storage, ns, convert::to_storage(&obj), manager, dry_run)?;
            return Ok(Arc::new(convert::to_view(&out)));
        }
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
        if let Some(storage) = convert::storage_of(res) {
            let out = self.update(&storage, ns, name, convert::to_storage(&obj), sub, manager)?;
            return Ok(Arc::new(convert::to_view(&out)));
        }
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
        if let Some(storage) = convert::storage_of(res) {
            let view = self.lock().rtype(res)?;
            let out = self.modify_in(
                &storage,
                (ns, name, sub, manager, op),
                Box::new(move |cur, _| f(&convert::to_view(cur), &view).map(|new| convert::to_storage(&new))),
            )?;
            return Ok(Arc::new(convert::to_view(&out)));
        }
        self.modify_in(res, (ns, name, sub, manager, op), Box::new(f))
    }

    fn modify_in(
        &self,
        res: &ResKey,
        (ns, name, sub, manager, op): (&str, &str, Sub, &str, Op),
        f: Modifier<'_>,
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
        if let Some(storage) = convert::storage_of(res) {
            let config = convert::to_storage(&config);
            let out = self.apply(&storage, ns, name, config, sub, manager, force)?;
            return Ok(Arc::new(convert::to_view(&out)));
        }
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
                let new = managed::apply_to(&current, &config, &rt, manager, force, sub == Sub::Status)?;
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
        if let Some(storage) = convert::storage_of(res) {
            return self
                .delete(&storage, ns, name, opts)
                .map(|o| Arc::new(convert::to_view(&o)));
        }
        let mut g = self.lock();
        let out = g.delete(res, ns, name, opts)?;
        drop(g);
        self.notify();
        Ok(out)
    }

    /// Bind a pod to a node (the `pods/binding` subresource, as a scheduler does): sets
    /// `spec.nodeName`, which no update may change.
    ///
    /// # Errors
    /// 404, or 409 when the pod is already bound.
    pub fn bind(&self, ns: &str, name: &str, node: &str) -> Result<Arc<Value>, ApiError> {
        let pods = ResKey {
            group: String::new(),
            plural: "pods".into(),
        };
        self.modify(&pods, ns, name, Sub::Main, "embedded-scheduler", Op::Server, |cur, _| {
            if let Some(bound) = cur.pointer("/spec/nodeName").and_then(Value::as_str) {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is already assigned to node \"{bound}\""
                    ),
                ));
            }
            if cur.pointer("/metadata/deletionTimestamp").is_some() {
                return Err(ApiError::new(
                    409,
                    "Conflict",
                    format!("Operation cannot be fulfilled on pods/binding \"{name}\": pod {name} is being deleted, cannot be assigned to a host"),
                ));
            }
            let mut p = cur.clone();
            p["spec"]["nodeName"] = node.into();
            Ok(p)
        })
    }

    fn notify(&self) {
        let rev = self.lock().rev;
        self.revision.send_replace(rev);
    }
}

/// The object without server-set metadata.
pub(crate) fn strip_server_fields(v: &Value) -> Value {
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
    /// Server-side apply: ownership already computed by `managed::apply_to`.
    Apply,
    /// A write by the server itself (no ownership change).
    Server,
}

fn owner_uids(obj: &Value) -> impl Iterator<Item = &str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

impl Inner {
    /// Store an object (new or replacing one), keeping the uid and owner indexes in step.
    fn put(&mut self, res: &ResKey, key: ObjKey, obj: Arc<Value>) {
        self.take(res, &key);
        if let Some(uid) = meta_str(&obj, "uid") {
            self.by_uid.insert(uid.to_string(), (res.clone(), key.clone()));
        }
        for owner in owner_uids(&obj) {
            self.owned_by
                .entry(owner.to_string())
                .or_default()
                .insert((res.clone(), key.clone()));
        }
        self.objects.entry(res.clone()).or_default().insert(key, obj);
    }

    /// Remove an object, keeping the indexes in step.
    fn take(&mut self, res: &ResKey, key: &ObjKey) -> Option<Arc<Value>> {
        let removed = self.objects.get_mut(res)?.remove(key)?;
        if let Some(uid) = meta_str(&removed, "uid") {
            self.by_uid.remove(uid);
        }
        for owner in owner_uids(&removed) {
            if let Some(set) = self.owned_by.get_mut(owner) {
                set.remove(&(res.clone(), key.clone()));
                if set.is_empty() {
                    self.owned_by.remove(owner);
                }
            }
        }
        Some(removed)
    }
}
