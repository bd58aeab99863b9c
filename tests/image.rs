//! The host image, run with podman: the image the `Dockerfile` builds (here with
//! `deploy/image/build-local.sh`, from Debian's packages) reconciles a cluster as the install's
//! ServiceAccount, with the install's RBAC (on a real cluster, `SLINKY_TEST_KUBECONFIG`: a token of
//! `slinky-host manifests`' ServiceAccount; the embedded server does not authorize, so there the
//! test's own credentials), with leader election on the install's Lease.
//!
//! Skips, saying why, where podman is missing or the image was not built (`SLINKY_HOST_TEST_IMAGE`,
//! default `localhost/slinky-host:0.1.0`).

use std::{
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, ResourceExt, api::ListParams};
use serde_json::Value;
use slinky_tests::{
    eventually,
    host::{apply_example, cluster},
    kubectl,
    process::bound_addresses,
    run,
};

/// The image to run, or why the test cannot.
fn image() -> std::result::Result<String, String> {
    let image =
        std::env::var("SLINKY_HOST_TEST_IMAGE").unwrap_or_else(|_| "localhost/slinky-host:0.1.0".into());
    let podman = Command::new("podman").args(["image", "exists", &image]).status();
    match podman {
        Err(_) => Err("podman is not installed (apt-get install podman runc)".into()),
        Ok(s) if !s.success() => Err(format!(
            "no image {image}: build it with deploy/image/build-local.sh"
        )),
        Ok(_) => Ok(image),
    }
}

/// Whether `rules` (a role's) grant the audited request `a`.
fn granted(rules: &[Value], a: &slinky_apiserver::AuditRecord) -> bool {
    rules.iter().any(|r| {
        let has = |field: &str, v: &str| {
            r[field]
                .as_array()
                .is_some_and(|l| l.iter().any(|x| x.as_str() == Some(v) || x.as_str() == Some("*")))
        };
        has("apiGroups", &a.group) && has("resources", &a.resource) && has("verbs", &a.verb)
    })
}

/// A kubeconfig for `token` on the cluster of `kubeconfig` (its server and CA).
fn token_kubeconfig(kubeconfig: &std::path::Path, token: &str) -> Result<String> {
    let text = std::fs::read_to_string(kubeconfig)?;
    let v: Value = serde_saphyr::from_str(&text)?;
    let cluster = &v["clusters"][0]["cluster"];
    let server = cluster["server"]
        .as_str()
        .context("no server in the kubeconfig")?;
    let ca = match cluster["certificate-authority-data"].as_str() {
        Some(data) => format!("certificate-authority-data: {data}"),
        None => "insecure-skip-tls-verify: true".into(),
    };
    Ok(format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n    {ca}\nusers:\n- name: sa\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: c, user: sa}}\ncurrent-context: c\n"
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_reconciles_as_the_installs_service_account() -> Result<()> {
    let image = match image() {
        Ok(i) => i,
        Err(why) => {
            slinky_apiserver::testing::skip(
                "the_image_reconciles_as_the_installs_service_account",
                "image",
                &why,
            );
            return Ok(());
        }
    };
    let c = cluster(true).await;
    let ns = c.namespace("image").await;
    let install = format!("{ns}-host");
    let manifests = run(&["manifests", "--namespace", &install, "--image", &image]);
    ensure!(
        manifests.status.success(),
        "{}",
        String::from_utf8_lossy(&manifests.stderr)
    );
    let kc = c.kubeconfig.clone();
    tokio::task::spawn_blocking(move || {
        kubectl(
            &kc,
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager",
                "platform",
                "-f",
                "-",
            ],
            Some(&manifests.stdout),
        )
    })
    .await??;
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    let as_sa = slinky_apiserver::testing::real_cluster();
    if as_sa {
        let kc = c.kubeconfig.clone();
        let install2 = install.clone();
        let token = tokio::task::spawn_blocking(move || {
            kubectl(
                &kc,
                &[
                    "-n",
                    &install2,
                    "create",
                    "token",
                    "slinky-host",
                    "--duration",
                    "1h",
                ],
                None,
            )
        })
        .await??;
        std::fs::write(&kubeconfig, token_kubeconfig(&c.kubeconfig, token.trim())?)?;
    } else {
        std::fs::copy(&c.kubeconfig, &kubeconfig)?;
    }
    // The container runs as 65532: let it read the file.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    }
    apply_example(&c, &ns, 2).await?;
    let started = Instant::now();
    let mut child = Command::new("podman")
        .args(["run", "--rm", "--network", "host", "--name", &ns, "-v"])
        .arg(format!("{}:/etc/slinky/kubeconfig:ro", kubeconfig.display()))
        .arg(&image)
        .args([
            "run",
            "--kubeconfig",
            "/etc/slinky/kubeconfig",
            "--namespace",
            &ns,
        ])
        // Port 0: the host binds its own and logs them.
        .args(["--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .args([
            "--leader-elect",
            "--leader-election-namespace",
            &install,
            "--run-for-seconds",
            "30",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot run podman")?;
    let (http, _admin, log) = bound_addresses(child.stderr.take().context("no stderr")?)?;
    let pods = Api::<Pod>::namespaced(c.client.clone(), &ns);
    let made = eventually(60, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        (list.items.len() == 2).then_some(list.items)
    })
    .await;
    let first_pods = started.elapsed();
    let ready = eventually(30, || async {
        slinky_tests::http_get(http, "/readyz").await.ok()
    })
    .await;
    let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    let logs = format!("{}{}", String::from_utf8_lossy(&out.stdout), log.text());
    let made = made.with_context(|| format!("the container made no pods; its output:\n{logs}"))?;
    ensure!(ready.is_some(), "/readyz never answered; the output:\n{logs}");
    ensure!(
        out.status.success(),
        "the container exited with {}:\n{logs}",
        out.status
    );
    if as_sa {
        // kube-apiserver authorizes the ServiceAccount: a request the install's roles do not
        // grant is refused, and the host logs it.
        ensure!(!logs.contains("forbidden"), "a request was forbidden:\n{logs}");
    } else if let Some(server) = &c.server {
        // The embedded server does not authorize: its audit shows what the container asked,
        // which the install's roles must grant.
        let rules = slinky_host::cmd::manifests::cluster_rules();
        let leases = slinky_host::cmd::manifests::lease_rules();
        let refused: Vec<String> = server
            .audit()
            .into_iter()
            .filter(|a| a.user_agent == "slinky-host")
            .filter(|a| !(granted(&rules, a) || (a.group == "coordination.k8s.io" && granted(&leases, a))))
            .map(|a| format!("{} {}/{}", a.verb, a.group, a.resource))
            .collect();
        ensure!(
            refused.is_empty(),
            "the install's roles do not grant: {refused:?}"
        );
    }
    for p in &made {
        let builder = p.annotations().get(slinky_api::keys::ANNOTATION_BUILDER).cloned();
        ensure!(
            builder.as_deref().is_some_and(|b| b.starts_with("nodeset-pod@")),
            "{builder:?}"
        );
    }
    eprintln!(
        "image {image}: first pods {} ms after `podman run` (as the ServiceAccount: {as_sa})",
        first_pods.as_millis()
    );
    Ok(())
}
