//! Which contract version a component speaks, read from its exports before anything runs. The
//! contract's types (versions, builder kinds, what a plugin says about itself) are the API crate's
//! (`slinky_api::contract`), shared with the guest SDK.

use crate::{CONTRACT_VERSION, Contract, PACKAGE, SUPPORTED_CONTRACTS};

/// The contract version a component speaks, from its exports; refuse components that speak
/// another version or none, before anything runs.
pub(crate) fn check_contract(
    engine: &wasmtime::Engine,
    component: &wasmtime::component::Component,
) -> Result<Contract, String> {
    let exports: Vec<String> = component
        .component_type()
        .exports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let prefix = format!("{PACKAGE}/");
    if let Some(contract) = Contract::ALL
        .into_iter()
        .find(|c| exports.contains(&c.export_name("plugin")))
    {
        // One version per plugin: an interface of another version would never be called.
        let other: Vec<&String> = exports
            .iter()
            .filter(|e| e.starts_with(&prefix) && !e.ends_with(&format!("@{}", contract.as_str())))
            .collect();
        if !other.is_empty() {
            return Err(format!(
                "its describe() is contract {contract}'s but it also exports {}: a plugin speaks \
                 one contract version; rebuild it against slinky-guest-sdk {CONTRACT_VERSION}",
                other.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            ));
        }
        return Ok(contract);
    }
    let ours: Vec<&String> = exports.iter().filter(|e| e.starts_with(&prefix)).collect();
    let supported = SUPPORTED_CONTRACTS.join(" and ");
    if let Some(other) = ours.iter().find_map(|e| e.split_once('@').map(|(_, v)| v)) {
        return Err(format!(
            "it was built against contract version {other}, this host speaks {supported} \
             (it exports {}): rebuild it against slinky-guest-sdk {CONTRACT_VERSION}",
            ours.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    Err(format!(
        "it does not export `{}` (no describe()); it exports [{}]. Export your builder with \
         `slinky_guest_sdk::export_plugin!`",
        Contract::ALL[0].export_name("plugin"),
        exports.join(", ")
    ))
}

/// What a plugin of a contract without settings (before 0.3.0) accepts: no settings at all (an
/// empty object or `null`).
pub(crate) fn no_settings(contract: Contract, settings: &str) -> Result<(), String> {
    match serde_json::from_str::<serde_json::Value>(settings) {
        Ok(serde_json::Value::Null) => Ok(()),
        Ok(serde_json::Value::Object(m)) if m.is_empty() => Ok(()),
        _ => Err(format!(
            "it speaks contract {contract}, which has no settings, but was given {settings}: remove \
             spec.settings, or rebuild it against slinky-guest-sdk {CONTRACT_VERSION} with \
             `settings = …` in export_plugin!"
        )),
    }
}
