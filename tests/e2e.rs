//! The end-to-end tests that need no real Slurm: the real `slinky-host` binary and library
//! against the embedded API server, with the real plugins built from `plugins/`. One module per
//! file (see `Cargo.toml` for why they share one binary).

mod accounting;
mod authoring;
mod builder_plugins;
mod children;
mod daemonset;
mod deploy;
mod drain;
mod golden;
mod image;
mod leader;
mod loginset;
mod ordinals;
mod reconcile;
mod reload;
mod render;
mod resilience;
mod restapi;
mod revisions;
mod sandbox;
mod service_monitor;
mod token;
mod volumes;
