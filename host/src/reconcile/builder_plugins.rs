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
use slinky_api::{BuilderPlugin, BuilderPluginStatus, DEFAULT_ORDER};

use crate::{
    oci::{self, Oci, PublicKey, Reference},
    plugins::{
        BuildContext, BuilderKind, Plugin, PluginRegistry, PluginSource, Step, selector_matches, vet_step,
    },
    reconcile::{Events, Leadership},
};

/// How often every BuilderPlugin is looked at again without a change of its own (a ConfigMap's
/// content, a parent's labels for `status.appliesTo`).
pub const RESYNC: Duration = Duration::from_secs(10);

/// The condition type on a BuilderPlugin.
pub const LOADED: &str = "Loaded";

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
    generation: Option<i64>,
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
    /// without the CRD, or a host without RBAC to list them, has none (logged).
    pub async fn load_all(&self) {
        let api = Api::<BuilderPlugin>::all(self.client.clone());
        match api.list(&Default::default()).await {
            Ok(list) => self.sync(&list.items, None).await,
            Err(error) => {
                tracing::warn!(%error, "cannot list BuilderPlugins; only the bundled and directory plugins serve until the watch sees them");
            }
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
        let prepared = self.prepare(bp).await;
        let (fingerprint, bytes, module, kinds, settings) = match prepared {
            Ok(p) => p,
            Err((reason, message)) => {
                // Unreadable inputs: the fingerprint is the message (tried again when it changes).
                let key = format!("{:?}/{message}", bp.metadata.generation);
                self.refused(bp, state, key, reason, message).await;
                return;
            }
        };
        if state
            .loaded
            .get(&name)
            .is_some_and(|l| l.fingerprint == fingerprint)
        {
            if let Some(l) = state.loaded.get_mut(&name) {
                l.generation = bp.metadata.generation;
            }
            state.tried.insert(name, (fingerprint, Outcome::Loaded));
            return;
        }
        if state.tried.get(&name).is_some_and(|(f, _)| *f == fingerprint) {
            return;
        }
        let step_name = name.clone();
        let (registry, build) = (self.registry.clone(), self.config.build.clone());
        let order = bp.spec.order.unwrap_or(DEFAULT_ORDER);
        let selector = bp.spec.selector.clone();
        let kinds_for_vet = kinds.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let source = PluginSource::Resource {
                name: step_name.clone(),
                module,
            };
            let plugin = Plugin::load_unoptimized(registry.engine(), &bytes, source)?;
            let step = Step {
                name: step_name,
                plugin,
                settings,
                order,
                selector,
            };
            vet_step(&registry, &step, &kinds_for_vet, &build)?;
            step.plugin.optimize_in_background(&bytes);
            Ok::<_, crate::plugins::PluginError>(step)
        })
        .await;
        match loaded {
            Ok(Ok(step)) => {
                tracing::info!(builder_plugin = %name, plugin = %step.plugin.label(), digest = %&step.plugin.digest()[..12],
                    kinds = ?kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(), order = step.order,
                    "BuilderPlugin loaded; it serves now");
                self.events
                    .publish(
                        bp,
                        None,
                        EventType::Normal,
                        "PluginLoaded",
                        "Load",
                        format!(
                            "{} (sha256:{}) serves {} at order {}",
                            step.plugin.label(),
                            step.plugin.digest(),
                            kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", "),
                            step.order
                        ),
                    )
                    .await;
                state
                    .tried
                    .insert(name.clone(), (fingerprint.clone(), Outcome::Loaded));
                state.loaded.insert(
                    name,
                    Loaded {
                        fingerprint,
                        step,
                        kinds,
                        generation: bp.metadata.generation,
                    },
                );
            }
            Ok(Err(error)) => {
                let reason = if error.to_string().contains("settings are invalid") {
                    "InvalidSettings"
                } else {
                    "Refused"
                };
                self.refused(bp, state, fingerprint, reason, error.to_string())
                    .await;
            }
            Err(join) => {
                self.refused(
                    bp,
                    state,
                    fingerprint,
                    "Refused",
                    format!("the load task failed: {join}"),
                )
                .await
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
        if state.tried.get(&name).is_some_and(|(f, _)| *f == fingerprint) {
            return;
        }
        let serving = state.loaded.get(&name).map(|l| {
            format!(
                "; {} (sha256:{}) keeps serving",
                l.step.plugin.label(),
                &l.step.plugin.digest()[..12]
            )
        });
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

    /// The module's bytes and what identifies this version: (fingerprint, bytes, module label,
    /// kinds, settings), or why it cannot be read (reason, message).
    #[allow(clippy::type_complexity, reason = "one private helper")]
    async fn prepare(
        &self,
        bp: &BuilderPlugin,
    ) -> Result<(String, Vec<u8>, String, Vec<BuilderKind>, String), (&'static str, String)> {
        let spec = &bp.spec;
        let mut kinds = Vec::new();
        for (i, k) in spec.kinds.iter().enumerate() {
            let kind = k
                .parse::<BuilderKind>()
                .map_err(|e| ("InvalidSpec", format!("spec.kinds[{i}]: {e}")))?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        let settings = match &spec.settings {
            None => slinky_api::contract::NO_SETTINGS.to_string(),
            Some(v) => {
                serde_json::to_string(v).map_err(|e| ("InvalidSpec", format!("spec.settings: {e}")))?
            }
        };
        let (bytes, module) = match (&spec.module.image, &spec.module.config_map) {
            (Some(image), None) => self.pull(image).await?,
            (None, Some(cm)) => self.read_config_map(cm).await?,
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
        let fingerprint = oci::sha256(
            serde_json::to_string(&json!([
                digest,
                settings,
                kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
                spec.order.unwrap_or(DEFAULT_ORDER),
                spec.selector,
            ]))
            .unwrap_or_default()
            .as_bytes(),
        );
        Ok((fingerprint, bytes, module, kinds, settings))
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
                    |l| {
                        format!(
                            "; {} (sha256:{}) keeps serving",
                            l.step.plugin.label(),
                            &l.step.plugin.digest()[..12]
                        )
                    },
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
            if let Some(parents) = parents {
                let applies = applies_to(l, parents);
                status.applies_to_count = Some(applies.len() as i64);
                status.applies_to = applies.into_iter().take(APPLIES_TO_NAMED).collect();
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
        let patch = Patch::Merge(json!({ "status": status }));
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
        if step.selector.as_ref().is_none_or(|s| selector_matches(s, labels)) {
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
