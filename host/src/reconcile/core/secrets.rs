//! The Secrets a parent references (a Controller's `slurmKeyRef` and `jwtKeyRef`, a LoginSet's
//! `sssdConfRef`, an Accounting's keys and database password) are read by name, never listed or
//! watched: the host's RBAC on Secrets lets it `get` them, not list them, so it cannot read the
//! cluster's other Secrets. To follow a rotation without a watch, a poll per parent kind re-reads
//! the referenced Secrets every `interval` and triggers each parent one of whose Secrets changed
//! (a new resourceVersion), appeared or went away: the pods follow the new key within about one
//! interval, not at the next resync (5 minutes). A Secret two parents of a kind reference is read
//! once per round.

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
use slinky_api::{Accounting, Controller, LoginSet};
use tokio::sync::mpsc::UnboundedSender;

/// The default poll interval (`run --secret-poll-seconds`).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);

/// `(namespace, name)` of a Secret.
type SecretKey = (String, String);

/// A parent kind that references Secrets by name.
pub(super) trait ReferencesSecrets:
    kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static
{
    /// The names of the Secrets of its namespace it reads.
    fn secret_names(&self) -> Vec<String>;

    /// `(namespace, name)` of each Secret it reads.
    fn referenced(&self) -> Vec<SecretKey> {
        let ns = self.meta().namespace.clone().unwrap_or_default();
        self.secret_names().into_iter().map(|n| (ns.clone(), n)).collect()
    }
}

impl ReferencesSecrets for Controller {
    /// The key Secrets (none for an external Controller).
    fn secret_names(&self) -> Vec<String> {
        if self.spec.external {
            return Vec::new();
        }
        self.key_secret_refs().map(|r| r.name.clone()).collect()
    }
}

impl ReferencesSecrets for LoginSet {
    /// `sssd.conf`'s Secret (its host keys Secret is its own: made once, immutable).
    fn secret_names(&self) -> Vec<String> {
        vec![self.spec.sssd_conf_ref.name.clone()]
    }
}

impl ReferencesSecrets for Accounting {
    /// The key Secrets and the database password's (none for an external Accounting).
    fn secret_names(&self) -> Vec<String> {
        if self.spec.external {
            return Vec::new();
        }
        self.key_secret_refs()
            .map(|r| r.name.clone())
            .chain([self.spec.storage_config.password_key_ref.name.clone()])
            .collect()
    }
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

/// The poll of referenced Secrets: the client, the namespaces served (all when empty) and the
/// period.
#[derive(Clone)]
pub(super) struct Poll {
    pub(super) client: Client,
    pub(super) allowed: Arc<Vec<String>>,
    pub(super) interval: Duration,
}

/// Where the parents whose Secrets changed are sent: Controllers, LoginSets, Accountings.
pub(super) type ParentSenders = (
    UnboundedSender<ObjectRef<Controller>>,
    UnboundedSender<ObjectRef<LoginSet>>,
    UnboundedSender<ObjectRef<Accounting>>,
);

impl Poll {
    /// Poll the Secrets of the Controllers, LoginSets and Accountings, triggering each parent one
    /// of whose Secrets changed.
    pub(super) fn run_all(
        self,
        (controllers, loginsets, accountings): (&Store<Controller>, &Store<LoginSet>, &Store<Accounting>),
        (to_controllers, to_loginsets, to_accountings): ParentSenders,
    ) -> impl std::future::Future<Output = ((), (), ())> + Send + 'static {
        futures::future::join3(
            self.clone().run(controllers.clone(), to_controllers),
            self.clone().run(loginsets.clone(), to_loginsets),
            self.run(accountings.clone(), to_accountings),
        )
    }

    /// Poll the referenced Secrets of the cached parents of kind `K` every interval, sending the
    /// parents whose Secrets changed to `tx`. Runs until `tx`'s receiver is gone.
    pub(super) async fn run<K: ReferencesSecrets>(
        self,
        parents: Store<K>,
        tx: UnboundedSender<ObjectRef<K>>,
    ) {
        poll(self.client, parents, tx, self.allowed, self.interval).await;
    }
}

async fn poll<K: ReferencesSecrets>(
    client: Client,
    controllers: Store<K>,
    tx: UnboundedSender<ObjectRef<K>>,
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
        let served =
            |c: &&Arc<K>| allowed.is_empty() || c.namespace().is_some_and(|ns| allowed.contains(&ns));
        let wanted: BTreeSet<SecretKey> = state.iter().filter(served).flat_map(|c| c.referenced()).collect();
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
            if c.referenced().iter().any(|k| changed.contains(k)) {
                tracing::info!(kind = %K::kind(&()), name = %c.name_any(), "a referenced Secret changed: reconciling");
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
