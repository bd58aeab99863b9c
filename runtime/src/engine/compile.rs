//! Compiling components, and the cache of precompiled ones: keyed by the component's sha256 and
//! the engine's compatibility hash, loaded with `deserialize` (mmap), re-checked by wasmtime.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use wasmtime::component::Component;

use crate::PluginError;

use super::*;

impl EngineHandle {
    /// The optimized (Cranelift) component for `bytes` (digest `digest`): from memory, else from
    /// the disk cache, else compiled (and stored in the disk cache).
    ///
    /// # Errors
    /// [`PluginError::Compile`] when the bytes are not a valid component.
    pub fn component(
        &self,
        name: &str,
        digest: &str,
        bytes: &[u8],
    ) -> Result<(Component, CompileSource), PluginError> {
        if let Some(found) = self.cached(digest)? {
            return Ok(found);
        }
        let precompiled = self
            .engine
            .precompile_component(bytes)
            .map_err(|e| compile_error(name, &e))?;
        if let Some(path) = self.cache_path(digest) {
            store_cached(&path, &precompiled);
        }
        let component = self.deserialize(&precompiled, name)?;
        self.remember(digest, &component)?;
        Ok((component, CompileSource::Compiled))
    }

    /// The optimized component of `digest` if it is already compiled: in this process, or in the
    /// disk cache.
    ///
    /// # Errors
    /// [`PluginError::Engine`] when the cache lock is poisoned.
    pub fn cached(&self, digest: &str) -> Result<Option<(Component, CompileSource)>, PluginError> {
        if let Some(c) = self.compiled.lock().map_err(poisoned)?.get(digest) {
            return Ok(Some((c.clone(), CompileSource::Memory)));
        }
        let Some(component) = self.cache_path(digest).and_then(|p| self.load_cached(&p)) else {
            return Ok(None);
        };
        self.remember(digest, &component)?;
        Ok(Some((component, CompileSource::Disk)))
    }

    fn remember(&self, digest: &str, component: &Component) -> Result<(), PluginError> {
        self.compiled
            .lock()
            .map_err(poisoned)?
            .insert(digest.to_string(), component.clone());
        Ok(())
    }

    /// `bytes` compiled with Winch, the baseline tier (not cached: the optimized code replaces
    /// it within seconds, and is what the disk cache keeps).
    ///
    /// # Errors
    /// [`PluginError::Compile`] when the bytes are not a valid component or use a feature Winch
    /// does not compile; [`PluginError::Engine`] when there is no baseline engine.
    pub fn baseline_component(&self, name: &str, bytes: &[u8]) -> Result<Component, PluginError> {
        let engine = self
            .baseline
            .as_ref()
            .ok_or_else(|| PluginError::Engine("no baseline (Winch) engine".into()))?;
        Component::new(engine, bytes).map_err(|e| compile_error(name, &e))
    }

    fn cache_path(&self, digest: &str) -> Option<PathBuf> {
        let dir = self.config.cache_dir.as_ref()?;
        Some(dir.join(format!("{digest}-{}.cwasm", self.compat)))
    }

    /// Load a cached artifact. It is read into memory rather than mapped: a file truncated under
    /// a mapping would crash the process (SIGBUS), a read copy can only fail to deserialize.
    fn load_cached(&self, path: &Path) -> Option<Component> {
        let bytes = std::fs::read(path).ok()?;
        match self.deserialize(&bytes, &path.display().to_string()) {
            Ok(c) => Some(c),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "discarding unusable precompiled component");
                let _ = std::fs::remove_file(path);
                None
            }
        }
    }

    #[allow(
        unsafe_code,
        reason = "deserializing artifacts of our own engine; see the safety note"
    )]
    fn deserialize(&self, precompiled: &[u8], name: &str) -> Result<Component, PluginError> {
        // SAFETY: `precompiled` was produced by `precompile_component` of this engine, or of an
        // engine with the same compatibility hash (it is in the cache file's name), and stored
        // atomically (unique temp file + rename) in the host's private cache directory. wasmtime
        // checks the header and refuses artifacts of another version or configuration.
        unsafe { Component::deserialize(&self.engine, precompiled) }.map_err(|e| PluginError::Compile {
            plugin: name.to_string(),
            reason: format!("{e:#}"),
        })
    }
}

/// Where a compiled component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileSource {
    /// Already compiled in this process.
    Memory,
    /// Loaded from the precompiled-artifact cache.
    Disk,
    /// Compiled now.
    Compiled,
}

fn store_cached(path: &Path, bytes: &[u8]) {
    let write = || -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let tmp = path.with_extension(format!("tmp.{}.{unique}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    };
    if let Err(error) = write() {
        tracing::warn!(path = %path.display(), %error, "cannot store the precompiled component (continuing)");
    }
}

fn compile_error(name: &str, error: &wasmtime::Error) -> PluginError {
    PluginError::Compile {
        plugin: name.to_string(),
        reason: format!("{error:#}"),
    }
}

fn poisoned<T>(_: std::sync::PoisonError<T>) -> PluginError {
    PluginError::Engine("the compiled-component cache lock is poisoned".into())
}
