//! The object store: one global, monotonically increasing revision (like etcd's), objects per
//! resource type, a bounded event log for watches, and the write semantics (preconditions,
//! generation, status/spec split, managedFields, finalizers, garbage collection, namespaces,
//! CRDs). Everything happens under one lock, so every write is atomic.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard},
};

use serde_json::{Value, json};
use tokio::sync::watch;

mod decode;
mod delete;
mod event;
mod index;
mod managed;
mod meta;
mod persist;
mod read;
mod write;

pub use event::{Event, EventKind};
pub(crate) use meta::{meta_mut, meta_str, new_uid, now, same_content, spec_part, strip_server_fields};

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
    /// The `SidecarContainers` feature gate (see `ApiServerConfig::sidecar_containers`).
    sidecar_containers: bool,
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
            sidecar_containers: true,
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

    /// Turn the `SidecarContainers` feature gate on or off (see
    /// `ApiServerConfig::sidecar_containers`).
    pub fn set_sidecar_containers(&self, on: bool) {
        self.lock().sidecar_containers = on;
    }

    /// All served types.
    pub fn types(&self) -> Vec<ResourceType> {
        self.lock().types.values().cloned().collect()
    }

    /// Whether any served type is of API group `group`.
    pub fn serves_group(&self, group: &str) -> bool {
        self.lock().types.values().any(|t| t.group == group)
    }

    /// Find a served type by group, version and plural.
    pub fn find_type(&self, group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        self.lock()
            .types
            .values()
            .find(|t| t.group == group && t.version == version && t.plural == plural)
            .cloned()
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
