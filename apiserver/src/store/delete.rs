//! Deletion: preconditions, finalizers, namespaces (their content goes with them), CRDs (their
//! objects go with them) and garbage collection of dependents through `ownerReferences`
//! (Background, Foreground, Orphan), found through the owner-uid index.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{DeleteOpts, EventKind, Inner, ObjKey, meta_mut, meta_str, now};
use crate::{
    ApiError,
    resources::{self, ResKey},
};

fn has_finalizers(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// The grace period of a pod's deletion (kube-apiserver's `CheckGracefulDelete`): the request's,
/// else the pod's `terminationGracePeriodSeconds` (30 by default); 0 for a pod no kubelet runs
/// (unbound) or that already finished (Failed, Succeeded).
fn pod_grace_period(pod: &Value, requested: Option<i64>) -> i64 {
    let unbound = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    let finished = matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Failed" | "Succeeded")
    );
    if unbound || finished {
        return 0;
    }
    requested
        .or_else(|| {
            pod.pointer("/spec/terminationGracePeriodSeconds")
                .and_then(Value::as_i64)
        })
        .unwrap_or(30)
        .max(0)
}

/// The time `secs` seconds from now, as a Kubernetes timestamp.
fn after_seconds(secs: i64) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    now.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
        .unwrap_or(now)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

impl Inner {
    pub(super) fn delete(
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
        if res.group.is_empty() && res.plural == "pods" {
            let grace = pod_grace_period(&current, opts.grace_period);
            let terminating = current.pointer("/metadata/deletionTimestamp").is_some();
            let previous = current
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64);
            if terminating && previous.is_some_and(|p| p <= grace) {
                // A second delete may shorten the grace period, never lengthen it.
                return Ok(current);
            }
            if terminating && grace == 0 {
                // Ending a grace period early is a change watchers see before the deletion.
                let mut ended = (*current).clone();
                meta_mut(&mut ended).insert("deletionTimestamp".into(), after_seconds(0).into());
                meta_mut(&mut ended).insert("deletionGracePeriodSeconds".into(), 0.into());
                let ended = self.commit_raw(res, &current, ended, EventKind::Modified)?;
                if has_finalizers(&ended) {
                    return Ok(ended);
                }
                return self.remove(res, ns, name, (*ended).clone(), &propagation);
            }
            if grace > 0 {
                // Graceful: the pod stays, terminating, until its kubelet finishes it (or, with
                // finalizers, until they are removed).
                let mut marked = (*current).clone();
                meta_mut(&mut marked).insert("deletionTimestamp".into(), after_seconds(grace).into());
                meta_mut(&mut marked).insert("deletionGracePeriodSeconds".into(), grace.into());
                return self.commit_raw(res, &current, marked, EventKind::Modified);
            }
        }
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
    pub(super) fn remove(
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
        let removed = self.take(res, &key);
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
    pub(super) fn collect_dependents(&mut self, uid: &str, propagation: &str) {
        if uid.is_empty() {
            return;
        }
        let dependents: Vec<(ResKey, String, String, Arc<Value>)> = self
            .owned_by
            .get(uid)
            .into_iter()
            .flatten()
            .filter_map(|(res, key)| {
                let obj = self.objects.get(res)?.get(key)?;
                Some((res.clone(), key.0.clone(), key.1.clone(), obj.clone()))
            })
            .collect();
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

    pub(super) fn uid_exists(&self, uid: &str) -> bool {
        !uid.is_empty() && self.by_uid.contains_key(uid)
    }

    pub(super) fn empty_namespace(&mut self, ns: &str) {
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
