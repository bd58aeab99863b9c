//! Partial core types, like Slinky's `ContainerWrapper`/`PodSpecWrapper`/`ServiceSpecWrapper`:
//! any subset of the core type's fields is accepted and kept as JSON, and converted to the typed
//! k8s-openapi value when a builder needs it.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{Container, PodSpec, ServiceSpec};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// A wrapper's JSON is not a valid value of the core type it stands for.
#[derive(Debug)]
pub struct WrapperError {
    /// Which wrapper (`container`, `pod spec`, `service spec`).
    pub what: &'static str,
    /// The deserialization error, with its path inside the value.
    pub source: serde_json::Error,
}

impl std::fmt::Display for WrapperError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid {}: {}", self.what, self.source)
    }
}

impl std::error::Error for WrapperError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Schema of an object whose fields are passed through unchecked.
pub(crate) fn preserve_unknown(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true })
}

/// Schema of a list of pass-through objects.
pub(crate) fn preserve_unknown_list(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
    })
}

fn typed<T: DeserializeOwned>(
    what: &'static str,
    value: &serde_json::Value,
    fill: &[(&str, serde_json::Value)],
) -> Result<T, WrapperError> {
    let mut value = match value {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        other => other.clone(),
    };
    if let serde_json::Value::Object(map) = &mut value {
        for (key, default) in fill {
            map.entry(key.to_string()).or_insert_with(|| default.clone());
        }
    }
    serde_json::from_value(value).map_err(|source| WrapperError { what, source })
}

macro_rules! wrapper {
    ($(#[$doc:meta])* $name:ident, $schema_name:literal) => {
        $(#[$doc])*
        #[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
        #[serde(transparent)]
        pub struct $name(pub serde_json::Value);

        impl $name {
            /// True when nothing was given.
            pub fn is_empty(&self) -> bool {
                match &self.0 {
                    serde_json::Value::Null => true,
                    serde_json::Value::Object(map) => map.is_empty(),
                    _ => false,
                }
            }

            /// A top-level string field, if present.
            pub fn str_field(&self, key: &str) -> Option<&str> {
                self.0.get(key).and_then(serde_json::Value::as_str)
            }
        }

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                $schema_name.into()
            }
            fn json_schema(generator: &mut SchemaGenerator) -> Schema {
                preserve_unknown(generator)
            }
        }
    };
}

wrapper!(
    /// A partial `Container`: every field optional, including `name`.
    ContainerWrapper,
    "ContainerWrapper"
);
wrapper!(
    /// A partial `PodSpec`: every field optional, including `containers`.
    PodSpecWrapper,
    "PodSpecWrapper"
);
wrapper!(
    /// A partial `ServiceSpec`.
    ServiceSpecWrapper,
    "ServiceSpecWrapper"
);

impl ContainerWrapper {
    /// The typed container, named `default_name` unless the wrapper names it.
    ///
    /// # Errors
    /// When a field has the wrong type (the error names the field).
    pub fn to_container(&self, default_name: &str) -> Result<Container, WrapperError> {
        typed("container", &self.0, &[("name", default_name.into())])
    }

    /// The image, if set.
    pub fn image(&self) -> Option<&str> {
        self.str_field("image")
    }
}

impl PodSpecWrapper {
    /// The typed pod spec (`containers` defaults to empty).
    ///
    /// # Errors
    /// When a field has the wrong type (the error names the field).
    pub fn to_pod_spec(&self) -> Result<PodSpec, WrapperError> {
        typed("pod spec", &self.0, &[("containers", serde_json::json!([]))])
    }

    /// `hostname`, if set.
    pub fn hostname(&self) -> Option<&str> {
        self.str_field("hostname")
    }
}

impl ServiceSpecWrapper {
    /// The typed service spec.
    ///
    /// # Errors
    /// When a field has the wrong type (the error names the field).
    pub fn to_service_spec(&self) -> Result<ServiceSpec, WrapperError> {
        typed("service spec", &self.0, &[])
    }
}
