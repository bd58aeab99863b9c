//! Reads: get, list (filtered, paged) and the events a watch sees after a revision, each
//! through the storage version when the requested version is a view of it.

use std::sync::Arc;

use serde_json::Value;

use super::{Event, ObjKey, Store};
use crate::{ApiError, convert, resources::ResKey};

impl Store {
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
}
