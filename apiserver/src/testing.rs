//! The test harness shared by this crate's conformance suite and the host's end-to-end tests: a
//! cluster that is the embedded API server by default, or the real cluster named by
//! `SLINKY_TEST_KUBECONFIG` (a differential run: the same assertions against both).

use std::{path::PathBuf, time::Duration};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::{ApiServer, ApiServerConfig};

/// The environment variable naming a real cluster's kubeconfig to test against.
pub const KUBECONFIG_ENV: &str = "SLINKY_TEST_KUBECONFIG";
/// The environment variable whose value prefixes every test namespace (see
/// [`TestCluster::namespace`]).
pub const NAMESPACE_PREFIX_ENV: &str = "SLINKY_TEST_NAMESPACE_PREFIX";

/// A cluster for API-semantics tests: the embedded API server by default, or the cluster named
/// by `SLINKY_TEST_KUBECONFIG` (then `server` is `None` and fault-injection tests skip).
pub struct TestCluster {
    /// A client for the cluster.
    pub client: kube::Client,
    /// The embedded server, when not testing a real cluster.
    pub server: Option<ApiServer>,
    /// A kubeconfig file for kubectl.
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("embedded", &self.server.as_ref().map(ApiServer::url))
            .field("kubeconfig", &self.kubeconfig)
            .finish_non_exhaustive()
    }
}

/// The environment variable listing the tools the run provided (comma-separated: `slurm`,
/// `slurmdbd`, `registry`, `kubectl`, `podman`, …): a test that needs one of them and does not
/// find it fails instead of skipping. `.ci/run` sets it to what it installed.
pub const REQUIRE_ENV: &str = "SLINKY_TEST_REQUIRE";
/// The environment variable naming a file every skip is appended to (`.ci/run` prints it at the
/// end, so a skip is never silent).
pub const SKIPS_ENV: &str = "SLINKY_TEST_SKIPS";

/// Whether the run requires `tool` ([`REQUIRE_ENV`] lists it).
pub fn required(tool: &str) -> bool {
    std::env::var(REQUIRE_ENV)
        .unwrap_or_default()
        .split(',')
        .any(|t| t.trim() == tool)
}

/// A test that needs `tool`, missing for `why`, skips: said on stderr and appended to
/// [`SKIPS_ENV`]'s file, so the run reports it. When the run requires the tool ([`required`]),
/// the test fails instead (a panic naming the tool and why).
///
/// # Panics
/// When `tool` is required.
pub fn skip(test: &str, tool: &str, why: &str) {
    assert!(
        !required(tool),
        "{test}: {tool} is required ({REQUIRE_ENV}) but not usable: {why}"
    );
    let line = format!("{test}: skipped, no {tool}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIPS_ENV) {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Whether `program` runs (`program --help` or `version` answers).
pub fn on_path(program: &str) -> bool {
    std::process::Command::new(program)
        .arg("version")
        .arg("--client")
        .output()
        .or_else(|_| std::process::Command::new(program).arg("--help").output())
        .is_ok()
}

/// Whether the tests run against a real cluster (`SLINKY_TEST_KUBECONFIG` is set).
pub fn real_cluster() -> bool {
    std::env::var_os(KUBECONFIG_ENV).is_some()
}

/// A test harness: a cluster that cannot start fails the test with the reason (a panic).
impl TestCluster {
    /// Start (or connect to) the cluster.
    pub async fn start() -> Self {
        Self::start_with(ApiServerConfig::default()).await
    }

    /// A cluster that drops native sidecars as Kubernetes 1.28 does by default: the embedded
    /// server with its `SidecarContainers` gate off, or the real cluster when it is a 1.28 one.
    /// `None` on a newer real cluster, which keeps them (the skip is said and listed).
    ///
    /// # Panics
    /// When the cluster cannot start or does not say its version (the harness's way to fail).
    pub async fn without_sidecars(test: &str) -> Option<Self> {
        let c = Self::start_with(ApiServerConfig {
            sidecar_containers: false,
            ..Default::default()
        })
        .await;
        let version = c
            .client
            .apiserver_version()
            .await
            .unwrap_or_else(|e| panic!("{test}: cannot read the API server's version: {e}"));
        if version.minor.trim_end_matches('+') == "28" {
            return Some(c);
        }
        skip(
            test,
            "kubernetes-1.28",
            &format!(
                "the cluster is Kubernetes {}, which keeps native sidecars",
                version.git_version
            ),
        );
        None
    }

    /// Start with a given embedded-server configuration (ignored on a real cluster).
    pub async fn start_with(config: ApiServerConfig) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        if let Some(path) = std::env::var_os(KUBECONFIG_ENV) {
            let path = PathBuf::from(path);
            let kc = kube::config::Kubeconfig::read_from(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let client = kube::Client::try_from(cfg).unwrap_or_else(|e| panic!("client: {e}"));
            return TestCluster {
                client,
                server: None,
                kubeconfig: path,
                _dir: dir,
            };
        }
        let server = ApiServer::start(config)
            .await
            .unwrap_or_else(|e| panic!("start: {e}"));
        let kubeconfig = dir.path().join("kubeconfig");
        server
            .write_kubeconfig(&kubeconfig)
            .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
        let client = server.client().unwrap_or_else(|e| panic!("client: {e}"));
        TestCluster {
            client,
            server: Some(server),
            kubeconfig,
            _dir: dir,
        }
    }

    /// The embedded server, or `None` (with a message) on a real cluster: for tests that need
    /// fault injection or server internals.
    pub fn embedded(&self, test: &str) -> Option<&ApiServer> {
        if self.server.is_none() {
            eprintln!(
                "{test}: skipped against a real cluster (needs the embedded server's internals: fault injection, its watch window, token or simulated kubelet)"
            );
        }
        self.server.as_ref()
    }

    /// Create a fresh namespace `<prefix>-<random>` and return its name. On a shared cluster,
    /// `SLINKY_TEST_NAMESPACE_PREFIX` (e.g. `alice-`) is put in front, so a test run's namespaces
    /// can be found and deleted afterwards.
    pub async fn namespace(&self, prefix: &str) -> String {
        use k8s_openapi::api::core::v1::Namespace;
        let run = std::env::var(NAMESPACE_PREFIX_ENV).unwrap_or_default();
        let name = format!("{run}{prefix}-{}", &crate::random_hex()[..6]);
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        kube::Api::<Namespace>::all(self.client.clone())
            .create(&Default::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        name
    }

    /// Install CRDs (server-side apply, idempotent) and wait until every one is established.
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) {
        let api = kube::Api::<CustomResourceDefinition>::all(self.client.clone());
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let pp = kube::api::PatchParams::apply("slinky-tests").force();
            api.patch(&name, &pp, &kube::api::Patch::Apply(crd))
                .await
                .unwrap_or_else(|e| panic!("CRD {name}: {e}"));
        }
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            let established = eventually(10, || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let got = api.get(&name).await.ok()?;
                    got.status?
                        .conditions?
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                        .then_some(())
                }
            })
            .await;
            if established.is_none() {
                panic!("the CRD {name} is not established after 10 s");
            }
        }
        // Established is set just before the resource is served: wait until a list works.
        for crd in crds {
            let group = &crd.spec.group;
            let plural = &crd.spec.names.plural;
            let Some(version) = crd.spec.versions.iter().find(|v| v.served) else {
                continue;
            };
            let ar = kube::discovery::ApiResource {
                group: group.clone(),
                version: version.name.clone(),
                api_version: format!("{group}/{}", version.name),
                kind: crd.spec.names.kind.clone(),
                plural: plural.clone(),
            };
            // Listed as text: an object of another test nested too deep for a JSON decoder
            // must not make the kind look unserved.
            let url = kube::api::Api::<kube::api::DynamicObject>::all_with(self.client.clone(), &ar)
                .resource_url()
                .to_string();
            let served = eventually(10, || {
                let (client, url) = (self.client.clone(), url.clone());
                async move {
                    let list = kube::core::Request::new(url)
                        .list(&kube::api::ListParams::default().limit(1))
                        .ok()?;
                    client.request_text(list).await.ok().map(drop)
                }
            })
            .await;
            if served.is_none() {
                panic!("{plural}.{group} is not served after 10 s");
            }
        }
    }
}

/// Poll `f` every 50 ms until it returns `Some`, for at most `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
