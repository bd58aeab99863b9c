//! Watch events: what changed, at which revision, as watches see it; and the event log every
//! write appends to (and, with `--state-dir`, the write-ahead log), trimmed to its window.

use std::sync::Arc;

use serde_json::{Value, json};

use super::Inner;
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

impl Inner {
    /// Drop the oldest events beyond the window: watches from before them must relist.
    pub(super) fn trim(&mut self) {
        while self.events.len() > self.window {
            if let Some(e) = self.events.pop_front() {
                self.compacted = e.rev;
            }
        }
    }

    /// Log a change at the current revision (in the write-ahead log too, when there is one).
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
}
