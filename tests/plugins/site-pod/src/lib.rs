//! A `nodeset-pod` pipeline step: the previous step's pod (Slinky's when it runs first) plus the
//! labels and annotations its settings give. Its settings are checked at load: label keys must
//! not be Slinky's (`slinky.slurm.net/…`, `app.kubernetes.io/…`: the pod's selector labels are
//! not a site's to change) and values at most 63 characters.

use std::collections::BTreeMap;

use slinky_guest_sdk::{
    BuildContext, BuildError, NodeSetPodBuilder, PodIdentity, Settings,
    api::{Controller, NodeSet},
    k8s_openapi::api::core::v1::Pod,
    slinky,
};

/// The step.
pub struct SitePods;

/// Its settings.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SiteSettings {
    /// Labels every pod gets.
    pub labels: BTreeMap<String, String>,
    /// Annotations every pod gets.
    pub annotations: BTreeMap<String, String>,
}

impl Settings for SiteSettings {
    fn validate(&self) -> Result<(), String> {
        for (k, v) in &self.labels {
            if k.starts_with("slinky.slurm.net/") || k.starts_with("app.kubernetes.io/") {
                return Err(format!(
                    "labels.{k}: Slinky's labels select the pods; use a key of your own domain"
                ));
            }
            if v.len() > 63 {
                return Err(format!(
                    "labels.{k}: the value has {} characters, at most 63 are allowed",
                    v.len()
                ));
            }
        }
        Ok(())
    }
}

impl NodeSetPodBuilder for SitePods {
    fn build_pod(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, BuildError> {
        let settings: SiteSettings = ctx.settings()?;
        let mut pod = match ctx.previous::<Pod>()? {
            Some(pod) => pod,
            None => slinky::build_nodeset_pod(ctx, nodeset, controller, identity)?,
        };
        slinky_guest_sdk::log::info(&format!("adding {} site labels", settings.labels.len()));
        pod.metadata
            .labels
            .get_or_insert_default()
            .extend(settings.labels);
        pod.metadata
            .annotations
            .get_or_insert_default()
            .extend(settings.annotations);
        Ok(pod)
    }
}

slinky_guest_sdk::export_plugin!(SitePods, kinds = [nodeset_pod], settings = SiteSettings);
