//! The object map and its indexes (uid, owner uid), kept in step by [`Inner::put`] and
//! [`Inner::take`].

use std::sync::Arc;

use serde_json::Value;

use super::{Inner, ObjKey, meta_str};
use crate::resources::ResKey;

fn owner_uids(obj: &Value) -> impl Iterator<Item = &str> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str))
}

impl Inner {
    /// Store an object (new or replacing one), keeping the uid and owner indexes in step.
    pub(super) fn put(&mut self, res: &ResKey, key: ObjKey, obj: Arc<Value>) {
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
    pub(super) fn take(&mut self, res: &ResKey, key: &ObjKey) -> Option<Arc<Value>> {
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
