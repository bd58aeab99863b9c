//! Watch events: what changed, at which revision, as watches see it.

use std::sync::Arc;

use serde_json::Value;

use crate::resources::ResKey;

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
