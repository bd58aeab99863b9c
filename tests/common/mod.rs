//! Shared helpers of the end-to-end tests: the real `slinky-host` binary, real plugin files built
//! by `tests/build.rs`, and one on-disk precompiled-plugin cache for the whole test run.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::Arc,
    time::Duration,
};

use slinky_host::plugins::{EngineHandle, RuntimeConfig};

pub mod host;
pub mod process;
pub mod python;
pub mod slurm;

/// The workspace root.
pub fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A file under `examples/`.
pub fn example(name: &str) -> PathBuf {
    workspace().join("examples").join(name)
}

/// A test plugin built by `tests/build.rs` (`hostile`, `raw`).
pub fn test_plugin(name: &str) -> PathBuf {
    PathBuf::from(env!("SLINKY_TEST_PLUGIN_DIR")).join(format!("{name}.wasm"))
}

/// A `.wat` guest under `tests/wat/`, assembled to a `.wasm` file (in the target directory).
pub fn wat(name: &str) -> PathBuf {
    let source = workspace().join("tests").join("wat").join(format!("{name}.wat"));
    let bytes = wat::parse_file(&source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
    let dir = target_dir().join("test-wat");
    let out = dir.join(format!("{name}.wasm"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    // Write atomically: several test binaries may assemble the same file at once.
    let tmp = dir.join(format!("{name}.{}.tmp", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, &out))
        .unwrap_or_else(|e| panic!("{}: {e}", out.display()));
    out
}

/// The precompiled-plugin cache shared by every test (so each component compiles once per run).
pub fn cache_dir() -> PathBuf {
    target_dir().join("test-plugin-cache")
}

fn target_dir() -> PathBuf {
    // target/<profile>/deps/<test binary>
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| workspace().join("target"))
}

/// The `slinky-host` binary of this build (built by cargo because `host/tests/cli.rs` exists).
pub fn binary() -> PathBuf {
    let exe = std::env::current_exe().ok();
    let dir = exe
        .as_deref()
        .and_then(|e| e.ancestors().nth(2))
        .map(Path::to_path_buf);
    dir.unwrap_or_else(|| target_dir().join("debug"))
        .join("slinky-host")
}

/// Run the binary with `args` (and the shared plugin cache).
pub fn run(args: &[&str]) -> Output {
    let bin = binary();
    assert!(
        bin.is_file(),
        "{} is missing: run the tests with `cargo test --workspace`",
        bin.display()
    );
    Command::new(&bin)
        .args(args)
        .env("SLINKY_HOST_PLUGIN_CACHE", cache_dir())
        .env_remove("RUST_LOG")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

/// An engine with the given deadline and memory cap, sharing the test cache.
pub fn engine(deadline: Duration, memory_mib: usize) -> Arc<EngineHandle> {
    let config = RuntimeConfig {
        call_deadline: deadline,
        memory_limit: memory_mib << 20,
        cache_dir: Some(cache_dir()),
        ..RuntimeConfig::default()
    };
    EngineHandle::new(config).unwrap_or_else(|e| panic!("cannot create the engine: {e}"))
}

/// The default engine, letting plugins build the classes of `allow` past their parents' grants
/// (as `--allow`).
pub fn engine_allowing(allow: &[slinky_host::plugins::Allow]) -> Arc<EngineHandle> {
    let config = RuntimeConfig {
        cache_dir: Some(cache_dir()),
        allow: allow.iter().copied().collect(),
        ..RuntimeConfig::default()
    };
    EngineHandle::new(config).unwrap_or_else(|e| panic!("cannot create the engine: {e}"))
}

/// The default engine (1 s deadline, 64 MiB).
pub fn default_engine() -> Arc<EngineHandle> {
    engine(Duration::from_secs(1), 64)
}

pub use slinky_apiserver::testing::{TestCluster, eventually};

/// Make the embedded `server` fail `verb` on `resource` (`pods`, `nodesets/status` …) with
/// `error`, `times` (a rule that fires before the request is served).
pub fn inject_fault(
    server: &slinky_apiserver::ApiServer,
    verb: &str,
    resource: &str,
    error: slinky_apiserver::FaultError,
    times: slinky_apiserver::Times,
) {
    server
        .faults()
        .add(slinky_apiserver::FaultRule::new(verb, resource, error, times));
}

/// An HTTP answer: status code, `Content-Type`, body.
#[derive(Debug)]
pub struct Answer {
    /// The status code.
    pub status: u16,
    /// The `Content-Type` header (empty when absent).
    pub content_type: String,
    /// The body (de-chunked).
    pub body: String,
}

/// `method path` on a plain-HTTP server with an optional `Accept` header.
///
/// # Errors
/// Connection errors, a timeout (10 s), or no HTTP answer.
pub async fn http_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    accept: Option<&str>,
) -> anyhow::Result<Answer> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    stream
        .write_all(
            format!("{method} {path} HTTP/1.0\r\nHost: x\r\n{accept}Content-Length: 0\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut text)).await??;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP answer in {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status in {head:?}"))?;
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    Ok(Answer {
        status,
        content_type,
        body: body.to_string(),
    })
}

/// `GET path` on a plain-HTTP server (the host's endpoints); returns the body.
///
/// # Errors
/// Connection errors, a timeout (10 s), or no HTTP body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut text)).await??;
    let (_, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP body in {text:?}"))?;
    Ok(body.to_string())
}

/// `slinky-host render -o json` of `files` with `extra` args: the List's items, or the error
/// with stderr.
///
/// # Errors
/// Render failed, or its output is not a `v1` `List`.
pub fn render_json(files: &[&std::path::Path], extra: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut args = vec!["render", "-o", "json"];
    let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    for f in &files {
        args.extend(["-f", f.as_str()]);
    }
    args.extend(extra);
    let out = run(&args);
    anyhow::ensure!(
        out.status.success(),
        "render failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    anyhow::ensure!(
        list["apiVersion"] == "v1" && list["kind"] == "List",
        "not a v1 List: {list}"
    );
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// One Slurm test's turn: the Slurm build it runs, while it holds the binary's one turn (each
/// test starts a whole local Slurm; two at once on a small machine race for its cores and
/// bridges). Derefs to the build's directory.
pub struct SlurmTurn {
    dir: PathBuf,
    _turn: std::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for SlurmTurn {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.dir
    }
}

impl AsRef<Path> for SlurmTurn {
    fn as_ref(&self) -> &Path {
        &self.dir
    }
}

/// The one turn of the Slurm tests of a test binary.
static SLURM_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The Slurm build for the tests judged by a real Slurm (`tests/slurm*.rs`), with the turn of
/// this test binary ([`SlurmTurn`]); or `None` after saying why they skip (no build, not root;
/// a failure instead when the run requires `slurm`). Also starts test logging
/// (`RUST_LOG=slinky_host=debug,slinky_slurm_local=info` to follow a run).
pub fn slurm_or_skip() -> Option<SlurmTurn> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    match slinky_slurm_local::usable() {
        Ok(dir) => Some(SlurmTurn {
            dir,
            // A test that panicked holding it loses nothing: the next takes its turn.
            _turn: SLURM_TURN
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        }),
        Err(why) => {
            slinky_apiserver::testing::skip(&test_name(), "slurm", &why);
            None
        }
    }
}

/// The Slurm build for the tests of slurmdbd (`tests/slurm_accounting.rs`), or `None` after
/// saying why they skip: as [`slurm_or_skip`], and the build must have slurmdbd and its MySQL
/// plugin, and Debian's `mariadb-server` must be installed (the run may require `slurmdbd`).
pub fn slurmdbd_or_skip() -> Option<SlurmTurn> {
    let slurm = slurm_or_skip()?;
    match slinky_slurm_local::accounting_usable(&slurm) {
        Ok(()) => Some(slurm),
        Err(why) => {
            slinky_apiserver::testing::skip(&test_name(), "slurmdbd", &why);
            None
        }
    }
}

/// The running test's name (its thread's), for skip lines.
pub fn test_name() -> String {
    std::thread::current().name().unwrap_or("a test").to_string()
}

/// Every child `slinky-host render` builds for the manifests in `files`, by `Kind/name`: each
/// parent edited by `edit` first, then given the UID `uid-<name>` unless `edit` gave it one (so
/// owner references are set as on a cluster).
///
/// # Errors
/// A file cannot be read, a builder refuses, or two children share a `Kind/name`.
pub fn render_children(
    files: &[PathBuf],
    edit: impl Fn(&mut slinky_host::cmd::render::Parent),
) -> anyhow::Result<std::collections::BTreeMap<String, serde_json::Value>> {
    use slinky_host::{PluginRegistry, cmd::render, plugins::BuildContext};
    let mut manifests = render::read_manifests(files)?;
    for m in &mut manifests {
        edit(&mut m.parent);
        let meta = m.parent.meta_mut();
        if meta.uid.is_none() {
            meta.uid = Some(format!("uid-{}", meta.name.clone().unwrap_or_default()));
        }
    }
    let references = render::read_references(files)?;
    let registry = PluginRegistry::new(&default_engine(), &[])?;
    let children = render::render_with(&manifests, &references, &registry, &BuildContext::default())?;
    let mut out = std::collections::BTreeMap::new();
    for c in children {
        let v = c.to_json();
        let key = format!(
            "{}/{}",
            v["kind"].as_str().unwrap_or_default(),
            v["metadata"]["name"].as_str().unwrap_or_default()
        );
        anyhow::ensure!(out.insert(key.clone(), v).is_none(), "{key} built twice");
    }
    Ok(out)
}

/// `kubectl --kubeconfig KUBECONFIG ARGS` with `stdin`; its stdout, or an error with its stderr.
///
/// # Errors
/// kubectl is missing or fails.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&[u8]>) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("kubectl is not installed")?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input)?;
    }
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The objects Slinky's operator makes for the example cluster (`tests/slinky-made/`), derived
/// from its source: see the files' headers.
const SLINKY_MADE: [&str; 2] = [
    include_str!("../slinky-made/example-cluster.yaml"),
    include_str!("../slinky-made/login-accounting.yaml"),
];

/// The owners of [`slinky_made`]'s objects: (placeholder of its UID, kind, name).
pub const SLINKY_MADE_OWNERS: [(&str, &str, &str); 5] = [
    ("CONTROLLER-UID", "Controller", "slurm"),
    ("NODESET-UID", "NodeSet", "slurm-worker-slinky"),
    ("RESTAPI-UID", "RestApi", "slurm"),
    ("LOGINSET-UID", "LoginSet", "slurm-login-slinky"),
    ("ACCOUNTING-UID", "Accounting", "slurm"),
];

/// The ssh host keys Slinky generated at random, as fixed bytes (the host never reads them).
pub const SSH_HOST_KEYS: [(&str, &str); 6] = [
    ("ECDSA", "ecdsa key\n"),
    ("ECDSA_PUB", "ecdsa-sha2-nistp256 AAAA\n"),
    ("ED25519", "ed25519 key\n"),
    ("ED25519_PUB", "ssh-ed25519 AAAA\n"),
    ("RSA", "rsa key\n"),
    ("RSA_PUB", "ssh-rsa AAAA\n"),
];

/// Slinky's `CheckSumFromMap`: sha256 (hex) of the values in key order.
pub fn checksum<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> String {
    let bytes: Vec<u8> = values.into_iter().flatten().copied().collect();
    slinky_guest_sdk::helpers::sha256_hex(&bytes)
}

/// What Slinky's operator makes for the example cluster in namespace `ns`, its owners' UIDs
/// taken from `uids` (placeholder → UID), its hashes computed as Slinky computes them.
///
/// # Errors
/// A placeholder without a UID, or a document that does not parse.
pub fn slinky_made(
    ns: &str,
    uids: &std::collections::BTreeMap<&str, String>,
) -> anyhow::Result<Vec<serde_json::Value>> {
    slinky_made_from(&SLINKY_MADE, ns, uids)
}

/// What Slinky's operator makes for the example cluster with a high-availability Controller
/// (`tests/slinky-made/ha-controller.yaml`: two slurmctld, the existing claim `slurm-statesave`)
/// and its NodeSet (the workers of `example-cluster.yaml`), in namespace `ns`, as [`slinky_made`].
///
/// # Errors
/// As [`slinky_made`].
pub fn slinky_made_ha(
    ns: &str,
    uids: &std::collections::BTreeMap<&str, String>,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let docs = slinky_made_from(
        &[include_str!("../slinky-made/ha-controller.yaml"), SLINKY_MADE[0]],
        ns,
        uids,
    )?;
    // The HA Controller's objects first; the example's own Controller and RestApi objects go.
    let mut seen = std::collections::BTreeSet::new();
    Ok(docs
        .into_iter()
        .filter(|d| {
            let key = format!("{}/{}", d["kind"], d["metadata"]["name"]);
            seen.insert(key) && d["metadata"]["name"] != "slurm-restapi"
        })
        .collect())
}

fn slinky_made_from(
    files: &[&str],
    ns: &str,
    uids: &std::collections::BTreeMap<&str, String>,
) -> anyhow::Result<Vec<serde_json::Value>> {
    use anyhow::Context;
    let mut text = files.join("\n---\n").replace("@NS@", ns);
    for (placeholder, kind, name) in SLINKY_MADE_OWNERS {
        let uid = uids
            .get(placeholder)
            .with_context(|| format!("no UID for {kind} {name}"))?;
        text = text.replace(placeholder, uid);
    }
    // The keys in their Secret's key order (ecdsa, ecdsa.pub, ed25519, …): the order hashed.
    for (key, value) in SSH_HOST_KEYS {
        let data = serde_json::to_value(k8s_openapi::ByteString(value.as_bytes().to_vec()))?;
        text = text.replace(
            &format!("@SSH_HOST_KEY_{key}@"),
            data.as_str().unwrap_or_default(),
        );
    }
    text = text.replace(
        "@SSH_HOST_KEYS_HASH@",
        &checksum(SSH_HOST_KEYS.iter().map(|(_, v)| v.as_bytes())),
    );
    let docs: Vec<serde_json::Value> = slinky_host::cmd::render::yaml_documents(&text)
        .into_iter()
        .map(serde_saphyr::from_str)
        .collect::<Result<_, _>>()?;
    // Slinky's `CheckSumFromMap` of the Controller's ConfigMap as stored.
    let config = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "slurm-config")
        .context("no ConfigMap slurm-config")?;
    let data: std::collections::BTreeMap<String, String> = serde_json::from_value(config["data"].clone())?;
    let hash = checksum(data.values().map(String::as_bytes));
    docs.into_iter()
        .map(|d| {
            Ok(serde_json::from_str(
                &d.to_string().replace("@SLURM_CONFIG_HASH@", &hash),
            )?)
        })
        .collect()
}
