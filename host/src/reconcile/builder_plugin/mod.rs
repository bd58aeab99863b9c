//! `BuilderPlugin` custom resources: each is a step in the pipelines of the builder kinds it
//! lists (see `slinky_runtime::Pipeline`).
//!
//! # What happens to a BuilderPlugin
//! 1. Its module is read: pulled by digest from its OCI registry (cached on disk; its cosign
//!    signature verified when the host has `--plugin-public-key`), or read from its ConfigMap;
//!    `spec.module.digest`, when given, must be the component's sha256.
//! 2. It is loaded like any plugin (compiled, described, contract checked), must build every kind
//!    it lists, must accept its settings (`validate-settings`), and, after each kind's base
//!    builder, must build the example inputs through the output policy into the same children.
//! 3. Then it serves: the registry's steps of its kinds are replaced at once and the parents of
//!    those kinds re-reconciled (a step's module, settings, order or selector are part of the pod
//!    revision: pods roll within `maxUnavailable`).
//!
//! A version that fails any step is refused with the reason in `status` (phase `Refused`, the
//! `Loaded` condition False) and a Warning Event; the version that served before keeps serving.
//! The same inputs are not tried again until they change. Status and Events are written by the
//! leader only; every replica loads the steps, so a new leader builds what the old one built.
//!
//! At start-up the host loads the BuilderPlugins before it reconciles anything: a restart never
//! builds a parent without its steps (which would roll its pods twice).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::{
    api::core::v1::ConfigMap,
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{events::EventType, reflector::Store, watcher},
};
use serde_json::json;
use slinky_api::{BuilderPlugin, BuilderPluginSpec, BuilderPluginStatus, DEFAULT_ORDER, ServingVersion};

use crate::{
    oci::{self, Oci, PublicKey, Reference},
    plugins::{BuildContext, BuilderKind, Plugin, PluginRegistry, PluginSource, Step, vet_step},
    reconcile::{Events, Leadership},
};

/// How often every BuilderPlugin is looked at again without a change of its own (a ConfigMap's
/// content, a parent's labels for `status.appliesTo`).
pub const RESYNC: Duration = Duration::from_secs(10);

/// The condition type on a BuilderPlugin.
pub const LOADED: &str = "Loaded";

/// The refusals tried again at every sync: they depend on something outside the spec.
const RETRIED: [&str; 4] = ["PullFailed", "ModuleUnreadable", "BadSignature", "UnknownDigest"];

/// At most this many parents are named in `status.appliesTo`.
const APPLIES_TO_NAMED: usize = 50;

/// The parents' caches, for `status.appliesTo`.
#[derive(Clone)]
pub struct Parents {
    /// Controllers.
    pub controllers: Store<slinky_api::Controller>,
    /// NodeSets.
    pub nodesets: Store<slinky_api::NodeSet>,
    /// RestApis.
    pub restapis: Store<slinky_api::RestApi>,
    /// LoginSets.
    pub loginsets: Store<slinky_api::LoginSet>,
    /// Accountings.
    pub accountings: Store<slinky_api::Accounting>,
}

/// Options of the BuilderPlugin controller.
#[derive(Clone)]
pub struct Config {
    /// The build context of example builds.
    pub build: BuildContext,
    /// Where pulled modules are cached.
    pub cache: Option<std::path::PathBuf>,
    /// Registries reached over plain HTTP (loopback ones always are).
    pub insecure_registries: Vec<String>,
    /// The key OCI modules' signatures must verify with.
    pub public_key: Option<PublicKey>,
}

/// One BuilderPlugin's serving version.
struct Loaded {
    fingerprint: String,
    step: Step,
    kinds: Vec<BuilderKind>,
    /// The spec it was loaded with (`status.serving`).
    spec: BuilderPluginSpec,
    /// The component's `sha256:<hex>`.
    digest: String,
}

/// What the last look at one BuilderPlugin found.
#[derive(Clone)]
enum Outcome {
    /// This generation serves.
    Loaded,
    /// Refused (`reason`, `message`); the serving version (if any) keeps serving.
    Refused(&'static str, String),
}

#[derive(Default)]
struct State {
    loaded: BTreeMap<String, Loaded>,
    /// Name → (fingerprint, outcome) of the last version tried.
    tried: BTreeMap<String, (String, Outcome)>,
    /// The BuilderPlugins whose `status.serving` this process tried to load again.
    restored: BTreeSet<String>,
}

/// Why a version is refused: the condition's reason and the message.
type Refusal = (&'static str, String);

/// What a spec asks for, checked: the kinds, the settings (JSON text), the order, the selector.
struct Wanted {
    kinds: Vec<BuilderKind>,
    settings: String,
    order: i32,
    selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
}

impl Wanted {
    fn of(spec: &BuilderPluginSpec) -> Result<Wanted, Refusal> {
        let mut kinds = Vec::new();
        for (i, k) in spec.kinds.iter().enumerate() {
            let kind = k
                .parse::<BuilderKind>()
                .map_err(|e| ("InvalidSpec", format!("spec.kinds[{i}]: {e}")))?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        if kinds.is_empty() {
            return Err((
                "InvalidSpec",
                "spec.kinds is empty: list the builder kinds it serves, like [nodeset-pod]".into(),
            ));
        }
        if let Some(selector) = &spec.selector {
            slinky_api::selectors::problem(selector)
                .map_err(|e| ("InvalidSpec", format!("spec.selector.{e}")))?;
        }
        let settings = match &spec.settings {
            None => slinky_api::contract::NO_SETTINGS.to_string(),
            Some(v) => {
                serde_json::to_string(v).map_err(|e| ("InvalidSpec", format!("spec.settings: {e}")))?
            }
        };
        Ok(Wanted {
            kinds,
            settings,
            order: spec.order.unwrap_or(DEFAULT_ORDER),
            selector: spec.selector.clone(),
        })
    }

    /// What identifies this version with the module `module` (its digest, or an immutable
    /// reference).
    fn fingerprint(&self, module: &str) -> String {
        oci::sha256(
            serde_json::to_string(&json!([
                module,
                self.settings,
                self.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
                self.order,
                self.selector,
            ]))
            .unwrap_or_default()
            .as_bytes(),
        )
    }
}

/// The BuilderPlugin controller.
pub struct BuilderPlugins {
    client: Client,
    registry: Arc<PluginRegistry>,
    config: Config,
    oci: Oci,
    events: Events,
    leader: Leadership,
    state: tokio::sync::Mutex<State>,
}

impl BuilderPlugins {
    /// A controller of the cluster's BuilderPlugins, feeding `registry`.
    ///
    /// # Errors
    /// The OCI client cannot be made (the system's root certificates).
    pub fn new(
        client: Client,
        registry: Arc<PluginRegistry>,
        config: Config,
        leader: Leadership,
    ) -> anyhow::Result<Self> {
        let oci = Oci::new(config.cache.clone(), config.insecure_registries.clone())?;
        let events = Events::new(
            client.clone(),
            kube::runtime::events::Reporter {
                controller: "slinky-host".into(),
                instance: None,
            },
            leader.clone(),
            Arc::new(crate::reconcile::WriteMetrics::default()),
        );
        Ok(BuilderPlugins {
            client,
            registry,
            config,
            oci,
            events,
            leader,
            state: tokio::sync::Mutex::default(),
        })
    }

    /// List and load every BuilderPlugin once (start-up, before anything reconciles). A cluster
    /// without the CRD has none.
    ///
    /// # Errors
    /// They cannot be listed for another reason (RBAC, the API server): reconciling without
    /// them would rebuild every parent without its steps and roll its pods, so the host stops
    /// with the reason instead (`--builder-plugins=false` runs without them).
    pub async fn load_all(&self) -> anyhow::Result<()> {
        let api = Api::<BuilderPlugin>::all(self.client.clone());
        match api.list(&Default::default()).await {
            Ok(list) => {
                self.sync(&list.items, None).await;
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                tracing::info!(
                    "no BuilderPlugin CRD in the cluster: only the bundled and directory plugins serve"
                );
                Ok(())
            }
            Err(error) => Err(anyhow::anyhow!(
                "cannot list BuilderPlugins ({error}); the host does not reconcile without them, since every \
                 parent would be rebuilt without its steps and its pods rolled: grant `list` on \
                 builderplugins.plugins.slinky.slurm.net, or run with --builder-plugins=false"
            )),
        }
    }

    /// Watch BuilderPlugins and sync on every change and every [`RESYNC`].
    pub async fn run(self: Arc<Self>, parents: Parents) {
        let api = Api::<BuilderPlugin>::all(self.client.clone());
        let (store, writer) = kube::runtime::reflector::store::<BuilderPlugin>();
        let mut changes = Box::pin(kube::runtime::reflector(
            writer,
            watcher(api, watcher::Config::default()),
        ));
        let mut tick = tokio::time::interval(RESYNC);
        let mut ready = false;
        loop {
            tokio::select! {
                event = changes.next() => match event {
                    Some(Ok(watcher::Event::InitDone)) => ready = true,
                    Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_))) => {}
                    Some(Ok(_)) => continue,
                    Some(Err(error)) => {
                        tracing::debug!(%error, "BuilderPlugin watch error; it restarts");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                    None => return,
                },
                _ = tick.tick() => {}
            }
            if !ready {
                continue;
            }
            let items: Vec<BuilderPlugin> = store.state().iter().map(|p| p.as_ref().clone()).collect();
            self.sync(&items, Some(&parents)).await;
        }
    }

    /// Look at every BuilderPlugin in `items` (the whole set: one missing is gone), load what
    /// changed, replace the registry's steps, and write the status of each (leader only).
    async fn sync(&self, items: &[BuilderPlugin], parents: Option<&Parents>) {
        let mut state = self.state.lock().await;
        let names: BTreeSet<String> = items.iter().map(|p| p.name_any()).collect();
        state.loaded.retain(|n, _| names.contains(n));
        state.tried.retain(|n, _| names.contains(n));
        for bp in items {
            self.consider(bp, &mut state).await;
        }
        for kind in BuilderKind::ALL {
            let steps = state
                .loaded
                .values()
                .filter(|l| l.kinds.contains(&kind))
                .map(|l| l.step.clone())
                .collect();
            self.registry.set_steps(kind, steps);
        }
        for bp in items {
            self.write_status(bp, &state, parents).await;
        }
    }

    async fn consider(&self, bp: &BuilderPlugin, state: &mut State) {
        let name = bp.name_any();
        let wanted = match Wanted::of(&bp.spec) {
            Ok(w) => w,
            Err((reason, message)) => {
                let key = format!("spec:{message}");
                self.refused(bp, state, key, reason, message).await;
                return;
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
            && self.known(&name, fp, state)
        {
            return;
        }
        let (bytes, module) = match self.fetch(&bp.spec).await {
            Ok(m) => m,
            Err((reason, message)) => {
                let key = pinned.clone().unwrap_or_else(|| format!("fetch:{message}"));
                self.refused(bp, state, key, reason, message).await;
                return;
            }
        };
        let digest = oci::sha256(&bytes);
        let fingerprint = pinned.unwrap_or_else(|| wanted.fingerprint(&digest));
        if self.known(&name, &fingerprint, state) {
            return;
        }
        match self.load(&name, &bytes, &module, &wanted).await {
            Ok(step) => {
                tracing::info!(builder_plugin = %name, plugin = %step.plugin.label(), digest = %&step.plugin.digest()[..12],
                    kinds = %kinds_text(&wanted.kinds), order = step.order, "BuilderPlugin loaded; it serves now");
                self.events
                    .publish(
                        bp,
                        None,
                        EventType::Normal,
                        "PluginLoaded",
                        "Load",
                        format!(
                            "{} ({digest}) serves {} at order {}",
                            step.plugin.label(),
                            kinds_text(&wanted.kinds),
                            step.order
                        ),
                    )
                    .await;
                self.keep_module(&digest, &bytes);
                state
                    .tried
                    .insert(name.clone(), (fingerprint.clone(), Outcome::Loaded));
                state.loaded.insert(
                    name,
                    Loaded {
                        fingerprint,
                        step,
                        kinds: wanted.kinds,
                        spec: bp.spec.clone(),
                        digest,
                    },
                );
            }
            Err((reason, message)) => {
                let message = format!("{message} (module {module}, {digest})");
                self.refused(bp, state, fingerprint, reason, message).await;
            }
        }
    }

    /// Whether the version `fingerprint` of `name` was looked at already (serving, or refused
    /// with nothing changed since).
    fn known(&self, name: &str, fingerprint: &str, state: &mut State) -> bool {
        if state
            .loaded
            .get(name)
            .is_some_and(|l| l.fingerprint == fingerprint)
        {
            state
                .tried
                .insert(name.to_string(), (fingerprint.to_string(), Outcome::Loaded));
            return true;
        }
        // A refusal that depends on the world (a registry, a signature pushed later, a ConfigMap
        // being written) is tried again at the next sync; one that depends only on the inputs is
        // not, until they change.
        state.tried.get(name).is_some_and(|(f, o)| {
            f == fingerprint && !matches!(o, Outcome::Refused(r, _) if RETRIED.contains(r))
        })
    }

    /// Load `bytes` as the step `name` wants, off the async threads: compiled, described, its
    /// settings validated, the example inputs built through base + it.
    async fn load(&self, name: &str, bytes: &[u8], module: &str, wanted: &Wanted) -> Result<Step, Refusal> {
        let (registry, build) = (self.registry.clone(), self.config.build.clone());
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
        let loaded = tokio::task::spawn_blocking(move || {
            let plugin = Plugin::load_unoptimized(registry.engine(), &bytes, source)
                .map_err(|e| ("Refused", e.to_string()))?;
            plugin
                .validate_settings(&settings)
                .map_err(|e| ("InvalidSettings", e.in_step(&name).to_string()))?;
            let step = Step {
                name,
                plugin,
                settings,
                order,
                selector,
            };
            vet_step(&registry, &step, &kinds, &build).map_err(|e| ("Refused", e.to_string()))?;
            step.plugin.optimize_in_background(&bytes);
            Ok::<_, Refusal>(step)
        })
        .await;
        loaded.unwrap_or_else(|join| Err(("Refused", format!("the load task failed: {join}"))))
    }

    /// Keep a module that loaded, by digest (`<cache>/modules/<hex>.wasm`), so a restart can load
    /// it again while its registry or ConfigMap has moved on.
    fn keep_module(&self, digest: &str, bytes: &[u8]) {
        let Some(dir) = self.config.cache.as_ref().map(|d| d.join("modules")) else {
            return;
        };
        let hex = digest.trim_start_matches("sha256:");
        let path = dir.join(format!("{hex}.wasm"));
        if path.exists() {
            return;
        }
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            let tmp = dir.join(format!(".{hex}.tmp"));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(error) = write() {
            tracing::warn!(dir = %dir.display(), %error, "cannot keep a loaded module; a restart needs its source");
        }
    }

    /// The module `digest` kept by [`Self::keep_module`], if it is there and intact.
    fn kept_module(&self, digest: &str) -> Option<Vec<u8>> {
        let dir = self.config.cache.as_ref()?.join("modules");
        let bytes = std::fs::read(dir.join(format!("{}.wasm", digest.trim_start_matches("sha256:")))).ok()?;
        (oci::sha256(&bytes) == digest).then_some(bytes)
    }

    /// After a restart, when this BuilderPlugin's current spec is refused: load the version its
    /// status says served (`status.serving`), so the parents keep their steps and their pods do
    /// not roll. Tried once per process.
    async fn restore(&self, bp: &BuilderPlugin, state: &mut State) {
        let name = bp.name_any();
        if state.loaded.contains_key(&name) || !state.restored.insert(name.clone()) {
            return;
        }
        let Some(serving) = bp.status.as_ref().and_then(|s| s.serving.clone()) else {
            return;
        };
        let restored = async {
            let wanted = Wanted::of(&serving.spec)?;
            let bytes = match self.kept_module(&serving.digest) {
                Some(bytes) => bytes,
                None => {
                    let (bytes, _) = self.fetch(&serving.spec).await?;
                    if oci::sha256(&bytes) != serving.digest {
                        return Err(("Refused", format!("its source no longer has {}", serving.digest)));
                    }
                    bytes
                }
            };
            let step = self
                .load(
                    &name,
                    &bytes,
                    &format!("status.serving, {}", serving.digest),
                    &wanted,
                )
                .await?;
            Ok::<_, Refusal>((step, wanted))
        }
        .await;
        match restored {
            Ok((step, wanted)) => {
                tracing::warn!(builder_plugin = %name, plugin = %step.plugin.label(), digest = %serving.digest,
                    "the BuilderPlugin's current spec is refused; the version that served before this restart serves again");
                state.loaded.insert(
                    name,
                    Loaded {
                        fingerprint: format!("restored:{}", serving.digest),
                        step,
                        kinds: wanted.kinds,
                        spec: serving.spec,
                        digest: serving.digest,
                    },
                );
            }
            Err((_, message)) => {
                tracing::error!(builder_plugin = %name, digest = %serving.digest, %message,
                    "the version that served before this restart cannot be loaded again; the parents it applied to are built without it");
            }
        }
    }

    async fn refused(
        &self,
        bp: &BuilderPlugin,
        state: &mut State,
        fingerprint: String,
        reason: &'static str,
        message: String,
    ) {
        let name = bp.name_any();
        let again = state.tried.get(&name).is_some_and(|(f, o)| {
            *f == fingerprint && matches!(o, Outcome::Refused(r, m) if *r == reason && *m == message)
        });
        if again {
            // The same refusal as last time: already reported.
            return;
        }
        self.restore(bp, state).await;
        let serving = state
            .loaded
            .get(&name)
            .map(|l| format!("; {} ({}) keeps serving", l.step.plugin.label(), l.digest));
        tracing::warn!(builder_plugin = %name, reason, %message, "BuilderPlugin refused; the version serving before keeps serving");
        self.events
            .publish(
                bp,
                None,
                EventType::Warning,
                reason,
                "Load",
                format!("{message}{}", serving.unwrap_or_default()),
            )
            .await;
        state
            .tried
            .insert(name, (fingerprint, Outcome::Refused(reason, message)));
    }

    /// The module's bytes and a label of where it came from.
    async fn fetch(&self, spec: &BuilderPluginSpec) -> Result<(Vec<u8>, String), Refusal> {
        let (bytes, module) = match (&spec.module.image, &spec.module.config_map) {
            (Some(image), None) => self.pull(image).await?,
            (None, Some(cm)) => {
                if self.config.public_key.is_some() && spec.module.digest.is_none() {
                    return Err((
                        "InvalidSpec",
                        "spec.module.digest is required for a ConfigMap module on a host with \
                         --plugin-public-key (a ConfigMap carries no signature: the digest pins what \
                         the BuilderPlugin's author installed)"
                            .into(),
                    ));
                }
                self.read_config_map(cm).await?
            }
            _ => {
                return Err((
                    "InvalidSpec",
                    "spec.module: set exactly one of image (an OCI reference pinned by digest) and configMap"
                        .into(),
                ));
            }
        };
        let digest = oci::sha256(&bytes);
        if let Some(want) = &spec.module.digest
            && *want != digest
        {
            return Err((
                "UnknownDigest",
                format!(
                    "spec.module.digest is {want}, but the module {module} has {digest}: pin the digest the module has, or give the module that digest"
                ),
            ));
        }
        Ok((bytes, module))
    }

    async fn pull(&self, image: &str) -> Result<(Vec<u8>, String), (&'static str, String)> {
        let reference =
            Reference::parse(image).map_err(|e| ("InvalidSpec", format!("spec.module.image: {e}")))?;
        let pulled = self.oci.pull(&reference).await.map_err(|e| {
            let reason = match &e {
                oci::OciError::Content(m) if m.starts_with("unknown digest") => "UnknownDigest",
                oci::OciError::Reference(..) => "InvalidSpec",
                _ => "PullFailed",
            };
            (reason, format!("cannot pull {image}: {e}"))
        })?;
        if let Some(key) = &self.config.public_key {
            self.oci
                .verify(&reference, &pulled.manifest_digest, key)
                .await
                .map_err(|e| ("BadSignature", format!("{image}: {e}")))?;
        }
        let wasm = crate::plugins::gunzip_if_gzipped(pulled.wasm)
            .map_err(|e| ("Refused", format!("{image}: {e}")))?;
        Ok((wasm, image.to_string()))
    }

    async fn read_config_map(
        &self,
        cm: &slinky_api::ConfigMapModule,
    ) -> Result<(Vec<u8>, String), (&'static str, String)> {
        let key = cm.key.clone().unwrap_or_else(|| "plugin.wasm".into());
        let label = format!("ConfigMap {}/{} key {key}", cm.namespace, cm.name);
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &cm.namespace);
        let map = api
            .get_opt(&cm.name)
            .await
            .map_err(|e| ("ModuleUnreadable", format!("cannot read the {label}: {e}")))?
            .ok_or_else(|| ("ModuleUnreadable", format!("the {label} does not exist (yet)")))?;
        let bytes = map
            .binary_data
            .as_ref()
            .and_then(|d| d.get(&key))
            .map(|b| b.0.clone())
            .ok_or_else(|| {
                (
                    "ModuleUnreadable",
                    format!(
                        "the {label} has no binaryData key {key:?} (it has [{}]): `kubectl create configmap {} --from-file={key}=plugin.wasm`",
                        map.binary_data.iter().flatten().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(", "),
                        cm.name
                    ),
                )
            })?;
        let bytes =
            crate::plugins::gunzip_if_gzipped(bytes).map_err(|e| ("Refused", format!("{label}: {e}")))?;
        Ok((bytes, label))
    }

    async fn write_status(&self, bp: &BuilderPlugin, state: &State, parents: Option<&Parents>) {
        if !self.leader.may_write() {
            return;
        }
        let name = bp.name_any();
        let loaded = state.loaded.get(&name);
        let outcome = state.tried.get(&name).map(|(_, o)| o.clone());
        let mut status = BuilderPluginStatus {
            observed_generation: bp.metadata.generation,
            ..Default::default()
        };
        let (phase, cond_status, reason, message) = match &outcome {
            Some(Outcome::Loaded) => (
                "Loaded",
                "True",
                "Loaded",
                loaded.map_or_else(String::new, |l| {
                    format!("{} serves {}", l.step.plugin.label(), kinds_text(&l.kinds))
                }),
            ),
            Some(Outcome::Refused(reason, message)) => {
                let keeps = loaded.map_or_else(
                    || "; nothing serves for it".to_string(),
                    |l| format!("; {} ({}) keeps serving", l.step.plugin.label(), l.digest),
                );
                ("Refused", "False", *reason, format!("{message}{keeps}"))
            }
            None => ("Pending", "Unknown", "Pending", "not looked at yet".to_string()),
        };
        status.phase = Some(phase.into());
        if let Some(l) = loaded {
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
            match parents {
                Some(parents) => {
                    let applies = applies_to(l, parents);
                    status.applies_to_count = Some(applies.len() as i64);
                    status.applies_to = applies.into_iter().take(APPLIES_TO_NAMED).collect();
                }
                // At start-up, before the parents' caches: what the last status said.
                None => {
                    if let Some(old) = &bp.status {
                        status.applies_to_count = old.applies_to_count;
                        status.applies_to = old.applies_to.clone();
                    }
                }
            }
        }
        let previous = bp
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == LOADED));
        let since = previous
            .filter(|c| c.status == cond_status && c.reason == reason)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| Time(Timestamp::now()));
        status.conditions = vec![Condition {
            type_: LOADED.into(),
            status: cond_status.into(),
            reason: reason.into(),
            message: message.chars().take(32 * 1024).collect(),
            last_transition_time: since,
            observed_generation: bp.metadata.generation,
        }];
        if bp.status.as_ref() == Some(&status) {
            return;
        }
        let api = Api::<BuilderPlugin>::all(self.client.clone());
        // A merge patch keeps what it does not name: the fields this status has not are nulled.
        let mut body = serde_json::to_value(&status).unwrap_or_default();
        if let Some(map) = body.as_object_mut() {
            for field in [
                "plugin",
                "digest",
                "shortDigest",
                "contract",
                "tier",
                "appliesTo",
                "appliesToCount",
                "serving",
            ] {
                map.entry(field).or_insert(serde_json::Value::Null);
            }
        }
        let patch = Patch::Merge(json!({ "status": body }));
        if let Err(error) = api.patch_status(&name, &PatchParams::default(), &patch).await {
            tracing::warn!(builder_plugin = %name, %error, "cannot write the BuilderPlugin's status; the next sync tries again");
        }
    }
}

fn kinds_text(kinds: &[BuilderKind]) -> String {
    kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
}

/// The parents `loaded` applies to now: `<Kind> <namespace>/<name>`, sorted.
fn applies_to(loaded: &Loaded, parents: &Parents) -> Vec<String> {
    let mut out = BTreeSet::new();
    let step = &loaded.step;
    let mut add = |kind: &str, ns: Option<String>, name: String, labels: &BTreeMap<String, String>| {
        if step
            .selector
            .as_ref()
            .is_none_or(|s| slinky_api::selectors::matches(s, labels))
        {
            out.insert(format!("{kind} {}/{name}", ns.unwrap_or_default()));
        }
    };
    for kind in &loaded.kinds {
        match kind {
            BuilderKind::ControllerService | BuilderKind::ControllerChildren => {
                for o in parents.controllers.state() {
                    add("Controller", o.namespace(), o.name_any(), o.labels());
                }
            }
            BuilderKind::NodesetPod | BuilderKind::NodesetChildren => {
                for o in parents.nodesets.state() {
                    add("NodeSet", o.namespace(), o.name_any(), o.labels());
                }
            }
            BuilderKind::RestapiChildren => {
                for o in parents.restapis.state() {
                    add("RestApi", o.namespace(), o.name_any(), o.labels());
                }
            }
            BuilderKind::LoginsetChildren => {
                for o in parents.loginsets.state() {
                    add("LoginSet", o.namespace(), o.name_any(), o.labels());
                }
            }
            BuilderKind::AccountingChildren => {
                for o in parents.accountings.state() {
                    add("Accounting", o.namespace(), o.name_any(), o.labels());
                }
            }
        }
    }
    out.into_iter().collect()
}
