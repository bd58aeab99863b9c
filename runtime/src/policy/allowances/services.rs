//! What a Service is granted ([`ServiceGrants`]: `ClusterIP`, and for the Controller's Service
//! what its spec asks for) and the check of a Service's spec against it.

use k8s_openapi::api::core::v1::ServiceSpec;
use slinky_api::Controller;

use super::{Allow, Allowances, refused};

/// What the bundled builder makes a Service: `ClusterIP` (headless or not), and for the
/// Controller's Service what its `spec.service.spec` asks for.
#[derive(Debug, Default)]
pub(crate) struct ServiceGrants {
    type_: Option<String>,
    load_balancer_ip: Option<String>,
    /// Whose `spec.service.spec` asked for them (`Controller`, `RestApi`).
    whose: &'static str,
}

impl ServiceGrants {
    /// The Controller's Service (`<controller>-controller`): the type and `loadBalancerIP` of
    /// `spec.service.spec` (the bundled builder drops its `externalIPs`).
    pub(crate) fn of_controller_service(controller: &Controller) -> Self {
        Self::asked_by(&controller.spec.service, "Controller")
    }

    /// The Service a parent's `spec.service` customises (a RestApi's `<restapi>-restapi`): the
    /// type and `loadBalancerIP` of its `spec.service.spec`.
    pub(crate) fn asked_by(service: &slinky_api::ServiceSpec, whose: &'static str) -> Self {
        let asked = service.spec.to_service_spec().unwrap_or_default();
        ServiceGrants {
            type_: asked.type_,
            load_balancer_ip: asked.load_balancer_ip,
            whose,
        }
    }

    fn granted(&self) -> String {
        match &self.type_ {
            Some(t) => format!(
                "Slinky's builder makes this Service ClusterIP or, as the {}'s spec.service.spec asks, {t}",
                self.whose
            ),
            None => "Slinky's builders make ClusterIP Services".into(),
        }
    }
}

/// A Service's spec within `grants`, unless `allow`ed.
///
/// # Errors
/// The first field past its grant.
pub(crate) fn service_spec(
    spec: Option<&ServiceSpec>,
    grants: &ServiceGrants,
    allow: &Allowances,
) -> Result<(), String> {
    let Some(spec) = spec else { return Ok(()) };
    if allow.allows(Allow::ServiceExposure) {
        return Ok(());
    }
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    if type_ != "ClusterIP" && grants.type_.as_deref() != Some(type_) {
        return Err(refused(
            "spec.type",
            &format!("is {type_}"),
            &match type_ {
                "ExternalName" => "an ExternalName Service points its name at another host".to_string(),
                _ => format!("a {type_} Service is reachable from outside the cluster"),
            },
            &grants.granted(),
            Allow::ServiceExposure,
        ));
    }
    if let Some(ips) = spec.external_ips.as_ref().filter(|ips| !ips.is_empty()) {
        return Err(refused(
            "spec.externalIPs",
            &format!("is {ips:?}"),
            "the nodes would route traffic for these addresses to the Service's pods, away from \
             whoever owns them",
            "Slinky's builders set none",
            Allow::ServiceExposure,
        ));
    }
    if let Some(ip) = spec.load_balancer_ip.as_deref().filter(|ip| !ip.is_empty())
        && grants.load_balancer_ip.as_deref() != Some(ip)
    {
        return Err(refused(
            "spec.loadBalancerIP",
            &format!("is {ip:?}"),
            "it claims an address of the load balancer",
            "the Controller's spec.service.spec does not ask for it",
            Allow::ServiceExposure,
        ));
    }
    Ok(())
}
