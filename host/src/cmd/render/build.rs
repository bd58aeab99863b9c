//! Building every child of the parents read from files, through exactly the pipelines the
//! reconcilers use.

use std::collections::BTreeSet;

use kube::ResourceExt;
use slinky_api::{Accounting, Controller, LoginSet, NodeSet, RestApi, checks};

use super::{Child, Manifest, Parent, References, RenderError, controllers, key};
use crate::{
    plugins::{BuildContext, Builder as _, BuilderKind, Ownership, PluginError, PluginRegistry, PodIdentity},
    revision::pod_revision,
};

/// Build every child of the parents, in a stable order: for each Controller (in input order) its
/// children by kind (ConfigMaps, Services, StatefulSet) and name; for each NodeSet its children
/// other than pods (the workers' Service and PodDisruptionBudget once per Controller and
/// namespace, owned by every NodeSet of the input sharing them), then its pods for ordinals
/// `0..replicas` (in DaemonSet mode, with the live pods read: for those pods). An external Controller has only its minimal ConfigMap.
///
/// # Errors
/// The first parent whose Controller is missing or whose builder fails.
pub fn render_with(
    manifests: &[Manifest],
    references: &References,
    plugins: &PluginRegistry,
    ctx: &BuildContext,
) -> Result<Vec<Child>, RenderError> {
    let mut r = Renderer {
        manifests,
        references,
        plugins,
        ctx,
        controllers: controllers(manifests),
        shared_done: BTreeSet::new(),
        children: Vec::new(),
    };
    for m in manifests {
        match &m.parent {
            Parent::Controller(c) => r.controller(m, c)?,
            Parent::NodeSet(n) => r.nodeset(m, n)?,
            Parent::RestApi(a) => r.restapi(m, a)?,
            Parent::LoginSet(l) => r.loginset(m, l)?,
            Parent::Accounting(a) => r.accounting(m, a)?,
        }
    }
    Ok(r.children)
}

/// One render: the inputs, and the children built so far.
struct Renderer<'a> {
    manifests: &'a [Manifest],
    references: &'a References,
    plugins: &'a PluginRegistry,
    ctx: &'a BuildContext,
    controllers: Vec<&'a Controller>,
    /// The shared children (the workers' Service and PDB) already built, per namespace.
    shared_done: BTreeSet<(crate::plugins::ChildKind, String, String)>,
    children: Vec<Child>,
}

/// `Kind ns/name` of a parent.
fn object_of(kind: &str, obj: &impl ResourceExt) -> String {
    format!(
        "{kind} {}",
        key(&obj.namespace().unwrap_or_default(), &obj.name_any())
    )
}

/// What the host would refuse with an `InvalidSpec` condition, render refuses too.
fn refuse_invalid(
    m: &Manifest,
    kind: &str,
    name: &str,
    problems: &[checks::SpecProblem],
) -> Result<(), RenderError> {
    match checks::summary(problems) {
        Some(problem) => Err(RenderError::Invalid {
            at: m.at.clone(),
            reason: format!("{kind} {name}: {problem}"),
        }),
        None => Ok(()),
    }
}

impl<'a> Renderer<'a> {
    /// A build error of `object` of the manifest `m`.
    fn failed(m: &Manifest, object: &str) -> impl FnOnce(PluginError) -> RenderError {
        let (at, object) = (m.at.clone(), object.to_string());
        move |source| RenderError::Build {
            at,
            object,
            source: Box::new(source),
        }
    }

    /// The Controller `ns/name` of the input, referenced by `object`.
    fn controller_of(
        &self,
        m: &Manifest,
        ns: &str,
        name: &str,
        object: &str,
    ) -> Result<&'a Controller, RenderError> {
        self.controllers
            .iter()
            .find(|c| c.namespace().as_deref() == Some(ns) && c.name_any() == name)
            .copied()
            .ok_or_else(|| RenderError::MissingController {
                at: m.at.clone(),
                nodeset: object.to_string(),
                controller: key(ns, name),
            })
    }

    /// `built`, in kind and name order.
    fn push(&mut self, mut built: Vec<crate::plugins::Child>) {
        built.sort_by(|a, b| (a.kind, a.name()).cmp(&(b.kind, b.name())));
        self.children
            .extend(built.into_iter().map(|o| Child::Object(Box::new(o))));
    }

    fn controller(&mut self, m: &Manifest, c: &Controller) -> Result<(), RenderError> {
        let object = object_of("Controller", c);
        refuse_invalid(m, "Controller", &c.name_any(), &c.spec_problems())?;
        let mut built = Vec::new();
        if c.spec.external {
            tracing::info!(controller = %c.name_any(), "external Controller: no Service, StatefulSet or internal Service to build");
        } else {
            let svc = self
                .plugins
                .pipeline(BuilderKind::ControllerService, &c.metadata)
                .build_service(self.ctx, c)
                .map_err(Self::failed(m, &object))?;
            built.push(crate::plugins::Child {
                kind: crate::plugins::ChildKind::Service,
                ownership: Ownership::Controlled,
                object: serde_json::to_value(&svc).unwrap_or_default(),
            });
        }
        let inputs = self.references.inputs(c, self.manifests);
        built.extend(
            self.plugins
                .pipeline(BuilderKind::ControllerChildren, &c.metadata)
                .build_controller_children(self.ctx, c, &inputs)
                .map_err(Self::failed(m, &object))?,
        );
        self.push(built);
        Ok(())
    }

    fn nodeset(&mut self, m: &Manifest, n: &NodeSet) -> Result<(), RenderError> {
        let ns = n.namespace().unwrap_or_default();
        let object = object_of("NodeSet", n);
        let controller =
            self.controller_of(m, n.controller_namespace(), &n.spec.controller_ref.name, &object)?;
        refuse_invalid(m, "NodeSet", &n.name_any(), &n.spec_problems())?;
        let mut built = self
            .plugins
            .pipeline(BuilderKind::NodesetChildren, &n.metadata)
            .build_nodeset_children(self.ctx, n, controller)
            .map_err(Self::failed(m, &object))?;
        let sharing: Vec<&NodeSet> = self
            .manifests
            .iter()
            .filter_map(|m| m.parent.as_nodeset())
            .filter(|o| o.shares_workers_with(n))
            .collect();
        let owners = slinky_api::owners::shared_refs(sharing);
        let shared_done = &mut self.shared_done;
        built.retain(|c| {
            c.ownership == Ownership::Controlled
                || shared_done.insert((c.kind, ns.clone(), c.name().to_string()))
        });
        for c in built.iter_mut().filter(|c| c.ownership == Ownership::Shared) {
            c.set_owners(owners.clone());
        }
        self.push(built);
        let plugin = self.plugins.pipeline(BuilderKind::NodesetPod, &n.metadata);
        let revision = pod_revision(&plugin, n, controller, self.ctx).map_err(Self::failed(m, &object))?;
        for (identity, node) in self.pod_identities(n, &revision) {
            let mut pod = plugin
                .build_pod(self.ctx, n, controller, &identity)
                .map_err(Self::failed(m, &object))?;
            if let Some(node) = node {
                slinky_api::placement::pin_to_node(pod.spec.get_or_insert_default(), &node);
            }
            self.children.push(Child::Pod(Box::new(pod)));
        }
        Ok(())
    }

    /// The pods to build for `n`: its ordinals `0..replicas`; in DaemonSet mode, when the live
    /// pods were read, each of its live pods, by its name and hostname, bound to its node (as the
    /// host compares them).
    fn pod_identities(&self, n: &NodeSet, revision: &str) -> Vec<(PodIdentity, Option<String>)> {
        match (&self.references.daemon_pods, n.is_daemon()) {
            (Some(pods), true) => pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| {
                    p.owner_references()
                        .iter()
                        .any(|o| Some(&o.uid) == n.metadata.uid.as_ref())
                })
                .filter_map(|p| {
                    let id = PodIdentity::of_pod(n, p, revision)?;
                    Some((id, slinky_api::placement::target_node(p)))
                })
                .collect(),
            _ => (0..u32::try_from(n.replicas()).unwrap_or(0))
                .map(|o| (PodIdentity::for_ordinal(n, o, revision), None))
                .collect(),
        }
    }

    fn restapi(&mut self, m: &Manifest, r: &RestApi) -> Result<(), RenderError> {
        let ns = r.namespace().unwrap_or_default();
        let object = object_of("RestApi", r);
        refuse_invalid(m, "RestApi", &r.name_any(), &r.spec_problems())?;
        let controller = self.controller_of(m, &ns, &r.spec.controller_ref.name, &object)?;
        let built = self
            .plugins
            .pipeline(BuilderKind::RestapiChildren, &r.metadata)
            .build_restapi_children(self.ctx, r, controller)
            .map_err(Self::failed(m, &object))?;
        self.push(built);
        Ok(())
    }

    fn loginset(&mut self, m: &Manifest, l: &LoginSet) -> Result<(), RenderError> {
        let ns = l.namespace().unwrap_or_default();
        let object = object_of("LoginSet", l);
        refuse_invalid(m, "LoginSet", &l.name_any(), &l.spec_problems())?;
        let controller = self.controller_of(m, &ns, &l.spec.controller_ref.name, &object)?;
        let inputs = self.references.loginset_inputs(l);
        let built = self
            .plugins
            .pipeline(BuilderKind::LoginsetChildren, &l.metadata)
            .build_loginset_children(self.ctx, l, controller, &inputs)
            .map_err(Self::failed(m, &object))?;
        self.push(built);
        Ok(())
    }

    fn accounting(&mut self, m: &Manifest, a: &Accounting) -> Result<(), RenderError> {
        let object = object_of("Accounting", a);
        refuse_invalid(m, "Accounting", &a.name_any(), &a.spec_problems())?;
        let inputs = self.references.accounting_inputs(a);
        // The password placeholder stays: the host, not render, writes the value.
        let built = self
            .plugins
            .pipeline(BuilderKind::AccountingChildren, &a.metadata)
            .build_accounting_children(self.ctx, a, &inputs)
            .map_err(Self::failed(m, &object))?;
        self.push(built);
        Ok(())
    }
}
