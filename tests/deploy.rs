//! The install: `slinky-host manifests` applied with kubectl to the embedded API server; the RBAC
//! it grants checked against every request a running host (with leader election) made, from the
//! server's audit; the Helm chart rendered and linted by Helm's own code, and kept in step with
//! the manifests.

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};
use slinky_host::cmd::manifests;
use slinky_tests::{
    eventually,
    host::{NS_NAME, apply_example_with, apply_file, cluster, scale},
    kubectl, python, run, workspace,
};

/// `slinky-host manifests args…` applied to `c` with kubectl (server-side); what kubectl printed
/// and the Deployment as the API server then has it.
async fn apply_manifests(c: &slinky_tests::TestCluster, args: &[&str]) -> Result<(String, Value)> {
    let mut all = vec!["manifests"];
    all.extend_from_slice(args);
    let out = run(&all);
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let kc = c.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        let applied = kubectl(
            &kc,
            &["apply", "--server-side", "--field-manager", "platform", "-f", "-"],
            Some(&out.stdout),
        )?;
        let deploy = kubectl(
            &kc,
            &[
                "-n",
                "slinky-system",
                "get",
                "deployment",
                "slinky-host",
                "-o",
                "json",
            ],
            None,
        )?;
        anyhow::Ok((applied, serde_json::from_str(&deploy)?))
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_apply_cleanly_with_kubectl() -> Result<()> {
    // A fresh cluster: nothing installed yet.
    let c = slinky_tests::TestCluster::start().await;
    let (applied, d) = apply_manifests(
        &c,
        &[
            "--plugins-configmap",
            "slinky-plugins",
            "--watch-namespace",
            "hpc",
        ],
    )
    .await?;
    for want in [
        "customresourcedefinition.apiextensions.k8s.io/nodesets.slinky.slurm.net serverside-applied",
        "namespace/slinky-system serverside-applied",
        "clusterrole.rbac.authorization.k8s.io/slinky-host serverside-applied",
        "role.rbac.authorization.k8s.io/slinky-host-leader-election serverside-applied",
        "deployment.apps/slinky-host serverside-applied",
        "service/slinky-host-metrics serverside-applied",
    ] {
        ensure!(applied.contains(want), "{want:?} not in:\n{applied}");
    }
    assert_eq!(d["spec"]["replicas"], 2);
    let pod = &d["spec"]["template"]["spec"];
    let ctr = &pod["containers"][0];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(ctr["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(ctr["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(ctr["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(ctr["livenessProbe"]["httpGet"]["path"], "/healthz");
    let args: Vec<&str> = ctr["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    for want in [
        "--leader-elect",
        "--plugins-dir",
        manifests::PLUGINS_DIR,
        "--namespace",
        "hpc",
    ] {
        ensure!(args.contains(&want), "{want} not in {args:?}");
    }
    assert_eq!(pod["volumes"][2]["configMap"]["optional"], true);
    assert_eq!(ctr["startupProbe"]["httpGet"]["path"], "/healthz");

    // With verification on and a private registry's credentials: the install applies too, the
    // key and the credentials mounted from their Secrets and passed to `run`.
    let (applied, d) = apply_manifests(
        &c,
        &[
            "--plugin-public-key-secret",
            "slinky-plugin-keys",
            "--registry-credentials-secret",
            "slinky-registry",
        ],
    )
    .await?;
    ensure!(
        applied.contains("deployment.apps/slinky-host serverside-applied"),
        "{applied}"
    );
    let pod = &d["spec"]["template"]["spec"];
    let args = pod["containers"][0]["args"].to_string();
    ensure!(
        args.contains("\"--plugin-public-key\",\"/etc/slinky-host/keys/cosign.pub\"")
            && args.contains("\"--registry-credentials\",\"/etc/slinky-host/registry/config.json\""),
        "{args}"
    );
    let volumes = pod["volumes"].to_string();
    ensure!(
        volumes.contains("\"secretName\":\"slinky-plugin-keys\"")
            && volumes.contains("\"secretName\":\"slinky-registry\""),
        "{volumes}"
    );
    Ok(())
}

fn allowed(rules: &[Value], verb: &str, group: &str, resource: &str) -> bool {
    rules.iter().any(|r| {
        let has = |field: &str, v: &str| {
            r[field]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(v) || x.as_str() == Some("*")))
        };
        has("apiGroups", group) && has("resources", resource) && has("verbs", verb)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_roles_grant_every_request_a_running_host_makes() -> Result<()> {
    let c = cluster(true).await;
    let Some(server) = c.embedded("rbac audit") else {
        return Ok(());
    };
    let ns = c.namespace("rbac").await;
    // Per-pod claims that go with a scale-in: the claims are created and their owners patched.
    apply_example_with(&c, &ns, 2, |v| {
        v["spec"]["volumeClaimTemplates"] = json!([{"metadata": {"name": "scratch"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]);
        v["spec"]["persistentVolumeClaimRetentionPolicy"] = json!({"whenScaled": "Delete"});
    })
    .await?;
    let mut host = Command::new(slinky_tests::binary())
        .arg("run")
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .args([
            "--namespace",
            &ns,
            "--leader-elect",
            "--leader-election-namespace",
            &ns,
        ])
        .args([
            "--resync-seconds",
            "1",
            "--http-addr",
            "127.0.0.1:0",
            "--admin-addr",
            "127.0.0.1:0",
        ])
        // A slurmrestd (refusing at once) for the Controller `other` only: its NodeSet gets the
        // host's finalizer (patch nodesets); the example's NodeSet has no Slurm to ask.
        .args(["--slurmrestd-url", &format!("{ns}/other=http://127.0.0.1:9")])
        .env("SLINKY_HOST_PLUGIN_CACHE", slinky_tests::cache_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let scenario = async {
        let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
        let count = |n: usize| {
            let pods = pods.clone();
            async move {
                eventually(60, || async {
                    let l = pods.list(&ListParams::default()).await.ok()?;
                    let live = l
                        .items
                        .iter()
                        .filter(|p| p.metadata.deletion_timestamp.is_none())
                        .count();
                    (live == n && l.items.len() == n).then_some(())
                })
                .await
                .with_context(|| format!("{n} pods never appeared"))
            }
        };
        count(2).await?;
        // A LoginSet (its host keys Secret made: create secrets) and an Accounting (its
        // slurmdbd.conf Secret created, then applied: patch secrets).
        apply_file(&c, &ns, "loginset.yaml", |_| {}).await?;
        apply_file(&c, &ns, "accounting.yaml", |_| {}).await?;
        let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.client.clone(), &ns);
        for name in ["slurm-login-slinky-ssh-host-keys", "slurm-accounting"] {
            eventually(60, || async { secrets.get_opt(name).await.ok()?.map(|_| ()) })
                .await
                .with_context(|| format!("the host did not make Secret {name}"))?;
        }
        // An orphan the host adopts (patch), a scale-down (delete), a scale-up (create).
        let orphan: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{NS_NAME}-7"), "labels": {
                "app.kubernetes.io/instance": NS_NAME, "app.kubernetes.io/name": "slurmd"}},
            "spec": {"containers": [{"name": "slurmd", "image": "x"}]},
        }))?;
        pods.create(&PostParams::default(), &orphan).await?;
        scale(&c, &ns, 1).await?;
        count(1).await?;
        scale(&c, &ns, 3).await?;
        count(3).await?;
        // A new template: the NodeSet records its revision (create controllerrevisions) and,
        // the pods rolled, deletes the old one (revisionHistoryLimit 0: delete).
        let nodesets = Api::<slinky_api::NodeSet>::namespaced(c.client.clone(), &ns);
        let revisions =
            Api::<k8s_openapi::api::apps::v1::ControllerRevision>::namespaced(c.client.clone(), &ns);
        // The revision the pods run before the patch: the roll is over when the status names
        // another (until the host saw the patch, the old one is the only one, and updated).
        let before = nodesets.get(NS_NAME).await?.status.and_then(|s| s.node_set_hash);
        nodesets
            .patch(
                NS_NAME,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"spec": {"template": {"metadata": {"labels": {"pool": "b"}}}}}),
                ),
            )
            .await?;
        let rolled = eventually(60, || async {
            let st = nodesets.get(NS_NAME).await.ok()?.status?;
            let hash = st.node_set_hash.filter(|h| Some(h) != before.as_ref())?;
            let l = revisions
                .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={NS_NAME}")))
                .await
                .ok()?;
            let names: Vec<String> = l.items.iter().filter_map(|r| r.metadata.name.clone()).collect();
            (st.updated_replicas == 3 && names == [format!("{NS_NAME}-{hash}")]).then_some(names[0].clone())
        })
        .await
        .context("the NodeSet did not roll to one revision")?;
        // The revision loses its instance label: the host finds its name taken (get) by its own
        // revision and puts the labels back (patch).
        revisions
            .patch(
                &rolled,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"metadata": {"labels": {"app.kubernetes.io/instance": null}}}),
                ),
            )
            .await?;
        eventually(30, || async {
            let r = revisions.get(&rolled).await.ok()?;
            r.metadata
                .labels?
                .get("app.kubernetes.io/instance")
                .is_some_and(|i| i == NS_NAME)
                .then_some(())
        })
        .await
        .context("the revision's labels were not put back")?;
        // An external Controller: the host deletes the Service it built (delete services).
        let svcs = Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.client.clone(), &ns);
        Api::<slinky_api::Controller>::namespaced(c.client.clone(), &ns)
            .patch(
                "slurm",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"spec": {"external": true, "externalConfig": {"host": "ctld", "port": 6817}}}),
                ),
            )
            .await?;
        eventually(30, || async {
            svcs.get_opt("slurm-controller")
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await
        .context("the Service was not pruned")?;
        // A second Controller with a slurmrestd, and its NodeSet of no pods: the finalizer.
        apply_file(&c, &ns, "slurm-cluster.yaml", |v| match v["kind"].as_str() {
            Some("Controller") => v["metadata"]["name"] = json!("other"),
            Some("NodeSet") => {
                v["metadata"]["name"] = json!("other-workers");
                v["spec"]["controllerRef"]["name"] = json!("other");
                v["spec"]["replicas"] = json!(0);
            }
            _ => {}
        })
        .await?;
        eventually(30, || async {
            let n = nodesets.get("other-workers").await.ok()?;
            n.metadata
                .finalizers?
                .iter()
                .any(|f| f == slinky_api::keys::FINALIZER_SLURM_NODES)
                .then_some(())
        })
        .await
        .context("the NodeSet of a Controller with a slurmrestd never got the host's finalizer")?;
        // A Token: its JWT Secret applied (patch secrets), its status written.
        let token: slinky_api::Token = serde_json::from_value(json!({
            "metadata": {"name": "exporter"},
            "spec": {"username": "slurm",
                     "jwtKeyRef": {"name": "slurm-auth-jwths256", "key": "jwt_hs256.key"}}
        }))?;
        let tokens = Api::<slinky_api::Token>::namespaced(c.client.clone(), &ns);
        tokens.create(&PostParams::default(), &token).await?;
        eventually(30, || async {
            tokens.get("exporter").await.ok()?.status?.issued_at.map(|_| ())
        })
        .await
        .context("the Token never got its JWT")?;
        // A BuilderPlugin it refuses: its status is written (patch builderplugins/status).
        let bp_name = format!("{ns}-refused");
        let bp: slinky_api::BuilderPlugin = serde_json::from_value(json!({
            "apiVersion": "plugins.slinky.slurm.net/v1alpha1", "kind": "BuilderPlugin",
            "metadata": {"name": bp_name},
            "spec": {"module": {"image": "registry.invalid/x@sha256:0000000000000000000000000000000000000000000000000000000000000000"},
                     "kinds": ["no-such-kind"]}
        }))?;
        let bps = Api::<slinky_api::BuilderPlugin>::all(c.client.clone());
        bps.create(&PostParams::default(), &bp).await?;
        let refused = eventually(30, || async {
            let s = bps.get(&bp_name).await.ok()?.status?;
            (s.phase.as_deref() == Some("Refused")).then_some(())
        })
        .await;
        let _ = bps.delete(&bp_name, &Default::default()).await;
        refused.context("the host never wrote the refused BuilderPlugin's status")?;
        anyhow::Ok(())
    };
    let result = scenario.await;
    let _ = host.kill();
    let _ = host.wait();
    result?;

    let used: Vec<_> = server
        .audit()
        .into_iter()
        .filter(|a| a.user_agent == "slinky-host")
        .collect();
    ensure!(used.len() >= 10, "the audit saw too little of the host: {used:?}");
    for a in &used {
        eprintln!("host request: {} {}/{}", a.verb, a.group, a.resource);
    }
    let cluster_rules = manifests::cluster_rules();
    let lease_rules = manifests::lease_rules();
    let mut missing = Vec::new();
    for a in &used {
        let ok = allowed(&cluster_rules, &a.verb, &a.group, &a.resource)
            || (a.group == "coordination.k8s.io" && allowed(&lease_rules, &a.verb, &a.group, &a.resource));
        if !ok {
            missing.push(format!("{} {}/{}", a.verb, a.group, a.resource));
        }
    }
    ensure!(
        missing.is_empty(),
        "the manifests' roles do not grant: {missing:?}"
    );
    // What a host with a reachable Slurm also writes (the real-Slurm tests make these writes):
    // the roles grant them.
    for (verb, group, resource) in [("patch", "", "pods/status"), ("patch", "", "pods")] {
        ensure!(
            allowed(&cluster_rules, verb, group, resource),
            "the manifests' roles do not grant {verb} {group}/{resource}"
        );
    }
    // And the host used what matters most (the audit is not vacuous).
    for (verb, group, resource) in [
        ("create", "", "pods"),
        ("delete", "", "pods"),
        ("patch", "", "pods"),
        ("patch", "", "services"),
        ("delete", "", "services"),
        ("patch", "", "configmaps"),
        ("watch", "", "configmaps"),
        ("patch", "apps", "statefulsets"),
        ("delete", "apps", "statefulsets"),
        ("patch", "policy", "poddisruptionbudgets"),
        ("get", "", "secrets"),
        ("create", "", "secrets"),
        ("patch", "", "secrets"),
        ("patch", "slinky.slurm.net", "nodesets/status"),
        ("patch", "slinky.slurm.net", "loginsets/status"),
        ("patch", "slinky.slurm.net", "accountings/status"),
        ("watch", "slinky.slurm.net", "loginsets"),
        ("watch", "slinky.slurm.net", "accountings"),
        ("patch", "apps", "deployments"),
        ("watch", "slinky.slurm.net", "nodesets"),
        ("create", "events.k8s.io", "events"),
        ("watch", "", "persistentvolumeclaims"),
        ("create", "", "persistentvolumeclaims"),
        ("patch", "", "persistentvolumeclaims"),
        ("watch", "apps", "controllerrevisions"),
        ("create", "apps", "controllerrevisions"),
        ("get", "apps", "controllerrevisions"),
        ("patch", "apps", "controllerrevisions"),
        ("delete", "apps", "controllerrevisions"),
        // The NodeSet's finalizer (a slurmrestd is configured).
        ("patch", "slinky.slurm.net", "nodesets"),
        ("watch", "plugins.slinky.slurm.net", "builderplugins"),
        ("patch", "plugins.slinky.slurm.net", "builderplugins/status"),
        ("watch", "slinky.slurm.net", "tokens"),
        ("patch", "slinky.slurm.net", "tokens/status"),
    ] {
        ensure!(
            used.iter()
                .any(|a| a.verb == verb && a.group == group && a.resource == resource),
            "the host never did {verb} {group}/{resource}: {used:?}"
        );
    }
    ensure!(
        used.iter().any(|a| a.group == "coordination.k8s.io"),
        "the host never touched its Lease: {used:?}"
    );
    ensure!(
        !used
            .iter()
            .any(|a| a.resource == "secrets" && !["get", "create", "patch"].contains(&a.verb.as_str())),
        "the host only gets the Secrets it references and makes its own (never lists, watches or \
         deletes): {used:?}"
    );
    Ok(())
}

/// `helm lint` (strict) and `helm template` of the chart with `values`, by Helm's own code: the
/// rendered objects by `kind/name`.
fn helm_template(release: &str, values: &Value) -> Result<BTreeMap<String, Value>> {
    let chart = workspace().join("deploy/helm/slinky-host");
    let out = python::run_json(
        "helm_check.py",
        &[
            &chart.display().to_string(),
            release,
            "slinky-system",
            &values.to_string(),
        ],
    )?;
    let errors: Vec<&Value> = out["lint"]["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["severity"].as_u64().unwrap_or(0) >= 2)
        .collect();
    ensure!(
        errors.is_empty() && out["lint"]["errors"] == json!([]),
        "helm lint: {}",
        out["lint"]
    );
    let mut objects = BTreeMap::new();
    for (path, text) in out["manifests"].as_object().into_iter().flatten() {
        if path.ends_with("NOTES.txt") {
            continue;
        }
        for doc in text.as_str().unwrap_or_default().split("\n---") {
            let v: Value = serde_saphyr::from_str(doc).with_context(|| format!("{path}: {doc}"))?;
            if v.is_null() {
                continue;
            }
            objects.insert(
                format!(
                    "{}/{}",
                    v["kind"].as_str().unwrap_or_default(),
                    v["metadata"]["name"].as_str().unwrap_or_default()
                ),
                v,
            );
        }
    }
    Ok(objects)
}

#[test]
fn the_helm_chart_renders_and_lints_like_the_manifests() -> Result<()> {
    let chart = workspace().join("deploy/helm/slinky-host");
    let meta: Value = serde_saphyr::from_str(&std::fs::read_to_string(chart.join("Chart.yaml"))?)?;
    assert_eq!(meta["appVersion"], env!("CARGO_PKG_VERSION"));
    // The CRDs are the host's.
    let out = run(&["crds"]);
    ensure!(out.status.success());
    let crds = std::fs::read_to_string(chart.join("crds/slinky-crds.yaml"))?;
    assert_eq!(
        crds,
        String::from_utf8_lossy(&out.stdout),
        "deploy/helm/slinky-host/crds/slinky-crds.yaml is stale: regenerate with `slinky-host crds`"
    );

    // The default install, as `helm template` renders it, is what `slinky-host manifests` prints.
    let chart_objects = helm_template("slinky-host", &json!({}))?;
    let args = manifests::ManifestsArgs {
        namespace: "slinky-system".into(),
        image: format!("slinky-host:{}", env!("CARGO_PKG_VERSION")),
        replicas: 2,
        watch_namespaces: Vec::new(),
        plugins_configmap: Some("slinky-plugins".into()),
        plugin_public_key_secret: None,
        allow_unsigned_plugins: false,
        registry_credentials_secret: None,
        plugin_configmap_namespaces: Vec::new(),
        insecure_registries: Vec::new(),
        registry_proxy: None,
        no_proxy: None,
        builder_plugins_startup_seconds: None,
        slurmrestd_urls: Vec::new(),
        plugin_cache_size: "256Mi".into(),
        plugin_cache_claim: None,
        log_level: "info".into(),
        no_crds: true,
    };
    for ours in manifests::objects(&args)? {
        let kind = ours["kind"].as_str().unwrap_or_default();
        if kind == "Namespace" {
            continue; // helm installs into an existing namespace
        }
        let key = format!("{kind}/{}", ours["metadata"]["name"].as_str().unwrap_or_default());
        let theirs = chart_objects
            .get(&key)
            .with_context(|| format!("the chart renders no {key}"))?;
        for field in ["rules", "roleRef", "subjects"] {
            assert_eq!(theirs[field], ours[field], "{key} {field}");
        }
        match kind {
            "Deployment" => {
                assert_eq!(
                    theirs["spec"]["selector"], ours["spec"]["selector"],
                    "{key} selector"
                );
                assert_eq!(
                    theirs["spec"]["strategy"], ours["spec"]["strategy"],
                    "{key} strategy"
                );
                let (mut t, o) = (
                    theirs["spec"]["template"]["spec"].clone(),
                    &ours["spec"]["template"]["spec"],
                );
                t["containers"][0]["imagePullPolicy"] = Value::Null;
                let t = strip_nulls(t);
                assert_eq!(&t, o, "{key} pod spec");
            }
            "Service" | "PodDisruptionBudget" => assert_eq!(theirs["spec"], ours["spec"], "{key} spec"),
            _ => {}
        }
        for (k, v) in ours["metadata"]["labels"].as_object().into_iter().flatten() {
            assert_eq!(&theirs["metadata"]["labels"][k], v, "{key} label {k}");
        }
    }
    // Verification on, as the chart's values and `manifests`' flags ask for it: the same pod.
    let verified = helm_template(
        "slinky-host",
        &json!({"builderPlugins": {"publicKeySecret": "slinky-plugin-keys", "configMapNamespaces": ["slurm"],
                                   "registrySecret": "slinky-registry"}}),
    )?;
    let verified_args = manifests::ManifestsArgs {
        plugin_public_key_secret: Some("slinky-plugin-keys".into()),
        registry_credentials_secret: Some("slinky-registry".into()),
        plugin_configmap_namespaces: vec!["slurm".into()],
        ..args.clone()
    };
    let ours = manifests::objects(&verified_args)?
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .context("no Deployment")?;
    let mut theirs = verified["Deployment/slinky-host"]["spec"]["template"]["spec"].clone();
    theirs["containers"][0]["imagePullPolicy"] = Value::Null;
    assert_eq!(
        strip_nulls(theirs.clone()),
        ours["spec"]["template"]["spec"],
        "verification on: pod spec"
    );
    let vargs = theirs["containers"][0]["args"].to_string();
    ensure!(
        vargs.contains("\"--plugin-public-key\",\"/etc/slinky-host/keys/cosign.pub\"")
            && vargs.contains("\"--plugin-configmap-namespace\",\"slurm\"")
            && vargs.contains("\"--registry-credentials\",\"/etc/slinky-host/registry/config.json\"")
            && !vargs.contains("--allow-unsigned-plugins"),
        "{vargs}"
    );
    // Closed by default: the default install runs no unsigned registry module; allowing them is
    // an explicit value, the same in both.
    let default_args =
        chart_objects["Deployment/slinky-host"]["spec"]["template"]["spec"]["containers"][0]["args"]
            .to_string();
    ensure!(
        !default_args.contains("--allow-unsigned-plugins"),
        "{default_args}"
    );
    let open = helm_template("slinky-host", &json!({"builderPlugins": {"allowUnsigned": true}}))?;
    let open_args = manifests::ManifestsArgs {
        allow_unsigned_plugins: true,
        ..verified_args.clone()
    };
    let ours = manifests::objects(&manifests::ManifestsArgs {
        plugin_public_key_secret: None,
        registry_credentials_secret: None,
        plugin_configmap_namespaces: Vec::new(),
        ..open_args
    })?
    .into_iter()
    .find(|o| o["kind"] == "Deployment")
    .context("no Deployment")?;
    let mut theirs = open["Deployment/slinky-host"]["spec"]["template"]["spec"].clone();
    theirs["containers"][0]["imagePullPolicy"] = Value::Null;
    assert_eq!(
        strip_nulls(theirs.clone()),
        ours["spec"]["template"]["spec"],
        "allowUnsigned: pod spec"
    );
    ensure!(
        theirs["containers"][0]["args"]
            .to_string()
            .contains("\"--allow-unsigned-plugins\"")
    );
    // The supply chain's and Slurm's values reach the host as its flags; the cache may be a claim.
    let set = helm_template(
        "slinky-host",
        &json!({"builderPlugins": {"insecureRegistries": ["registry.lab:5000"], "startupSeconds": 300,
                                   "proxy": {"url": "http://proxy.lab:3128", "noProxy": ".svc,10.0.0.0/8"}},
                "slurmrestdUrls": ["slurm/slurm=http://10.0.0.5:6820"],
                "pluginCache": {"persistentVolumeClaim": "slinky-cache"},
                "startupProbe": {"failureThreshold": 120}}),
    )?;
    let pod = &set["Deployment/slinky-host"]["spec"]["template"]["spec"];
    // `manifests`' flags make the same pod (its startup probe is the chart's default).
    let ours = manifests::objects(&manifests::ManifestsArgs {
        insecure_registries: vec!["registry.lab:5000".into()],
        builder_plugins_startup_seconds: Some(300),
        registry_proxy: Some("http://proxy.lab:3128".into()),
        no_proxy: Some(".svc,10.0.0.0/8".into()),
        slurmrestd_urls: vec!["slurm/slurm=http://10.0.0.5:6820".into()],
        plugin_cache_claim: Some("slinky-cache".into()),
        ..args.clone()
    })?
    .into_iter()
    .find(|o| o["kind"] == "Deployment")
    .context("no Deployment")?;
    let mut theirs = pod.clone();
    theirs["containers"][0]["imagePullPolicy"] = Value::Null;
    theirs["containers"][0]["startupProbe"] =
        ours["spec"]["template"]["spec"]["containers"][0]["startupProbe"].clone();
    assert_eq!(
        strip_nulls(theirs),
        ours["spec"]["template"]["spec"],
        "registries, proxy, cache, slurmrestd: pod spec"
    );
    let env = pod["containers"][0]["env"].to_string();
    ensure!(
        env.contains(r#"{"name":"HTTPS_PROXY","value":"http://proxy.lab:3128"}"#)
            && env.contains(r#"{"name":"NO_PROXY","value":".svc,10.0.0.0/8"}"#),
        "{env}"
    );
    let sargs = pod["containers"][0]["args"].to_string();
    for pair in [
        "\"--insecure-registry\",\"registry.lab:5000\"",
        "\"--builder-plugins-startup-seconds\",\"300\"",
        "\"--slurmrestd-url\",\"slurm/slurm=http://10.0.0.5:6820\"",
    ] {
        ensure!(sargs.contains(pair), "{pair} not in {sargs}");
    }
    ensure!(
        pod["volumes"][1]
            == json!({"name": "plugin-cache", "persistentVolumeClaim": {"claimName": "slinky-cache"}}),
        "{}",
        pod["volumes"][1]
    );
    let default_pod = &chart_objects["Deployment/slinky-host"]["spec"]["template"]["spec"];
    ensure!(
        pod["containers"][0]["startupProbe"]["failureThreshold"] == 120
            && default_pod["containers"][0]["startupProbe"]["httpGet"]["path"] == "/healthz",
        "{}",
        pod["containers"][0]["startupProbe"]
    );
    // Every flag the chart passes is one `run` takes.
    let help = slinky_tests::run(&["run", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--insecure-registry",
        "--builder-plugins-startup-seconds",
        "--slurmrestd-url",
        "--allow-unsigned-plugins",
        "--registry-credentials",
    ] {
        ensure!(help.contains(flag), "run has no {flag}");
    }

    // The admin endpoints are on loopback, and the metrics Service reaches only the metrics port.
    let deploy = &chart_objects["Deployment/slinky-host"];
    let container = &deploy["spec"]["template"]["spec"]["containers"][0];
    let cargs: Vec<&str> = container["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let admin = cargs
        .iter()
        .position(|a| *a == "--admin-addr")
        .and_then(|i| cargs.get(i + 1));
    assert_eq!(admin, Some(&manifests::ADMIN_ADDR), "{cargs:?}");
    let ports: Vec<&Value> = container["ports"].as_array().into_iter().flatten().collect();
    assert_eq!(
        ports.len(),
        1,
        "only the metrics port is a container port: {ports:?}"
    );
    assert_eq!(
        chart_objects["Service/slinky-host-metrics"]["spec"]["ports"][0]["targetPort"],
        "http"
    );

    // Release names: two releases elect on their own Leases; overrides name everything.
    let other = helm_template(
        "hpc",
        &json!({"podLabels": {"team": "hpc"}, "extraArgs": ["--cluster-domain=example.org"],
        "metrics": {"serviceMonitor": {"enabled": true}}, "serviceAccount": {"annotations": {"iam.example.com/role": "x"}}}),
    )?;
    let hpc = &other["Deployment/hpc-slinky-host"];
    let hargs: Vec<&str> = hpc["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let lease = hargs
        .iter()
        .position(|a| *a == "--leader-election-lease")
        .and_then(|i| hargs.get(i + 1));
    assert_eq!(lease, Some(&"hpc-slinky-host"), "{hargs:?}");
    ensure!(
        hargs.contains(&"--cluster-domain=example.org"),
        "extraArgs: {hargs:?}"
    );
    assert_eq!(hpc["spec"]["template"]["metadata"]["labels"]["team"], "hpc");
    ensure!(
        other.contains_key("ServiceMonitor/hpc-slinky-host"),
        "{:?}",
        other.keys()
    );
    assert_eq!(
        other["ServiceAccount/hpc-slinky-host"]["metadata"]["annotations"]["iam.example.com/role"],
        "x"
    );
    assert_eq!(
        other["ClusterRoleBinding/hpc-slinky-host"]["subjects"][0]["name"],
        "hpc-slinky-host"
    );
    ensure!(
        !chart_objects.contains_key("ServiceMonitor/slinky-host"),
        "no ServiceMonitor by default"
    );
    let renamed = helm_template(
        "x",
        &json!({"fullnameOverride": "ops", "serviceAccount": {"create": false, "name": "existing"}, "replicaCount": 1}),
    )?;
    ensure!(
        renamed.contains_key("Deployment/ops") && !renamed.contains_key("ServiceAccount/existing"),
        "{:?}",
        renamed.keys()
    );
    ensure!(
        !renamed.contains_key("PodDisruptionBudget/ops"),
        "no PDB for one replica"
    );
    assert_eq!(
        renamed["Deployment/ops"]["spec"]["template"]["spec"]["serviceAccountName"],
        "existing"
    );
    // The values schema refuses a typo'd or mistyped key, naming it.
    let refused = helm_template("x", &json!({"replicaCount": "two"}));
    let e = format!(
        "{:#}",
        refused.err().context("a string replicaCount was accepted")?
    );
    ensure!(e.contains("replicaCount"), "{e}");
    let refused = helm_template("x", &json!({"replicas": 2}));
    let e = format!("{:#}", refused.err().context("an unknown key was accepted")?);
    ensure!(
        e.contains("additional properties 'replicas' not allowed"),
        "the refusal does not name the unknown key: {e}"
    );
    Ok(())
}

fn strip_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k, strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(strip_nulls).collect()),
        other => other,
    }
}

#[test]
fn the_dockerfile_builds_with_the_pinned_toolchain_and_caches_dependencies() -> Result<()> {
    let toolchain = std::fs::read_to_string(workspace().join("rust-toolchain.toml"))?;
    let channel = toolchain
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|l| l.split('"').nth(1))
        .context("rust-toolchain.toml has no channel")?;
    let dockerfile = std::fs::read_to_string(workspace().join("Dockerfile"))?;
    let image = format!("rust:{}-bookworm", channel.trim_end_matches(".0"));
    ensure!(
        dockerfile.contains(&image),
        "the Dockerfile does not build with {image}"
    );
    for cache in ["/usr/local/cargo/registry", "/src/target"] {
        ensure!(
            dockerfile.contains(&format!("--mount=type=cache,target={cache}")),
            "the Dockerfile does not cache {cache}"
        );
    }
    ensure!(
        dockerfile.contains("slinky-host version"),
        "the build prints the plugin digests"
    );
    ensure!(
        dockerfile.contains(&format!("0.0.0.0:{}", manifests::METRICS_PORT)),
        "the image's default command serves metrics on the install's port"
    );
    Ok(())
}
