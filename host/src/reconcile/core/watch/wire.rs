//! The BuilderPlugin watch's wire type: each BuilderPlugin decoded on its own, so that one the
//! host cannot decode is refused by itself (an `InvalidSpec` condition and Event) instead of
//! failing the list, and with it every BuilderPlugin's loading and the host's start.
//!
//! A list decodes all or nothing, and the host's JSON decoder stops at 128 levels while
//! kube-apiserver stores objects nested far deeper (`spec.settings` a hundred levels deep, and
//! the managedFields that mirror it). So the metadata is read without its managedFields (serde
//! skips them without looking in), and `spec` and `status` are kept as text while the list
//! decodes, then decoded each on its own.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::value::RawValue;
use slinky_api::{BuilderPlugin, BuilderPluginSpec, BuilderPluginStatus};

use super::slim::Meta;

/// The annotation the watch puts on a BuilderPlugin whose `spec` it cannot decode, saying why
/// (in the cache only: never written to the API server). Such a BuilderPlugin is refused.
pub const UNDECODABLE: &str = "plugins.slinky.slurm.net/undecodable";

/// A BuilderPlugin as the watch decodes it (see the module).
#[derive(Clone, Debug, Default)]
pub struct WireBuilderPlugin(pub BuilderPlugin);

impl From<WireBuilderPlugin> for BuilderPlugin {
    fn from(w: WireBuilderPlugin) -> Self {
        w.0
    }
}

impl serde::Serialize for WireBuilderPlugin {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

impl kube::Resource for WireBuilderPlugin {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
        BuilderPlugin::kind(dt)
    }

    fn group(dt: &()) -> std::borrow::Cow<'_, str> {
        BuilderPlugin::group(dt)
    }

    fn version(dt: &()) -> std::borrow::Cow<'_, str> {
        BuilderPlugin::version(dt)
    }

    fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
        BuilderPlugin::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.0.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.0.metadata
    }
}

#[derive(Deserialize)]
struct Wire {
    metadata: Option<Meta>,
    spec: Option<Box<RawValue>>,
    status: Option<Box<RawValue>>,
}

impl<'de> Deserialize<'de> for WireBuilderPlugin {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = Wire::deserialize(d)?;
        let mut metadata = w
            .metadata
            .map_or_else(ObjectMeta::default, Meta::into_object_meta);
        let spec = match w.spec {
            Some(raw) => serde_json::from_str::<BuilderPluginSpec>(raw.get()).map_err(|e| e.to_string()),
            None => Err("it has none".to_string()),
        };
        let spec = spec.unwrap_or_else(|why| {
            metadata
                .annotations
                .get_or_insert_default()
                .insert(UNDECODABLE.into(), format!("spec cannot be decoded: {why}"));
            BuilderPluginSpec::default()
        });
        // The status is a hint (what served, for a restore): one that cannot be decoded is
        // dropped, and the next status write replaces it.
        let status = w.status.and_then(|raw| {
            serde_json::from_str::<BuilderPluginStatus>(raw.get())
                .inspect_err(|error| {
                    tracing::warn!(builder_plugin = ?metadata.name, %error, "the BuilderPlugin's status cannot be decoded; ignored");
                })
                .ok()
        });
        Ok(WireBuilderPlugin(BuilderPlugin {
            metadata,
            spec,
            status,
        }))
    }
}

#[cfg(test)]
mod tests {
    use kube::ResourceExt;

    use super::*;

    #[derive(Deserialize)]
    struct List {
        items: Vec<WireBuilderPlugin>,
    }

    #[test]
    fn a_builder_plugin_nested_deeper_than_the_decoder_goes_is_refused_alone() -> anyhow::Result<()> {
        let deep = |n: usize| format!("{}1{}", "{\"f:a\":".repeat(n), "}".repeat(n));
        // Settings (and the managedFields mirroring them) 150 levels deep, and a spec of the
        // wrong shape: the list decodes, and each is what it can be.
        let list = format!(
            r#"{{"items":[
              {{"metadata":{{"name":"deep","managedFields":[{{"fieldsV1":{{"f:spec":{deep}}}}}]}},
                "spec":{{"module":{{}},"kinds":["nodeset-pod"],"settings":{deep}}},
                "status":{{"phase":"Loaded","serving":{{"digest":"sha256:1","spec":{{"module":{{}},"kinds":[],"settings":{deep}}}}}}}}},
              {{"metadata":{{"name":"wrong"}},"spec":{{"module":{{}},"kinds":"nodeset-pod"}},"status":{{"phase":7}}}},
              {{"metadata":{{"name":"fine","annotations":{{"a":"b"}}}},"spec":{{"module":{{}},"kinds":["nodeset-pod"],"order":2147483648}}}}
            ]}}"#,
            deep = deep(150)
        );
        let list: List = serde_json::from_str(&list)?;
        let [deep, wrong, fine] = [&list.items[0].0, &list.items[1].0, &list.items[2].0];
        assert_eq!(deep.name_any(), "deep");
        assert!(
            deep.annotations().get(UNDECODABLE).is_none(),
            "{:?}",
            deep.annotations()
        );
        let settings = deep.spec.settings.as_ref().map(|s| s.checked());
        assert!(
            matches!(&settings, Some(Err(e)) if e.contains("nested 150 levels deep")),
            "{settings:?}"
        );
        assert_eq!(
            deep.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Loaded")
        );
        let why = wrong.annotations().get(UNDECODABLE).cloned().unwrap_or_default();
        assert!(
            why.starts_with("spec cannot be decoded: invalid type: string"),
            "{why}"
        );
        assert!(wrong.status.is_none(), "a status of the wrong shape is dropped");
        assert_eq!(fine.spec.order, Some(2_147_483_648));
        assert_eq!(fine.annotations().get("a").map(String::as_str), Some("b"));
        Ok(())
    }
}
