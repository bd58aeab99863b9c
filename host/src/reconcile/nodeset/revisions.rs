//! Each NodeSet's pod revision ([`crate::revision`]), remembered with the build key it was built
//! under: a pass builds the probe pod only when what the builders are given changed (a spec
//! field, the Controller, another builder or settings), not on every pass.
//!
//! # Guarantees
//! * One entry per NodeSet UID, forgotten when the NodeSet goes.
//! * A failed build is not remembered: the next pass builds again.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
};

use slinky_api::{Controller, NodeSet};

use crate::{
    plugins::{Pipeline, PluginError},
    reconcile::{Error, core::context::Core},
    revision::{build_key, output_revision, probe_identity, provenance},
};

/// A NodeSet's revision and the builder annotations of its probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Known {
    /// [`build_key`] it was built under.
    key: String,
    /// [`versions`] when `key` was last computed: while they stay, so does the key.
    versions: Option<String>,
    /// The pod revision.
    pub revision: String,
    /// The probe's builder annotations (what pods of this revision carry).
    pub provenance: BTreeMap<String, String>,
}

impl Known {
    /// The revision the NodeSet's status names, for a pass whose probe could not be built: its
    /// pods are synced under it (deletes, drains, protection) while what needs the builder waits.
    pub fn last(revision: String) -> Known {
        Known {
            key: String::new(),
            versions: None,
            revision,
            provenance: BTreeMap::new(),
        }
    }
}

/// The NodeSet's and the Controller's resourceVersions and the builder's digest: what
/// [`build_key`] is computed from cannot have changed while they stay (the build context is
/// the host's, fixed for its life), so a pass computes the key only after a write to either.
/// `None` for an object without a resourceVersion (never stored).
fn versions(nodeset: &NodeSet, controller: &Controller, digest: &str) -> Option<String> {
    Some(format!(
        "{} {} {digest}",
        nodeset.metadata.resource_version.as_deref()?,
        controller.metadata.resource_version.as_deref()?
    ))
}

/// The remembered revisions, per NodeSet UID.
#[derive(Debug, Default)]
pub(crate) struct Revisions {
    entries: Mutex<HashMap<String, Known>>,
}

impl Revisions {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<String, Known>) -> R) -> R {
        crate::reconcile::core::locked(&self.entries, f)
    }

    /// Forget `nodeset_uid` (it is gone).
    pub fn forget(&self, nodeset_uid: &str) {
        self.with(|m| m.remove(nodeset_uid));
    }

    /// `nodeset`'s revision as `plugin` builds it: remembered, or built now (the probe pod, on a
    /// blocking thread) and remembered.
    ///
    /// # Errors
    /// The outer error is the host's (the blocking pool is gone); the inner one the builder's.
    pub async fn of(
        &self,
        core: &Core,
        nodeset: &NodeSet,
        controller: &Controller,
        plugin: &Pipeline,
    ) -> Result<Result<Known, PluginError>, Error> {
        let uid = kube::ResourceExt::uid(nodeset).unwrap_or_default();
        let versions = versions(nodeset, controller, plugin.digest());
        let fresh = |k: &&Known| versions.is_some() && k.versions == versions;
        if let Some(known) = self.with(|m| m.get(&uid).filter(fresh).cloned()) {
            return Ok(Ok(known));
        }
        let key = build_key(nodeset, controller, plugin.digest(), &core.build);
        let same_key = |m: &mut HashMap<String, Known>| {
            let k = m.get_mut(&uid).filter(|k| k.key == key)?;
            k.versions.clone_from(&versions);
            Some(k.clone())
        };
        if let Some(known) = self.with(same_key) {
            return Ok(Ok(known));
        }
        let built =
            super::pods::build_pods(core, nodeset, controller, plugin, vec![probe_identity(nodeset)]).await?;
        let pod = match built.map(|mut pods| pods.pop()) {
            Ok(Some(pod)) => pod,
            // One identity, one pod: build_pods maps each identity to its pod.
            Ok(None) => {
                return Ok(Err(PluginError::Refused {
                    plugin: plugin.label().to_string(),
                    reason: "no pod was built for the revision probe".into(),
                }));
            }
            Err(e) => return Ok(Err(e)),
        };
        let known = Known {
            key,
            versions,
            revision: output_revision(&pod, nodeset),
            provenance: provenance(&pod),
        };
        tracing::debug!(nodeset = %kube::ResourceExt::name_any(nodeset), revision = %known.revision, "pod revision built");
        self.with(|m| m.insert(uid, known.clone()));
        Ok(Ok(known))
    }
}
