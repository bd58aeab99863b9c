//! `slinky-host plugin diff`: what a plugin would change in a live cluster, before it is installed.
//!
//! It reads the cluster's Controllers, NodeSets, RestApis, LoginSets and Accountings (and the
//! ConfigMaps and Secrets they reference, as the host does), builds every child twice (with the
//! builders serving: the bundled ones and the cluster's BuilderPlugins, loaded as the host loads
//! them; and with the plugin added as a pipeline step with its settings and `--order`, as a
//! BuilderPlugin would add it; `--replace` makes it the base builder instead, as the plugins
//! directory would), and for each child the plugin changes prints the field diff against the
//! **live** object (the live object's fields the builder does not set are left out), and, per
//! NodeSet, which pods would roll. It writes nothing.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc};

use anyhow::Context as _;
use k8s_openapi::{
    api::core::v1::{ConfigMap, Pod, Secret},
    apimachinery::pkg::apis::meta::v1::LabelSelector,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, ListParams},
};
use serde_json::Value;
use slinky_api::{Accounting, Controller, LoginSet, NodeSet, RestApi, keys};

use super::{
    check::diff_lines,
    print,
    render::{self, Child, Manifest, Parent, References},
};
use crate::plugins::{BuildContext, EngineHandle, Plugin, PluginRegistry, Step};

/// Options of `plugin diff`.
#[derive(Debug, Clone, clap::Args)]
pub struct DiffArgs {
    /// The plugin file (`.wasm` component). Without one: what the builders serving now would
    /// change in the live cluster (before taking over a cluster another operator made: which
    /// pods would roll, which objects would change).
    pub path: Option<PathBuf>,
    /// The cluster's kubeconfig (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only these namespaces; repeatable (default: all).
    #[arg(short = 'n', long = "namespace")]
    pub namespaces: Vec<String>,
    /// The plugin's settings (JSON), as its BuilderPlugin's `spec.settings` would give them.
    #[arg(long, default_value = slinky_api::contract::NO_SETTINGS)]
    pub settings: String,
    /// Only the parents whose labels match this selector (`key=value,…`), as the BuilderPlugin's
    /// `spec.selector.matchLabels` would.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// Its order among the cluster's BuilderPlugins of its kinds (as `spec.order`).
    #[arg(long, default_value_t = slinky_api::DEFAULT_ORDER)]
    pub order: i32,
    /// Make the plugin the base builder of its kinds (as the plugins directory does) instead of
    /// a step after the builders serving.
    #[arg(long)]
    pub replace: bool,
    /// The cluster DNS domain given to builders.
    #[arg(long, env = "SLINKY_HOST_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
}

/// `plugin diff`.
///
/// # Errors
/// The plugin does not load or refuses its settings, the cluster cannot be read, or a build fails.
pub fn execute(engine: &Arc<EngineHandle>, args: DiffArgs, path: &std::path::Path) -> anyhow::Result<()> {
    let text = runtime()?.block_on(diff(engine, &args, path))?;
    print(&text)
}

/// The runtime a one-shot `plugin diff` runs on.
pub(super) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// The registries to compare: the builders serving now (the bundled ones and the cluster's
/// BuilderPlugins), and the same with the plugin (a step after them, or the base builder with
/// `--replace`); the BuilderPlugins included.
async fn registries(
    engine: &Arc<EngineHandle>,
    args: &DiffArgs,
    path: &std::path::Path,
    client: &Client,
    ctx: &BuildContext,
) -> anyhow::Result<(Arc<PluginRegistry>, Arc<PluginRegistry>, Plugin, Vec<String>)> {
    let plugin =
        Plugin::load_file(engine, path).with_context(|| format!("cannot load {}", path.display()))?;
    serde_json::from_str::<Value>(&args.settings).context("--settings is not JSON")?;
    plugin
        .validate_settings(&args.settings)
        .context("the plugin refuses --settings")?;
    let selector = args.selector.as_deref().map(parse_selector).transpose()?;
    let plain = Arc::new(PluginRegistry::new(engine, &[])?);
    let with = Arc::new(if args.replace {
        PluginRegistry::new(engine, &[path.to_path_buf()])?
    } else {
        PluginRegistry::new(engine, &[])?
    });
    // The cluster's steps, loaded once, serve in both.
    let installed = cluster_steps(client, &plain, ctx).await?;
    for kind in crate::plugins::bundled::KINDS {
        with.set_steps(kind, plain.steps(kind));
    }
    if !args.replace {
        for &kind in &plugin.info().kinds {
            let mut steps = with.steps(kind);
            steps.push(Step {
                name: "plugin-diff".into(),
                plugin: plugin.clone(),
                settings: args.settings.clone(),
                order: args.order,
                selector: selector.clone(),
                namespaces: None,
            });
            with.set_steps(kind, steps);
        }
    }
    Ok((plain, with, plugin, installed))
}

/// Load the cluster's BuilderPlugins into `registry` as the host would (read-only: no status
/// is written); the names of those serving.
pub(super) async fn cluster_steps(
    client: &Client,
    registry: &Arc<PluginRegistry>,
    ctx: &BuildContext,
) -> anyhow::Result<Vec<String>> {
    // `plugin diff` shows what the cluster's BuilderPlugins build, wherever their modules are
    // (it runs them in its sandbox to compare, and serves nothing: unsigned ones too).
    let source = crate::cmd::module_source(
        client,
        None,
        Vec::new(),
        None,
        true,
        vec![slinky_plugin_source::ANY_NAMESPACE.into()],
        std::env::var_os("SLINKY_HOST_REGISTRY_CREDENTIALS")
            .map(std::path::PathBuf::from)
            .as_deref(),
    )?;
    let steps = crate::reconcile::builder_plugin::Steps::new(registry.clone(), Arc::new(source), ctx.clone());
    crate::reconcile::builder_plugin::load_once(client, &steps).await?;
    let mut names: Vec<String> = crate::plugins::bundled::KINDS
        .iter()
        .flat_map(|&k| registry.steps(k))
        .map(|s| s.name)
        .collect();
    names.sort();
    names.dedup();
    Ok(names)
}

/// `a=b,c=d` as a label selector.
fn parse_selector(text: &str) -> anyhow::Result<LabelSelector> {
    let mut labels = BTreeMap::new();
    for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .with_context(|| format!("--selector: {pair:?} is not key=value"))?;
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(LabelSelector {
        match_labels: Some(labels),
        ..Default::default()
    })
}

pub(super) async fn connect(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    Ok(Client::try_from(config)?)
}

/// Every object of kind `K` in `namespaces` (all when empty).
async fn list<K>(client: &Client, namespaces: &[String]) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    if namespaces.is_empty() {
        return Ok(Api::<K>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items);
    }
    let mut out = Vec::new();
    for ns in namespaces {
        out.extend(
            Api::<K>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await?
                .items,
        );
    }
    Ok(out)
}

async fn diff(engine: &Arc<EngineHandle>, args: &DiffArgs, path: &std::path::Path) -> anyhow::Result<String> {
    let client = connect(args.kubeconfig.as_deref()).await?;
    let ctx = BuildContext {
        cluster_domain: args.cluster_domain.clone(),
        ..BuildContext::default()
    };
    let (plain, with, plugin, installed) = registries(engine, args, path, &client, &ctx).await?;
    let manifests = live_parents(&client, &args.namespaces).await?;
    let references = live_references(&client, &manifests).await;
    let before = render::render_with(&manifests, &references, &plain, &ctx)
        .context("the builders serving now fail")?;
    let after = render::render_with(&manifests, &references, &with, &ctx)
        .with_context(|| format!("{} fails", plugin.label()))?;
    let mut out = header(args, &plugin, manifests.len(), &installed);
    let mut changes = Changes::default();
    for child in &after {
        changes.compare(&client, &before, child, &mut out).await?;
    }
    for gone in before.iter().filter(|b| {
        !after
            .iter()
            .any(|a| a.describe() == b.describe() && namespace(a) == namespace(b))
    }) {
        changes.changed += 1;
        out.push_str(&format!(
            "{} in {}: would be deleted (the plugin no longer builds it)\n\n",
            gone.describe(),
            namespace(gone)
        ));
    }
    changes.summary(&mut out);
    Ok(out)
}

/// The parents of `namespaces` (all when empty) as the cluster has them.
///
/// # Errors
/// Controllers or NodeSets cannot be listed (the other kinds may not be served: absent is none).
pub(super) async fn live_parents(client: &Client, namespaces: &[String]) -> anyhow::Result<Vec<Manifest>> {
    let live = |at: &str, parent| Manifest {
        at: format!("live {at}"),
        parent,
    };
    let mut manifests = Vec::new();
    for c in list::<Controller>(client, namespaces)
        .await
        .context("cannot list Controllers")?
    {
        manifests.push(live("Controller", Parent::Controller(Box::new(c))));
    }
    for n in list::<NodeSet>(client, namespaces)
        .await
        .context("cannot list NodeSets")?
    {
        manifests.push(live("NodeSet", Parent::NodeSet(Box::new(n))));
    }
    for r in list::<RestApi>(client, namespaces).await.unwrap_or_default() {
        manifests.push(live("RestApi", Parent::RestApi(Box::new(r))));
    }
    for l in list::<LoginSet>(client, namespaces).await.unwrap_or_default() {
        manifests.push(live("LoginSet", Parent::LoginSet(Box::new(l))));
    }
    for a in list::<Accounting>(client, namespaces).await.unwrap_or_default() {
        manifests.push(live("Accounting", Parent::Accounting(Box::new(a))));
    }
    Ok(manifests)
}

/// The ConfigMaps and Secrets of the parents' namespaces. Only the Secrets' hashes are used (as
/// the host does); without RBAC to read them the key hash annotations show as changes.
pub(super) async fn live_references(client: &Client, manifests: &[Manifest]) -> References {
    let namespaces: std::collections::BTreeSet<String> = manifests
        .iter()
        .filter_map(|m| match &m.parent {
            Parent::Controller(c) => c.namespace(),
            Parent::NodeSet(n) => n.namespace(),
            Parent::RestApi(r) => r.namespace(),
            Parent::LoginSet(l) => l.namespace(),
            Parent::Accounting(a) => a.namespace(),
        })
        .collect();
    let namespaces: Vec<String> = namespaces.into_iter().collect();
    let daemon = manifests
        .iter()
        .any(|m| m.parent.as_nodeset().is_some_and(slinky_api::NodeSet::is_daemon));
    References {
        config_maps: list::<ConfigMap>(client, &namespaces).await.unwrap_or_default(),
        secrets: list::<Secret>(client, &namespaces).await.unwrap_or_default(),
        // Not readable: rendered by ordinal, so the report shows them as pods to create.
        daemon_pods: if daemon {
            list::<Pod>(client, &namespaces)
                .await
                .inspect_err(|e| tracing::warn!(error = %e, "cannot list the DaemonSet-mode NodeSets' pods"))
                .ok()
        } else {
            None
        },
    }
}

/// What the diff compares: the plugin, how it joins, and what serves now.
fn header(args: &DiffArgs, plugin: &Plugin, parents: usize, installed: &[String]) -> String {
    format!(
        "plugin: {} (sha256:{}), {} {}, settings {}\nparents: {} read from the cluster; BuilderPlugins serving: {}\n\n",
        plugin.label(),
        plugin.digest(),
        if args.replace {
            "replacing the bundled builder of"
        } else {
            "as a step after the builders serving"
        },
        plugin
            .info()
            .kinds
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        args.settings,
        parents,
        if installed.is_empty() {
            "none".to_string()
        } else {
            installed.join(", ")
        }
    )
}

/// What changes: the count of objects, and the pods that would roll per NodeSet.
#[derive(Default)]
pub(super) struct Changes {
    pub(super) changed: usize,
    pub(super) rolling: BTreeMap<String, Vec<String>>,
}

impl Changes {
    /// The pods that would roll, per NodeSet, and the counts: the report's last lines.
    pub(super) fn summary(&self, out: &mut String) {
        for (nodeset, pods) in &self.rolling {
            out.push_str(&format!(
                "{nodeset}: {} pod(s) would roll: {}\n",
                pods.len(),
                pods.join(", ")
            ));
        }
        out.push_str(&format!(
            "{} object(s) would change; {} pod(s) would roll\n",
            self.changed,
            self.rolling.values().map(Vec::len).sum::<usize>()
        ));
    }
}

impl Changes {
    /// Compare `child` (built with the plugin) with what the builders serving now build and
    /// with the live object; print its diff into `out`.
    async fn compare(
        &mut self,
        client: &Client,
        before: &[Child],
        child: &Child,
        out: &mut String,
    ) -> anyhow::Result<()> {
        let same = before
            .iter()
            .find(|b| b.describe() == child.describe() && namespace(b) == namespace(child))
            .is_some_and(|b| strip(b.to_json()) == strip(child.to_json()));
        if same {
            return Ok(());
        }
        self.changed += 1;
        let desired = child.to_json();
        let ns = namespace(child);
        let current = live_object(client, child, &ns).await?;
        match (&current, child) {
            (None, _) => out.push_str(&format!("{} in {ns}: would be created\n\n", child.describe())),
            (Some(current), Child::Pod(pod)) => {
                let from = current.pointer(&format!(
                    "/metadata/labels/{}",
                    keys::LABEL_REVISION_HASH.replace('/', "~1")
                ));
                let to = pod.labels().get(keys::LABEL_REVISION_HASH);
                let d = diff_lines(&yaml(&project(current, &desired)), &yaml(&desired));
                if from.and_then(Value::as_str) != to.map(String::as_str) {
                    let owner = pod
                        .owner_references()
                        .first()
                        .map(|o| o.name.clone())
                        .unwrap_or_default();
                    self.rolling
                        .entry(format!("NodeSet {ns}/{owner}"))
                        .or_default()
                        .push(pod.name_any());
                }
                out.push_str(&format!(
                    "{} in {ns}: would be replaced (pods roll within maxUnavailable):\n{d}\n",
                    child.describe()
                ));
            }
            (Some(current), _) => {
                let d = diff_lines(&yaml(&project(current, &desired)), &yaml(&desired));
                out.push_str(&format!(
                    "{} in {ns}: would change (- live, + with the plugin):\n{d}\n",
                    child.describe()
                ));
            }
        }
        Ok(())
    }
}

pub(super) fn namespace(c: &Child) -> String {
    c.to_json()
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The object without what always differs between two pipelines (builder annotations, the
/// revision label): equal when the plugin changes nothing else.
pub(super) fn strip(mut v: Value) -> Value {
    for at in ["/metadata", "/spec/template/metadata"] {
        if let Some(meta) = v.pointer_mut(at).and_then(Value::as_object_mut) {
            for (field, key) in [
                ("annotations", keys::ANNOTATION_BUILDER),
                ("annotations", keys::ANNOTATION_BUILDER_DIGEST),
                ("labels", keys::LABEL_REVISION_HASH),
            ] {
                if let Some(m) = meta.get_mut(field).and_then(Value::as_object_mut) {
                    m.remove(key);
                }
            }
        }
    }
    v
}

/// The live object of `child`, as JSON, if it exists.
pub(super) async fn live_object(client: &Client, child: &Child, ns: &str) -> anyhow::Result<Option<Value>> {
    let name = child.to_json()["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let found = match child {
        Child::Pod(_) => Api::<Pod>::namespaced(client.clone(), ns)
            .get_opt(&name)
            .await?
            .map(serde_json::to_value)
            .transpose()?,
        Child::Service(_) => Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), ns)
            .get_opt(&name)
            .await?
            .map(serde_json::to_value)
            .transpose()?,
        Child::Object(o) => {
            let ar = o.kind.api_resource();
            match Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar)
                .get_opt(&name)
                .await
            {
                Ok(found) => found.map(serde_json::to_value).transpose()?,
                // A kind the cluster does not serve (the ServiceMonitor without the Prometheus
                // Operator): nothing live.
                Err(kube::Error::Api(s)) if s.code == 404 => None,
                Err(e) => return Err(e.into()),
            }
        }
    };
    Ok(found)
}

/// `live` cut down to the fields `desired` sets (maps key by key, lists item by item when they
/// have the same length): what applying `desired` would change, without the fields the API
/// server and other controllers fill in.
pub(super) fn project(live: &Value, desired: &Value) -> Value {
    match (live, desired) {
        (Value::Object(l), Value::Object(d)) => Value::Object(
            d.keys()
                .filter_map(|k| l.get(k).map(|v| (k.clone(), project(v, &d[k]))))
                .collect(),
        ),
        (Value::Array(l), Value::Array(d)) if l.len() == d.len() => {
            Value::Array(l.iter().zip(d).map(|(l, d)| project(l, d)).collect())
        }
        (l, _) => l.clone(),
    }
}

pub(super) fn yaml(v: &Value) -> String {
    serde_saphyr::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn live_objects_are_cut_to_the_fields_the_builder_sets() {
        let live = json!({"metadata": {"name": "a", "uid": "u", "labels": {"x": "1", "y": "2"}},
            "spec": {"containers": [{"name": "c", "image": "i", "terminationMessagePath": "/dev/t"}]},
            "status": {"phase": "Running"}});
        let desired = json!({"metadata": {"name": "a", "labels": {"x": "1"}},
            "spec": {"containers": [{"name": "c", "image": "j"}]}});
        assert_eq!(
            project(&live, &desired),
            json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}})
        );
    }

    #[test]
    fn selectors_parse_as_match_labels() -> anyhow::Result<()> {
        let s = parse_selector("canary=true, site=a")?;
        assert_eq!(s.match_labels.map(|m| m.len()), Some(2));
        assert!(parse_selector("canary").is_err());
        Ok(())
    }
}
