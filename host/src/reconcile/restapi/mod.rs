//! The RestApi: slurmrestd's Deployment and Service (`restapi-children` builder), through the
//! generic component pass ([`crate::reconcile::component`]). The Controller's slurmrestd client
//! talks to the oldest RestApi's Service ([`crate::reconcile::slurm`]).
//!
//! # Guarantees
//! * The builder gets copies of the RestApi and its Controller, never a Secret (the pods mount
//!   the Controller's key by reference).
//! * A missing Controller is a `ControllerNotFound` condition and an Event; the existing children
//!   stay (slurmrestd keeps serving what it served) until the Controller is back.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{ResourceExt, runtime::reflector::ObjectRef};
use slinky_api::{Controller, RestApi, RestApiStatus, checks, failure::Failure};

use super::{
    component::{Component, ComponentContext, controller_of},
    core::{Error, apply::ChildSync, caches::Caches},
};
use crate::plugins::{BuildContext, Builder as _, BuilderKind, Child, ChildKind, Pipeline, PluginError};

impl Component for RestApi {
    const BUILDER: BuilderKind = BuilderKind::RestapiChildren;
    const CHILD_KINDS: &'static [ChildKind] = &[ChildKind::Deployment, ChildKind::Service];
    type Inputs = Arc<Controller>;

    fn spec_problem(&self) -> Option<String> {
        checks::summary(&self.spec_problems())
    }

    async fn inputs(
        &self,
        ctx: &ComponentContext,
        _: &mut ChildSync<'_, Self>,
    ) -> Result<Result<Arc<Controller>, Option<Failure>>, Error> {
        let ns = self.namespace().unwrap_or_default();
        Ok(controller_of(
            &ctx.caches,
            &ns,
            &self.spec.controller_ref.name,
            "slurmrestd's Deployment and Service",
        )
        .map_err(Some))
    }

    fn build(
        &self,
        builder: &Pipeline,
        ctx: &BuildContext,
        controller: &Arc<Controller>,
    ) -> Result<Vec<Child>, PluginError> {
        builder.build_restapi_children(ctx, self, controller)
    }

    fn readiness(&self, caches: &Caches) -> Option<String> {
        let key = ObjectRef::new(&self.restapi_key()).within(&self.namespace().unwrap_or_default());
        let d = caches.children.deployments.get(&key)?;
        let ready = d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
        Some(format!("slurmrestd {ready}/{} ready", self.replicas()))
    }

    fn status_after(&self, _: &Self, conditions: Vec<Condition>, _: &Caches) -> RestApiStatus {
        RestApiStatus {
            observed_generation: self.metadata.generation,
            conditions,
        }
    }
}
