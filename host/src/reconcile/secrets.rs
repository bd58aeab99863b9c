//! The key Secrets a Controller references (`slurmKeyRef`, `jwtKeyRef`) are read by name, never
//! listed or watched: the host's RBAC on Secrets is `get`, so it cannot read the cluster's other
//! Secrets. To follow a key rotation without a watch, a poll re-reads the referenced Secrets every
//! `interval` and triggers each Controller one of whose Secrets changed (a new resourceVersion),
//! appeared or went away: slurmctld's StatefulSet follows the new key within about one interval,
//! not at the next resync (5 minutes). A Secret two Controllers reference is read once per round.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api, Client, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use slinky_api::Controller;
use tokio::sync::mpsc::UnboundedSender;

/// The default poll interval (`run --secret-poll-seconds`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);

/// `(namespace, name)` of a Secret.
type SecretKey = (String, String);

/// The key Secrets `c` references (none for an external Controller).
fn referenced(c: &Controller) -> Vec<SecretKey> {
    if c.spec.external {
        return Vec::new();
    }
    let ns = c.namespace().unwrap_or_default();
    c.key_secret_refs()
        .map(|r| (ns.clone(), r.name.clone()))
        .collect()
}

/// The Secrets whose version differs between two rounds (a Secret first seen is no change: the
/// Controller's own pass read it).
fn changed(
    before: &BTreeMap<SecretKey, Option<String>>,
    now: &BTreeMap<SecretKey, Option<String>>,
) -> BTreeSet<SecretKey> {
    now.iter()
        .filter(|(k, v)| before.get(*k).is_some_and(|old| old != *v))
        .map(|(k, _)| k.clone())
        .collect()
}

/// Poll the referenced Secrets of the cached Controllers (of `allowed` namespaces, all when
/// empty) every `interval`, sending the Controllers whose Secrets changed to `tx`. Runs until
/// `tx`'s receiver is gone.
pub(super) async fn poll(
    client: Client,
    controllers: Store<Controller>,
    tx: UnboundedSender<ObjectRef<Controller>>,
    allowed: Arc<Vec<String>>,
    interval: Duration,
) {
    let mut seen: BTreeMap<SecretKey, Option<String>> = BTreeMap::new();
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if tx.is_closed() {
            return;
        }
        let state = controllers.state();
        let served = |c: &&Arc<Controller>| {
            allowed.is_empty() || c.namespace().is_some_and(|ns| allowed.contains(&ns))
        };
        let wanted: BTreeSet<SecretKey> = state.iter().filter(served).flat_map(|c| referenced(c)).collect();
        let mut now = BTreeMap::new();
        for (ns, name) in wanted {
            let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
            match api.get_opt(&name).await {
                Ok(s) => {
                    now.insert((ns, name), s.and_then(|s| s.metadata.resource_version));
                }
                // Unknown this round: keep what was seen, so the next read compares with it.
                Err(error) => {
                    tracing::debug!(%error, namespace = %ns, secret = %name, "cannot read a key Secret (retried next round)");
                    if let Some(old) = seen.get(&(ns.clone(), name.clone())) {
                        now.insert((ns, name), old.clone());
                    }
                }
            }
        }
        let changed = changed(&seen, &now);
        for c in state.iter().filter(served) {
            if referenced(c).iter().any(|k| changed.contains(k)) {
                tracing::info!(controller = %c.name_any(), "a key Secret changed: reconciling");
                let _ = tx.send(ObjectRef::from_obj(c.as_ref()));
            }
        }
        seen = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_version_an_appearance_or_a_removal_is_a_change() {
        let key = |n: &str| ("ns".to_string(), n.to_string());
        let before: BTreeMap<_, _> = [
            (key("a"), Some("1".to_string())),
            (key("b"), None),
            (key("c"), Some("5".to_string())),
            (key("d"), Some("7".to_string())),
        ]
        .into();
        let now: BTreeMap<_, _> = [
            (key("a"), Some("2".to_string())),
            (key("b"), Some("3".to_string())),
            (key("c"), None),
            (key("d"), Some("7".to_string())),
            (key("e"), Some("9".to_string())),
        ]
        .into();
        assert_eq!(changed(&before, &now), [key("a"), key("b"), key("c")].into());
    }
}
