//! `slinky-host render`: read Controller/NodeSet manifests (and the Secrets and ConfigMaps they
//! reference) and print what the builders make of them, offline, through exactly the plugin path
//! the reconciler uses.

mod build;
mod read;

pub use self::build::render_with;

use std::{path::PathBuf, sync::Arc};

use clap::Args;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::ResourceExt;
use serde_json::Value;
use slinky_api::{
    Controller, NodeSet,
    contract::{ControllerInputs, MissingReference},
};

pub use self::read::{parse_manifests, parse_yaml, read_manifests, read_references, yaml_documents};
use super::{OutputFormat, print};
use crate::plugins::{BuildContext, EngineHandle, PluginError, PluginRegistry};

/// Errors of reading manifests and rendering them; each names the file/object.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A document is not valid YAML/JSON.
    #[error("{at}: not valid YAML or JSON: {reason}")]
    Parse {
        /// `file` or `file (document N)`.
        at: String,
        /// The parser's message.
        reason: String,
    },
    /// A document is not a Controller or NodeSet, or is an invalid one.
    #[error("{at}: {reason}")]
    Invalid {
        /// Where.
        at: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A NodeSet's Controller is not among the inputs.
    #[error(
        "{at}: {nodeset} references Controller {controller}, which is not in the input; add it (render needs the Controller to build its children)"
    )]
    MissingController {
        /// Where the NodeSet (or RestApi) is.
        at: String,
        /// `NodeSet namespace/name` (or `RestApi namespace/name`).
        nodeset: String,
        /// `namespace/name` of the missing Controller.
        controller: String,
    },
    /// A builder failed for an object.
    #[error("{at}: {object}: {source}")]
    Build {
        /// Where the parent is.
        at: String,
        /// `Kind namespace/name` of the parent.
        object: String,
        /// The plugin error.
        #[source]
        source: Box<PluginError>,
    },
}

/// A parent object read from a manifest.
#[derive(Debug, Clone)]
pub enum Parent {
    /// A Controller.
    Controller(Box<Controller>),
    /// A NodeSet.
    NodeSet(Box<NodeSet>),
    /// A RestApi.
    RestApi(Box<slinky_api::RestApi>),
    /// A LoginSet.
    LoginSet(Box<slinky_api::LoginSet>),
    /// An Accounting.
    Accounting(Box<slinky_api::Accounting>),
}

impl Parent {
    /// The object's metadata.
    pub fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Parent::Controller(c) => &mut c.metadata,
            Parent::NodeSet(n) => &mut n.metadata,
            Parent::RestApi(r) => &mut r.metadata,
            Parent::LoginSet(l) => &mut l.metadata,
            Parent::Accounting(a) => &mut a.metadata,
        }
    }

    /// The NodeSet, if this is one.
    pub fn as_nodeset(&self) -> Option<&NodeSet> {
        match self {
            Parent::NodeSet(n) => Some(n),
            _ => None,
        }
    }

    /// The Controller, if this is one.
    pub fn as_controller(&self) -> Option<&Controller> {
        match self {
            Parent::Controller(c) => Some(c),
            _ => None,
        }
    }

    /// The Accounting, if this is one.
    pub fn as_accounting(&self) -> Option<&slinky_api::Accounting> {
        match self {
            Parent::Accounting(a) => Some(a),
            _ => None,
        }
    }
}

/// A parent and where it was read from.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// `file` or `file (document N)`.
    pub at: String,
    /// The object.
    pub parent: Parent,
}

/// A built child object.
#[derive(Debug, Clone)]
pub enum Child {
    /// The Controller's Service.
    Service(Box<Service>),
    /// A NodeSet pod.
    Pod(Box<Pod>),
    /// Another child (a StatefulSet, ConfigMap, Service or PodDisruptionBudget) from a children
    /// builder.
    Object(Box<crate::plugins::Child>),
}

impl Child {
    /// As JSON.
    pub fn to_json(&self) -> Value {
        let v = match self {
            Child::Service(s) => serde_json::to_value(s),
            Child::Pod(p) => serde_json::to_value(p),
            Child::Object(o) => Ok(o.object.clone()),
        };
        v.unwrap_or(Value::Null)
    }

    /// As a YAML document.
    ///
    /// # Errors
    /// A serializer failure (not expected for built objects).
    pub fn to_yaml(&self) -> Result<String, serde_saphyr::SerializeError> {
        match self {
            Child::Service(s) => serde_saphyr::to_string(s),
            Child::Pod(p) => serde_saphyr::to_string(p),
            Child::Object(o) => serde_saphyr::to_string(&o.object),
        }
    }

    /// `Kind name`.
    pub fn describe(&self) -> String {
        match self {
            Child::Service(s) => format!("Service {}", s.name_any()),
            Child::Pod(p) => format!("Pod {}", p.name_any()),
            Child::Object(o) => o.describe(),
        }
    }
}

/// The Secrets and ConfigMaps of the input files: what the Controllers reference (the host reads
/// them from the cluster; `render` from its input).
#[derive(Debug, Clone, Default)]
pub struct References {
    /// Secrets (for the key hashes; their data never reaches a builder).
    pub secrets: Vec<Secret>,
    /// ConfigMaps (for the files they provide).
    pub config_maps: Vec<ConfigMap>,
    /// The live pods of the DaemonSet-mode NodeSets, read from a cluster (`None`: not read; such
    /// a NodeSet's pods are rendered by ordinal, as no node is known).
    pub daemon_pods: Option<Vec<k8s_openapi::api::core::v1::Pod>>,
}

impl References {
    /// The inputs of `controller`'s children builder, by the host's rule
    /// ([`ControllerInputs::gather`]): its NodeSets among `manifests`, the key hashes of the
    /// Secrets it references (empty, with a warning, for one not in the input), the files of the
    /// ConfigMaps it references (none, with a warning, for one not in the input).
    pub fn inputs(&self, controller: &Controller, manifests: &[Manifest]) -> ControllerInputs {
        let ns = controller.namespace().unwrap_or_default();
        let nodesets = manifests.iter().filter_map(|m| m.parent.as_nodeset());
        let (inputs, missing) = ControllerInputs::gather(
            controller,
            nodesets,
            |name| self.secrets.iter().find(|s| is(*s, &ns, name)),
            |name| self.config_maps.iter().find(|c| is(*c, &ns, name)),
            |name| {
                manifests
                    .iter()
                    .filter_map(|m| m.parent.as_accounting())
                    .find(|a| is(*a, &ns, name))
            },
        );
        for m in missing {
            match m {
                MissingReference::Secret { field, name } => tracing::warn!(
                    "Secret {ns}/{name} ({field}) is not in the input: its key hash is left empty \
                     (add the Secret to the input to render the hash the host would)"
                ),
                MissingReference::ConfigMap { name } => tracing::warn!(
                    "ConfigMap {ns}/{name} is not in the input: rendered as providing no files"
                ),
                MissingReference::Accounting { name } => tracing::warn!(
                    "Accounting {ns}/{name} (spec.accountingRef) is not in the input: slurm.conf names \
                     its default address"
                ),
                MissingReference::SecretKey { .. } | MissingReference::ConfigMapKey { .. } => {}
            }
        }
        inputs
    }

    /// The Secret `ns/name` of the input, if any.
    fn secret(&self, ns: &str, name: &str) -> Option<&Secret> {
        self.secrets.iter().find(|s| is(*s, ns, name))
    }

    /// The inputs of a LoginSet's children builder: the hashes of its host keys Secret and of its
    /// `sssd.conf` when the input has them (empty, with a warning, when not: the host makes the
    /// host keys in a cluster).
    pub fn loginset_inputs(&self, l: &slinky_api::LoginSet) -> slinky_api::contract::LoginSetInputs {
        let ns = l.namespace().unwrap_or_default();
        let keys = self.secret(&ns, &l.ssh_host_keys_name());
        if keys.is_none() {
            tracing::info!(
                "Secret {ns}/{} (the host keys the host makes) is not in the input: its hash is left empty",
                l.ssh_host_keys_name()
            );
        }
        let (inputs, missing) =
            slinky_api::contract::LoginSetInputs::gather(l, keys, |name| self.secret(&ns, name));
        if let Some(m) = missing {
            tracing::warn!("{} in the input: its hash is left empty", m.describe(&ns));
        }
        inputs
    }

    /// The inputs of an Accounting's children builder: the hashes of its key Secrets (empty, with
    /// a warning, for one not in the input) and of its `slurmdbd.conf` Secret when the input has it.
    pub fn accounting_inputs(&self, a: &slinky_api::Accounting) -> slinky_api::contract::AccountingInputs {
        let ns = a.namespace().unwrap_or_default();
        let (inputs, missing) = slinky_api::contract::AccountingInputs::gather(
            a,
            |name| self.secret(&ns, name),
            self.secret(&ns, &a.accounting_key()),
        );
        for m in missing {
            if let MissingReference::Secret { field, name } = m {
                tracing::warn!(
                    "Secret {ns}/{name} ({field}) is not in the input: its key hash is left empty"
                );
            }
        }
        inputs
    }
}

/// Whether `object` is `ns/name`.
fn is(object: &impl ResourceExt, ns: &str, name: &str) -> bool {
    object.namespace().as_deref() == Some(ns) && object.name_any() == name
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// Build every child of the parents, as [`render_with`] does, without any Secret or ConfigMap
/// in the input (key hashes are empty).
///
/// # Errors
/// The first parent whose Controller is missing or whose builder fails.
pub fn render(
    manifests: &[Manifest],
    plugins: &PluginRegistry,
    ctx: &BuildContext,
) -> Result<Vec<Child>, RenderError> {
    render_with(manifests, &References::default(), plugins, ctx)
}

/// The Controllers among `manifests`.
pub fn controllers(manifests: &[Manifest]) -> Vec<&Controller> {
    manifests
        .iter()
        .filter_map(|m| m.parent.as_controller())
        .collect()
}

/// Kubernetes YAML: one document per object, separated by `---`.
///
/// # Errors
/// A serializer failure.
pub fn to_yaml(children: &[Child]) -> Result<String, serde_saphyr::SerializeError> {
    let docs = children
        .iter()
        .map(Child::to_yaml)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(docs.join("---\n"))
}

/// A `v1` `List` of the objects.
pub fn to_json_list(children: &[Child]) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {},
        "items": children.iter().map(Child::to_json).collect::<Vec<_>>(),
    })
}

/// `render` options.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Manifest files (YAML, multi-document, or JSON) with Controllers and NodeSets.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// Plugin files overriding the bundled builders of the kinds they build.
    #[arg(long = "plugin")]
    pub plugins: Vec<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "yaml")]
    pub output: OutputFormat,
    /// The cluster DNS domain given to builders.
    #[arg(long, env = "SLINKY_HOST_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
}

/// `render`: read `args.files`, build, print.
///
/// # Errors
/// As [`render_with`], a plugin that does not load, or stdout closed.
pub fn execute(engine: &Arc<EngineHandle>, args: RenderArgs) -> anyhow::Result<()> {
    let manifests = read_manifests(&args.files)?;
    let references = read_references(&args.files)?;
    let registry = PluginRegistry::new(engine, &args.plugins)?;
    let ctx = crate::BuildContext {
        cluster_domain: args.cluster_domain,
        ..crate::BuildContext::default()
    };
    let children = render_with(&manifests, &references, &registry, &ctx)?;
    let text = match args.output {
        OutputFormat::Yaml => to_yaml(&children)?,
        OutputFormat::Json => serde_json::to_string_pretty(&to_json_list(&children))? + "\n",
    };
    print(&text)
}
