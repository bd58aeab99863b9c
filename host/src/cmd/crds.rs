//! The CustomResourceDefinitions of the Slinky kinds, generated from the shared API types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use slinky_api::{Accounting, BuilderPlugin, Controller, LoginSet, NodeSet, RestApi, Token};

/// The CRDs, in install order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        Controller::crd(),
        NodeSet::crd(),
        RestApi::crd(),
        LoginSet::crd(),
        Accounting::crd(),
        Token::crd(),
        {
            let mut crd = BuilderPlugin::crd();
            slinky_api::builder_plugin_rules(&mut crd);
            crd
        },
    ]
}

/// The CRDs as multi-document YAML.
///
/// # Errors
/// A serializer failure.
pub fn crds_yaml() -> Result<String, serde_saphyr::SerializeError> {
    let docs = crds()
        .iter()
        .map(serde_saphyr::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(docs.join("---\n"))
}
