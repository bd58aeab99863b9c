//! Compiling components, and the cache of precompiled ones: keyed by the component's sha256 and
//! the engine's compatibility hash, mapped from the file (`deserialize_file`), re-checked by
//! wasmtime.

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
        let precompiled = self.precompile(name, bytes);
        // What the compile freed (its engine's included), back to the system.
        release_freed_memory();
        let precompiled = precompiled?;
        let mut component = None;
        if let Some(path) = self.cache_path(digest) {
            // Served from the stored file when it could be stored (see `load_cached`).
            if store_cached(&path, &precompiled) {
                component = self.load_cached(&path);
            }
            prune(&path, COMPILED_LIMIT);
        }
        let component = match component {
            Some(c) => c,
            None => self.deserialize(&precompiled, name)?,
        };
        self.remember(digest, &component)?;
        Ok((component, CompileSource::Compiled))
    }

    /// `bytes` compiled with Cranelift into an artifact, on an engine made for this compile and
    /// dropped after it, configured as the serving one (the same compatibility hash, so the
    /// serving engine loads the artifact as it loads the disk cache's). wasmtime keeps an
    /// engine's compiler contexts for its next compiles, with the buffers its largest function
    /// grew them to: compiled on the serving engine, the bundled builders of a start on an empty
    /// cache left a 256 MiB allocation (144 MiB resident) for the host's life (the
    /// `run --embedded` demo: 274 MiB resident after the switch to optimized code, 60 from a
    /// warm cache). Where no such engine can be made, or its hash differs, the serving engine
    /// compiles.
    fn precompile(&self, name: &str, bytes: &[u8]) -> Result<Vec<u8>, PluginError> {
        let apart = match Engine::new(&optimized_config(&self.config)) {
            Ok(e) if compat_of(&e) == self.compat => Some(e),
            Ok(_) => {
                tracing::warn!(
                    plugin = name,
                    "an engine made for the compile has another compatibility hash: compiling on the \
                     serving engine, which keeps the compiler's buffers afterwards"
                );
                None
            }
            Err(error) => {
                tracing::warn!(plugin = name, error = %format!("{error:#}"),
                    "cannot make an engine for the compile: compiling on the serving engine, which keeps \
                     the compiler's buffers afterwards");
                None
            }
        };
        apart
            .as_ref()
            .unwrap_or(&self.engine)
            .precompile_component(bytes)
            .map_err(|e| compile_error(name, &e))
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

    /// Load a cached artifact, mapped from its file: its code pages are the file's, and only
    /// those a call runs are resident. Read into memory instead, wasmtime's copy of it was
    /// resident whole, as anonymous memory: 25 MiB for the seven bundled builders, where mapped
    /// they hold about 9 MiB (the `run --embedded` demo: RSS 83 → 67 MiB).
    fn load_cached(&self, path: &Path) -> Option<Component> {
        // Its modification time is its last use: what pruning keeps longest.
        let _ = std::fs::File::options()
            .write(true)
            .open(path)
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
        if path.parent().is_some_and(local_file_system) {
            match self.deserialize_file(path) {
                Ok(c) => return Some(c),
                // A file system mounted `noexec` refuses executable mappings: a read copy serves.
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "cannot map the precompiled component: reading it");
                }
            }
        }
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
        reason = "mapping artifacts of our own engine; see the safety note"
    )]
    fn deserialize_file(&self, path: &Path) -> Result<Component, PluginError> {
        // SAFETY: as `deserialize` for the contents. Mapped, the file must also not be truncated
        // or written in place while the component lives (a page past a truncation is SIGBUS).
        // The host never does either: an artifact is written to a unique temporary file and
        // renamed over (the mapped inode stays as it was), and pruning unlinks (the same; on a
        // local file system only, see `local_file_system`). Who else can write the host's
        // private cache directory can already give it native code to run: mapping widens no
        // trust.
        unsafe { Component::deserialize_file(&self.engine, path) }.map_err(|e| PluginError::Compile {
            plugin: path.display().to_string(),
            reason: format!("{e:#}"),
        })
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

/// Whether artifacts in `dir` may be mapped: only on a local file system. On a network one (NFS,
/// SMB, Ceph, FUSE: the chart's ReadWriteMany cache shared by replicas on several nodes) another
/// node's unlink or rename drops the file at the server, and a later page-in of a mapped page is
/// SIGBUS; a read copy is served there.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code, reason = "statfs(2) into a zeroed struct it fills")]
#[allow(clippy::useless_conversion, reason = "`f_type` is an i32 on 32-bit targets")]
fn local_file_system(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    /// ext2/3/4, XFS, Btrfs, tmpfs, overlayfs (a container's own file system), ZFS, F2FS.
    const LOCAL: [i64; 7] = [
        0xEF53,
        0x5846_5342,
        0x9123_683E,
        0x0102_1994,
        0x794C_7630,
        0x2FC1_2FC1,
        0xF2F5_2010,
    ];
    let Ok(c_path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `statfs` reads the NUL-terminated path and writes only into `st`, a plain C struct
    // for which all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c_path.as_ptr(), &mut st) } != 0 {
        return false;
    }
    LOCAL.contains(&i64::from(st.f_type))
}

/// Elsewhere, artifacts are read, never mapped.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn local_file_system(_dir: &Path) -> bool {
    false
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

/// Store `bytes` at `path` (atomically); whether it was stored.
fn store_cached(path: &Path, bytes: &[u8]) -> bool {
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
    match write() {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot store the precompiled component (continuing)");
            false
        }
    }
}

/// The most bytes of precompiled components the disk cache keeps (with the pulled modules'
/// 128 MiB, within the install's 256 MiB cache volume).
pub const COMPILED_LIMIT: u64 = 96 << 20;

/// Prune the directory of `just_written` to `limit` bytes of precompiled components, least
/// recently used first (another engine's, e.g. an older host's, are never used again), never
/// `just_written`; temporary files a crash left behind (older than a minute) go too.
pub(crate) fn prune(just_written: &Path, limit: u64) {
    let Some(dir) = just_written.parent() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let now = std::time::SystemTime::now();
    let mut kept = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else { continue };
        let name = entry.file_name().to_string_lossy().into_owned();
        let modified = meta.modified().unwrap_or(now);
        if name.contains(".tmp.") {
            if now.duration_since(modified).unwrap_or_default() > std::time::Duration::from_secs(60) {
                let _ = std::fs::remove_file(&path);
            }
        } else if name.ends_with(".cwasm") && path != just_written {
            kept.push((modified, meta.len(), path));
        }
    }
    let mut total: u64 = kept.iter().map(|(_, len, _)| len).sum::<u64>()
        + std::fs::metadata(just_written).map(|m| m.len()).unwrap_or(0);
    kept.sort_by_key(|(modified, ..)| *modified);
    for (_, len, path) in kept {
        if total <= limit {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            tracing::debug!(path = %path.display(), "pruned a precompiled component from the cache");
            total = total.saturating_sub(len);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_pruned_least_recently_used_first_never_the_new_one() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        let file = |name: &str, len: usize, age: u64| -> std::io::Result<PathBuf> {
            let p = dir.path().join(name);
            std::fs::write(&p, vec![0u8; len])?;
            std::fs::File::options()
                .write(true)
                .open(&p)?
                .set_modified(old + std::time::Duration::from_secs(age))?;
            Ok(p)
        };
        let oldest = file("a-1.cwasm", 400, 0)?;
        let used = file("b-1.cwasm", 400, 100)?;
        let stale_tmp = file("c-1.tmp.1.0", 50, 0)?;
        let other = file("notes.txt", 10_000, 0)?;
        let new = file("d-1.cwasm", 400, 0)?;
        prune(&new, 900);
        assert!(!oldest.exists(), "the least recently used one stays");
        assert!(used.exists() && new.exists() && other.exists());
        assert!(!stale_tmp.exists(), "a crash's temporary file stays");
        // Even alone over the limit, the one just written stays.
        prune(&new, 10);
        assert!(new.exists() && !used.exists());
        Ok(())
    }

    /// Only a local file system's artifacts are mapped: procfs and sysfs stand in for the
    /// network ones (NFS, SMB, FUSE), which a test cannot mount.
    #[test]
    fn artifacts_are_mapped_from_local_file_systems_only() {
        assert!(!local_file_system(Path::new("/proc")));
        assert!(!local_file_system(Path::new("/sys")));
        assert!(!local_file_system(Path::new("/no/such/directory")));
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            // Where the tests are built: ext4, XFS, Btrfs or overlayfs on every machine here.
            assert!(local_file_system(Path::new(env!("CARGO_MANIFEST_DIR"))));
        }
    }
}
