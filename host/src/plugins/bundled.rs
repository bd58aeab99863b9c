//! The bundled builders, compiled from `plugins/*` by the build script and embedded in the
//! binary, and the registry that picks one active plugin per builder kind.

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
};

use super::{BuilderKind, EngineHandle, Plugin, PluginError, PluginSource};

/// The bundled `controller-service` component.
pub const CONTROLLER_SERVICE: &[u8] = include_bytes!(env!("SLINKY_BUNDLED_CONTROLLER_SERVICE"));
/// The bundled `nodeset-pod` component.
pub const NODESET_POD: &[u8] = include_bytes!(env!("SLINKY_BUNDLED_NODESET_POD"));

/// Every builder kind.
pub const KINDS: [BuilderKind; 2] = [BuilderKind::ControllerService, BuilderKind::NodesetPod];

/// The bundled component for a kind.
pub fn bundled_bytes(kind: BuilderKind) -> &'static [u8] {
    match kind {
        BuilderKind::ControllerService => CONTROLLER_SERVICE,
        BuilderKind::NodesetPod => NODESET_POD,
    }
}

/// One active plugin per builder kind. Reads take a clone of the active [`Plugin`] (an `Arc`),
/// so a call in flight keeps the version it started with even if another is swapped in.
#[derive(Debug)]
pub struct PluginRegistry {
    engine: Arc<EngineHandle>,
    service: RwLock<Plugin>,
    pod: RwLock<Plugin>,
}

impl PluginRegistry {
    /// The bundled plugins, overridden by kind by the given plugin files.
    ///
    /// # Errors
    /// A file that fails to load, or two files building the same kind.
    pub fn new(engine: &Arc<EngineHandle>, overrides: &[PathBuf]) -> Result<Self, PluginError> {
        let mut chosen: [Option<Plugin>; 2] = [None, None];
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
        let [service, pod] = chosen;
        let bundled = |slot: Option<Plugin>, kind| match slot {
            Some(p) => Ok(p),
            None => Plugin::load(engine, bundled_bytes(kind), PluginSource::Bundled),
        };
        Ok(PluginRegistry {
            engine: engine.clone(),
            service: RwLock::new(bundled(service, BuilderKind::ControllerService)?),
            pod: RwLock::new(bundled(pod, BuilderKind::NodesetPod)?),
        })
    }

    /// The engine the plugins run on.
    pub fn engine(&self) -> &Arc<EngineHandle> {
        &self.engine
    }

    fn slot(&self, kind: BuilderKind) -> &RwLock<Plugin> {
        match kind {
            BuilderKind::ControllerService => &self.service,
            BuilderKind::NodesetPod => &self.pod,
        }
    }

    /// The active plugin for `kind`.
    pub fn active(&self, kind: BuilderKind) -> Plugin {
        match self.slot(kind).read() {
            Ok(p) => p.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Make `plugin` the active plugin for `kind` (it must build that kind); returns the previous.
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
        let mut slot = match self.slot(kind).write() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        Ok(std::mem::replace(&mut *slot, plugin))
    }
}
