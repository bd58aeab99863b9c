//! `slinky-host plugin`: its subcommands, and `plugin inspect`.

use std::{path::PathBuf, sync::Arc};

use anyhow::Context as _;
use clap::{Subcommand, ValueEnum};

use super::print;
use crate::plugins::{EngineHandle, Plugin};

/// `plugin` subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Load a plugin and print what it says about itself, its digest and contract version.
    Inspect {
        /// The plugin file (`.wasm` component).
        path: PathBuf,
    },
    /// Create a new builder plugin crate that starts from the bundled builder's behaviour.
    New {
        /// The plugin (crate) name, e.g. `site-gpu-pods`.
        name: String,
        /// The builder kind it builds.
        #[arg(long, value_enum)]
        kind: KindArg,
        /// Where to create it (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The guest SDK to depend on (default: the `guest-sdk` of the source tree this binary
        /// was built from).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Load a plugin, print describe(), build inputs with it through the output policy, and show
    /// how its outputs differ from the bundled builder's. Exits 1 when a build fails.
    Check {
        /// The plugin file (`.wasm` component).
        path: PathBuf,
        /// Manifests with Controllers/NodeSets to build (default: the example cluster).
        #[arg(short = 'f', long = "filename")]
        files: Vec<PathBuf>,
        /// The cluster DNS domain given to builders.
        #[arg(long, env = "SLINKY_HOST_CLUSTER_DOMAIN", default_value = "cluster.local")]
        cluster_domain: String,
        /// A BuilderPlugin's `spec.settings` (JSON) to ask the plugin's `validate-settings`
        /// about, as the host does before a step serves: refused settings fail the check.
        #[arg(long, value_name = "JSON")]
        settings: Option<String>,
    },
    /// Publish a plugin to an OCI registry (the Wasm artifact layout), signed with `--sign-key`
    /// (cosign-compatible), after loading it (a plugin that does not load is not pushed). Prints
    /// the reference pinned by digest, for a BuilderPlugin's `spec.module.image`.
    Push {
        /// The plugin file (`.wasm` component).
        path: PathBuf,
        /// Where to: `registry/repository[:tag]` (tag default `latest`).
        reference: String,
        /// Sign it with this ECDSA P-256 private key (PEM PKCS#8, `plugin keygen`'s `.key`).
        #[arg(long, value_name = "PEM")]
        sign_key: Option<PathBuf>,
        /// Reach this registry over plain HTTP (loopback registries always are).
        #[arg(long)]
        insecure: bool,
        /// Credentials for the registry: a Docker config (`docker login`'s `config.json`, a
        /// `.dockerconfigjson`).
        #[arg(long, env = "SLINKY_HOST_REGISTRY_CREDENTIALS", value_name = "FILE")]
        registry_credentials: Option<PathBuf>,
    },
    /// Show what a plugin would change in a live cluster, before it is installed: per child the
    /// field diff against the live object, per NodeSet the pods that would roll. Writes nothing.
    Diff(super::diff::DiffArgs),
    /// Sign a plugin for a ConfigMap module: writes `PLUGIN.sig` (`--output`), the signature of
    /// the uncompressed component (as `cosign sign-blob --key --output-signature` writes it), and
    /// prints the digest to pin. Put both in the ConfigMap: `--from-file=plugin.wasm=PLUGIN
    /// --from-file=plugin.wasm.sig=PLUGIN.sig`.
    Sign {
        /// The plugin file (`.wasm` component, or gzipped).
        path: PathBuf,
        /// The ECDSA P-256 private key (PEM PKCS#8, `plugin keygen`'s `.key`).
        #[arg(long, value_name = "PEM")]
        key: PathBuf,
        /// Where to write the signature (default: the plugin's path with `.sig` added).
        #[arg(long)]
        output: Option<PathBuf>,
    },
    /// Make an ECDSA P-256 key pair for signing plugins: `<prefix>.key` (keep it secret) and
    /// `<prefix>.pub` (give it to the host's `--plugin-public-key`).
    Keygen {
        /// The files' prefix.
        #[arg(default_value = "plugin-signing")]
        prefix: PathBuf,
    },
    /// Ask a running `run --plugins-dir` host to rescan its plugins directory now (like SIGHUP)
    /// and print what it swapped and refused; exits 1 when a version was refused.
    Reload {
        /// The host's admin address (its `run --admin-addr`).
        #[arg(long, env = "SLINKY_HOST_ADMIN_ADDR", default_value = "127.0.0.1:8081")]
        admin_addr: std::net::SocketAddr,
    },
}

/// A builder kind on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KindArg {
    /// The Controller's Service.
    ControllerService,
    /// A NodeSet's pods.
    NodesetPod,
    /// The Controller's other children: the slurmctld StatefulSet, the slurm.conf ConfigMap, the
    /// internal Service.
    ControllerChildren,
    /// A NodeSet's other children: the workers' Service and PodDisruptionBudget, the SSH ConfigMap.
    NodesetChildren,
    /// A RestApi's children: slurmrestd's Deployment and Service.
    RestapiChildren,
    /// A LoginSet's children: the login Deployment, its Service and sshd_config.
    LoginsetChildren,
    /// An Accounting's children: slurmdbd's StatefulSet, Service and slurmdbd.conf Secret.
    AccountingChildren,
}

impl From<KindArg> for crate::plugins::BuilderKind {
    fn from(k: KindArg) -> Self {
        match k {
            KindArg::ControllerService => crate::plugins::BuilderKind::ControllerService,
            KindArg::NodesetPod => crate::plugins::BuilderKind::NodesetPod,
            KindArg::ControllerChildren => crate::plugins::BuilderKind::ControllerChildren,
            KindArg::NodesetChildren => crate::plugins::BuilderKind::NodesetChildren,
            KindArg::RestapiChildren => crate::plugins::BuilderKind::RestapiChildren,
            KindArg::LoginsetChildren => crate::plugins::BuilderKind::LoginsetChildren,
            KindArg::AccountingChildren => crate::plugins::BuilderKind::AccountingChildren,
        }
    }
}

/// `plugin inspect`: load the plugin at `path` and print what it says about itself.
///
/// # Errors
/// The plugin does not load, or stdout is closed.
pub fn inspect(engine: &Arc<EngineHandle>, path: &std::path::Path) -> anyhow::Result<()> {
    let plugin =
        Plugin::load_file(engine, path).with_context(|| format!("cannot load {}", path.display()))?;
    let info = plugin.info();
    let report = serde_json::json!({
        "name": info.name,
        "version": info.version,
        "kinds": info.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
        "contractVersion": info.contract_version,
        "hostContractVersion": crate::plugins::CONTRACT_VERSION,
        "digest": format!("sha256:{}", plugin.digest()),
        "source": plugin.source().to_string(),
    });
    print(&serde_saphyr::to_string(&report)?)
}

/// `plugin push`: load the plugin (refusing one that does not), push it, print the pinned
/// reference.
///
/// # Errors
/// The plugin does not load, the key does not parse, or the registry refuses an upload.
pub fn push(
    engine: &Arc<EngineHandle>,
    path: &std::path::Path,
    reference: &str,
    sign_key: Option<&std::path::Path>,
    insecure: bool,
    credentials: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    // Read once; a `.wasm.gz` is pushed as the component it holds (the layer is `application/wasm`).
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let bytes =
        crate::plugins::gunzip_if_gzipped(bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let plugin = Plugin::load(
        engine,
        &bytes,
        crate::plugins::PluginSource::File(path.to_path_buf()),
    )
    .with_context(|| format!("cannot load {}", path.display()))?;
    let reference = crate::oci::Reference::parse(reference)?;
    let key = match sign_key {
        None => None,
        Some(p) => {
            let pem = std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
            Some(
                crate::oci::SigningKey::from_pem(&pem)
                    .with_context(|| format!("--sign-key {}", p.display()))?,
            )
        }
    };
    let insecure = if insecure {
        vec![reference.registry.clone()]
    } else {
        Vec::new()
    };
    let oci = crate::oci::Oci::new(crate::oci::DigestStore::default(), insecure)?
        .with_credentials(super::registry_credentials(credentials)?);
    let info = plugin.info();
    let annotations = serde_json::json!({
        "org.opencontainers.image.title": info.name,
        "org.opencontainers.image.version": info.version,
        "net.slurm.slinky.contract": info.contract_version,
        "net.slurm.slinky.kinds": info.kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(","),
    });
    let (imports, exports) = plugin.interfaces();
    let component = serde_json::json!({"imports": imports, "exports": exports});
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let pinned = runtime
        .block_on(oci.push(&reference, &bytes, annotations, component, key.as_ref()))
        .with_context(|| format!("cannot push {} to {reference}", path.display()))?;
    tracing::info!(plugin = %plugin.label(), reference = %pinned, signed = key.is_some(), "plugin pushed");
    print(&format!("{pinned}\n"))
}

/// `plugin sign`: the signature of the component at `path` (gunzipped if gzipped), written to
/// `output` (default `<path>.sig`); prints where, and the digest a BuilderPlugin pins.
///
/// # Errors
/// A file cannot be read or written, the key is not a P-256 PKCS#8 key, the file is not gzip
/// when it says so.
pub fn sign(path: &std::path::Path, key: &std::path::Path, output: Option<PathBuf>) -> anyhow::Result<()> {
    let pem =
        std::fs::read_to_string(key).with_context(|| format!("cannot read the key {}", key.display()))?;
    let key = crate::oci::SigningKey::from_pem(&pem).with_context(|| format!("the key {}", key.display()))?;
    let raw = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let component =
        crate::plugins::gunzip_if_gzipped(raw).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let output = output.unwrap_or_else(|| {
        let mut p = path.as_os_str().to_owned();
        p.push(".sig");
        PathBuf::from(p)
    });
    std::fs::write(&output, key.sign_blob(&component)?)
        .with_context(|| format!("cannot write {}", output.display()))?;
    print(&format!(
        "wrote {}; the component's digest (spec.module.digest): {}\n",
        output.display(),
        crate::oci::sha256(&component)
    ))
}

/// `plugin check --settings`: ask the plugin at `path` whether it accepts `settings` (a
/// BuilderPlugin's `spec.settings`, JSON), as the host does before a step serves; print the
/// verdict.
///
/// # Errors
/// The settings are not JSON, the plugin does not load, or it refuses them.
pub fn check_settings(
    engine: &Arc<EngineHandle>,
    path: &std::path::Path,
    settings: &str,
) -> anyhow::Result<()> {
    let value: serde_json::Value = serde_json::from_str(settings).map_err(|e| {
        anyhow::anyhow!(
            "--settings is not JSON: {e} (give the spec.settings object, like '{{\"gpusPerPod\": 2}}')"
        )
    })?;
    let plugin = Plugin::load_file(engine, path)
        .map_err(|e| anyhow::anyhow!("{} does not load: {e}", path.display()))?;
    match plugin.validate_settings(&value.to_string()) {
        Ok(()) => print(&format!("settings: accepted by {}\n", plugin.label())),
        Err(e) => {
            print(&format!("settings: REFUSED: {e}\n"))?;
            anyhow::bail!("{} refuses the settings {settings}", path.display())
        }
    }
}

/// `plugin keygen`: write `<prefix>.key` (mode 0600) and `<prefix>.pub`.
///
/// # Errors
/// A file exists already or cannot be written.
pub fn keygen(prefix: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let (private, public) = crate::oci::SigningKey::generate()?;
    let with = |ext: &str| {
        let mut p = prefix.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    let (key_path, pub_path) = (with(".key"), with(".pub"));
    let mut key = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key_path)
        .with_context(|| format!("cannot create {} (it must not exist)", key_path.display()))?;
    key.write_all(private.as_bytes())
        .with_context(|| format!("cannot write {}", key_path.display()))?;
    std::fs::write(&pub_path, public).with_context(|| format!("cannot write {}", pub_path.display()))?;
    print(&format!(
        "wrote {} (keep it secret) and {} (the host's --plugin-public-key)\n",
        key_path.display(),
        pub_path.display()
    ))
}
