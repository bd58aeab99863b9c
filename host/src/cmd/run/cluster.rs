//! Where `run` reconciles: a cluster's API server (`identified` configs), or the embedded one
//! with the CRDs installed and manifests applied.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use kube::{
    Api, Client,
    api::{DynamicObject, Patch, PatchParams},
    discovery::Discovery,
};
use serde_json::Value;

use super::RunArgs;
use crate::{
    client::ApiRequests,
    cmd::{crds, render},
};

/// Server-side apply every object in `files` (YAML documents), creating missing namespaces.
///
/// # Errors
/// A file that can't be read or parsed, an unknown kind, or an API error; each names the object.
pub async fn apply_files(client: &Client, files: &[PathBuf]) -> anyhow::Result<usize> {
    let discovery = Discovery::new(client.clone())
        .run()
        .await
        .context("API discovery failed")?;
    let mut n = 0;
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
        for (i, doc) in render::yaml_documents(&text).into_iter().enumerate() {
            let at = format!("{} (document {})", file.display(), i + 1);
            let value: Value = render::parse_yaml(doc).with_context(|| format!("{at}: not valid YAML"))?;
            if value.is_null() {
                continue;
            }
            let obj: DynamicObject =
                serde_json::from_value(value).with_context(|| format!("{at}: not a Kubernetes object"))?;
            let types = obj
                .types
                .clone()
                .with_context(|| format!("{at}: apiVersion and kind are required"))?;
            let gvk = kube::api::GroupVersionKind::try_from(&types)
                .with_context(|| format!("{at}: bad apiVersion"))?;
            let (ar, caps) = discovery.resolve_gvk(&gvk).with_context(|| {
                format!(
                    "{at}: the server does not serve {} {}",
                    types.api_version, types.kind
                )
            })?;
            let name = obj
                .metadata
                .name
                .clone()
                .with_context(|| format!("{at}: metadata.name is required"))?;
            let api: Api<DynamicObject> = if caps.scope == kube::discovery::Scope::Namespaced {
                let ns = obj.metadata.namespace.clone().unwrap_or_else(|| "default".into());
                ensure_namespace(client, &ns).await?;
                Api::namespaced_with(client.clone(), &ns, &ar)
            } else {
                Api::all_with(client.clone(), &ar)
            };
            api.patch(
                &name,
                &PatchParams::apply("slinky-host-apply").force(),
                &Patch::Apply(&obj),
            )
            .await
            .with_context(|| format!("{at}: cannot apply {} {name}", types.kind))?;
            n += 1;
        }
    }
    Ok(n)
}

async fn ensure_namespace(client: &Client, ns: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(client.clone());
    if api.get_opt(ns).await?.is_none() {
        let obj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?;
        match api.create(&Default::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e).with_context(|| format!("cannot create namespace {ns}")),
        }
    }
    Ok(())
}

/// Install (server-side apply) the Slinky CRDs and wait until they are served.
///
/// # Errors
/// API errors.
pub async fn install_crds(client: &Client) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &PatchParams::apply("slinky-host").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("cannot install CRD {name}"))?;
    }
    Ok(())
}

/// The embedded API server of `run --embedded` (with simulated pod lifecycle in real time), the
/// CRDs installed and `--apply` files applied.
#[cfg(feature = "embedded")]
async fn start_embedded(
    args: &RunArgs,
    requests: Arc<ApiRequests>,
) -> anyhow::Result<(crate::embedded::ApiServer, Client)> {
    use crate::embedded::{ApiServer, ApiServerConfig, LifecycleConfig};
    let s = ApiServer::start(ApiServerConfig {
        lifecycle: Some(LifecycleConfig::default()),
        statefulsets: true,
        deployments: true,
        ..Default::default()
    })
    .await
    .context("cannot start the embedded API server")?;
    s.write_kubeconfig(&args.kubeconfig_out)
        .with_context(|| format!("cannot write {}", args.kubeconfig_out.display()))?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&s.kubeconfig_yaml())
        .context("the embedded API server's kubeconfig")?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    let client = crate::client::client(config, requests)
        .context("cannot build a client for the embedded API server")?;
    install_crds(&client).await?;
    let n = apply_files(&client, &args.apply).await?;
    println!(
        "embedded API server at {} (kubeconfig: {})",
        s.url(),
        args.kubeconfig_out.display()
    );
    println!(
        "applied {n} objects; watch with: kubectl --kubeconfig {} get nodesets,pods -A -w",
        args.kubeconfig_out.display()
    );
    Ok((s, client))
}

/// No embedded API server: this host was built without the `embedded` feature.
#[cfg(not(feature = "embedded"))]
pub(super) enum NoServer {}

#[cfg(not(feature = "embedded"))]
impl NoServer {
    pub(super) async fn shutdown(self) {
        match self {}
    }
}

/// Without the `embedded` feature there is no embedded API server to start.
#[cfg(not(feature = "embedded"))]
async fn start_embedded(_: &RunArgs, _: Arc<ApiRequests>) -> anyhow::Result<(NoServer, Client)> {
    anyhow::bail!(
        "this slinky-host was built without the `embedded` feature: --embedded is not available (run `cargo run -p slinky-host --features embedded -- run --embedded …`)"
    )
}

/// The embedded API server `run --embedded` starts.
#[cfg(feature = "embedded")]
pub(super) type EmbeddedServer = crate::embedded::ApiServer;
/// The embedded API server `run --embedded` starts: none without the `embedded` feature.
#[cfg(not(feature = "embedded"))]
pub(super) type EmbeddedServer = NoServer;

/// A client of the API server `args` name: the embedded one (started here, and returned so it
/// can be shut down), the `--kubeconfig` one, or the inferred one (`$KUBECONFIG`,
/// `~/.kube/config`, in-cluster). Its requests are counted into `requests`.
pub(super) async fn connect(
    args: &RunArgs,
    requests: Arc<ApiRequests>,
) -> anyhow::Result<(Option<EmbeddedServer>, Client)> {
    if args.embedded {
        let (server, client) = start_embedded(args, requests).await?;
        return Ok((Some(server), client));
    }
    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster: pass --kubeconfig or --embedded")?,
    };
    Ok((None, crate::client::client(identified(config), requests)?))
}

/// `config` sending `User-Agent: slinky-host/VERSION` (audit logs, API priority and fairness).
pub fn identified(mut config: kube::Config) -> kube::Config {
    if let Ok(ua) = http::HeaderValue::from_str(&format!("slinky-host/{}", env!("CARGO_PKG_VERSION"))) {
        config.headers.push((http::header::USER_AGENT, ua));
    }
    config
}
