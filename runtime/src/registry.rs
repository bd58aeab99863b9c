//! The registry of builders: one active plugin per builder kind (the bundled one, a `--plugin`
//! file, or a plugins-directory override), the BuilderPlugin steps after it, and the pipeline a
//! parent's namespace and labels select.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex, RwLock},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

use super::{
    BuilderKind, EngineHandle, Plugin, PluginError,
    bundled::KINDS,
    metrics::ReloadMetrics,
    pipeline::{Pipeline, Step},
};

fn index(kind: BuilderKind) -> usize {
    kind.index()
}

/// Now, as RFC 3339 text.
pub(crate) fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// A version that was refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct RefusedVersion {
    /// The file.
    pub source: String,
    /// The sha256 of what was read, when it could be read.
    pub digest: Option<String>,
    /// Why, and how to fix it.
    pub reason: String,
    /// When (RFC 3339).
    pub at: String,
}

/// The active plugin of a kind, as `/plugins` shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveInfo {
    /// `describe().name`.
    pub name: String,
    /// `describe().version`.
    pub version: String,
    /// sha256 of the component.
    pub digest: String,
    /// The file, or `bundled`.
    pub source: String,
    /// When it became active (RFC 3339).
    pub loaded_at: String,
    /// Which compiler made the code it runs: `baseline` (Winch, until the optimized code is
    /// ready) or `optimized` (Cranelift).
    pub tier: super::Tier,
}

struct Slot {
    active: RwLock<(Plugin, String)>,
    /// What serves when no override is present: the bundled plugin, or a `--plugin` file.
    base: Plugin,
    /// Bumped on every swap; reconcilers subscribe to re-reconcile the parents of this kind.
    changes: tokio::sync::watch::Sender<u64>,
    last_refused: Mutex<Option<RefusedVersion>>,
    /// The steps `BuilderPlugin`s add after the base builder, sorted by order, then name.
    steps: RwLock<Vec<Step>>,
}

/// One active plugin per builder kind. Reads take a clone of the active [`Plugin`] (an `Arc`),
/// so a call in flight keeps the version it started with even if another is swapped in.
pub struct PluginRegistry {
    engine: Arc<EngineHandle>,
    slots: [Slot; KINDS.len()],
    /// Per-file state of the plugins directory, for `/plugins` (set by the reloader).
    files: Mutex<Vec<serde_json::Value>>,
    plugins_dir: Mutex<Option<PathBuf>>,
    /// Reload counters.
    pub reloads: ReloadMetrics,
}

impl std::fmt::Debug for PluginRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("PluginRegistry");
        for kind in KINDS {
            d.field(kind.as_str(), &self.active(kind));
        }
        d.finish_non_exhaustive()
    }
}

impl PluginRegistry {
    /// The bundled plugins, overridden by kind by the given plugin files.
    ///
    /// # Errors
    /// A file that fails to load, or two files building the same kind.
    pub fn new(engine: &Arc<EngineHandle>, overrides: &[PathBuf]) -> Result<Self, PluginError> {
        let mut chosen: [Option<Plugin>; KINDS.len()] = Default::default();
        for path in overrides {
            let plugin = Plugin::load_file(engine, path)?;
            for (slot, kind) in chosen.iter_mut().zip(KINDS) {
                if !plugin.builds(kind) {
                    continue;
                }
                if let Some(previous) = slot {
                    return Err(PluginError::Refused {
                        plugin: path.display().to_string(),
                        reason: format!(
                            "{} also builds {kind}; give one plugin per builder kind",
                            previous.source()
                        ),
                    });
                }
                *slot = Some(plugin.clone());
            }
        }
        let [
            service,
            pod,
            controller_children,
            nodeset_children,
            restapi_children,
            loginset_children,
            accounting_children,
        ] = chosen;
        let slot = |chosen: Option<Plugin>, kind| -> Result<Slot, PluginError> {
            let base = match chosen {
                Some(p) => p,
                None => Plugin::load_bundled(engine, kind)?,
            };
            Ok(Slot {
                active: RwLock::new((base.clone(), now_rfc3339())),
                base,
                changes: tokio::sync::watch::channel(0).0,
                last_refused: Mutex::new(None),
                steps: RwLock::new(Vec::new()),
            })
        };
        Ok(PluginRegistry {
            engine: engine.clone(),
            slots: [
                slot(service, BuilderKind::ControllerService)?,
                slot(pod, BuilderKind::NodesetPod)?,
                slot(controller_children, BuilderKind::ControllerChildren)?,
                slot(nodeset_children, BuilderKind::NodesetChildren)?,
                slot(restapi_children, BuilderKind::RestapiChildren)?,
                slot(loginset_children, BuilderKind::LoginsetChildren)?,
                slot(accounting_children, BuilderKind::AccountingChildren)?,
            ],
            files: Mutex::new(Vec::new()),
            plugins_dir: Mutex::new(None),
            reloads: ReloadMetrics::default(),
        })
    }

    /// The engine the plugins run on.
    pub fn engine(&self) -> &Arc<EngineHandle> {
        &self.engine
    }

    fn slot(&self, kind: BuilderKind) -> &Slot {
        &self.slots[index(kind)]
    }

    /// The active plugin for `kind`.
    pub fn active(&self, kind: BuilderKind) -> Plugin {
        match self.slot(kind).active.read() {
            Ok(p) => p.0.clone(),
            Err(poisoned) => poisoned.into_inner().0.clone(),
        }
    }

    /// What serves `kind` when no override is present (bundled, or a `--plugin` file).
    pub fn base(&self, kind: BuilderKind) -> Plugin {
        self.slot(kind).base.clone()
    }

    /// Make `plugin` the active plugin for `kind` (it must build that kind); returns the previous.
    /// Subscribers of `kind` are told. Swapping in the plugin that is already active does nothing.
    ///
    /// # Errors
    /// [`PluginError::NotAKind`] when the plugin does not build `kind`.
    pub fn swap(&self, kind: BuilderKind, plugin: Plugin) -> Result<Plugin, PluginError> {
        if !plugin.builds(kind) {
            return Err(PluginError::NotAKind {
                plugin: plugin.label(),
                kind,
            });
        }
        let slot = self.slot(kind);
        let previous = {
            let mut active = match slot.active.write() {
                Ok(s) => s,
                Err(poisoned) => poisoned.into_inner(),
            };
            if active.0.digest() == plugin.digest() && active.0.source() == plugin.source() {
                return Ok(plugin);
            }
            let previous = std::mem::replace(&mut *active, (plugin, now_rfc3339())).0;
            // Counted before the lock is released: whoever sees the new version sees its swap.
            slot.changes.send_modify(|n| *n += 1);
            previous
        };
        Ok(previous)
    }

    /// The pipeline that builds `kind` for the parent `parent` describes: the active plugin, then
    /// the steps whose namespaces and selector take it.
    pub fn pipeline(&self, kind: BuilderKind, parent: &ObjectMeta) -> Pipeline {
        let base = self.active(kind);
        let steps = match self.slot(kind).steps.read() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        if steps.is_empty() {
            return Pipeline::from(base);
        }
        let applying = steps.iter().filter(|s| s.applies_to(parent)).cloned().collect();
        Pipeline::new(base, applying)
    }

    /// Replace the steps of `kind` (sorted here by order, then name). Subscribers of `kind` are
    /// told when they changed (another module, settings, order or selector).
    pub fn set_steps(&self, kind: BuilderKind, mut steps: Vec<Step>) {
        steps.sort_by(|a, b| (a.order, &a.name).cmp(&(b.order, &b.name)));
        let slot = self.slot(kind);
        let changed = {
            let mut current = match slot.steps.write() {
                Ok(s) => s,
                Err(poisoned) => poisoned.into_inner(),
            };
            let same = current.len() == steps.len()
                && current.iter().zip(&steps).all(|(a, b)| {
                    a.name == b.name
                        && a.plugin.digest() == b.plugin.digest()
                        && a.settings == b.settings
                        && a.order == b.order
                        && a.selector == b.selector
                });
            *current = steps;
            !same
        };
        if changed {
            slot.changes.send_modify(|n| *n += 1);
        }
    }

    /// The steps of `kind`, in pipeline order.
    pub fn steps(&self, kind: BuilderKind) -> Vec<Step> {
        match self.slot(kind).steps.read() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// A receiver that changes on every swap of `kind` (its value counts the swaps).
    pub fn subscribe(&self, kind: BuilderKind) -> tokio::sync::watch::Receiver<u64> {
        self.slot(kind).changes.subscribe()
    }

    /// How many times `kind` was swapped.
    pub fn swaps(&self, kind: BuilderKind) -> u64 {
        *self.slot(kind).changes.borrow()
    }

    /// Remember a refused version of `kind`.
    pub fn refused(&self, kind: BuilderKind, refusal: RefusedVersion) {
        if let Ok(mut r) = self.slot(kind).last_refused.lock() {
            *r = Some(refusal);
        }
    }

    /// The last refused version of `kind`.
    pub fn last_refused(&self, kind: BuilderKind) -> Option<RefusedVersion> {
        self.slot(kind).last_refused.lock().ok().and_then(|r| r.clone())
    }

    /// Publish the per-file state of the plugins directory (for `/plugins`).
    pub(crate) fn set_files(&self, dir: &std::path::Path, files: Vec<serde_json::Value>) {
        if let Ok(mut d) = self.plugins_dir.lock() {
            *d = Some(dir.to_path_buf());
        }
        if let Ok(mut f) = self.files.lock() {
            *f = files;
        }
    }

    /// The active plugin of `kind` as `/plugins` shows it.
    pub fn active_info(&self, kind: BuilderKind) -> ActiveInfo {
        let (plugin, since) = match self.slot(kind).active.read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        ActiveInfo {
            name: plugin.info().name.clone(),
            version: plugin.info().version.clone(),
            digest: plugin.digest().to_string(),
            source: plugin.source().to_string(),
            loaded_at: since,
            tier: plugin.tier(),
        }
    }

    /// The `/plugins` document: per builder kind the active plugin and the last refused
    /// version; the plugins directory and the state of each file in it; reload counters.
    pub fn status_json(&self) -> serde_json::Value {
        let builders: Vec<serde_json::Value> = KINDS
            .iter()
            .map(|&kind| {
                let base = self.base(kind);
                serde_json::json!({
                    "kind": kind.as_str(),
                    "active": self.active_info(kind),
                    "fallback": format!("{} ({})", base.label(), base.source()),
                    "swaps": self.swaps(kind),
                    "lastRefused": self.last_refused(kind),
                    "steps": self.steps(kind).iter().map(|s| serde_json::json!({
                        "builderPlugin": s.name,
                        "plugin": s.plugin.label(),
                        "digest": s.plugin.digest(),
                        "order": s.order,
                        "selector": s.selector,
                        "tier": s.plugin.tier(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let reloads = self.reloads.results.lock().map(|m| m.clone()).unwrap_or_default();
        serde_json::json!({
            "builders": builders,
            "pluginsDir": self.plugins_dir.lock().ok().and_then(|d| d.clone()),
            "files": self.files.lock().map(|f| f.clone()).unwrap_or_default(),
            "reloads": reloads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundled::bundled_bytes;

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
    }

    /// Reproducible guests (`--remap-path-prefix` in the build): no path of the machine that
    /// built them is inside, so the same source built elsewhere has the same digest.
    #[test]
    fn bundled_plugins_carry_no_build_machine_paths() {
        let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        for kind in KINDS {
            let (name, bytes) = (kind.as_str(), bundled_bytes(kind));
            assert!(
                !contains(bytes, workspace.as_bytes()),
                "{name} contains {workspace}"
            );
            assert!(
                !contains(bytes, b"/.cargo/registry"),
                "{name} contains a path of cargo's registry"
            );
        }
    }
}
