//! The steps the cluster's BuilderPlugins add to the pipelines, as one process loads them:
//! what each BuilderPlugin's spec asks for (checked), the version that serves, the last version
//! tried and why it was refused. It fetches through the plugin source and loads through the
//! runtime; it writes nothing to the API (the reconciler reports what it returns).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex},
};

use kube::ResourceExt;
use slinky_api::{
    BuilderPlugin, BuilderPluginSpec, ServingVersion,
    conditions::LOADED,
    failure::{Failure, Retry},
};
use slinky_plugin_source::ModuleSource;

use super::wanted::{Wanted, invalid};

use crate::{
    plugins::{BuildContext, BuilderKind, Plugin, PluginRegistry, PluginSource, Step, vet_step},
    reconcile::core::{locked, watch::UNDECODABLE},
};

/// The module-cache record of a ConfigMap's component loaded under a spec that pinned its
/// digest: which ConfigMap ([`pinned_record`]).
const PINNED: &str = "pinned";

/// What [`PINNED`] records: the ConfigMap (namespace, name, key) the pinned module came from.
fn pinned_record(cm: &slinky_api::ConfigMapModule) -> String {
    format!(
        "{}/{}/{}",
        cm.namespace,
        cm.name,
        cm.key.as_deref().unwrap_or("plugin.wasm")
    )
}

/// The ConfigMaps a [`PINNED`] record names, one per line (several BuilderPlugins may pin the
/// same module in ConfigMaps of their own).
fn pinned_records(record: &[u8]) -> impl Iterator<Item = &str> {
    std::str::from_utf8(record).unwrap_or_default().lines()
}

/// The most ConfigMaps a [`PINNED`] record keeps (the oldest go first).
const PINNED_RECORDS: usize = 64;

/// One BuilderPlugin's serving version.
pub(super) struct Loaded {
    fingerprint: String,
    pub(super) step: Step,
    pub(super) kinds: Vec<BuilderKind>,
    /// The spec it was loaded with (`status.serving`).
    pub(super) spec: BuilderPluginSpec,
    /// The component's `sha256:<hex>`.
    pub(super) digest: String,
}

/// What the last look at one BuilderPlugin found.
#[derive(Clone)]
pub(super) enum Outcome {
    /// This generation serves.
    Loaded,
    /// Refused; the serving version (if any) keeps serving.
    Refused(Failure),
}

/// What a look at a BuilderPlugin has to report (an Event), when it found something new.
pub(super) enum Report {
    /// A version was loaded and serves now.
    Loaded {
        /// `<plugin>@<version>`.
        plugin: String,
        /// The component's digest.
        digest: String,
        /// The kinds it serves.
        kinds: String,
        /// Its order.
        order: i32,
    },
    /// A version was refused (the message says what keeps serving).
    Refused(Failure),
}

#[derive(Default)]
struct State {
    loaded: BTreeMap<String, Arc<Loaded>>,
    /// Name → (fingerprint, outcome) of the last version tried.
    tried: BTreeMap<String, (String, Outcome)>,
    /// The BuilderPlugins whose `status.serving` this process tried to load again.
    restored: BTreeSet<String>,
    /// Name → how many times a BuilderPlugin of that name was deleted: a look that began before
    /// a deletion puts nothing in the pipelines.
    deletions: BTreeMap<String, u64>,
}

impl State {
    /// The deletions of `name` so far.
    fn deletions(&self, name: &str) -> u64 {
        self.deletions.get(name).copied().unwrap_or_default()
    }

    /// Replace the registry's steps of `kinds` with what serves now (under the state's lock, so
    /// two loads never publish out of order).
    fn publish(&self, registry: &PluginRegistry, kinds: &[BuilderKind]) {
        for &kind in kinds {
            let steps = self
                .loaded
                .values()
                .filter(|l| l.kinds.contains(&kind))
                .map(|l| l.step.clone())
                .collect();
            registry.set_steps(kind, steps);
        }
    }
}

/// The kinds as `a, b`.
pub(super) fn kinds_text(kinds: &[BuilderKind]) -> String {
    kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
}

/// The BuilderPlugin steps of one process.
pub struct Steps {
    registry: Arc<PluginRegistry>,
    source: Arc<ModuleSource>,
    build: BuildContext,
    state: Mutex<State>,
    /// Held while a [`PINNED`] record is read and written again.
    pinned: Mutex<()>,
    /// One look at a time per BuilderPlugin (a start-up load still under way and its queue's
    /// reconcile), never one across BuilderPlugins: a slow registry delays only its own step.
    looking: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// A few loads (compiles, example builds) at a time, whatever the BuilderPlugin count;
    /// fetches are not held to it.
    loads: tokio::sync::Semaphore,
}

impl Steps {
    /// Steps fetched through `source`, loaded into `registry` (examples built with `build`).
    pub fn new(registry: Arc<PluginRegistry>, source: Arc<ModuleSource>, build: BuildContext) -> Steps {
        Steps {
            registry,
            source,
            build,
            state: Mutex::default(),
            pinned: Mutex::default(),
            looking: Mutex::default(),
            loads: tokio::sync::Semaphore::new(4),
        }
    }

    /// Record that the module `digest` was loaded from `cm` under a spec that pinned it, beside
    /// the other ConfigMaps recorded for it.
    fn remember_pinned(&self, digest: &str, cm: &slinky_api::ConfigMapModule) {
        // One read-modify-write at a time (two BuilderPlugins may load the module at once).
        let _one = self.pinned.lock();
        let store = self.source.store();
        let this = pinned_record(cm);
        let old = store.get_record(digest, PINNED).unwrap_or_default();
        let mut records: Vec<&str> = pinned_records(&old).filter(|r| *r != this).collect();
        records.push(&this);
        let keep = records.len().saturating_sub(PINNED_RECORDS);
        store.put_record(digest, PINNED, records[keep..].join("\n").as_bytes());
    }

    /// The serving version of `name`.
    pub(super) fn loaded(&self, name: &str) -> Option<Arc<Loaded>> {
        locked(&self.state, |s| s.loaded.get(name).cloned())
    }

    /// The outcome of the last look at `name`.
    pub(super) fn outcome(&self, name: &str) -> Option<Outcome> {
        locked(&self.state, |s| s.tried.get(name).map(|(_, o)| o.clone()))
    }

    /// `name` is gone: its step leaves the pipelines (and a look at it still under way puts
    /// nothing there).
    pub fn forget(&self, name: &str) {
        let gone = locked(&self.state, |s| {
            *s.deletions.entry(name.to_string()).or_default() += 1;
            s.tried.remove(name);
            s.restored.remove(name);
            let gone = s.loaded.remove(name);
            if let Some(l) = &gone {
                s.publish(&self.registry, &l.kinds);
            }
            gone.is_some()
        });
        if gone {
            tracing::info!(builder_plugin = %name, "BuilderPlugin deleted; its step leaves the pipelines");
        }
    }

    /// Look at `bp`: load its version when it changed (or was refused for a reason that may
    /// have gone), and put what serves into the pipelines. What is new to report, if anything;
    /// nothing when `bp` was deleted while it was looked at.
    pub(super) async fn sync(&self, bp: &BuilderPlugin) -> Option<Report> {
        let name = bp.name_any();
        let turn = locked(&self.looking, |l| l.entry(name.clone()).or_default().clone());
        let _turn = turn.lock().await;
        let deletions = locked(&self.state, |s| s.deletions(&name));
        let report = self.look(bp, deletions).await;
        let deleted = locked(&self.state, |s| {
            let deleted = s.deletions(&name) != deletions;
            if deleted {
                // What the look recorded belongs to an object that is gone.
                s.tried.remove(&name);
            }
            deleted
        });
        (!deleted).then_some(report).flatten()
    }

    /// [`Steps::sync`] of `bp`, whose name was deleted `deletions` times when the look began.
    async fn look(&self, bp: &BuilderPlugin, deletions: u64) -> Option<Report> {
        let name = bp.name_any();
        let wanted = match bp.annotations().get(UNDECODABLE) {
            Some(why) => Err(invalid(why.clone())),
            None => Wanted::of(&bp.spec),
        };
        let wanted = match wanted {
            Ok(w) => w,
            Err(failure) => {
                let key = format!("spec:{}", failure.message);
                return self.refused(bp, key, failure, deletions).await;
            }
        };
        // A module pinned in a registry never changes: this version is known without a pull.
        let pinned = bp
            .spec
            .module
            .image
            .as_deref()
            .map(|image| wanted.fingerprint(image));
        if let Some(fp) = &pinned
            && self.known(&name, fp)
        {
            return None;
        }
        let fetched = match self.source.fetch(&bp.spec.module).await {
            Ok(f) => f,
            Err(failure) => {
                let key = pinned.unwrap_or_else(|| format!("fetch:{}", failure.message));
                return self.refused(bp, key, failure, deletions).await;
            }
        };
        let fingerprint = pinned.unwrap_or_else(|| wanted.fingerprint(&fetched.digest));
        if self.known(&name, &fingerprint) {
            return None;
        }
        match self.load(&name, &fetched.bytes, &fetched.label, &wanted).await {
            Ok(step) => {
                let report = Report::Loaded {
                    plugin: step.plugin.label(),
                    digest: fetched.digest.clone(),
                    kinds: kinds_text(&wanted.kinds),
                    order: step.order,
                };
                tracing::info!(builder_plugin = %name, plugin = %step.plugin.label(), digest = %&step.plugin.digest()[..12],
                    kinds = %kinds_text(&wanted.kinds), order = step.order, "BuilderPlugin loaded; it serves now");
                self.source.store().put(&fetched.bytes);
                if let (Some(cm), Some(_)) = (&bp.spec.module.config_map, &bp.spec.module.digest) {
                    // Its author pinned this ConfigMap's module: a restore may trust the cached
                    // bytes for this ConfigMap (see `restorable`).
                    self.remember_pinned(&fetched.digest, cm);
                }
                locked(&self.state, |s| {
                    if s.deletions(&name) != deletions {
                        return;
                    }
                    s.tried
                        .insert(name.clone(), (fingerprint.clone(), Outcome::Loaded));
                    let mut kinds = wanted.kinds.clone();
                    let old = s.loaded.insert(
                        name,
                        Arc::new(Loaded {
                            fingerprint,
                            step,
                            kinds: wanted.kinds,
                            spec: bp.spec.clone(),
                            digest: fetched.digest,
                        }),
                    );
                    kinds.extend(old.map(|o| o.kinds.clone()).unwrap_or_default());
                    s.publish(&self.registry, &kinds);
                });
                Some(report)
            }
            Err(mut failure) => {
                failure.message = format!(
                    "{} (module {}, {})",
                    failure.message, fetched.label, fetched.digest
                );
                self.refused(bp, fingerprint, failure, deletions).await
            }
        }
    }

    /// Whether the version `fingerprint` of `name` was looked at already (serving, or refused
    /// for a reason that depends only on the inputs, with nothing changed since).
    fn known(&self, name: &str, fingerprint: &str) -> bool {
        locked(&self.state, |s| {
            if s.loaded.get(name).is_some_and(|l| l.fingerprint == fingerprint) {
                s.tried
                    .insert(name.to_string(), (fingerprint.to_string(), Outcome::Loaded));
                return true;
            }
            s.tried.get(name).is_some_and(|(f, o)| {
                f == fingerprint && !matches!(o, Outcome::Refused(r) if r.retry() != Retry::OnChange)
            })
        })
    }

    /// Load `bytes` as the step `name` wants, off the async threads: compiled, described, its
    /// settings validated, the example inputs built through base + it.
    async fn load(&self, name: &str, bytes: &[u8], module: &str, wanted: &Wanted) -> Result<Step, Failure> {
        let (registry, build) = (self.registry.clone(), self.build.clone());
        let (bytes, name) = (bytes.to_vec(), name.to_string());
        let source = PluginSource::Resource {
            name: name.clone(),
            module: module.to_string(),
        };
        let (settings, order, selector, kinds) = (
            wanted.settings.clone(),
            wanted.order,
            wanted.selector.clone(),
            wanted.kinds.clone(),
        );
        let namespaces = wanted.namespaces.clone();
        let refused = |reason, message: String| Failure::new(LOADED, reason, message);
        let _turn = self.loads.acquire().await;
        let loaded = tokio::task::spawn_blocking(move || {
            let plugin = Plugin::load_unoptimized(registry.engine(), &bytes, source)
                .map_err(|e| refused("Refused", e.to_string()))?;
            plugin
                .validate_settings(&settings)
                .map_err(|e| refused("InvalidSettings", e.in_step(&name).to_string()))?;
            let step = Step {
                name,
                plugin,
                settings,
                order,
                selector,
                namespaces,
            };
            vet_step(&registry, &step, &kinds, &build).map_err(|e| refused("Refused", e.to_string()))?;
            step.plugin.optimize_in_background(&bytes);
            Ok::<_, Failure>(step)
        })
        .await;
        loaded.unwrap_or_else(|join| Err(refused("Refused", format!("the load task failed: {join}"))))
    }

    /// After a restart, when this BuilderPlugin's current spec is refused: load the version its
    /// status says served (`status.serving`), so the parents keep their steps and their pods do
    /// not roll. Tried once per process.
    ///
    /// The status is a hint, never a source of trust (whoever may write `builderplugins/status`
    /// could name any module there): see [`Steps::restorable`].
    async fn restore(&self, bp: &BuilderPlugin, deletions: u64) {
        let name = bp.name_any();
        let first = locked(&self.state, |s| {
            !s.loaded.contains_key(&name) && s.restored.insert(name.clone())
        });
        let Some(serving) = bp
            .status
            .as_ref()
            .and_then(|s| s.serving.clone())
            .filter(|_| first)
        else {
            return;
        };
        let restored = async {
            let wanted = Wanted::of(&serving.spec)?;
            let bytes = self.restorable(&serving).await?;
            let label = format!("status.serving, {}", serving.digest);
            let step = self.load(&name, &bytes, &label, &wanted).await?;
            Ok::<_, Failure>((step, wanted))
        }
        .await;
        match restored {
            Ok((step, wanted)) => {
                tracing::warn!(builder_plugin = %name, plugin = %step.plugin.label(), digest = %serving.digest,
                    "the BuilderPlugin's current spec is refused; the version that served before this restart serves again");
                locked(&self.state, |s| {
                    if s.deletions(&name) != deletions {
                        return;
                    }
                    let kinds = wanted.kinds.clone();
                    s.loaded.insert(
                        name,
                        Arc::new(Loaded {
                            fingerprint: format!("restored:{}", serving.digest),
                            step,
                            kinds: wanted.kinds,
                            spec: serving.spec,
                            digest: serving.digest,
                        }),
                    );
                    s.publish(&self.registry, &kinds);
                });
            }
            Err(failure) => {
                tracing::error!(builder_plugin = %name, digest = %serving.digest, message = %failure.message,
                    "the version that served before this restart cannot be loaded again; the parents it applied to are built without it");
            }
        }
    }

    /// The component `status.serving` names, when this host may trust it again:
    /// * a registry module on a host with keys: fetched as every load is (from the cache or the
    ///   registry) and its signature verified under **today's** keys (a key turned on or
    ///   rotated since stops it);
    /// * any other: only one this host loaded before (its disk cache holds it, checked by
    ///   digest) and vouches for today ([`ModuleSource::vouch_kept`]: a registry module only on
    ///   a host that allows unsigned ones; a ConfigMap module only from a namespace allowed
    ///   today, with keys only if its signature verifies under today's keys, and only if this
    ///   host loaded it from that very ConfigMap under a spec that pinned its digest, recorded
    ///   then).
    ///
    /// # Errors
    /// Why it is not restored (a `Loaded` failure: `BadSignature`, `Unverified`, `Refused`, …).
    async fn restorable(&self, serving: &ServingVersion) -> Result<Vec<u8>, Failure> {
        let refused = |m: String| Failure::new(LOADED, "Refused", m);
        let store = self.source.store();
        if serving.spec.module.image.is_some() && self.source.verifies() {
            let fetched = self.source.fetch(&serving.spec.module).await?;
            if fetched.digest != serving.digest {
                return Err(refused(format!(
                    "status.serving names {}, but its module has {}",
                    serving.digest, fetched.digest
                )));
            }
            return Ok(fetched.bytes);
        }
        let bytes = store.get(&serving.digest).ok_or_else(|| {
            refused(format!(
                "status.serving names {}, which this host never loaded (it is not in its module \
                 cache), and nothing else vouches for it",
                serving.digest
            ))
        })?;
        self.source
            .vouch_kept(&serving.spec.module, &serving.digest, &bytes)?;
        if let Some(cm) = &serving.spec.module.config_map {
            // With keys or without: else a status writer could name a cached registry module (one
            // loaded while unsigned modules were allowed) as a ConfigMap module.
            let pinned = store.get_record(&serving.digest, PINNED);
            if serving.spec.module.digest.as_deref() != Some(serving.digest.as_str())
                || !pinned.is_some_and(|p| pinned_records(&p).any(|r| r == pinned_record(cm)))
            {
                return Err(refused(format!(
                    "status.serving names the ConfigMap module {}, which this host never loaded from \
                     that ConfigMap under a pinned spec.module.digest: a ConfigMap module is restored \
                     only then",
                    serving.digest
                )));
            }
        }
        Ok(bytes)
    }

    /// A refused version: reported once (not again while the same refusal stands); the version
    /// that served before keeps serving (restored from `status.serving` after a restart).
    async fn refused(
        &self,
        bp: &BuilderPlugin,
        fingerprint: String,
        failure: Failure,
        deletions: u64,
    ) -> Option<Report> {
        let name = bp.name_any();
        let again = locked(&self.state, |s| {
            s.tried
                .get(&name)
                .is_some_and(|(f, o)| *f == fingerprint && matches!(o, Outcome::Refused(r) if *r == failure))
        });
        if again {
            return None;
        }
        self.restore(bp, deletions).await;
        let serving = self
            .loaded(&name)
            .map(|l| format!("; {} ({}) keeps serving", l.step.plugin.label(), l.digest));
        tracing::warn!(builder_plugin = %name, reason = failure.reason, message = %failure.message,
            "BuilderPlugin refused; the version serving before keeps serving");
        locked(&self.state, |s| {
            s.tried
                .insert(name, (fingerprint, Outcome::Refused(failure.clone())))
        });
        Some(Report::Refused(Failure {
            message: format!("{}{}", failure.message, serving.unwrap_or_default()),
            ..failure
        }))
    }
}
