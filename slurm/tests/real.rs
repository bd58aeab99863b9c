//! Against a real slurmrestd: `SLINKY_TEST_SLURMRESTD=http://HOST:6820` and
//! `SLINKY_TEST_JWT_KEY=PATH` (the jwt.key slurmctld reads), with at least one node registered.
//! Without them the test says why it skips. (The host's end-to-end Slurm tests in `tests/`
//! start their own Slurm.)

use std::time::Duration;

use slinky_slurm::{Client, Error, jwt::Tokens};

fn target() -> Option<(String, Vec<u8>)> {
    let url = std::env::var("SLINKY_TEST_SLURMRESTD").ok()?;
    let key = std::fs::read(std::env::var("SLINKY_TEST_JWT_KEY").ok()?).ok()?;
    Some((url, key))
}

#[tokio::test]
async fn a_real_slurmrestd_answers_the_hosts_tokens_and_drains() -> Result<(), Error> {
    let Some((url, key)) = target() else {
        eprintln!(
            "skipping: set SLINKY_TEST_SLURMRESTD and SLINKY_TEST_JWT_KEY to run against a real slurmrestd"
        );
        return Ok(());
    };
    let client = Client::new(
        &url,
        Tokens::new(key, "slurm", Duration::from_secs(900)),
        Duration::from_secs(5),
    )?;
    let version = client.version().await?;
    assert_eq!(version, "v0.0.43", "Slurm 25.05 serves v0.0.43");
    let pings = client.ping().await?;
    assert!(
        slinky_slurm::in_control(&pings).is_some_and(|p| p.mode == "primary"),
        "{pings:?}"
    );
    let nodes = client.nodes().await?;
    let Some(node) = nodes.first() else {
        panic!("no node registered");
    };
    client.drain(&node.name, "slurm-operator: test drain").await?;
    let drained = client.nodes().await?.into_iter().find(|n| n.name == node.name);
    assert!(
        drained
            .as_ref()
            .is_some_and(|n| n.is_drain() && n.reason_is_ours()),
        "{drained:?}"
    );
    client.undrain(&node.name).await?;
    let undrained = client.nodes().await?.into_iter().find(|n| n.name == node.name);
    assert!(undrained.as_ref().is_some_and(|n| !n.is_drain()), "{undrained:?}");
    // A token signed with another key is refused, with a message saying what to check.
    let wrong = Client::new(
        &url,
        Tokens::new(b"wrong".to_vec(), "slurm", Duration::from_secs(900)),
        Duration::from_secs(5),
    )?;
    match wrong.nodes().await {
        Err(e @ Error::Unauthorized { .. }) => assert!(e.to_string().contains("jwtKeyRef")),
        other => panic!("expected Unauthorized, got {other:?}"),
    }
    // Nothing listens: a clear error within the deadline, never a hang.
    let nowhere = Client::new(
        "http://127.0.0.1:9",
        Tokens::new(vec![1], "slurm", Duration::from_secs(900)),
        Duration::from_secs(2),
    )?;
    assert!(matches!(nowhere.nodes().await, Err(Error::Unreachable { .. })));
    Ok(())
}
