//! A BuilderPlugin's status: the phase and the `Loaded` condition of the last look at it, the
//! version that serves (`status.serving`: what a restart loads again when the current spec is
//! refused) and the parents it applies to.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use slinky_api::{BuilderPlugin, BuilderPluginStatus, ServingVersion, conditions::LOADED};

use super::steps::{Loaded, Outcome, Steps, kinds_text};
use crate::{
    plugins::BuilderKind,
    reconcile::core::{caches::Caches, status::ConditionChanges},
};

/// At most this many parents are named in `status.appliesTo`.
const APPLIES_TO_NAMED: usize = 50;

/// The longest `Loaded` message written (a module's error can be long).
const MESSAGE_CAP: usize = 32 * 1024;

/// The `Loaded` condition of `bp` as `steps` last found it.
pub(super) fn conditions(bp: &BuilderPlugin, steps: &Steps) -> ConditionChanges {
    let name = bp.name_any();
    let loaded = steps.loaded(&name);
    let (status, reason, message) = match steps.outcome(&name) {
        Some(Outcome::Loaded) => (
            true,
            "Loaded".to_string(),
            loaded.as_ref().map_or_else(String::new, |l| {
                format!("{} serves {}", l.step.plugin.label(), kinds_text(&l.kinds))
            }),
        ),
        Some(Outcome::Refused(failure)) => {
            let keeps = loaded.as_ref().map_or_else(
                || "; nothing serves for it".to_string(),
                |l| format!("; {} ({}) keeps serving", l.step.plugin.label(), l.digest),
            );
            (
                false,
                failure.reason.to_string(),
                format!("{}{keeps}", failure.message),
            )
        }
        None => (false, "Pending".to_string(), "not looked at yet".to_string()),
    };
    let mut changes = ConditionChanges::new(bp.metadata.generation);
    let message: String = message.chars().take(MESSAGE_CAP).collect();
    changes.set(LOADED, status, &reason, message);
    changes
}

/// The status of `bp`: its conditions (`conditions`, already merged), what serves, and the
/// parents it applies to (from `caches`; at start-up, before they synced, what the status said).
pub(super) fn status(
    bp: &BuilderPlugin,
    steps: &Steps,
    conditions: Vec<Condition>,
    caches: Option<&Caches>,
) -> BuilderPluginStatus {
    let name = bp.name_any();
    let phase = match steps.outcome(&name) {
        Some(Outcome::Loaded) => "Loaded",
        Some(Outcome::Refused(_)) => "Refused",
        None => "Pending",
    };
    let mut status = BuilderPluginStatus {
        observed_generation: bp.metadata.generation,
        phase: Some(phase.into()),
        conditions,
        ..Default::default()
    };
    let Some(l) = steps.loaded(&name) else {
        return status;
    };
    let p = &l.step.plugin;
    status.plugin = Some(p.label());
    status.digest = Some(format!("sha256:{}", p.digest()));
    status.short_digest = Some(p.digest().chars().take(12).collect());
    status.contract = Some(p.contract().as_str().to_string());
    status.tier = Some(p.tier().as_str().to_string());
    status.serving = Some(ServingVersion {
        digest: l.digest.clone(),
        spec: l.spec.clone(),
    });
    match caches {
        Some(caches) => {
            let applies = applies_to(&l, caches);
            status.applies_to_count = Some(applies.len() as i64);
            status.applies_to = applies.into_iter().take(APPLIES_TO_NAMED).collect();
        }
        None => {
            if let Some(old) = &bp.status {
                status.applies_to_count = old.applies_to_count;
                status.applies_to = old.applies_to.clone();
            }
        }
    }
    status
}

/// The parents `loaded` applies to now: `<Kind> <namespace>/<name>`, sorted.
fn applies_to(loaded: &Loaded, caches: &Caches) -> Vec<String> {
    let mut out = BTreeSet::new();
    let step = &loaded.step;
    let mut add = |kind: &str, meta: &ObjectMeta| {
        if step.applies_to(meta) {
            let (ns, name) = (meta.namespace.as_deref(), meta.name.as_deref());
            out.insert(format!(
                "{kind} {}/{}",
                ns.unwrap_or_default(),
                name.unwrap_or_default()
            ));
        }
    };
    for kind in &loaded.kinds {
        match kind {
            BuilderKind::ControllerService | BuilderKind::ControllerChildren => {
                for o in caches.controllers.state() {
                    add("Controller", &o.metadata);
                }
            }
            BuilderKind::NodesetPod | BuilderKind::NodesetChildren => {
                for o in caches.nodesets.state() {
                    add("NodeSet", &o.metadata);
                }
            }
            BuilderKind::RestapiChildren => {
                for o in caches.restapis.state() {
                    add("RestApi", &o.metadata);
                }
            }
            BuilderKind::LoginsetChildren => {
                for o in caches.loginsets.state() {
                    add("LoginSet", &o.metadata);
                }
            }
            BuilderKind::AccountingChildren => {
                for o in caches.accountings.state() {
                    add("Accounting", &o.metadata);
                }
            }
        }
    }
    out.into_iter().collect()
}
