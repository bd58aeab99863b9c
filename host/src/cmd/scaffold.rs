//! `slinky-host plugin new`: a new builder plugin crate that builds for `wasm32-wasip2` on the
//! first try, starts from the bundled builder's behaviour, and has a native test and a README.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

use super::plugin::KindArg;
use crate::plugins::BuilderKind;

/// The guest SDK of the source tree this binary was built from (present for a user who cloned
/// the repository and built it).
const BUILT_FROM_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk");
/// The lock file of the workspace this binary was built from: the versions the SDK is tested
/// with, so the new crate resolves the same ones.
const WORKSPACE_LOCK: &str = include_str!("../../../Cargo.lock");

/// What `plugin new` made.
#[derive(Debug)]
pub struct Scaffold {
    /// The crate directory.
    pub dir: PathBuf,
    /// The component file `cargo build --target wasm32-wasip2 --release` makes (relative to `dir`).
    pub wasm: PathBuf,
}

/// Check a crate name the way cargo does (so the error comes before any file is written).
fn check_name(name: &str) -> anyhow::Result<()> {
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name.len() <= 64;
    if !ok {
        bail!(
            "{name:?} is not a valid plugin name: use lower-case letters, digits, `-` and `_`, starting \
             with a letter (for example `site-gpu-pods`)"
        );
    }
    Ok(())
}

fn type_name(name: &str) -> String {
    name.split(['-', '_'])
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The guest SDK to depend on: `sdk`, or the one this binary was built from.
fn find_sdk(sdk: Option<&Path>) -> anyhow::Result<PathBuf> {
    let candidate = sdk.map_or_else(|| PathBuf::from(BUILT_FROM_SDK), Path::to_path_buf);
    let manifest = candidate.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).with_context(|| match sdk {
        Some(p) => format!(
            "--sdk {}: no Cargo.toml there; point it at the repository's guest-sdk directory",
            p.display()
        ),
        None => format!(
            "this slinky-host was built from a source tree that is not here any more ({BUILT_FROM_SDK}); \
             pass --sdk PATH/TO/slinky-host/guest-sdk (a clone of the repository)"
        ),
    })?;
    if !text.contains("name = \"slinky-guest-sdk\"") {
        bail!("{} is not the slinky-guest-sdk crate", manifest.display());
    }
    candidate
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", candidate.display()))
}

/// `plugin new`: write the crate (into `dir`, default `./NAME`) and print what to do next.
///
/// # Errors
/// As [`new_plugin`], or stdout closed.
pub fn execute(name: &str, kind: KindArg, dir: Option<PathBuf>, sdk: Option<&Path>) -> anyhow::Result<()> {
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    let made = new_plugin(name, kind.into(), &dir, sdk)?;
    let d = made.dir.display();
    let w = made.wasm.display();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "created {d}: a {} builder starting from the bundled one\n\nnext:\n  cd {d}\n  cargo test\n  \
         cargo build --target wasm32-wasip2 --release\n  slinky-host plugin check {w}\n  \
         slinky-host render -f cluster.yaml --plugin {w}\n  \
         cp {w} PLUGINS_DIR/   # a running `slinky-host run --plugins-dir PLUGINS_DIR` hot-reloads it",
        BuilderKind::from(kind)
    )?;
    Ok(())
}

/// Write a new plugin crate `name` building `kind` into `dir` (which must not exist or be empty).
///
/// # Errors
/// An invalid name, a non-empty directory, no guest SDK, or an I/O error; each says how to fix it.
pub fn new_plugin(name: &str, kind: BuilderKind, dir: &Path, sdk: Option<&Path>) -> anyhow::Result<Scaffold> {
    check_name(name)?;
    let sdk = find_sdk(sdk)?;
    if dir.exists() {
        let empty = std::fs::read_dir(dir)
            .with_context(|| format!("cannot read {}", dir.display()))?
            .next()
            .is_none();
        if !empty {
            bail!(
                "{} exists and is not empty: choose another --dir or remove it",
                dir.display()
            );
        }
    }
    std::fs::create_dir_all(dir.join("src")).with_context(|| format!("cannot create {}", dir.display()))?;
    let ty = type_name(name);
    let lib = match kind {
        BuilderKind::NodesetPod => NODESET_POD_LIB,
        BuilderKind::ControllerService => CONTROLLER_SERVICE_LIB,
        BuilderKind::ControllerChildren => CONTROLLER_CHILDREN_LIB,
        BuilderKind::NodesetChildren => NODESET_CHILDREN_LIB,
        BuilderKind::RestapiChildren => RESTAPI_CHILDREN_LIB,
        BuilderKind::LoginsetChildren => LOGINSET_CHILDREN_LIB,
        BuilderKind::AccountingChildren => ACCOUNTING_CHILDREN_LIB,
    };
    let wasm = PathBuf::from(format!(
        "target/wasm32-wasip2/release/{}.wasm",
        name.replace('-', "_")
    ));
    let fill = |t: &str| {
        t.replace("{name}", name)
            .replace("{Type}", &ty)
            .replace("{kind}", kind.as_str())
            .replace("{sdk}", &sdk.display().to_string())
            .replace("{wasm}", &wasm.display().to_string())
    };
    std::fs::create_dir_all(dir.join(".cargo"))
        .with_context(|| format!("cannot create {}/.cargo", dir.display()))?;
    let files: [(&str, String); 8] = [
        ("Cargo.toml", fill(CARGO_TOML)),
        (
            "cluster.yaml",
            include_str!("../../../examples/slurm-cluster.yaml").to_string(),
        ),
        (".cargo/config.toml", CARGO_CONFIG.to_string()),
        ("Cargo.lock", WORKSPACE_LOCK.to_string()),
        ("rust-toolchain.toml", RUST_TOOLCHAIN.to_string()),
        (".gitignore", "/target\n".to_string()),
        ("README.md", fill(README)),
        ("src/lib.rs", fill(lib)),
    ];
    for (file, text) in files {
        let path = dir.join(file);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(Scaffold {
        dir: dir.to_path_buf(),
        wasm,
    })
}

const CARGO_TOML: &str = r#"[package]
name = "{name}"
description = "A slinky-host {kind} builder plugin"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
# `cdylib` is the Wasm component; `rlib` lets `cargo test` run the builder natively.
crate-type = ["cdylib", "rlib"]

[dependencies]
slinky-guest-sdk = { path = "{sdk}" }
# The Kubernetes API version the plugin's objects are typed for: k8s-openapi's `latest`, or your
# cluster's (`v1_30`, …). The SDK picks none, so this is the one.
k8s-openapi = { version = "0.29", default-features = false, features = ["latest"] }
# The plugin's settings (a BuilderPlugin's `spec.settings`) are parsed with serde.
serde = { version = "1", features = ["derive"] }

# Small components compile and load faster, and fit a ConfigMap when gzipped.
[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
strip = true

# A workspace of its own, wherever this directory is.
[workspace]
"#;

/// The guest's linker flags (`wasm_build.rs` builds the bundled plugins with the same).
const CARGO_CONFIG: &str = r#"# The component starts with 2 MiB of linear memory: its stack (1 MiB), its data and room for a
# build's heap, so a call never grows memory (each growth costs the host two page-protection
# changes per call). A plugin that needs more still grows, in 1 MiB steps.
[target.wasm32-wasip2]
rustflags = ["-C", "link-arg=--initial-memory=2097152"]
"#;

const RUST_TOOLCHAIN: &str = r#"[toolchain]
channel = "1.95.0"
targets = ["wasm32-wasip2"]
"#;

/// The new crate's README (`{name}`, `{kind}`, `{wasm}` filled in).
const README: &str = include_str!("scaffold_templates/README.md");

const NODESET_POD_LIB: &str = r#"//! {name}: a slinky-host `nodeset-pod` builder.
//!
//! It starts from Slinky's pod (`slinky::build_nodeset_pod`), or, as a later step of a pipeline,
//! from the pod the step before built; change it in `build_pod`. Its settings (a BuilderPlugin's
//! `spec.settings`) are `{Type}Settings`, checked by `validate` before the plugin serves.

use slinky_guest_sdk::{
    BuildContext, BuildError, NodeSetPodBuilder, PodIdentity, Settings,
    api::{Controller, NodeSet},
    k8s_openapi::api::core::v1::Pod,
    slinky,
};

/// The builder.
pub struct {Type};

/// The plugin's settings (`{}` when its BuilderPlugin gives none).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct {Type}Settings {
    // Add settings here, for example:
    // pub rack: String,
}

impl Settings for {Type}Settings {
    fn validate(&self) -> Result<(), String> {
        // Refuse bad settings here, naming the setting and the fix.
        Ok(())
    }
}

impl NodeSetPodBuilder for {Type} {
    fn build_pod(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, BuildError> {
        #[allow(unused_variables, reason = "the starting point has no settings yet")]
        let settings: {Type}Settings = ctx.settings()?;
        #[allow(unused_mut, reason = "the starting point changes nothing yet")]
        let mut pod = match ctx.previous::<Pod>()? {
            Some(pod) => pod,
            None => slinky::build_nodeset_pod(ctx, nodeset, controller, identity)?,
        };
        // Change the pod here, for example:
        // pod.metadata.labels.get_or_insert_default().insert("example.com/rack".into(), settings.rack.clone());
        Ok(pod)
    }
}

slinky_guest_sdk::export_plugin!({Type}, kinds = [nodeset_pod], settings = {Type}Settings);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_pod() -> Result<(), BuildError> {
        let (nodeset, controller) = (testing::example_nodeset()?, testing::example_controller()?);
        let pod = testing::call_pod::<{Type}>(&nodeset, &controller, 0)?;
        assert_eq!(pod.metadata.name.as_deref(), Some("slurm-worker-slinky-0"));
        let spec = pod.spec.ok_or(BuildError::invalid("the pod has no spec"))?;
        assert_eq!(spec.containers[0].name, "slurmd");
        Ok(())
    }
}
"#;

const CONTROLLER_SERVICE_LIB: &str = r#"//! {name}: a slinky-host `controller-service` builder.
//!
//! It starts from Slinky's slurmctld Service (`slinky::build_controller_service`); change it in
//! `build_service`.

use slinky_guest_sdk::{
    BuildContext, BuildError, ControllerServiceBuilder, api::Controller,
    k8s_openapi::api::core::v1::Service, slinky,
};

/// The builder.
pub struct {Type};

impl ControllerServiceBuilder for {Type} {
    fn build_service(ctx: &BuildContext, controller: &Controller) -> Result<Service, BuildError> {
        #[allow(unused_mut, reason = "the starting point changes nothing yet")]
        let mut service = slinky::build_controller_service(ctx, controller)?;
        // Change the Service here, for example:
        // service.spec.get_or_insert_default().type_ = Some("LoadBalancer".into());
        Ok(service)
    }
}

slinky_guest_sdk::export_plugin!({Type}, kinds = [controller_service]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_service() -> Result<(), BuildError> {
        let controller = testing::example_controller()?;
        let service = testing::call_service::<{Type}>(&controller)?;
        assert_eq!(service.metadata.name.as_deref(), Some("slurm-controller"));
        let ports = service.spec.and_then(|s| s.ports).unwrap_or_default();
        assert!(ports.iter().any(|p| p.port == 6817), "{ports:?}");
        Ok(())
    }
}
"#;

const CONTROLLER_CHILDREN_LIB: &str = r#"//! {name}: a slinky-host `controller-children` builder.
//!
//! It starts from Slinky's children of a Controller (`slinky::build_controller_children`: the
//! slurmctld StatefulSet, the `slurm.conf` ConfigMap, the internal Service); change them in
//! `build_controller_children`.

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, ControllerChildrenBuilder, ControllerInputs, api::Controller, slinky,
};

/// The builder.
pub struct {Type};

impl ControllerChildrenBuilder for {Type} {
    fn build_controller_children(
        ctx: &BuildContext,
        controller: &Controller,
        inputs: &ControllerInputs,
    ) -> Result<Vec<Child>, BuildError> {
        #[allow(unused_mut, reason = "the starting point changes nothing yet")]
        let mut children = slinky::build_controller_children(ctx, controller, inputs)?;
        // Change the children here, for example the StatefulSet's pod template:
        // for child in &mut children {
        //     if let Child::StatefulSet(sts) = child { /* … */ }
        // }
        Ok(children)
    }
}

slinky_guest_sdk::export_plugin!({Type}, kinds = [controller_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let inputs = testing::example_inputs(&[testing::example_nodeset()?]);
        let children = testing::call_controller_children::<{Type}>(&testing::example_controller()?, &inputs)?;
        let sts = children
            .iter()
            .find_map(Child::as_stateful_set)
            .ok_or(BuildError::invalid("no StatefulSet"))?;
        assert_eq!(sts.metadata.name.as_deref(), Some("slurm-controller"));
        let conf = children
            .iter()
            .find_map(Child::as_config_map)
            .and_then(|c| c.data.as_ref()?.get("slurm.conf").cloned())
            .unwrap_or_default();
        assert!(conf.contains("NodeSet=slinky Feature=slinky"), "{conf}");
        Ok(())
    }
}
"#;

const NODESET_CHILDREN_LIB: &str = r#"//! {name}: a slinky-host `nodeset-children` builder.
//!
//! It starts from Slinky's children of a NodeSet besides its pods
//! (`slinky::build_nodeset_children`: the workers' Service and PodDisruptionBudget, the SSH
//! ConfigMap); change them in `build_nodeset_children`.

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, NodeSetChildrenBuilder,
    api::{Controller, NodeSet},
    slinky,
};

/// The builder.
pub struct {Type};

impl NodeSetChildrenBuilder for {Type} {
    fn build_nodeset_children(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
    ) -> Result<Vec<Child>, BuildError> {
        #[allow(unused_mut, reason = "the starting point changes nothing yet")]
        let mut children = slinky::build_nodeset_children(ctx, nodeset, controller)?;
        // Change the children here (a NodeSet's own objects must be named `<nodeset>-…`).
        Ok(children)
    }
}

slinky_guest_sdk::export_plugin!({Type}, kinds = [nodeset_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let children =
            testing::call_nodeset_children::<{Type}>(&testing::example_nodeset()?, &testing::example_controller()?)?;
        let names: Vec<&str> = children.iter().map(Child::name).collect();
        assert_eq!(names, ["slurm-workers-slurm", "slurm-workers-pdb-slurm"]);
        Ok(())
    }
}
"#;

const RESTAPI_CHILDREN_LIB: &str = r#"//! {name}: a slinky-host `restapi-children` builder.
//!
//! It starts from Slinky's children of a RestApi (`slinky::build_restapi_children`: slurmrestd's
//! Deployment and Service); change them in `build_restapi_children`.

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, RestApiChildrenBuilder,
    api::{Controller, RestApi},
    slinky,
};

/// The builder.
pub struct {Type};

impl RestApiChildrenBuilder for {Type} {
    fn build_restapi_children(
        ctx: &BuildContext,
        restapi: &RestApi,
        controller: &Controller,
    ) -> Result<Vec<Child>, BuildError> {
        #[allow(unused_mut, reason = "the starting point changes nothing yet")]
        let mut children = slinky::build_restapi_children(ctx, restapi, controller)?;
        // Change the children here (each must be named `<restapi>-…`).
        Ok(children)
    }
}

slinky_guest_sdk::export_plugin!({Type}, kinds = [restapi_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let children =
            testing::call_restapi_children::<{Type}>(&testing::example_restapi()?, &testing::example_controller()?)?;
        let names: Vec<&str> = children.iter().map(Child::name).collect();
        assert_eq!(names, ["slurm-restapi", "slurm-restapi"]);
        Ok(())
    }
}
"#;

const LOGINSET_CHILDREN_LIB: &str = r#"//! {name}: a slinky-host `loginset-children` builder.
//!
//! It starts from Slinky's children of a LoginSet (`slinky::build_loginset_children`: the login
//! Deployment, its Service and `sshd_config`); change them in `build_loginset_children`. The
//! host keys Secret is the host's.

use slinky_guest_sdk::{
    BuildContext, BuildError, Child, LoginSetChildrenBuilder, LoginSetInputs,
    api::{Controller, LoginSet},
    slinky,
};

/// The builder.
pub struct {Type};

impl LoginSetChildrenBuilder for {Type} {
    fn build_loginset_children(
        ctx: &BuildContext,
        loginset: &LoginSet,
        controller: &Controller,
        inputs: &LoginSetInputs,
    ) -> Result<Vec<Child>, BuildError> {
        #[allow(unused_mut, reason = "the starting point changes nothing yet")]
        let mut children = slinky::build_loginset_children(ctx, loginset, controller, inputs)?;
        // Change the children here (the Deployment and Service are `<loginset>`, ConfigMaps
        // `<loginset>-…`).
        Ok(children)
    }
}

slinky_guest_sdk::export_plugin!({Type}, kinds = [loginset_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let children = testing::call_loginset_children::<{Type}>(
            &testing::example_loginset()?,
            &testing::example_controller()?,
            &LoginSetInputs::example(),
        )?;
        let names: Vec<&str> = children.iter().map(Child::name).collect();
        assert_eq!(names, ["slurm-login-slinky", "slurm-login-slinky", "slurm-login-slinky-ssh-config"]);
        Ok(())
    }
}
"#;

const ACCOUNTING_CHILDREN_LIB: &str = r#"//! {name}: a slinky-host `accounting-children` builder.
//!
//! It starts from Slinky's children of an Accounting (`slinky::build_accounting_children`:
//! slurmdbd's StatefulSet, Service and `slurmdbd.conf` Secret); change them in
//! `build_accounting_children`. The database password is a placeholder the host fills.

use slinky_guest_sdk::{
    AccountingChildrenBuilder, AccountingInputs, BuildContext, BuildError, Child, api::Accounting, slinky,
};

/// The builder.
pub struct {Type};

impl AccountingChildrenBuilder for {Type} {
    fn build_accounting_children(
        ctx: &BuildContext,
        accounting: &Accounting,
        inputs: &AccountingInputs,
    ) -> Result<Vec<Child>, BuildError> {
        #[allow(unused_mut, reason = "the starting point changes nothing yet")]
        let mut children = slinky::build_accounting_children(ctx, accounting, inputs)?;
        // Change the children here (each is named `<accounting>-accounting`).
        Ok(children)
    }
}

slinky_guest_sdk::export_plugin!({Type}, kinds = [accounting_children]);

#[cfg(test)]
mod tests {
    use slinky_guest_sdk::testing;

    use super::*;

    #[test]
    fn builds_the_example_children() -> Result<(), BuildError> {
        let children =
            testing::call_accounting_children::<{Type}>(&testing::example_accounting()?, &AccountingInputs::example())?;
        let names: Vec<&str> = children.iter().map(Child::name).collect();
        assert_eq!(names, ["slurm-accounting", "slurm-accounting", "slurm-accounting"]);
        Ok(())
    }
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_typed() {
        assert!(check_name("site-gpu-pods").is_ok());
        for bad in ["", "Gpu", "1gpu", "gpu pods", "gpu/pods"] {
            let err = check_name(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains("not a valid plugin name"), "{bad}: {err}");
        }
        assert_eq!(type_name("site-gpu_pods"), "SiteGpuPods");
    }
}
