//! The pod builder behind a loopback HTTP/JSON webhook, as Metacontroller calls its hooks: a
//! server thread building pods natively ([`spawn_hook_server`]) and the timed client ([`webhook`]),
//! the contestant the Wasm calls are compared with.

use std::time::{Duration, Instant};

use slinky_api::{Controller, NodeSet};

use super::median;

/// Serves build-pod hooks on `listener` from a thread of its own (a task per connection): the
/// native builder, the NodeSet, Controller and identity in as JSON, the pod out as JSON.
fn spawn_hook_server(listener: std::net::TcpListener) {
    use http_body_util::{BodyExt, Full};
    use hyper::{Request, Response, body::Incoming, service::service_fn};
    use hyper_util::rt::TokioIo;

    #[derive(serde::Deserialize)]
    struct Hook {
        nodeset: NodeSet,
        controller: Controller,
        ordinal: u32,
        name: String,
        hostname: String,
        revision: String,
    }

    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let svc = service_fn(|req: Request<Incoming>| async move {
                        let body = req.into_body().collect().await?.to_bytes();
                        let hook: Hook = serde_json::from_slice(&body).expect("hook request");
                        let id = slinky_guest_sdk::PodIdentity {
                            ordinal: hook.ordinal,
                            name: hook.name,
                            hostname: hook.hostname,
                            revision: hook.revision,
                        };
                        let pod = slinky_guest_sdk::slinky::build_nodeset_pod(
                            &slinky_guest_sdk::BuildContext::default(),
                            &hook.nodeset,
                            &hook.controller,
                            &id,
                        )
                        .expect("build");
                        let json = serde_json::to_vec(&pod).expect("json");
                        Ok::<_, hyper::Error>(Response::new(Full::new(bytes::Bytes::from(json))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
    });
}

/// The same builder natively behind a loopback HTTP/1.1 webhook (one keep-alive connection): the
/// median round trip of `n` requests carrying the NodeSet, Controller and identity as JSON.
pub(crate) fn webhook(
    n: usize,
    ns_json: &str,
    ctl_json: &str,
    identity: &slinky_guest_sdk::PodIdentity,
) -> Duration {
    use http_body_util::{BodyExt, Full};
    use hyper::Request;
    use hyper_util::rt::TokioIo;

    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    listener.set_nonblocking(true).expect("nonblocking");
    spawn_hook_server(listener);
    let body = format!(
        r#"{{"nodeset":{ns_json},"controller":{ctl_json},"ordinal":{},"name":"{}","hostname":"{}","revision":"{}"}}"#,
        identity.ordinal, identity.name, identity.hostname, identity.revision
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("handshake");
        tokio::spawn(conn);
        let mut times = Vec::with_capacity(n);
        for i in 0..n + 50 {
            let req = Request::post("/build-pod")
                .header(hyper::header::HOST, "bench")
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(bytes::Bytes::from(body.clone())))
                .expect("request");
            let t = Instant::now();
            let resp = sender.send_request(req).await.expect("send");
            let out = resp.into_body().collect().await.expect("body").to_bytes();
            std::hint::black_box(String::from_utf8_lossy(&out).len());
            if i >= 50 {
                times.push(t.elapsed());
            }
        }
        median(times)
    })
}
