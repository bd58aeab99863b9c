//! The embedded API server alone: write throughput over HTTPS with 200 open watches, and a
//! 10,000-pod list.
//!
//! `cargo bench -p slinky-apiserver --bench throughput` (prints figures; no assertions).

#![allow(clippy::expect_used, reason = "a benchmark aborts on a broken setup")]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api,
    api::{ListParams, PostParams},
};
use serde_json::json;
use slinky_apiserver::{ApiServer, ApiServerConfig};

async fn apiserver_run() -> Result<(), Box<dyn std::error::Error>> {
    let server = ApiServer::start(ApiServerConfig::default()).await?;
    let client = server.client()?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // Watchers that every write fans out to.
    let mut watchers = Vec::new();
    for _ in 0..200 {
        let cms = cms.clone();
        watchers.push(tokio::spawn(async move {
            use futures::StreamExt;
            let stream = cms
                .watch(&kube::api::WatchParams::default().timeout(120), "0")
                .await;
            if let Ok(s) = stream {
                let mut s = s.boxed();
                while s.next().await.is_some() {}
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let n = 4000;
    let t = Instant::now();
    let ids: Vec<usize> = (0..n).collect();
    for chunk in ids.chunks(100) {
        futures::future::try_join_all(chunk.iter().map(|i| {
            let cm: ConfigMap =
                serde_json::from_value(json!({"metadata": {"name": format!("cm-{i}")}, "data": {"k": "v"}}))
                    .expect("cm");
            let cms = cms.clone();
            async move { cms.create(&PostParams::default(), &cm).await }
        }))
        .await?;
    }
    let secs = t.elapsed().as_secs_f64();
    println!(
        "  {n} creates over HTTPS with 200 open watches: {secs:.2} s ({:.0} writes/s)",
        f64::from(n as u32) / secs
    );
    for w in watchers {
        w.abort();
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for chunk in (0..10_000).collect::<Vec<usize>>().chunks(200) {
        futures::future::try_join_all(chunk.iter().map(|i| {
            let pod: Pod = serde_json::from_value(
                json!({"metadata": {"name": format!("p-{i}"), "labels": {"app": "x"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]}}),
            )
            .expect("pod");
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &pod).await }
        }))
        .await?;
    }
    let t = Instant::now();
    let list = pods.list(&ListParams::default()).await?;
    println!(
        "  list of {} pods: {:.0} ms",
        list.items.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    server.shutdown().await;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async {
        println!("embedded API server:");
        apiserver_run().await
    })
}
