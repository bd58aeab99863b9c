//! The Token kind: a JWT for a Slurm user in a Secret the host keeps, signed with the key its
//! `jwtKeyRef` names and refreshed at 80 % of its life; immutable and never refreshed with
//! `refresh: false`; a missing key Secret is a condition and an Event until it appears; a Token
//! without a key is refused by the API server. On the embedded API server, or on the cluster of
//! `SLINKY_TEST_KUBECONFIG` (whose garbage collector deletes the Secret with its Token). A real
//! slurmrestd accepting the token: `tests/slurm_client.rs`.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::{Value, json};
use slinky_api::Token;
use slinky_slurm::jwt;
use slinky_tests::{
    TestCluster, eventually,
    host::{Host, cluster},
};

const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";

async fn key_secret(c: &TestCluster, ns: &str, name: &str, key: &[u8]) -> Result<()> {
    let s = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "jwt_hs256.key".to_string(),
            ByteString(key.to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(c.client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await?;
    Ok(())
}

async fn create_token(c: &TestCluster, ns: &str, name: &str, spec: Value) -> Result<Token> {
    let t: Token =
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {"team": "hpc"}}, "spec": spec}))?;
    Ok(Api::<Token>::namespaced(c.client.clone(), ns)
        .create(&PostParams::default(), &t)
        .await?)
}

/// The claims of the JWT in Secret `name`, key `key`, verified with [`KEY`].
async fn held(c: &TestCluster, ns: &str, name: &str, key: &str) -> Option<(jwt::Claims, Secret)> {
    let s = Api::<Secret>::namespaced(c.client.clone(), ns)
        .get_opt(name)
        .await
        .ok()??;
    let value = String::from_utf8(s.data.as_ref()?.get(key)?.0.clone()).ok()?;
    Some((jwt::verify(KEY, &value)?, s))
}

async fn condition(c: &TestCluster, ns: &str, name: &str, type_: &str) -> Option<(String, String, String)> {
    let t = Api::<Token>::namespaced(c.client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    t.status?
        .conditions
        .into_iter()
        .find(|x| x.type_ == type_)
        .map(|x| (x.status, x.reason, x.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_token_keeps_a_fresh_jwt_in_its_secret() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("token").await;
    key_secret(&c, &ns, "jwt", KEY).await?;
    let host = Host::start(&c, &ns)?;
    let token = create_token(
        &c,
        &ns,
        "exporter",
        json!({"username": "slurm", "lifetime": "10s",
               "jwtKeyRef": {"name": "jwt", "key": "jwt_hs256.key"}}),
    )
    .await?;
    let (first, secret) = eventually(30, || held(&c, &ns, "exporter-jwt-slurm", "SLURM_JWT"))
        .await
        .context("no verified JWT in Secret exporter-jwt-slurm")?;
    assert_eq!(first.sun, "slurm");
    assert_eq!(first.exp - first.iat, 10, "the lifetime asked");
    assert_eq!(
        secret.owner_references().first().map(|o| o.uid.clone()),
        token.uid(),
        "owned by its Token"
    );
    assert_eq!(secret.labels().get("team").map(String::as_str), Some("hpc"));
    assert_ne!(secret.immutable, Some(true));
    let ready = eventually(30, || async {
        let t = Api::<Token>::namespaced(c.client.clone(), &ns)
            .get("exporter")
            .await
            .ok()?;
        let iat = t.status.as_ref()?.issued_at.as_ref()?.0.as_second();
        let ready = condition(&c, &ns, "exporter", "Ready").await?;
        (iat == i64::try_from(first.iat).ok()? && ready.0 == "True").then_some(ready)
    })
    .await
    .context("status.issuedAt is not the token's iat, or Ready is not True")?;
    ensure!(ready.2.contains("exporter-jwt-slurm"), "{ready:?}");
    // At 80 % of its life (8 s) a new token replaces it.
    let refreshed = eventually(30, || async {
        let (c2, _) = held(&c, &ns, "exporter-jwt-slurm", "SLURM_JWT").await?;
        (c2.iat > first.iat).then_some(c2)
    })
    .await
    .context("the token was not refreshed")?;
    ensure!(
        refreshed.iat + 2 <= first.exp,
        "refreshed before it expired: {first:?} → {refreshed:?}"
    );

    // Without refresh: an immutable Secret, named by secretRef.
    create_token(
        &c,
        &ns,
        "bridge",
        json!({"username": "bridge", "refresh": false, "lifetime": "24h",
               "secretRef": {"name": "bridge-token", "key": "token"},
               "jwtHs256KeyRef": {"name": "jwt", "key": "jwt_hs256.key"}}),
    )
    .await?;
    let (claims, secret) = eventually(30, || held(&c, &ns, "bridge-token", "token"))
        .await
        .context("no JWT in Secret bridge-token")?;
    ensure!(
        claims.exp - claims.iat == 86_400 && claims.sun == "bridge",
        "{claims:?}"
    );
    ensure!(
        secret.immutable == Some(true),
        "not immutable: {:?}",
        secret.immutable
    );

    // A key Secret that does not exist: a condition and an Event, then a token once it does.
    create_token(
        &c,
        &ns,
        "early",
        json!({"username": "slurm", "jwtKeyRef": {"name": "later", "key": "jwt_hs256.key"}}),
    )
    .await?;
    let missing = eventually(30, || async {
        let c = condition(&c, &ns, "early", "ReferenceNotFound").await?;
        (c.0 == "True").then_some(c)
    })
    .await
    .context("no ReferenceNotFound condition for a missing key Secret")?;
    ensure!(
        missing.1 == "SecretNotFound" && missing.2.contains("later"),
        "{missing:?}"
    );
    let event = eventually(30, || async {
        let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(c.client.clone(), &ns)
            .list(&ListParams::default())
            .await
            .ok()?;
        events.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("early")
                && e.reason.as_deref() == Some("SecretNotFound")
        })
    })
    .await;
    ensure!(event.is_some(), "no SecretNotFound Event");
    key_secret(&c, &ns, "later", KEY).await?;
    eventually(60, || held(&c, &ns, "early-jwt-slurm", "SLURM_JWT"))
        .await
        .context("no token once the key Secret appeared")?;
    let cleared = eventually(30, || async {
        condition(&c, &ns, "early", "ReferenceNotFound")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    ensure!(cleared.is_some(), "ReferenceNotFound stayed");

    // A lifetime that is no duration: InvalidSpec.
    create_token(
        &c,
        &ns,
        "odd",
        json!({"username": "slurm", "lifetime": "soon", "jwtKeyRef": {"name": "jwt", "key": "jwt_hs256.key"}}),
    )
    .await?;
    let invalid = eventually(30, || condition(&c, &ns, "odd", "InvalidSpec"))
        .await
        .context("no InvalidSpec for lifetime: soon")?;
    ensure!(invalid.2.contains("spec.lifetime"), "{invalid:?}");

    // Deleting the Token deletes its Secret.
    Api::<Token>::namespaced(c.client.clone(), &ns)
        .delete("exporter", &DeleteParams::default())
        .await?;
    let gone = eventually(60, || async {
        let s = Api::<Secret>::namespaced(c.client.clone(), &ns)
            .get_opt("exporter-jwt-slurm")
            .await
            .ok()?;
        s.is_none().then_some(())
    })
    .await;
    ensure!(gone.is_some(), "the Secret outlived its Token");
    host.stop().await;
    Ok(())
}

/// A Token with no key is refused by the API server (the CRD's rule, Slinky's message), and so
/// is a change of its key (Slinky's webhook: another key would sign tokens slurmctld refuses),
/// by either of its names; its other fields change.
#[tokio::test]
async fn a_token_without_a_key_or_changing_its_key_is_refused() -> Result<()> {
    let c = cluster(false).await;
    let ns = c.namespace("token-refused").await;
    create_token(
        &c,
        &ns,
        "keyed",
        json!({"username": "slurm", "jwtHs256KeyRef": {"name": "jwt", "key": "jwt_hs256.key"}}),
    )
    .await?;
    let tokens = Api::<Token>::namespaced(c.client.clone(), &ns);
    let patch = |spec: Value| kube::api::Patch::Merge(json!({"spec": spec}));
    let pp = kube::api::PatchParams::default();
    for change in [
        json!({"jwtHs256KeyRef": {"name": "other"}}),
        json!({"jwtHs256KeyRef": {"key": "other.key"}}),
        json!({"jwtHs256KeyRef": null, "jwtKeyRef": {"name": "other", "key": "jwt_hs256.key"}}),
    ] {
        match tokens.patch("keyed", &pp, &patch(change.clone())).await {
            Ok(_) => bail!("{change} was accepted"),
            Err(e) => ensure!(
                e.to_string().contains("cannot be modified after deployment"),
                "{change}: {e}"
            ),
        }
    }
    // The same key under its newer name, and another lifetime: accepted.
    tokens
        .patch(
            "keyed",
            &pp,
            &patch(json!({"jwtHs256KeyRef": null, "lifetime": "1h",
                          "jwtKeyRef": {"name": "jwt", "key": "jwt_hs256.key"}})),
        )
        .await?;
    match create_token(&c, &ns, "nokey", json!({"username": "slurm"})).await {
        Ok(_) => bail!("a Token without jwtKeyRef was accepted"),
        Err(e) => {
            let text = format!("{e:#}");
            ensure!(text.contains("jwtKeyRef or jwtHs256KeyRef must be set"), "{text}");
        }
    }
    Ok(())
}
