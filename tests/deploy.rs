//! The install: `slinky-host manifests` applied with kubectl to the embedded API server; the RBAC
//! it grants checked against every request a running host (with leader election) made, from the
//! server's audit; the Helm chart kept in step with the manifests.

use std::{
    io::Write,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::Value;
use slinky_host::manifests;
use slinky_tests::{
    eventually,
    host::{NS_NAME, apply_example, cluster, scale},
    run, workspace,
};

fn kubectl(kubeconfig: &std::path::Path, args: &[&str], stdin: Option<&[u8]>) -> Result<String> {
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
    ensure!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifests_apply_cleanly_with_kubectl() -> Result<()> {
    // A fresh cluster: nothing installed yet.
    let c = slinky_tests::TestCluster::start().await;
    let out = run(&[
        "manifests",
        "--plugins-configmap",
        "slinky-plugins",
        "--watch-namespace",
        "hpc",
    ]);
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let kc = c.kubeconfig.clone();
    let applied = tokio::task::spawn_blocking(move || {
        kubectl(
            &kc,
            &["apply", "--server-side", "--field-manager", "platform", "-f", "-"],
            Some(&out.stdout),
        )
    })
    .await??;
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
    let kc = c.kubeconfig.clone();
    let deploy = tokio::task::spawn_blocking(move || {
        kubectl(
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
        )
    })
    .await??;
    let d: Value = serde_json::from_str(&deploy)?;
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
    assert_eq!(pod["volumes"][1]["configMap"]["optional"], true);
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
    apply_example(&c, &ns, 2).await?;
    let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
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
        .args(["--resync-seconds", "1", "--http-addr", &addr.to_string()])
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
        tokio::time::sleep(Duration::from_secs(2)).await;
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
    // And the host used what matters most (the audit is not vacuous).
    for (verb, group, resource) in [
        ("create", "", "pods"),
        ("delete", "", "pods"),
        ("patch", "", "pods"),
        ("patch", "", "services"),
        ("patch", "slinky.slurm.net", "nodesets/status"),
        ("watch", "slinky.slurm.net", "nodesets"),
        ("create", "events.k8s.io", "events"),
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
    Ok(())
}

/// Replace Go template actions so a chart template parses as YAML.
fn untemplate(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("{{") && trimmed.ends_with("}}") {
            continue; // a control line ({{- if }}, {{- end }}, {{- include … | nindent }})
        }
        let mut l = line.to_string();
        while let (Some(a), Some(b)) = (l.find("{{"), l.find("}}")) {
            if b < a {
                break;
            }
            l.replace_range(a..b + 2, "X");
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}

#[test]
fn the_helm_chart_matches_the_manifests() -> Result<()> {
    let chart = workspace().join("deploy/helm/slinky-host");
    let meta: Value = serde_yaml::from_str(&std::fs::read_to_string(chart.join("Chart.yaml"))?)?;
    assert_eq!(meta["appVersion"], env!("CARGO_PKG_VERSION"));
    let values: Value = serde_yaml::from_str(&std::fs::read_to_string(chart.join("values.yaml"))?)?;
    for key in [
        "image",
        "replicaCount",
        "resources",
        "watchNamespaces",
        "plugins",
        "logLevel",
        "metrics",
        "leaderElection",
    ] {
        ensure!(!values[key].is_null(), "values.yaml has no {key}");
    }
    // The CRDs are the host's.
    let out = run(&["crds"]);
    ensure!(out.status.success());
    let crds = std::fs::read_to_string(chart.join("crds/slinky-crds.yaml"))?;
    assert_eq!(
        crds,
        String::from_utf8_lossy(&out.stdout),
        "deploy/helm/slinky-host/crds/slinky-crds.yaml is stale: regenerate with `slinky-host crds`"
    );
    // The RBAC rules are the manifests'.
    let rbac = untemplate(&std::fs::read_to_string(chart.join("templates/rbac.yaml"))?);
    let docs: Vec<Value> = rbac
        .split("\n---\n")
        .map(serde_yaml::from_str)
        .collect::<Result<_, _>>()
        .context("templates/rbac.yaml")?;
    let rules_of = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .map(|d| d["rules"].clone())
            .unwrap_or(Value::Null)
    };
    assert_eq!(rules_of("ClusterRole"), Value::Array(manifests::cluster_rules()));
    assert_eq!(rules_of("Role"), Value::Array(manifests::lease_rules()));
    // The Deployment runs the same command with the same hardening.
    let deploy = untemplate(&std::fs::read_to_string(chart.join("templates/deployment.yaml"))?);
    for want in [
        "--leader-elect",
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "runAsNonRoot: true",
        "path: /readyz",
        "path: /healthz",
        "POD_NAME",
        "SLINKY_HOST_PLUGIN_CACHE",
        manifests::PLUGINS_DIR,
    ] {
        ensure!(deploy.contains(want), "templates/deployment.yaml lacks {want:?}");
    }
    Ok(())
}
