//! Status, finalizers and a pod's conditions: status written only when it changed, as a merge
//! patch carrying the resourceVersion it was computed from, a 409 retried from a fresh read.
//! A status write is not sent over a version the host itself replaced: the object its last
//! write returned stands in for a cached one still at the version that write was made over
//! (the watch had not brought the write back yet), so passes in quick succession, as in a
//! scale-up, do not meet their own 409s.

use std::{
    any::Any,
    collections::HashMap,
    sync::{Arc, Mutex},
};

use super::*;

/// Objects kept before the memory is cleared (a bound, not a working size: one entry per
/// object whose status the host wrote).
const WRITTEN_MAX: usize = 20_000;

/// The last status write of each object: `kind/namespace/name` → (the resourceVersion it was
/// made over, the object it returned).
#[derive(Default)]
pub(crate) struct Written(Mutex<HashMap<String, (String, AnyObject)>>);

/// An object of any kind, downcast by the kind asking.
type AnyObject = Arc<dyn Any + Send + Sync>;

impl Written {
    fn key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
        format!(
            "{}/{}/{}",
            K::kind(&()),
            obj.namespace().unwrap_or_default(),
            obj.name_any()
        )
    }

    /// The object to write over: what the last write of `cached` returned if `cached` is still
    /// at the version that write replaced, else `cached`.
    fn base<K>(&self, cached: &K) -> K
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let m = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match m.get(&Self::key(cached)) {
            Some((over, after)) if cached.resource_version().as_deref() == Some(over.as_str()) => after
                .downcast_ref::<K>()
                .cloned()
                .unwrap_or_else(|| cached.clone()),
            _ => cached.clone(),
        }
    }

    /// `after` was written over `over`.
    fn remember<K>(&self, over: Option<String>, after: &K)
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let mut m = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let key = Self::key(after);
        let Some(over) = over else {
            m.remove(&key);
            return;
        };
        if m.len() >= WRITTEN_MAX {
            m.clear();
        }
        m.insert(key, (over, Arc::new(after.clone())));
    }
}

impl Writer {
    /// Set a NodeSet's finalizers (a merge patch with the resourceVersion they were read at).
    ///
    /// # Errors
    /// The API error (409 when the NodeSet changed meanwhile).
    pub async fn set_finalizers(
        &self,
        ns: &slinky_api::NodeSet,
        finalizers: &[String],
    ) -> Result<slinky_api::NodeSet, kube::Error> {
        self.fence("patch")?;
        let api: Api<slinky_api::NodeSet> =
            Api::namespaced(self.client.clone(), &ns.namespace().unwrap_or_default());
        let patch = json!({"metadata": {"resourceVersion": ns.resource_version(), "finalizers": finalizers}});
        let pp = patch_params();
        self.write("patch", api.patch(&ns.name_any(), &pp, &Patch::Merge(patch)))
            .await
    }

    /// Patch a pod's status with a JSON patch (its conditions: see
    /// `nodeset::slurm_conditions`).
    ///
    /// # Errors
    /// The API error (a failed `test` operation too).
    pub async fn patch_pod_status(&self, pod: &Pod, patch: Value) -> Result<Pod, kube::Error> {
        self.fence("status")?;
        // A raw request: kube's typed JSON patch needs a feature the host does not build.
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}/status?fieldManager={FIELD_MANAGER}",
            pod.namespace().unwrap_or_default(),
            pod.name_any()
        );
        let req = http::Request::patch(path)
            .header(http::header::CONTENT_TYPE, "application/json-patch+json")
            .body(patch.to_string().into_bytes())
            .map_err(kube::Error::HttpError)?;
        self.write("status", self.client.request::<Pod>(req)).await
    }

    /// Write `status` computed by `compute` from an object, only when it changed: the first attempt
    /// uses `cached`; after a 409 the object is re-read from the API and `compute` runs again on
    /// it (so it must merge what it owns into what it reads, keeping other writers' parts). Returns the written object,
    /// or `None` when nothing needed writing.
    ///
    /// # Errors
    /// The API error, or the last 409 after [`STATUS_ATTEMPTS`] attempts.
    pub async fn update_status<K, S>(
        &self,
        api: &Api<K>,
        cached: &K,
        compute: impl Fn(&K) -> S,
        current: impl Fn(&K) -> Option<S>,
    ) -> Result<Option<K>, kube::Error>
    where
        K: Resource<DynamicType = ()>
            + Clone
            + DeserializeOwned
            + Serialize
            + std::fmt::Debug
            + Send
            + Sync
            + 'static,
        S: Serialize + PartialEq,
    {
        let name = cached.name_any();
        let mut obj = self.written.base(cached);
        let mut attempt = 0;
        loop {
            let status = compute(&obj);
            if current(&obj).as_ref() == Some(&status) {
                return Ok(None);
            }
            self.fence("status")?;
            // A merge patch keeps what it does not name: a field the status had and the new one
            // has not is nulled (at any depth: a key gone from a map of the status too).
            let mut body = serde_json::to_value(&status).unwrap_or_default();
            if let Some(old) = current(&obj).and_then(|s| serde_json::to_value(s).ok()) {
                null_removed(&mut body, &old);
            }
            let patch = json!({"metadata": {"resourceVersion": obj.resource_version()}, "status": body});
            let pp = patch_params();
            let r = self
                .write("status", api.patch_status(&name, &pp, &Patch::Merge(&patch)))
                .await;
            match r {
                Ok(o) => {
                    self.written.remember(obj.resource_version(), &o);
                    return Ok(Some(o));
                }
                Err(e) if is_conflict(&e) && attempt + 1 < STATUS_ATTEMPTS => {
                    attempt += 1;
                    self.metrics.conflict_retries.inc();
                    tokio::time::sleep(super::super::backoff::delay(
                        attempt,
                        Duration::from_millis(10),
                        Duration::from_secs(1),
                    ))
                    .await;
                    obj = api.get(&name).await?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Make `new` a merge patch from `old`: every key of an object of `old` that the same object of
/// `new` lacks is added as `null` (objects in both are compared key by key; anything else is
/// replaced whole by a merge patch).
fn null_removed(new: &mut Value, old: &Value) {
    let (Value::Object(new), Value::Object(old)) = (new, old) else {
        return;
    };
    for (key, was) in old {
        match new.get_mut(key) {
            Some(now) => null_removed(now, was),
            None => {
                new.insert(key.clone(), Value::Null);
            }
        }
    }
}

#[cfg(test)]
mod written_tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::Written;

    fn pod(rv: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n", "resourceVersion": rv},
            "status": {"phase": phase}
        }))
        .unwrap_or_default()
    }

    #[test]
    fn a_cached_object_still_at_the_version_written_over_gives_way_to_the_written_one() {
        let w = Written::default();
        let cached = pod("5", "Pending");
        assert_eq!(w.base(&cached), cached, "nothing written yet");
        w.remember(Some("5".into()), &pod("6", "Running"));
        // The watch has not brought the write back: the written object is the base.
        assert_eq!(w.base(&cached), pod("6", "Running"));
        // The cache caught up, or someone else wrote since: the cached object is the base.
        assert_eq!(w.base(&pod("6", "Running")), pod("6", "Running"));
        assert_eq!(w.base(&pod("7", "Failed")), pod("7", "Failed"));
        // Another object of the same name elsewhere is not confused with it.
        let mut other = pod("5", "Pending");
        other.metadata.namespace = Some("m".into());
        assert_eq!(w.base(&other), other);
    }
}

#[cfg(test)]
mod null_tests {
    use serde_json::json;

    use super::null_removed;

    #[test]
    fn a_key_gone_at_any_depth_is_nulled() {
        let old = json!({"a": 1, "m": {"x": {"s": "DRAIN"}, "y": {"s": "DOWN"}}, "l": [1, 2]});
        let mut new = json!({"m": {"y": {"s": "DOWN"}}, "l": [1]});
        null_removed(&mut new, &old);
        assert_eq!(
            new,
            json!({"a": null, "m": {"x": null, "y": {"s": "DOWN"}}, "l": [1]})
        );
    }
}
