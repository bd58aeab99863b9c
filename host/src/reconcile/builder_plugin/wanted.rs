//! What a BuilderPlugin's spec asks for, checked before anything is fetched.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::json;
use slinky_api::{BuilderPluginSpec, DEFAULT_ORDER, conditions::LOADED, failure::Failure};
use slinky_plugin_source::sha256;

use crate::plugins::BuilderKind;

/// What a spec asks for, checked: the kinds, the settings (JSON text), the order, the selector,
/// the namespaces.
pub(super) struct Wanted {
    pub(super) kinds: Vec<BuilderKind>,
    pub(super) settings: String,
    pub(super) order: i32,
    pub(super) selector: Option<LabelSelector>,
    pub(super) namespaces: Option<Vec<String>>,
}

pub(super) fn invalid(message: String) -> Failure {
    Failure::new(LOADED, "InvalidSpec", message)
}

impl Wanted {
    pub(super) fn of(spec: &BuilderPluginSpec) -> Result<Wanted, Failure> {
        let mut kinds = Vec::new();
        for (i, k) in spec.kinds.iter().enumerate() {
            let kind = k
                .parse::<BuilderKind>()
                .map_err(|e| invalid(format!("spec.kinds[{i}]: {e}")))?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        if kinds.is_empty() {
            return Err(invalid(
                "spec.kinds is empty: list the builder kinds it serves, like [nodeset-pod]".into(),
            ));
        }
        if let Some(selector) = &spec.selector {
            slinky_api::selectors::problem(selector).map_err(|e| invalid(format!("spec.selector.{e}")))?;
        }
        for (i, ns) in spec.namespaces.iter().flatten().enumerate() {
            if let Some(e) = slinky_api::validation::dns1123_label(ns).into_iter().next() {
                return Err(invalid(format!(
                    "spec.namespaces[{i}]: {ns:?} is not a namespace name: {e}"
                )));
            }
        }
        let order = match spec.order {
            None => DEFAULT_ORDER,
            Some(o) => i32::try_from(o).map_err(|_| {
                invalid(format!(
                    "spec.order: {o} is out of range: give an order from {} to {}",
                    slinky_api::ORDER_MIN,
                    slinky_api::ORDER_MAX
                ))
            })?,
        };
        let settings = match &spec.settings {
            None => slinky_api::contract::NO_SETTINGS.to_string(),
            // The value's own text: settings served before they were held as text keep their
            // fingerprint (and their pods their revision).
            Some(v) => v
                .checked()
                .and_then(|v| serde_json::to_string(&v).map_err(|e| e.to_string()))
                .map_err(|e| invalid(format!("spec.settings: {e}")))?,
        };
        Ok(Wanted {
            kinds,
            settings,
            order,
            selector: spec.selector.clone(),
            namespaces: spec.namespaces.clone(),
        })
    }

    /// What identifies this version with the module `module` (its digest, or an immutable
    /// reference).
    pub(super) fn fingerprint(&self, module: &str) -> String {
        let mut parts = json!([
            module,
            self.settings,
            self.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
            self.order,
            self.selector,
        ]);
        // Only when set: the fingerprints of versions from before the field stay what they were.
        if let (Some(namespaces), Some(list)) = (&self.namespaces, parts.as_array_mut()) {
            list.push(json!(namespaces));
        }
        sha256(serde_json::to_string(&parts).unwrap_or_default().as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use slinky_api::BuilderPluginSpec;

    use super::*;

    /// An order the API server let through before the CRD bounded it (it does not enforce
    /// `int32` on custom resources) decodes, and refuses this BuilderPlugin alone.
    #[test]
    fn an_order_out_of_range_refuses_only_its_builder_plugin() -> Result<(), serde_json::Error> {
        let spec: BuilderPluginSpec = serde_json::from_value(json!({
            "module": {"image": "registry.example/p@sha256:00"}, "kinds": ["nodeset-pod"],
            "order": 2_147_483_648_i64
        }))?;
        let failure = Wanted::of(&spec).err();
        assert!(
            failure
                .as_ref()
                .is_some_and(|f| f.reason == "InvalidSpec"
                    && f.message.contains("spec.order: 2147483648 is out of range")),
            "{failure:?}"
        );
        let fine: BuilderPluginSpec =
            serde_json::from_value(json!({"module": {}, "kinds": ["nodeset-pod"], "order": -7}))?;
        assert!(Wanted::of(&fine).is_ok_and(|w| w.order == -7));
        Ok(())
    }

    /// Namespaces must be namespace names; they scope the step and change its fingerprint only
    /// when set (a version from before the field keeps its fingerprint).
    #[test]
    fn namespaces_are_checked_and_fingerprinted_only_when_set() -> Result<(), serde_json::Error> {
        let spec = |extra: serde_json::Value| -> Result<BuilderPluginSpec, serde_json::Error> {
            let mut v = json!({"module": {}, "kinds": ["nodeset-pod"]});
            if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
                o.extend(e.clone());
            }
            serde_json::from_value(v)
        };
        let bad = Wanted::of(&spec(json!({"namespaces": ["Tenant_A"]}))?).err();
        assert!(
            bad.as_ref()
                .is_some_and(|f| f.reason == "InvalidSpec" && f.message.contains("spec.namespaces[0]")),
            "{bad:?}"
        );
        let plain = Wanted::of(&spec(json!({}))?).map(|w| w.fingerprint("m")).ok();
        let empty = Wanted::of(&spec(json!({"namespaces": null}))?)
            .map(|w| w.fingerprint("m"))
            .ok();
        let scoped = Wanted::of(&spec(json!({"namespaces": ["tenant-a"]}))?)
            .map(|w| w.fingerprint("m"))
            .ok();
        assert!(plain.is_some() && plain == empty && plain != scoped);
        Ok(())
    }
}
