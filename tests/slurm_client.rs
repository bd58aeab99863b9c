//! The slurmrestd client (`slinky-slurm`) against a real slurmrestd: the example cluster's Slurm
//! run by `slinky-slurm-local`, its slurmrestd as the RestApi's Deployment runs it. The host's
//! tokens are accepted, drains and undrains land, a token signed with another key is refused
//! with a message saying what to check, and a slurmrestd that does not answer is a clear error
//! within the deadline, never a hang, whether nothing listens or a server accepts and stays
//! silent.
//!
//! Needs root and a Slurm build, as `tests/slurm.rs`.

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use slinky_slurm::{Client, Error, NodeList, NodeUpdate, jwt::Tokens};
use slinky_tests::{
    host::cluster_with_statefulsets,
    slurm::{nodes_idle, start},
};

/// The example's JWT key, as slurmctld reads it (`jwtKeyRef`).
async fn jwt_key(c: &slinky_tests::TestCluster, ns: &str) -> Result<Vec<u8>> {
    let secret = Api::<Secret>::namespaced(c.client.clone(), ns)
        .get("slurm-auth-jwths256")
        .await?;
    slinky_api::contract::secret_value(&secret, "jwt_hs256.key")
        .context("the example's JWT key Secret has no key")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_slurmrestd_answers_the_hosts_tokens_and_drains() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "client", 1).await?;
    let result = async {
        nodes_idle(&h, &["slinky-0"]).await?;
        let key = jwt_key(&c, &ns).await?;
        let client = Client::new(
            &h.restapi_url(),
            Tokens::new(key, "slurm", Duration::from_secs(900)),
            Duration::from_secs(5),
        )?;
        ensure!(client.version().await? == "v0.0.43", "Slurm 25.05 serves v0.0.43");
        let pings = client.ping().await?;
        ensure!(
            slinky_slurm::in_control(&pings).is_some_and(|p| p.mode == "primary"),
            "{pings:?}"
        );
        client.drain("slinky-0", "slurm-operator: test drain").await?;
        let drained = client.nodes().await?.into_iter().find(|n| n.name == "slinky-0");
        ensure!(
            drained
                .as_ref()
                .is_some_and(|n| n.is_drain() && n.reason_is_ours()),
            "{drained:?}"
        );
        client.undrain("slinky-0").await?;
        let undrained = client.nodes().await?.into_iter().find(|n| n.name == "slinky-0");
        ensure!(undrained.as_ref().is_some_and(|n| !n.is_drain()), "{undrained:?}");
        // A token signed with another key is refused, with a message saying what to check.
        let wrong = Client::new(
            &h.restapi_url(),
            Tokens::new(b"wrong".to_vec(), "slurm", Duration::from_secs(900)),
            Duration::from_secs(5),
        )?;
        match wrong.nodes().await {
            Err(e @ Error::Unauthorized { .. }) => ensure!(e.to_string().contains("jwtKeyRef"), "{e}"),
            other => anyhow::bail!("expected Unauthorized, got {other:?}"),
        }
        Ok(())
    }
    .await;
    h.shutdown().await;
    host.stop().await;
    result
}

/// The node list read with slurmctld's time of the last one: unchanged, a 304 and no list; a
/// change (here a drain) always comes back, also when the partitions did not change (slurmrestd
/// 25.05 fails such a read, which is then read whole). Drains and undrains of several nodes go
/// in one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_list_since_its_last_time_is_a_304_and_a_drain_of_three_nodes_one_request() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "since", 3).await?;
    let result = async {
        let names: Vec<String> = (0..3).map(|i| format!("slinky-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        nodes_idle(&h, &refs).await?;
        let key = jwt_key(&c, &ns).await?;
        let client = Client::new(
            &h.restapi_url(),
            Tokens::new(key, "slurm", Duration::from_secs(900)),
            Duration::from_secs(5),
        )?;
        let NodeList::Changed {
            last_update: Some(mut t),
            ..
        } = client.nodes_since(None).await?
        else {
            anyhow::bail!("a whole read gave no list or no last_update");
        };
        // Times are in seconds: a read answers 304 once nothing changed in the second of the
        // last read or after it (the slurmds registered just now), so read for up to 20 s.
        let mut unchanged = false;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            match client.nodes_since(Some(t)).await? {
                NodeList::Unchanged => {
                    unchanged = true;
                    break;
                }
                NodeList::Changed { last_update, .. } => t = last_update.context("no last_update")?,
            }
        }
        ensure!(unchanged, "20 s of reads since the last one's time, never a 304");

        let before = client.requests();
        let (done, error) = client
            .update_nodes(&names, NodeUpdate::Drain("slurm-operator: batch test"))
            .await;
        ensure!(error.is_none() && done == names, "drained {done:?}: {error:?}");
        ensure!(
            client.requests() - before == 1,
            "a drain of 3 nodes took {} requests",
            client.requests() - before
        );
        let before = client.requests();
        let NodeList::Changed { nodes, .. } = client.nodes_since(Some(t)).await? else {
            anyhow::bail!("the list since before the drain says nothing changed");
        };
        println!(
            "the list since, after a drain: {} request(s)",
            client.requests() - before
        );
        let drained = nodes
            .iter()
            .filter(|n| names.contains(&n.name) && n.is_drain() && n.reason == "slurm-operator: batch test");
        ensure!(drained.count() == 3, "{nodes:?}");

        let before = client.requests();
        let (done, error) = client.update_nodes(&names, NodeUpdate::Undrain).await;
        ensure!(error.is_none() && done == names, "undrained {done:?}: {error:?}");
        ensure!(
            client.requests() - before == 1,
            "an undrain of 3 nodes took {} requests",
            client.requests() - before
        );
        let nodes = client.nodes().await?;
        ensure!(
            nodes
                .iter()
                .filter(|n| names.contains(&n.name))
                .all(|n| !n.is_drain()),
            "{nodes:?}"
        );
        Ok(())
    }
    .await;
    h.shutdown().await;
    host.stop().await;
    result
}

/// Nothing listens, or a server accepts and never answers: a clear error within the deadline.
#[tokio::test]
async fn a_slurmrestd_that_does_not_answer_is_an_error_within_the_deadline() -> Result<()> {
    let tokens = || Tokens::new(vec![1], "slurm", Duration::from_secs(900));
    let nowhere = Client::new("http://127.0.0.1:9", tokens(), Duration::from_secs(2))?;
    let r = nowhere.nodes().await;
    ensure!(matches!(r, Err(Error::Unreachable { .. })), "{r:?}");
    // Accepts every connection, reads, never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let client = Client::new(&format!("http://{addr}"), tokens(), Duration::from_secs(2))?;
    // The client's own deadline ends the call (a Timeout error); a hang fails here instead.
    let r = tokio::time::timeout(Duration::from_secs(60), client.nodes())
        .await
        .context("the call hung past its deadline")?;
    silent.abort();
    ensure!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    Ok(())
}

/// A Token's JWT, as a tool such as slurm-exporter reads it from the Secret the host keeps, is
/// accepted by the real slurmrestd; one a Token signs with a key slurmctld does not have is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_slurmrestd_accepts_the_jwt_a_token_keeps_in_its_secret() -> Result<()> {
    let Some(slurm) = slinky_tests::slurm_or_skip() else {
        return Ok(());
    };
    let c = cluster_with_statefulsets().await;
    let (ns, h, host) = start(&c, &slurm, "token", 1).await?;
    let result = async {
        nodes_idle(&h, &["slinky-0"]).await?;
        let other: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "not-slurms-key"},
            "stringData": {"jwt.key": "a key slurmctld never read, 32 bytes"}
        }))?;
        let secrets = Api::<Secret>::namespaced(c.client.clone(), &ns);
        secrets.create(&Default::default(), &other).await?;
        let tokens = Api::<slinky_api::Token>::namespaced(c.client.clone(), &ns);
        for (name, key_ref) in [
            (
                "exporter",
                serde_json::json!({"name": "slurm-auth-jwths256", "key": "jwt_hs256.key"}),
            ),
            (
                "stranger",
                serde_json::json!({"name": "not-slurms-key", "key": "jwt.key"}),
            ),
        ] {
            let token: slinky_api::Token = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"username": "slurm", "jwtKeyRef": key_ref}
            }))?;
            tokens.create(&Default::default(), &token).await?;
        }
        let jwt = |name: &'static str| {
            let secrets = secrets.clone();
            async move {
                let s = secrets.get_opt(name).await.ok()??;
                let v = s.data?.get("SLURM_JWT")?.0.clone();
                String::from_utf8(v).ok()
            }
        };
        let good = slinky_tests::eventually(60, || jwt("exporter-jwt-slurm"))
            .await
            .context("the Token's Secret exporter-jwt-slurm never held SLURM_JWT")?;
        let client = Client::new(
            &h.restapi_url(),
            Tokens::fixed(good, "slurm"),
            Duration::from_secs(5),
        )?;
        let nodes = client.nodes().await?;
        ensure!(
            nodes.iter().any(|n| n.name == "slinky-0"),
            "slurmrestd answered the Token's JWT without the node: {nodes:?}"
        );
        let stranger = slinky_tests::eventually(60, || jwt("stranger-jwt-slurm"))
            .await
            .context("no Secret for the second Token")?;
        let refused = Client::new(
            &h.restapi_url(),
            Tokens::fixed(stranger, "slurm"),
            Duration::from_secs(5),
        )?;
        match refused.nodes().await {
            Err(Error::Unauthorized { .. }) => Ok(()),
            other => anyhow::bail!("a JWT signed with another key: expected Unauthorized, got {other:?}"),
        }
    }
    .await;
    h.shutdown().await;
    host.stop().await;
    result
}
