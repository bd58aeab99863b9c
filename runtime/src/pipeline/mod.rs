//! Pipelines: several plugins building one kind, in order.
//!
//! A kind's pipeline starts with its *base* builder (the bundled one, or the plugins directory's
//! or a `--plugin` file's override) and goes on with the steps the cluster's `BuilderPlugin`
//! custom resources add for that kind, sorted by `spec.order` (then name), each only for the
//! parents its `spec.selector` matches. Every step receives its own settings and the previous
//! step's output (`build-context.previous`), and its output passes the output policy before the
//! next step sees it: a step that breaks the policy is named in the error. The final object
//! carries the pipeline's label and digest in the builder annotations (on the object, never on a
//! workload's pod template). The pipeline's digest (every step's module digest and settings) tells
//! the host when to build again; the pod revision is a hash of what is built, so changing a step
//! or its settings rolls exactly the pods it builds differently.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{
    api::core::v1::{Pod, Service},
    apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta},
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use slinky_api::{Accounting, Controller, LoginSet, NodeSet, RestApi, keys};

use crate::{
    AccountingInputs, BuildContext, Builder, Child, ControllerInputs, LoginSetInputs, Plugin, PluginError,
    PodIdentity,
};

mod vet;
pub use vet::vet_step;
use vet::{children_json, keeps_children};

/// One step a `BuilderPlugin` adds to the pipelines of the kinds it serves.
#[derive(Clone)]
pub struct Step {
    /// The `BuilderPlugin`'s name.
    pub name: String,
    /// Its loaded module.
    pub plugin: Plugin,
    /// Its settings (JSON text, validated by the plugin).
    pub settings: String,
    /// Its place in the pipeline (lower first).
    pub order: i32,
    /// The parents it applies to (by their labels); `None` for every parent.
    pub selector: Option<LabelSelector>,
    /// The namespaces of the parents it applies to; `None` for every namespace.
    pub namespaces: Option<Vec<String>>,
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Step")
            .field("name", &self.name)
            .field("plugin", &self.plugin.label())
            .field("order", &self.order)
            .finish_non_exhaustive()
    }
}

impl Step {
    /// Whether this step applies to the parent `meta` describes (its namespace and labels).
    pub fn applies_to(&self, meta: &ObjectMeta) -> bool {
        let in_scope = self.namespaces.as_ref().is_none_or(|list| {
            meta.namespace
                .as_deref()
                .is_some_and(|ns| list.iter().any(|n| n == ns))
        });
        in_scope
            && self.selector.as_ref().is_none_or(|s| {
                slinky_api::selectors::matches(s, meta.labels.as_ref().unwrap_or(&BTreeMap::new()))
            })
    }
}

/// The builders one parent's build goes through: the base plugin, then the steps that apply to
/// it. Cheap to clone.
#[derive(Clone)]
pub struct Pipeline {
    base: Plugin,
    steps: Arc<[Step]>,
    digest: String,
    label: String,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label)
    }
}

impl From<Plugin> for Pipeline {
    fn from(base: Plugin) -> Self {
        Pipeline {
            digest: base.digest().to_string(),
            label: base.label(),
            base,
            steps: Arc::from([]),
        }
    }
}

impl Pipeline {
    /// `base`, then `steps` in the order given.
    pub fn new(base: Plugin, steps: Vec<Step>) -> Self {
        if steps.is_empty() {
            return Pipeline::from(base);
        }
        let mut hash = Sha256::new();
        hash.update(base.digest());
        let mut label = base.label();
        for step in &steps {
            // The module and its settings, in pipeline order: what the output depends on (not the
            // BuilderPlugin's name: renaming one rolls nothing).
            for part in [step.plugin.digest(), &step.settings] {
                hash.update([0]);
                hash.update(part.as_bytes());
            }
            label.push_str(" > ");
            label.push_str(&step.plugin.label());
        }
        Pipeline {
            digest: format!("{:x}", hash.finalize()),
            label,
            base,
            steps: steps.into(),
        }
    }

    /// The base builder alone: its digest; with steps, the sha256 of the base's digest and every
    /// step's module digest and settings, in order (what the pod revision includes).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// `<base>@<version> > <step>@<version> > …`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The base builder.
    pub fn base(&self) -> &Plugin {
        &self.base
    }

    /// The steps after the base builder.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Run `call` on the base builder, then on each step with its settings and the output before
    /// it (`previous`), then stamp the final output with the pipeline's annotations.
    fn run<T>(
        &self,
        ctx: &BuildContext,
        call: impl Fn(&Plugin, &BuildContext) -> Result<T, PluginError>,
        previous: impl Fn(&T) -> Result<Vec<String>, serde_json::Error>,
        keeps: impl Fn(&T, &T) -> Result<(), String>,
        stamp: impl Fn(&mut T, &BTreeMap<String, String>),
    ) -> Result<T, PluginError> {
        let mut out = call(&self.base, ctx)?;
        if self.steps.is_empty() {
            return Ok(out);
        }
        for step in self.steps.iter() {
            let previous = previous(&out).map_err(|e| PluginError::Refused {
                plugin: step.plugin.label(),
                reason: format!("cannot serialize the previous step's output: {e}"),
            })?;
            let ctx = BuildContext {
                cluster_domain: ctx.cluster_domain.clone(),
                settings: step.settings.clone(),
                previous,
            };
            let next = call(&step.plugin, &ctx).map_err(|e| e.in_step(&step.name))?;
            keeps(&out, &next).map_err(|reason| {
                PluginError::Rejected {
                    plugin: step.plugin.label(),
                    call: "pipeline",
                    reason,
                }
                .in_step(&step.name)
            })?;
            out = next;
        }
        stamp(&mut out, &self.annotations());
        Ok(out)
    }

    /// The builder annotations of the pipeline's output.
    fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (keys::ANNOTATION_BUILDER.to_string(), self.label.clone()),
            (
                keys::ANNOTATION_BUILDER_DIGEST.to_string(),
                format!("sha256:{}", self.digest),
            ),
        ])
    }
}

/// Each build runs the base builder, then every step with its settings and the output before it,
/// each step's output checked by the output policy (and, for children, that it keeps every child
/// before it), then stamps the final output with the pipeline's builder annotations.
impl Builder for Pipeline {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn digest(&self) -> &str {
        &self.digest
    }

    /// Build the Controller's Service through the pipeline.
    ///
    /// # Errors
    /// The first step's error, naming the step.
    fn build_service(&self, ctx: &BuildContext, controller: &Controller) -> Result<Service, PluginError> {
        self.run(
            ctx,
            |p, ctx| p.build_service(ctx, controller),
            |s| Ok(vec![serde_json::to_string(s)?]),
            |_, _| Ok(()),
            |s, a| stamp_meta(&mut s.metadata, a),
        )
    }

    /// Build one pod of a NodeSet through the pipeline.
    ///
    /// # Errors
    /// The first step's error, naming the step.
    fn build_pod(
        &self,
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, PluginError> {
        self.run(
            ctx,
            |p, ctx| p.build_pod(ctx, nodeset, controller, identity),
            |pod| Ok(vec![serde_json::to_string(pod)?]),
            |_, _| Ok(()),
            |pod, a| stamp_meta(&mut pod.metadata, a),
        )
    }

    /// Build a Controller's children besides its Service through the pipeline.
    ///
    /// # Errors
    /// The first step's error, naming the step.
    fn build_controller_children(
        &self,
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, PluginError> {
        self.run(
            ctx,
            |p, ctx| p.build_controller_children(ctx, controller, inputs),
            children_json,
            keeps_children,
            stamp_children,
        )
    }

    /// Build a NodeSet's children besides its pods through the pipeline.
    ///
    /// # Errors
    /// The first step's error, naming the step.
    fn build_nodeset_children(
        &self,
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
    ) -> Result<Vec<Child>, PluginError> {
        self.run(
            ctx,
            |p, ctx| p.build_nodeset_children(ctx, nodeset, controller),
            children_json,
            keeps_children,
            stamp_children,
        )
    }

    /// Build a RestApi's children through the pipeline.
    ///
    /// # Errors
    /// The first step's error, naming the step.
    fn build_restapi_children(
        &self,
        ctx: &BuildContext,
        restapi: &RestApi,
        controller: &Controller,
    ) -> Result<Vec<Child>, PluginError> {
        self.run(
            ctx,
            |p, ctx| p.build_restapi_children(ctx, restapi, controller),
            children_json,
            keeps_children,
            stamp_children,
        )
    }

    /// Build a LoginSet's children through the pipeline.
    ///
    /// # Errors
    /// The first step's error, naming the step.
    fn build_loginset_children(
        &self,
        ctx: &BuildContext,
        loginset: &LoginSet,
        controller: &Controller,
        inputs: &LoginSetInputs,
    ) -> Result<Vec<Child>, PluginError> {
        self.run(
            ctx,
            |p, ctx| p.build_loginset_children(ctx, loginset, controller, inputs),
            children_json,
            keeps_children,
            stamp_children,
        )
    }

    /// Build an Accounting's children through the pipeline.
    ///
    /// # Errors
    /// The first step's error, naming the step.
    fn build_accounting_children(
        &self,
        ctx: &BuildContext,
        accounting: &Accounting,
        inputs: &AccountingInputs,
    ) -> Result<Vec<Child>, PluginError> {
        self.run(
            ctx,
            |p, ctx| p.build_accounting_children(ctx, accounting, inputs),
            children_json,
            keeps_children,
            stamp_children,
        )
    }
}

fn stamp_meta(meta: &mut ObjectMeta, annotations: &BTreeMap<String, String>) {
    meta.annotations
        .get_or_insert_default()
        .extend(annotations.clone());
}

/// The annotations on each child, not on its pod template (a pipeline that builds the same
/// template restarts no pod: what is built rolls pods, not who built it).
fn stamp_children(children: &mut Vec<Child>, annotations: &BTreeMap<String, String>) {
    for child in children {
        stamp_value(&mut child.object, "/metadata", annotations);
    }
}

fn stamp_value(object: &mut Value, at: &str, annotations: &BTreeMap<String, String>) {
    let Some(Value::Object(meta)) = object.pointer_mut(at) else {
        return;
    };
    let entry = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Value::Object(map) = entry {
        for (k, v) in annotations {
            map.insert(k.clone(), Value::String(v.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn children_are_stamped_but_not_their_templates() {
        let mut children = vec![Child {
            kind: crate::ChildKind::StatefulSet,
            ownership: crate::Ownership::Controlled,
            object: serde_json::json!({
                "metadata": {"name": "x", "annotations": {"keep": "1"}},
                "spec": {"template": {"metadata": {}}}
            }),
        }];
        let a = labels(&[(keys::ANNOTATION_BUILDER, "a@1 > b@2")]);
        stamp_children(&mut children, &a);
        let o = &children[0].object;
        assert_eq!(o["metadata"]["annotations"]["keep"], "1");
        assert_eq!(
            o["metadata"]["annotations"][keys::ANNOTATION_BUILDER],
            "a@1 > b@2"
        );
        assert_eq!(
            o["spec"]["template"]["metadata"].get("annotations"),
            None,
            "provenance is not a template change"
        );
    }
}
