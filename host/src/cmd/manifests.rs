//! `slinky-host manifests`: a complete install: CRDs, namespace, ServiceAccount, least-privilege
//! RBAC (a ClusterRole for exactly what the host reads and writes, a Role for its Lease), the
//! Deployment (two replicas with leader election, probes, resources, a locked-down security
//! context, spread over nodes), a PodDisruptionBudget, a metrics Service (the admin endpoints
//! listen on the pods' loopback only), and optionally a plugins ConfigMap mounted as the plugins
//! directory.
//!
//! The Helm chart in `deploy/helm/slinky-host` renders the same objects; `tests/deploy.rs` keeps
//! them in step.

use serde_json::{Value, json};

/// Options of `manifests`.
#[derive(Debug, Clone, clap::Args)]
pub struct ManifestsArgs {
    /// The namespace the host runs in.
    #[arg(long, env = "SLINKY_HOST_INSTALL_NAMESPACE", default_value = "slinky-system")]
    pub namespace: String,
    /// The container image (build it with the repository's Dockerfile).
    #[arg(long, env = "SLINKY_HOST_IMAGE", default_value = concat!("slinky-host:", env!("CARGO_PKG_VERSION")))]
    pub image: String,
    /// Replicas (one leads, the others wait with warm caches).
    #[arg(long, default_value_t = 2)]
    pub replicas: u32,
    /// Serve only these namespaces (default: all).
    #[arg(long = "watch-namespace", value_delimiter = ',')]
    pub watch_namespaces: Vec<String>,
    /// Mount this ConfigMap (optional: it may not exist) as the plugins directory, hot-reloaded.
    #[arg(long)]
    pub plugins_configmap: Option<String>,
    /// Verify every BuilderPlugin module (a registry's cosign signature, a ConfigMap's
    /// `<key>.sig`) with the public key(s) in this Secret (key `cosign.pub`; the old and the new
    /// key one after the other while rotating): mounted and passed as `--plugin-public-key`.
    /// Without it, no registry module runs (unless `--allow-unsigned-plugins`).
    #[arg(long)]
    pub plugin_public_key_secret: Option<String>,
    /// Without a key, run registry modules on their pinned digest alone (`run
    /// --allow-unsigned-plugins`).
    #[arg(long)]
    pub allow_unsigned_plugins: bool,
    /// Pull BuilderPlugin modules with the registry credentials of this
    /// `kubernetes.io/dockerconfigjson` Secret (`kubectl create secret docker-registry`):
    /// mounted and passed as `--registry-credentials`.
    #[arg(long)]
    pub registry_credentials_secret: Option<String>,
    /// The namespaces BuilderPlugin modules kept in ConfigMaps are read from (default: the
    /// install's namespace; `*`: any).
    #[arg(long = "plugin-configmap-namespace", value_delimiter = ',')]
    pub plugin_configmap_namespaces: Vec<String>,
    /// Registries (`host:port`) reached over plain HTTP (`run --insecure-registry`).
    #[arg(long = "insecure-registry", value_delimiter = ',')]
    pub insecure_registries: Vec<String>,
    /// Reach registries through this HTTP proxy (`http://[user:pass@]host:port`; the pods'
    /// `HTTPS_PROXY` and `HTTP_PROXY`, read by the registry client only).
    #[arg(long)]
    pub registry_proxy: Option<String>,
    /// Hosts reached without the proxy (the pods' `NO_PROXY`: names, `.domain`s, addresses,
    /// CIDRs).
    #[arg(long)]
    pub no_proxy: Option<String>,
    /// How long a starting host waits for the BuilderPlugins (`run
    /// --builder-plugins-startup-seconds`).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub builder_plugins_startup_seconds: Option<u64>,
    /// slurmrestd of the Controllers, when the Service name does not reach it (`run
    /// --slurmrestd-url`, `[NAMESPACE/CONTROLLER=]URL`).
    #[arg(long = "slurmrestd-url", value_delimiter = ',')]
    pub slurmrestd_urls: Vec<String>,
    /// The size of the plugin cache's emptyDir.
    #[arg(long, default_value = "256Mi")]
    pub plugin_cache_size: String,
    /// Keep the plugin cache on this PersistentVolumeClaim instead (kept across restarts;
    /// ReadWriteMany for several replicas).
    #[arg(long)]
    pub plugin_cache_claim: Option<String>,
    /// The host's log level.
    #[arg(long, default_value = "info")]
    pub log_level: String,
    /// Leave the CRDs out (install them separately with `slinky-host crds`).
    #[arg(long)]
    pub no_crds: bool,
}

/// The name of every object of the install.
pub const NAME: &str = "slinky-host";
/// Where a plugins ConfigMap is mounted.
pub const PLUGINS_DIR: &str = "/etc/slinky-host/plugins";
/// Where the BuilderPlugins' public key Secret is mounted.
pub const KEYS_DIR: &str = "/etc/slinky-host/keys";
/// Where the registry credentials Secret is mounted.
pub const REGISTRY_DIR: &str = "/etc/slinky-host/registry";
/// The key of the public key in its Secret (cosign's file name).
pub const PUBLIC_KEY_FILE: &str = "cosign.pub";
/// The precompiled-plugin cache (an emptyDir: the root file system is read-only).
pub const CACHE_DIR: &str = "/var/cache/slinky-host";
/// Where a pod's API credentials are (the in-cluster client reads them there).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// The labels selecting the host's pods (the chart's, for a release named `slinky-host`).
fn selector() -> Value {
    json!({"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": NAME})
}

fn labels() -> Value {
    json!({
        "app.kubernetes.io/name": NAME,
        "app.kubernetes.io/instance": NAME,
        "app.kubernetes.io/component": "operator",
        "app.kubernetes.io/part-of": "slinky",
        "app.kubernetes.io/version": env!("CARGO_PKG_VERSION"),
    })
}

/// Where the metrics, health and readiness endpoints listen (the Service's target).
pub const METRICS_PORT: u16 = 8080;
/// Where the admin endpoints listen: the pod's loopback only.
pub const ADMIN_ADDR: &str = "127.0.0.1:8081";

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

/// The ClusterRole's rules: exactly the requests the host makes (tested against the embedded
/// API server's audit of a running host).
pub fn cluster_rules() -> Vec<Value> {
    vec![
        rule(
            &["slinky.slurm.net"],
            &[
                "controllers",
                "nodesets",
                "restapis",
                "loginsets",
                "accountings",
                "tokens",
            ],
            &["get", "list", "watch"],
        ),
        rule(
            &["slinky.slurm.net"],
            &[
                "controllers/status",
                "nodesets/status",
                "restapis/status",
                "loginsets/status",
                "accountings/status",
                "tokens/status",
            ],
            &["patch"],
        ),
        // BuilderPlugins: watched (every replica loads their steps), their status written.
        rule(
            &["plugins.slinky.slurm.net"],
            &["builderplugins"],
            &["get", "list", "watch"],
        ),
        rule(
            &["plugins.slinky.slurm.net"],
            &["builderplugins/status"],
            &["patch"],
        ),
        // The NodeSet's finalizer (its Slurm nodes stay in slurm.conf until their jobs end).
        rule(&["slinky.slurm.net"], &["nodesets"], &["patch"]),
        rule(
            &[""],
            &["pods"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        // What Slurm says of a worker pod: its `SlurmNodeState*` conditions (a JSON patch that
        // tests the conditions it read, so the kubelet's are never dropped).
        rule(&[""], &["pods/status"], &["patch"]),
        // The NodeSets' per-pod volume claims: watched, created before their pod, their owner
        // references set from the retention policy (a patch with a resourceVersion precondition).
        rule(
            &[""],
            &["persistentvolumeclaims"],
            &["get", "list", "watch", "create", "patch"],
        ),
        // Kubernetes Nodes, for their cordon (a cordoned node's Slurm nodes are drained).
        rule(&[""], &["nodes"], &["get", "list", "watch"]),
        // The children other than pods: watched (caches), read when the cache has none,
        // server-side applied (patch, and create when missing), deleted when the host no longer
        // builds them (with a UID precondition). ConfigMaps the Controllers reference are read
        // from the same cache (their keys only).
        rule(
            &[""],
            &["services", "configmaps"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        rule(
            &["apps"],
            &["statefulsets", "deployments"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        rule(
            &["policy"],
            &["poddisruptionbudgets"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        // A NodeSet's revision history: watched (those labelled slurmd), created, read when the
        // name is taken, renumbered on a rollback, adopted or relabelled (patch, with a
        // resourceVersion precondition), deleted past `revisionHistoryLimit` (UID precondition).
        rule(
            &["apps"],
            &["controllerrevisions"],
            &["get", "list", "watch", "create", "delete", "patch"],
        ),
        // The Secrets the parents reference, read by name for their hashes (and an Accounting's
        // database password, which the host writes into its `slurmdbd.conf`): `get`, never `list`
        // or `watch`, so the host cannot read the cluster's other Secrets. It creates the Secrets
        // it makes (a LoginSet's host keys, an Accounting's `slurmdbd.conf`) and applies the
        // latter (patch), and a Token's JWT Secret (applied).
        rule(&[""], &["secrets"], &["get", "create", "patch"]),
        // A Controller's ServiceMonitor (Prometheus Operator), read by name, never watched (the
        // kind may not be served).
        rule(
            &["monitoring.coreos.com"],
            &["servicemonitors"],
            &["get", "create", "delete", "patch"],
        ),
        rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
    ]
}

/// The leader-election Role's rules (in the host's namespace).
pub fn lease_rules() -> Vec<Value> {
    vec![rule(
        &["coordination.k8s.io"],
        &["leases"],
        &["get", "list", "watch", "create", "update", "patch"],
    )]
}

/// The install, as objects in apply order: the CRDs (unless `--no-crds`), the namespace, the
/// ServiceAccount and RBAC, the Deployment, the metrics Service, and with more than one replica
/// a PodDisruptionBudget.
///
/// # Errors
/// Never in practice (the CRDs serialize).
pub fn objects(args: &ManifestsArgs) -> anyhow::Result<Vec<Value>> {
    let ns = args.namespace.as_str();
    let mut out = Vec::new();
    if !args.no_crds {
        for crd in super::crds::crds() {
            out.push(serde_json::to_value(crd)?);
        }
    }
    out.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels()}}));
    out.extend(access(ns));
    out.push(deployment(args));
    out.push(metrics_service(ns));
    if args.replicas > 1 {
        out.push(json!({
            "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": meta(ns, NAME),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector()}},
        }));
    }
    Ok(out)
}

/// The metadata of the object `name` of the install, in `ns`.
fn meta(ns: &str, name: &str) -> Value {
    json!({"name": name, "namespace": ns, "labels": labels()})
}

/// The ServiceAccount and its RBAC: the ClusterRole (and binding) of [`cluster_rules`], the
/// leader-election Role (and binding) of [`lease_rules`] in `ns`.
fn access(ns: &str) -> Vec<Value> {
    let lease_role = format!("{NAME}-leader-election");
    vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(ns, NAME)}),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": NAME, "labels": labels()},
            "rules": cluster_rules(),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": labels()},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": ns}],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": meta(ns, &lease_role),
            "rules": lease_rules(),
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": meta(ns, &lease_role),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": lease_role},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": ns}],
        }),
    ]
}

/// The `run` arguments of the deployed host, and its volume mounts and volumes (the plugin cache,
/// and the plugins ConfigMap when there is one).
fn run_args(args: &ManifestsArgs) -> (Vec<String>, Vec<Value>, Vec<Value>) {
    let mut run_args: Vec<String> = [
        "run",
        "--http-addr",
        &format!("0.0.0.0:{METRICS_PORT}"),
        "--admin-addr",
        ADMIN_ADDR,
        "--leader-elect",
        "--leader-election-lease",
        NAME,
        "--leader-election-lease-seconds",
        "15",
        "--leader-election-grace-seconds",
        "4",
    ]
    .map(String::from)
    .to_vec();
    for n in &args.watch_namespaces {
        run_args.extend(["--namespace".into(), n.clone()]);
    }
    let mut mounts = vec![
        json!({"name": "kube-api-access", "mountPath": SERVICE_ACCOUNT_DIR, "readOnly": true}),
        json!({"name": "plugin-cache", "mountPath": CACHE_DIR}),
    ];
    let mut volumes = vec![
        kube_api_access(),
        match &args.plugin_cache_claim {
            Some(claim) => json!({"name": "plugin-cache", "persistentVolumeClaim": {"claimName": claim}}),
            None => json!({"name": "plugin-cache", "emptyDir": {"sizeLimit": args.plugin_cache_size}}),
        },
    ];
    if let Some(cm) = &args.plugins_configmap {
        run_args.extend([
            "--plugins-dir".into(),
            PLUGINS_DIR.into(),
            "--plugins-poll-ms".into(),
            "1000".into(),
        ]);
        mounts.push(json!({"name": "plugins", "mountPath": PLUGINS_DIR, "readOnly": true}));
        volumes.push(json!({"name": "plugins", "configMap": {"name": cm, "optional": true}}));
    }
    if let Some(secret) = &args.plugin_public_key_secret {
        run_args.extend([
            "--plugin-public-key".into(),
            format!("{KEYS_DIR}/{PUBLIC_KEY_FILE}"),
        ]);
        mounts.push(json!({"name": "plugin-keys", "mountPath": KEYS_DIR, "readOnly": true}));
        // Not optional: a host told to verify never starts without its key.
        volumes.push(json!({"name": "plugin-keys", "secret": {"secretName": secret,
            "items": [{"key": PUBLIC_KEY_FILE, "path": PUBLIC_KEY_FILE}]}}));
    }
    if args.allow_unsigned_plugins {
        run_args.push("--allow-unsigned-plugins".into());
    }
    if let Some(secret) = &args.registry_credentials_secret {
        run_args.extend([
            "--registry-credentials".into(),
            format!("{REGISTRY_DIR}/config.json"),
        ]);
        mounts.push(json!({"name": "registry-credentials", "mountPath": REGISTRY_DIR, "readOnly": true}));
        volumes.push(
            json!({"name": "registry-credentials", "secret": {"secretName": secret,
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}}),
        );
    }
    for n in &args.plugin_configmap_namespaces {
        run_args.extend(["--plugin-configmap-namespace".into(), n.clone()]);
    }
    for r in &args.insecure_registries {
        run_args.extend(["--insecure-registry".into(), r.clone()]);
    }
    if let Some(s) = args.builder_plugins_startup_seconds {
        run_args.extend(["--builder-plugins-startup-seconds".into(), s.to_string()]);
    }
    for u in &args.slurmrestd_urls {
        run_args.extend(["--slurmrestd-url".into(), u.clone()]);
    }
    (run_args, mounts, volumes)
}

/// The Deployment: the replicas with leader election, probes, resources, a locked-down security
/// context, spread over nodes.
fn deployment(args: &ManifestsArgs) -> Value {
    let (run_args, mounts, volumes) = run_args(args);
    let probe = |path: &str, period: u32| json!({"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": 3});
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(&args.namespace, NAME),
        "spec": {
            "replicas": args.replicas,
            "selector": {"matchLabels": selector()},
            // A new version starts its pods before the old ones go; leader election hands over.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels()},
                "spec": {
                    "serviceAccountName": NAME,
                    "automountServiceAccountToken": false,
                    "securityContext": {
                        "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "terminationGracePeriodSeconds": 40,
                    "containers": [{
                        "name": NAME,
                        "image": args.image,
                        "args": run_args,
                        "env": env(args),
                        "ports": [{"name": "http", "containerPort": METRICS_PORT, "protocol": "TCP"}],
                        // Until the host answers (its builders compiled, the API server reached),
                        // the liveness probe waits: a cold cache on a slow node is no crash loop.
                        "startupProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                            "periodSeconds": 5, "failureThreshold": 60},
                        "livenessProbe": probe("/healthz", 10),
                        "readinessProbe": probe("/readyz", 5),
                        "resources": {
                            "requests": {"cpu": "100m", "memory": "128Mi"},
                            "limits": {"memory": "512Mi"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                    // Spread the replicas over nodes.
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": selector()}},
                    }]}},
                },
            },
        },
    })
}

/// The host container's environment.
fn env(args: &ManifestsArgs) -> Vec<Value> {
    let field = |path: &str| json!({"fieldRef": {"fieldPath": path}});
    let mut env = json!([
        {"name": "POD_NAME", "valueFrom": field("metadata.name")},
        {"name": "POD_NAMESPACE", "valueFrom": field("metadata.namespace")},
        {"name": "SLINKY_HOST_LOG_LEVEL", "value": args.log_level},
        {"name": "SLINKY_HOST_LOG_FORMAT", "value": "json"},
        {"name": "SLINKY_HOST_PLUGIN_CACHE", "value": CACHE_DIR},
        {"name": "SLINKY_HOST_PLUGIN_DEADLINE_MS", "value": "1000"},
        {"name": "SLINKY_HOST_PLUGIN_MEMORY_MIB", "value": "64"},
        {"name": "SLINKY_HOST_PLUGIN_CONCURRENCY", "value": "16"},
        {"name": "SLINKY_HOST_PLUGIN_KEEP_RESIDENT_MIB", "value": "4"},
        // glibc's malloc keeps an arena per thread up to 8 per core; the
        // plugin calls' threads each fragmented one (10,000 pods: 158 MiB
        // with the default, 134 MiB with 2).
        {"name": "MALLOC_ARENA_MAX", "value": "2"},
    ]);
    let mut out: Vec<Value> = env.as_array_mut().map(std::mem::take).unwrap_or_default();
    out.extend(proxy_env(args));
    out
}

/// The host's API credentials, mounted as the ServiceAccount admission plugin would mount them (a
/// bound token, the cluster's CA, the namespace): the pod does not depend on that plugin, and
/// `automountServiceAccountToken: false` keeps any other token out.
fn kube_api_access() -> Value {
    json!({"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
    ]}})
}

/// The proxy environment of the host's registry client (`--registry-proxy`, `--no-proxy`).
fn proxy_env(args: &ManifestsArgs) -> Vec<Value> {
    let mut env = Vec::new();
    if let Some(proxy) = &args.registry_proxy {
        env.push(json!({"name": "HTTPS_PROXY", "value": proxy}));
        env.push(json!({"name": "HTTP_PROXY", "value": proxy}));
    }
    if let Some(no) = &args.no_proxy {
        env.push(json!({"name": "NO_PROXY", "value": no}));
    }
    env
}

/// The metrics Service (the admin endpoints listen on the pods' loopback only).
fn metrics_service(ns: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": format!("{NAME}-metrics"), "namespace": ns, "labels": labels(),
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8080", "prometheus.io/path": "/metrics"},
        },
        "spec": {
            "selector": selector(),
            "ports": [{"name": "http-metrics", "port": METRICS_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    })
}

/// The install as multi-document YAML.
///
/// # Errors
/// A serializer failure.
pub fn yaml(args: &ManifestsArgs) -> anyhow::Result<String> {
    let docs = objects(args)?
        .iter()
        .map(serde_saphyr::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(docs.join("---\n"))
}
