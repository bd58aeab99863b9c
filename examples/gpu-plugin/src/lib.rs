//! An example `nodeset-pod` builder: Slinky's slurmd pod, plus GPUs for sites that run them.
//!
//! Its **settings** (a `BuilderPlugin`'s `spec.settings`) say what every pod it builds gets:
//!
//! | setting | effect |
//! |---|---|
//! | `gpusPerPod: N` | `nvidia.com/gpu: N` in the slurmd container's limits and requests, and a toleration of the `nvidia.com/gpu` taint |
//! | `sidecarImage: IMAGE` | a `gpu-monitor` sidecar container running IMAGE (with a `metrics` port 9400) |
//!
//! The plugin checks them before it serves (`validate-settings`): `gpusPerPod` at most 16, a
//! non-empty `sidecarImage`, no other keys. A NodeSet may override them for its own pods with two
//! annotations of its **pod template** (`spec.template.metadata.annotations`):
//! `gpu.example.com/count: "N"` and `gpu.example.com/sidecar-image: IMAGE`. Template annotations
//! are part of the pod revision, so changing them rolls the pods, as changing the settings does.
//!
//! In a pipeline it starts from the previous step's pod (`BuildContext::previous`); as the first
//! step, or loaded as a plain file, from Slinky's pod.

use std::collections::BTreeMap;

use slinky_guest_sdk::{
    BuildContext, BuildError, NodeSetPodBuilder, PodIdentity, Settings,
    api::{Controller, NodeSet},
    k8s_openapi::{
        api::core::v1::{Container, ContainerPort, Pod, Toleration},
        apimachinery::pkg::api::resource::Quantity,
    },
    slinky,
};

/// The annotation with the GPU count.
pub const GPU_COUNT: &str = "gpu.example.com/count";
/// The annotation with the sidecar image.
pub const SIDECAR_IMAGE: &str = "gpu.example.com/sidecar-image";
/// The extended resource and taint key of NVIDIA's device plugin.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// The most GPUs a pod may ask for.
pub const MAX_GPUS: u32 = 16;

/// The GPU builder.
pub struct GpuPods;

/// The plugin's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct GpuSettings {
    /// GPUs per pod (0: none).
    pub gpus_per_pod: u32,
    /// The monitoring sidecar's image (none without).
    pub sidecar_image: Option<String>,
}

impl Settings for GpuSettings {
    fn validate(&self) -> Result<(), String> {
        if self.gpus_per_pod > MAX_GPUS {
            return Err(format!(
                "gpusPerPod is {}: a node has at most {MAX_GPUS} GPUs; give 0 to {MAX_GPUS}",
                self.gpus_per_pod
            ));
        }
        if self.sidecar_image.as_deref().is_some_and(|i| i.trim().is_empty()) {
            return Err("sidecarImage is empty: give an image, or leave sidecarImage out".into());
        }
        Ok(())
    }
}

/// The GPU count for `nodeset`: its template's annotation, else the settings'.
fn gpu_count(nodeset: &NodeSet, settings: &GpuSettings) -> Result<u32, BuildError> {
    let Some(text) = nodeset.spec.template.metadata.annotations.get(GPU_COUNT) else {
        return Ok(settings.gpus_per_pod);
    };
    text.trim().parse().map_err(|_| {
        BuildError::invalid(format!(
            "spec.template.metadata.annotations[{GPU_COUNT}] is {text:?}: give a whole number of GPUs \
             per pod, like \"2\""
        ))
    })
}

impl NodeSetPodBuilder for GpuPods {
    fn build_pod(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, BuildError> {
        let settings: GpuSettings = ctx.settings()?;
        let mut pod = match ctx.previous::<Pod>()? {
            Some(pod) => pod,
            None => slinky::build_nodeset_pod(ctx, nodeset, controller, identity)?,
        };
        let gpus = gpu_count(nodeset, &settings)?;
        let sidecar = nodeset
            .spec
            .template
            .metadata
            .annotations
            .get(SIDECAR_IMAGE)
            .or(settings.sidecar_image.as_ref());
        let spec = pod
            .spec
            .as_mut()
            .ok_or_else(|| BuildError::Internal("Slinky's builder made a pod without a spec".into()))?;
        if gpus > 0 {
            let slurmd = spec
                .containers
                .iter_mut()
                .find(|c| c.name == "slurmd")
                .ok_or_else(|| BuildError::Internal("Slinky's builder made a pod without slurmd".into()))?;
            let resources = slurmd.resources.get_or_insert_default();
            for list in [&mut resources.limits, &mut resources.requests] {
                list.get_or_insert_default()
                    .insert(GPU_RESOURCE.into(), Quantity(gpus.to_string()));
            }
            spec.tolerations.get_or_insert_default().push(Toleration {
                key: Some(GPU_RESOURCE.into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Toleration::default()
            });
        }
        if let Some(image) = sidecar {
            if image.trim().is_empty() {
                return Err(BuildError::invalid(format!(
                    "spec.template.metadata.annotations[{SIDECAR_IMAGE}] is empty: give an image or \
                     remove the annotation"
                )));
            }
            spec.containers.push(Container {
                name: "gpu-monitor".into(),
                image: Some(image.clone()),
                ports: Some(vec![ContainerPort {
                    name: Some("metrics".into()),
                    container_port: 9400,
                    ..ContainerPort::default()
                }]),
                ..Container::default()
            });
        }
        Ok(pod)
    }
}

slinky_guest_sdk::export_plugin!(GpuPods, kinds = [nodeset_pod], settings = GpuSettings);

/// The annotations this builder reads, for documentation and tests.
pub fn annotations(gpus: u32, sidecar: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (GPU_COUNT.to_string(), gpus.to_string()),
        (SIDECAR_IMAGE.to_string(), sidecar.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    fn example(annotations: BTreeMap<String, String>) -> Result<(NodeSet, Controller), BuildError> {
        let mut nodeset = testing::example_nodeset()?;
        nodeset.spec.template.metadata.annotations.extend(annotations);
        Ok((nodeset, testing::example_controller()?))
    }

    #[test]
    fn without_annotations_it_builds_slinkys_pod() -> Result<(), BuildError> {
        let (nodeset, controller) = example(BTreeMap::new())?;
        let ours = testing::call_pod::<GpuPods>(&nodeset, &controller, 1)?;
        let slinkys = slinky::build_nodeset_pod(
            &BuildContext::default(),
            &nodeset,
            &controller,
            &PodIdentity::for_ordinal(&nodeset, 1, "test"),
        )?;
        assert_eq!(ours, slinkys);
        Ok(())
    }

    #[test]
    fn adds_gpus_a_toleration_and_the_sidecar() -> Result<(), BuildError> {
        let (nodeset, controller) = example(annotations(2, "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9"))?;
        let pod = testing::call_pod::<GpuPods>(&nodeset, &controller, 0)?;
        let spec = pod.spec.ok_or(BuildError::invalid("no spec"))?;
        let slurmd = &spec.containers[0];
        assert_eq!(slurmd.name, "slurmd");
        let resources = slurmd.resources.clone().unwrap_or_default();
        assert_eq!(
            resources.limits.unwrap_or_default().get(GPU_RESOURCE),
            Some(&Quantity("2".into()))
        );
        assert_eq!(
            resources.requests.unwrap_or_default().get(GPU_RESOURCE),
            Some(&Quantity("2".into()))
        );
        let tolerations = spec.tolerations.unwrap_or_default();
        assert!(
            tolerations
                .iter()
                .any(|t| t.key.as_deref() == Some(GPU_RESOURCE) && t.effect.as_deref() == Some("NoSchedule"))
        );
        let sidecar = spec.containers.iter().find(|c| c.name == "gpu-monitor");
        assert_eq!(
            sidecar.and_then(|c| c.image.as_deref()),
            Some("nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9")
        );
        Ok(())
    }

    #[test]
    fn settings_are_validated_and_give_every_pod_its_gpus() -> Result<(), BuildError> {
        assert!(slinky_guest_sdk::validate_settings::<GpuSettings>(r#"{"gpusPerPod": 4}"#).is_ok());
        let too_many = slinky_guest_sdk::validate_settings::<GpuSettings>(r#"{"gpusPerPod": 99}"#);
        assert!(
            too_many.as_ref().is_err_and(|e| e.contains("gpusPerPod is 99")),
            "{too_many:?}"
        );
        let unknown = slinky_guest_sdk::validate_settings::<GpuSettings>(r#"{"gpus": 1}"#);
        assert!(
            unknown
                .as_ref()
                .is_err_and(|e| e.contains("unknown field `gpus`")),
            "{unknown:?}"
        );
        let (nodeset, controller) = example(BTreeMap::new())?;
        // As a BuilderPlugin step with `settings: {gpusPerPod: 3}`, the first of its pipeline.
        let ctx = testing::step_context(&serde_json::json!({"gpusPerPod": 3}), [] as [Pod; 0])?;
        let pod = testing::call_pod_with::<GpuPods>(&ctx, &nodeset, &controller, 0)?;
        let limits = pod
            .spec
            .and_then(|s| s.containers[0].resources.clone())
            .and_then(|r| r.limits);
        assert_eq!(
            limits.unwrap_or_default().get(GPU_RESOURCE),
            Some(&Quantity("3".into()))
        );
        Ok(())
    }

    #[test]
    fn a_later_step_starts_from_the_previous_pod() -> Result<(), BuildError> {
        let (nodeset, controller) = example(BTreeMap::new())?;
        let mut previous = testing::call_pod::<GpuPods>(&nodeset, &controller, 0)?;
        previous
            .metadata
            .labels
            .get_or_insert_default()
            .insert("from".into(), "before".into());
        // As a later step: the pod the step before it built comes along.
        let ctx = testing::step_context(&serde_json::json!({"gpusPerPod": 1}), [&previous])?;
        let pod = testing::call_pod_with::<GpuPods>(&ctx, &nodeset, &controller, 0)?;
        assert_eq!(
            pod.metadata
                .labels
                .unwrap_or_default()
                .get("from")
                .map(String::as_str),
            Some("before")
        );
        Ok(())
    }

    #[test]
    fn a_bad_count_names_the_annotation_and_the_fix() -> Result<(), BuildError> {
        let mut a = annotations(0, "x");
        a.insert(GPU_COUNT.into(), "two".into());
        let (nodeset, controller) = example(a)?;
        let err = testing::call_pod::<GpuPods>(&nodeset, &controller, 0).err();
        let msg = format!("{err:?}");
        assert!(msg.contains(GPU_COUNT) && msg.contains("whole number"), "{msg}");
        Ok(())
    }
}
