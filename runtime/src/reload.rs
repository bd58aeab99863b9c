//! Hot reload: builder plugins from a directory (`run --plugins-dir`), swapped into the
//! [`PluginRegistry`] without a restart.
//!
//! Every non-hidden `*.wasm` entry of the directory is a plugin, and so is every `*.wasm.gz` (a
//! gzipped component: a ConfigMap holds at most 1 MiB, a component often more); one that builds a
//! kind overrides the fallback of that kind (the bundled builder, or a `--plugin` file); removing
//! it falls back.
//!
//! # Guarantees
//! * **Nothing partial is loaded**: a file is read only after its size, modification time and
//!   inode stayed the same across two scans (the scan after a change comes [`SETTLE`] later, not a
//!   whole poll period), and the bytes read must have that size. Names that
//!   are hidden (`.x.wasm.swp`, Kubernetes' `..data` and `..2026_…` directories) or do not end in
//!   `.wasm` (`x.wasm.tmp`, `x.wasm~`) are ignored, so editors' temp files and the atomic symlink
//!   swap of a mounted ConfigMap are seen once, as the change of the target.
//! * **A version serves only after** it was read, hashed, compiled (the precompiled cache is
//!   used), instantiated, described itself with this host's contract version, and built the
//!   example inputs (`slinky_api::contract`'s examples, the guest SDK's `testing` ones) with outputs passing the output
//!   policy, for every kind it builds. A version failing any step is refused with the reason (logged, kept for
//!   `/plugins`, counted); the active version keeps serving. The same bytes are not retried
//!   until the file changes.
//! * **Atomic**: the swap replaces an `Arc`; calls in flight finish on the version they started
//!   with, every call after it uses the new one. Reconcilers subscribe to swaps
//!   ([`PluginRegistry::subscribe`]) and re-reconcile the parents of that kind.
//! * **Conflicts**: two files building the same kind: the one serving (or loaded first) keeps
//!   serving, the other is refused until one of them goes.
//! * **Compile tiers**: with tiering (the default) a new version is compiled with Winch to pass
//!   these checks and serve; once accepted, its Cranelift code is compiled on the engine's
//!   optimizer thread and replaces the Winch code only after it described itself the same way
//!   and built the example inputs identically. A refused version is never compiled with
//!   Cranelift. No compile runs on the reconcile path.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use serde::Serialize;

use super::{
    BuilderKind, Plugin, PluginError, PluginRegistry, PluginSource,
    bundled::KINDS,
    registry::{RefusedVersion, now_rfc3339},
};
use crate::BuildContext;

/// Settings of the reloader.
#[derive(Debug, Clone)]
pub struct ReloadConfig {
    /// The plugins directory.
    pub dir: PathBuf,
    /// How often the directory is scanned.
    pub poll: Duration,
    /// The build context for smoke builds.
    pub build: BuildContext,
}

/// What a scan did.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct ScanReport {
    /// Swaps made, as `<kind>: <plugin> (<source>)`.
    pub swapped: Vec<String>,
    /// Versions refused by this scan.
    pub refused: Vec<RefusedVersion>,
    /// Files still changing (read at a later scan).
    pub pending: Vec<String>,
}

/// Size, modification time and inode of a file (following symlinks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Fingerprint {
    len: u64,
    modified: Option<SystemTime>,
    ino: u64,
    dev: u64,
}

impl Fingerprint {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Fingerprint {
            len: meta.len(),
            modified: meta.modified().ok(),
            ino: meta.ino(),
            dev: meta.dev(),
        }
    }
}

/// The plugin files of the directory with their fingerprints, and the names that can't be read.
type Listing = (Vec<(PathBuf, Fingerprint)>, Vec<PathBuf>);

/// What the reloader knows about one file.
#[derive(Default)]
struct FileState {
    /// The fingerprint at the last scan.
    seen: Option<Fingerprint>,
    /// The fingerprint when it was last read.
    read: Option<Fingerprint>,
    /// The digest last read.
    digest: Option<String>,
    /// The last version of this file that passed every check.
    loaded: Option<Plugin>,
    /// Order of loading (older wins a conflict).
    order: u64,
    /// Why the last read version was refused (or conflicts).
    refusal: Option<RefusedVersion>,
}

/// Scans a plugins directory and swaps plugins into a registry.
pub struct Reloader {
    registry: Arc<PluginRegistry>,
    config: ReloadConfig,
    files: BTreeMap<PathBuf, FileState>,
    next_order: u64,
}

impl Reloader {
    /// A reloader of `config.dir` into `registry`.
    pub fn new(registry: Arc<PluginRegistry>, config: ReloadConfig) -> Self {
        Reloader {
            registry,
            config,
            files: BTreeMap::new(),
            next_order: 0,
        }
    }

    /// The plugins directory.
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// Scan the directory once and swap what changed. With `force`, every file is read now
    /// (`plugin reload`, SIGHUP, start-up), even one that changed since the last scan.
    /// Blocking: compiles.
    pub fn scan(&mut self, force: bool) -> ScanReport {
        let mut report = ScanReport::default();
        let Some((present, unreadable)) = self.list(&mut report) else {
            // The directory can't be listed (not: is gone): change nothing until it can.
            return report;
        };
        // A file that is gone falls back; one that is there but can't be read right now (a
        // symlink mid-swap) keeps its last version.
        self.files
            .retain(|path, _| present.iter().any(|(p, _)| p == path) || unreadable.contains(path));
        for (path, fp) in present {
            let state = self.files.entry(path.clone()).or_default();
            let stable = state.seen == Some(fp);
            state.seen = Some(fp);
            if !force && !stable {
                report.pending.push(path.display().to_string());
                continue;
            }
            if !force && state.read == Some(fp) {
                continue;
            }
            self.consider(&path, fp, &mut report);
        }
        self.settle(&mut report);
        self.publish_files();
        report
    }

    /// The plugin files in the directory with their fingerprints, and those that can't be read
    /// now; `None` when the directory can't be listed (a missing one is empty).
    fn list(&self, report: &mut ScanReport) -> Option<Listing> {
        let dir = &self.config.dir;
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            // A missing directory is an empty one: every override falls back.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Some(Default::default()),
            Err(error) => {
                tracing::warn!(dir = %dir.display(), %error, "cannot list the plugins directory; nothing changes");
                report.pending.push(format!("{}: {error}", dir.display()));
                return None;
            }
        };
        let mut out = Vec::new();
        let mut unreadable = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || !(name.ends_with(".wasm") || name.ends_with(".wasm.gz")) {
                continue;
            }
            let path = entry.path();
            // Follows symlinks: a ConfigMap's `x.wasm -> ..data/x.wasm` changes inode on a swap.
            match std::fs::metadata(&path) {
                Ok(meta) if meta.is_file() => out.push((path, Fingerprint::of(&meta))),
                Ok(_) => {}
                // A dangling symlink mid-swap: look again at the next scan.
                Err(_) => {
                    report.pending.push(path.display().to_string());
                    unreadable.push(path);
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Some((out, unreadable))
    }

    /// Read, hash, load and smoke-test one file.
    fn consider(&mut self, path: &Path, fp: Fingerprint, report: &mut ScanReport) {
        let metrics = &self.registry.reloads;
        let started = Instant::now();
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(error) => {
                report.pending.push(format!("{}: {error}", path.display()));
                return;
            }
        };
        if bytes.len() as u64 != fp.len {
            // Still being written.
            report.pending.push(path.display().to_string());
            return;
        }
        let bytes = if path.extension().is_some_and(|e| e == "gz") {
            match super::gunzip(&bytes) {
                Ok(b) => b,
                Err(reason) => {
                    self.refuse(path, fp, super::digest(&bytes), reason, report);
                    return;
                }
            }
        } else {
            bytes
        };
        metrics.time("read", started.elapsed());
        let digest = super::digest(&bytes);
        let Some(state) = self.files.get_mut(path) else {
            return;
        };
        state.read = Some(fp);
        if state.digest.as_deref() == Some(digest.as_str()) {
            metrics.count("unchanged");
            return;
        }
        state.digest = Some(digest.clone());
        let engine = self.registry.engine().clone();
        let load_started = Instant::now();
        let outcome = match Plugin::load_unoptimized(&engine, &bytes, PluginSource::File(path.to_path_buf()))
        {
            Err(e) => Err((e, Vec::new())),
            Ok(plugin) => {
                let describe = load_started.elapsed().saturating_sub(plugin.compile_time());
                let smoke_started = Instant::now();
                match self.smoke(&plugin) {
                    Ok(()) => {
                        metrics.time("compile", plugin.compile_time());
                        metrics.time("validate", describe + smoke_started.elapsed());
                        // Accepted: its optimized code may be compiled now (and is checked
                        // against the same examples before it serves).
                        plugin.optimize_in_background(&bytes);
                        Ok(plugin)
                    }
                    Err(e) => Err((e, plugin.info().kinds.clone())),
                }
            }
        };
        let Some(state) = self.files.get_mut(path) else {
            return;
        };
        match outcome {
            Ok(plugin) => {
                tracing::info!(file = %path.display(), plugin = %plugin.label(), digest = %&digest[..12],
                    kinds = ?plugin.info().kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
                    "plugin version passed its checks");
                state.loaded = Some(plugin);
                state.refusal = None;
                state.order = self.next_order;
                self.next_order += 1;
            }
            Err((error, described)) => {
                let refusal = RefusedVersion {
                    source: path.display().to_string(),
                    digest: Some(digest),
                    reason: error.to_string(),
                    at: now_rfc3339(),
                };
                tracing::warn!(file = %path.display(), reason = %refusal.reason,
                    "plugin version refused; the active version keeps serving");
                metrics.count("refused");
                // The kinds this refusal concerns: those it described, and those the previous
                // version of the file built.
                for kind in KINDS {
                    if described.contains(&kind) || state.loaded.as_ref().is_some_and(|p| p.builds(kind)) {
                        self.registry.refused(kind, refusal.clone());
                    }
                }
                state.refusal = Some(refusal.clone());
                report.refused.push(refusal);
            }
        }
    }

    /// Refuse a file that could not even be read as a component (a bad gzip stream).
    fn refuse(
        &mut self,
        path: &Path,
        fp: Fingerprint,
        digest: String,
        reason: String,
        report: &mut ScanReport,
    ) {
        let Some(state) = self.files.get_mut(path) else {
            return;
        };
        state.read = Some(fp);
        if state.digest.as_deref() == Some(digest.as_str()) {
            return;
        }
        state.digest = Some(digest.clone());
        let refusal = RefusedVersion {
            source: path.display().to_string(),
            digest: Some(digest),
            reason,
            at: now_rfc3339(),
        };
        tracing::warn!(file = %path.display(), reason = %refusal.reason,
            "plugin version refused; the active version keeps serving");
        self.registry.reloads.count("refused");
        for kind in KINDS {
            if state.loaded.as_ref().is_some_and(|p| p.builds(kind)) {
                self.registry.refused(kind, refusal.clone());
            }
        }
        state.refusal = Some(refusal.clone());
        report.refused.push(refusal);
    }

    /// Build the example inputs with every kind the plugin builds, through the output policy;
    /// a children builder must build them into the same children (kinds and names) as the
    /// version serving now: a version that leaves one out would have the host prune it from every
    /// parent (or, for slurmctld's StatefulSet, report it missing everywhere).
    fn smoke(&self, plugin: &Plugin) -> Result<(), PluginError> {
        plugin.example_builds(&self.config.build)?;
        for kind in [
            BuilderKind::ControllerChildren,
            BuilderKind::NodesetChildren,
            BuilderKind::RestapiChildren,
        ] {
            let Some(new) = plugin.example_children(&self.config.build, kind)? else {
                continue;
            };
            let serving = self.registry.active(kind);
            // The serving version built them when it was accepted: an error now is not this one's.
            let Ok(Some(old)) = serving.example_children(&self.config.build, kind) else {
                continue;
            };
            if new != old {
                let names = |set: Vec<&(crate::ChildKind, String)>| {
                    set.iter()
                        .map(|(k, n)| format!("{k} {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let missing = names(old.difference(&new).collect());
                let extra = names(new.difference(&old).collect());
                return Err(PluginError::Refused {
                    plugin: plugin.label(),
                    reason: format!(
                        "its {kind} builder builds the example inputs into other children than the \
                         serving version {} (missing: [{missing}]; new: [{extra}]): a new version must \
                         build the same children, or the host would delete what it leaves out from every \
                         parent. Make it build the same objects from the example inputs \
                         (`slinky_api::contract::example_controller`/`example_nodeset`), then copy it again",
                        serving.label()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Pick the plugin of each kind and swap where it changed.
    fn settle(&mut self, report: &mut ScanReport) {
        for kind in KINDS {
            let active = self.registry.active(kind);
            let mut candidates: Vec<(&PathBuf, &Plugin, u64)> = self
                .files
                .iter()
                .filter_map(|(path, s)| s.loaded.as_ref().map(|p| (path, p, s.order)))
                .filter(|(_, p, _)| p.builds(kind))
                .collect();
            // The serving one first, then the oldest.
            candidates.sort_by_key(|(_, p, order)| {
                (
                    !(p.digest() == active.digest() && p.source() == active.source()),
                    *order,
                )
            });
            let desired = candidates
                .first()
                .map(|(_, p, _)| (*p).clone())
                .unwrap_or_else(|| self.registry.base(kind));
            let losers: Vec<PathBuf> = candidates.iter().skip(1).map(|(p, _, _)| (*p).clone()).collect();
            for path in losers {
                let reason = format!(
                    "{} also builds {kind} and serves it; keep one plugin file per builder kind (remove one)",
                    desired.source()
                );
                let Some(state) = self.files.get_mut(&path) else {
                    continue;
                };
                if state.refusal.as_ref().is_some_and(|r| r.reason == reason) {
                    continue;
                }
                let refusal = RefusedVersion {
                    source: path.display().to_string(),
                    digest: state.digest.clone(),
                    reason,
                    at: now_rfc3339(),
                };
                tracing::warn!(file = %path.display(), reason = %refusal.reason, "plugin refused");
                self.registry.reloads.count("refused");
                self.registry.refused(kind, refusal.clone());
                state.refusal = Some(refusal.clone());
                report.refused.push(refusal);
            }
            if desired.digest() == active.digest() && desired.source() == active.source() {
                continue;
            }
            let started = Instant::now();
            match self.registry.swap(kind, desired.clone()) {
                Ok(previous) => {
                    self.registry.reloads.time("swap", started.elapsed());
                    self.registry.reloads.count("swapped");
                    tracing::info!(%kind, plugin = %desired.label(), digest = %&desired.digest()[..12],
                        source = %desired.source(), previous = %previous.label(),
                        previous_source = %previous.source(), "builder swapped");
                    report
                        .swapped
                        .push(format!("{kind}: {} ({})", desired.label(), desired.source()));
                }
                Err(error) => tracing::error!(%kind, %error, "swap refused"),
            }
        }
    }

    fn publish_files(&self) {
        let files = self
            .files
            .iter()
            .map(|(path, s)| {
                let serving: Vec<&str> = KINDS
                    .into_iter()
                    .filter(|k| {
                        s.loaded.as_ref().is_some_and(|p| {
                            let a = self.registry.active(*k);
                            a.digest() == p.digest() && a.source() == p.source()
                        })
                    })
                    .map(BuilderKind::as_str)
                    .collect();
                // `refused` wins: the latest bytes were refused (`serving` still lists the kinds
                // its previous version serves).
                let state = if s.refusal.is_some() {
                    "refused"
                } else if !serving.is_empty() {
                    "serving"
                } else if s.read.is_none() {
                    "pending"
                } else {
                    "standby"
                };
                serde_json::json!({
                    "path": path.display().to_string(),
                    "state": state,
                    "serving": serving,
                    "digest": s.digest,
                    "plugin": s.loaded.as_ref().map(Plugin::label),
                    "refusal": s.refusal,
                })
            })
            .collect();
        self.registry.set_files(&self.config.dir, files);
    }
}

/// How long a changing file must stay unchanged before it is read (at most the poll period).
pub const SETTLE: Duration = Duration::from_millis(200);

/// A request for a forced rescan; the report comes back on the channel.
type Request = tokio::sync::oneshot::Sender<ScanReport>;

/// Asks a running reloader for a forced rescan.
#[derive(Debug, Clone)]
pub struct ReloadHandle {
    tx: tokio::sync::mpsc::Sender<Request>,
}

impl ReloadHandle {
    /// Rescan now and return what changed (`None` when the reloader has stopped).
    pub async fn rescan(&self) -> Option<ScanReport> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.tx.send(tx).await.ok()?;
        rx.await.ok()
    }
}

/// Start a reloader: one forced scan now (so the first reconciles use the overrides), then a
/// scan every `config.poll` and on every [`ReloadHandle::rescan`], until the handle and its
/// clones are dropped or the task is aborted.
///
/// # Errors
/// Only when the first scan cannot run (a blocking task failed).
pub async fn start(
    registry: Arc<PluginRegistry>,
    config: ReloadConfig,
) -> Result<(ReloadHandle, ScanReport, tokio::task::JoinHandle<()>), PluginError> {
    let poll = config.poll.max(Duration::from_millis(10));
    let mut reloader = Reloader::new(registry, config);
    tracing::info!(dir = %reloader.dir().display(), poll_ms = poll.as_millis() as u64, "watching the plugins directory");
    let (mut reloader, first) = tokio::task::spawn_blocking(move || {
        let r = reloader.scan(true);
        (reloader, r)
    })
    .await
    .map_err(|e| PluginError::Engine(format!("the first plugin scan failed: {e}")))?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Request>(8);
    // A file seen changing is looked at again soon (it must be unchanged for one short period),
    // not a whole poll period later.
    let settle = poll.min(SETTLE);
    let task = tokio::spawn(async move {
        let mut delay = poll;
        loop {
            let reply = tokio::select! {
                _ = tokio::time::sleep(delay) => None,
                req = rx.recv() => match req {
                    Some(r) => Some(r),
                    None => return,
                },
            };
            let force = reply.is_some();
            let Ok((back, report)) = tokio::task::spawn_blocking(move || {
                let r = reloader.scan(force);
                (reloader, r)
            })
            .await
            else {
                tracing::error!("a plugin scan panicked; hot reload stops");
                return;
            };
            reloader = back;
            delay = if report.pending.is_empty() { poll } else { settle };
            if let Some(reply) = reply {
                let _ = reply.send(report);
            }
        }
    });
    Ok((ReloadHandle { tx }, first, task))
}
