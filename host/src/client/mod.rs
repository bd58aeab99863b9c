//! The host's Kubernetes client: kube's, but speaking HTTP/2 where the API server does (as
//! client-go does), and counting its requests.
//!
//! kube-rs builds an HTTP/1.1-only client: every request in flight holds a TCP connection and a
//! TLS session of its own, and each watch one more. A scale-up creating hundreds of pods at once
//! opened hundreds of TLS connections (each a handshake on both sides, and buffers kept in the
//! pool afterwards). Here the TLS connector offers `h2` and `http/1.1` by ALPN: a kube-apiserver
//! picks HTTP/2 and every request and watch shares one connection (flow-control windows as
//! client-go's: 4 MiB a stream, 1 GiB the connection, so no watch stalls another); a server that
//! speaks HTTP/1.1 only (the embedded one) is served as before. HTTP/2 keep-alive pings (every
//! 30 s, 15 s to answer; client-go's health check) find a dead connection, so a watch on it fails
//! and is re-established instead of hanging.
//!
//! Otherwise the stack is kube's: the base URI, the authentication of the kubeconfig (tokens,
//! refreshed exec credentials, client certificates), its extra headers, its TLS settings
//! (`tls-server-name` included) and connect timeout. Proxies are refused with a
//! clear error (kube's own client needs a feature for them that the host does not enable).
//!
//! Pod watches are asked for in protobuf, as kcm's informers ask, and handed to kube's watcher
//! as JSON lines (see [`protobuf_watch`]).

mod protobuf_watch;

pub use protobuf_watch::events_in_protobuf;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use hyper_util::{
    client::legacy::connect::HttpConnector,
    rt::{TokioExecutor, TokioTimer},
};
use kube::client::{Body, ClientBuilder, ConfigExt};
use tower::{BoxError, ServiceBuilder};

/// Why a client could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig's TLS or authentication settings are unusable.
    #[error("cannot configure the Kubernetes client: {0}")]
    Config(#[from] kube::Error),
    /// The kubeconfig names a proxy (`proxy-url`): the host's client does not go through
    /// proxies.
    #[error(
        "the kubeconfig names proxy-url {0}: slinky-host reaches the API server directly (drop proxy-url; \
         HTTPS_PROXY is for registries only)"
    )]
    Proxy(String),
    /// The kubeconfig's `tls-server-name` is not a valid DNS name or IP address.
    #[error("tls-server-name {0:?} is not a valid DNS name or IP address")]
    ServerName(String),
}

/// API requests a client made, by verb and resource (`slinky_host_api_requests_total`).
#[derive(Debug, Default)]
pub struct ApiRequests {
    counts: Mutex<BTreeMap<(String, String), u64>>,
}

impl ApiRequests {
    fn record(&self, method: &http::Method, path: &str) {
        let verb = method.as_str().to_ascii_lowercase();
        let key = (verb, resource_of(path).to_string());
        if let Ok(mut counts) = self.counts.lock() {
            *counts.entry(key).or_default() += 1;
        }
    }

    /// Every count: ((verb, resource), n).
    pub fn snapshot(&self) -> BTreeMap<(String, String), u64> {
        self.counts.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Requests so far.
    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    /// Requests of `verb` (lower-case HTTP method) on `resource` so far.
    pub fn get(&self, verb: &str, resource: &str) -> u64 {
        self.counts
            .lock()
            .ok()
            .and_then(|c| c.get(&(verb.to_string(), resource.to_string())).copied())
            .unwrap_or(0)
    }
}

/// The resource a request's path names (`pods`, `nodesets/status`), or `other` (discovery,
/// `/version`).
fn resource_of(path: &str) -> String {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    // /api/v1/… or /apis/GROUP/VERSION/…
    let rest = match segments.as_slice() {
        ["api", _version, rest @ ..] => rest,
        ["apis", _group, _version, rest @ ..] => rest,
        _ => return "other".into(),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] if !rest.is_empty() => rest,
        other => other,
    };
    match rest {
        [] => "other".into(),
        [resource] | [resource, _] => (*resource).to_string(),
        [resource, _, sub, ..] => format!("{resource}/{sub}"),
    }
}

/// A client of `config`'s API server, speaking HTTP/2 where it can; its requests are counted
/// into `requests`.
///
/// # Errors
/// The kubeconfig's TLS or authentication settings are unusable.
pub fn client(mut config: kube::Config, requests: Arc<ApiRequests>) -> Result<kube::Client, ClientError> {
    if let Some(proxy) = config.proxy_url.take() {
        // kube reads HTTPS_PROXY into a kubeconfig's proxy: that one is the registries' (the
        // in-cluster client never takes it), only a kubeconfig's own proxy-url is refused.
        let from_env = ["HTTPS_PROXY", "https_proxy"].iter().any(|v| {
            std::env::var(v)
                .ok()
                .and_then(|e| e.parse::<http::Uri>().ok())
                .is_some_and(|e| e == proxy)
        });
        if !from_env {
            return Err(ClientError::Proxy(
                slinky_plugin_source::proxy_without_credentials(&proxy),
            ));
        }
        tracing::debug!("HTTPS_PROXY is for registries: the API server is reached directly");
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let tls = config.rustls_client_config()?;
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    // The kubeconfig's `tls-server-name`: SNI and the certificate check use it, not the URL's host.
    let builder = match &config.tls_server_name {
        Some(name) => builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            name.clone()
                .try_into()
                .map_err(|_| ClientError::ServerName(name.clone()))?,
        )),
        None => builder,
    };
    let connector = builder.enable_http1().enable_http2().wrap_connector(http);
    // The connect timeout bounds the TLS handshake too (kube's own client does the same).
    let mut connector = hyper_timeout::TimeoutConnector::new(connector);
    connector.set_connect_timeout(config.connect_timeout);
    let hyper = hyper_util::client::legacy::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_timeout(Duration::from_secs(15))
        .http2_keep_alive_while_idle(true)
        .http2_initial_stream_window_size(4 << 20)
        .http2_initial_connection_window_size(1 << 30)
        .build::<_, Body>(connector);
    let default_ns = config.default_namespace.clone();
    // kube's layers, in kube's order, but for its retry of 429/503/504: a retried write could
    // land after this replica lost its Lease (a resilience test saw a status write do so).
    let service = ServiceBuilder::new()
        .map_request(move |req: http::Request<Body>| {
            requests.record(req.method(), req.uri().path());
            req
        })
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_request(protobuf_watch::ask)
        .map_response(protobuf_watch::answer)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(ClientBuilder::new(service, default_ns).build())
}

#[cfg(test)]
mod tests {
    use super::resource_of;

    #[test]
    fn resources_are_named_from_paths() {
        for (path, want) in [
            ("/api/v1/namespaces/slurm/pods", "pods"),
            ("/api/v1/namespaces/slurm/pods/slurm-worker-0", "pods"),
            ("/api/v1/pods", "pods"),
            ("/api/v1/namespaces/slurm", "namespaces"),
            (
                "/apis/slinky.slurm.net/v1beta1/namespaces/slurm/nodesets/a/status",
                "nodesets/status",
            ),
            (
                "/apis/apps/v1/namespaces/s/statefulsets/x/scale",
                "statefulsets/scale",
            ),
            ("/api/v1/nodes", "nodes"),
            ("/version", "other"),
            ("/apis", "other"),
            ("/apis/apps/v1", "other"),
        ] {
            assert_eq!(resource_of(path), want, "{path}");
        }
    }
}
