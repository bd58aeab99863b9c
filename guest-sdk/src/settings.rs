//! Plugin settings: what a cluster admin gives a plugin in its `BuilderPlugin`'s `spec.settings`.
//!
//! Declare a type for them and name it in [`crate::export_plugin!`] (`settings = MySettings`):
//! the host asks the plugin to check its settings before it serves with them
//! (`validate-settings`, at load and on every change), and refuses the plugin's new version with
//! the message [`Settings::validate`] returns, while the version serving before keeps serving.
//! A build reads them with [`crate::BuildContext::settings`].
//!
//! ```
//! use slinky_guest_sdk::Settings;
//!
//! #[derive(serde::Deserialize, Default)]
//! #[serde(default, deny_unknown_fields, rename_all = "camelCase")]
//! struct GpuSettings {
//!     gpus_per_pod: u32,
//! }
//!
//! impl Settings for GpuSettings {
//!     fn validate(&self) -> Result<(), String> {
//!         if self.gpus_per_pod > 16 {
//!             return Err(format!("gpusPerPod is {}: a node has at most 16", self.gpus_per_pod));
//!         }
//!         Ok(())
//!     }
//! }
//!
//! assert!(slinky_guest_sdk::validate_settings::<GpuSettings>(r#"{"gpusPerPod": 2}"#).is_ok());
//! assert!(slinky_guest_sdk::validate_settings::<GpuSettings>(r#"{"gpusPerPod": 99}"#).is_err());
//! assert!(slinky_guest_sdk::validate_settings::<GpuSettings>(r#"{"gpus": 2}"#).is_err());
//! ```

use serde::de::DeserializeOwned;

/// A plugin's settings type: parsed from the JSON of `spec.settings` (`{}` when there are
/// none), then checked by [`Settings::validate`].
pub trait Settings: DeserializeOwned {
    /// Check the parsed settings: `Err` with a message naming the setting and how to fix it.
    /// The default accepts whatever parses.
    ///
    /// # Errors
    /// The message the host puts in the `BuilderPlugin`'s status.
    fn validate(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The settings of a plugin that takes none: only `{}` (or no settings at all) is accepted.
#[derive(Debug, Clone, Copy, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoSettings {}

impl Settings for NoSettings {}

/// Parse `json` as `S` and validate it: what the host's `validate-settings` call runs.
///
/// # Errors
/// A message saying what does not parse (the serde error names the field) or what
/// [`Settings::validate`] refused.
pub fn validate_settings<S: Settings>(json: &str) -> Result<(), String> {
    let settings: S = serde_json::from_str(json).map_err(|e| {
        if std::any::type_name::<S>() == std::any::type_name::<NoSettings>() {
            format!("this plugin takes no settings, but was given {json}: remove spec.settings ({e})")
        } else {
            format!("the settings do not parse: {e}")
        }
    })?;
    settings.validate()
}
