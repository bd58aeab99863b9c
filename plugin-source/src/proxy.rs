//! Registries through an HTTP proxy, as the environment of a pod behind one names it
//! (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`, in either case, curl's rules): each
//! connection to a registry (and its token realm and blob store) that the proxy settings
//! intercept is a `CONNECT` tunnel through the proxy, with its credentials (`http://user:pass@…`)
//! as `Proxy-Authorization`; TLS to the registry runs inside the tunnel, end to end.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::Uri;
use hyper_util::{
    client::{
        legacy::connect::{HttpConnector, proxy::Tunnel},
        proxy::matcher::Matcher,
    },
    rt::TokioIo,
};
use tokio::net::TcpStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Which proxy, if any, each registry is reached through.
#[derive(Clone)]
pub struct Proxies(Arc<Matcher>);

impl Proxies {
    /// The environment's (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`).
    pub fn from_env() -> Proxies {
        Proxies(Arc::new(Matcher::from_env()))
    }

    /// Every registry through `proxy` (`http://[user:pass@]host:port`) but the hosts of
    /// `no_proxy` (`NO_PROXY`'s syntax: names, `.domain`s, addresses, CIDRs, `*`).
    pub fn through(proxy: &str, no_proxy: &str) -> Proxies {
        Proxies(Arc::new(Matcher::builder().all(proxy).no(no_proxy).build()))
    }

    /// The proxy a connection to `dst` goes through (without its credentials), if any: what the
    /// host logs.
    pub fn route(&self, dst: &Uri) -> Option<String> {
        self.0.intercept(dst).map(|i| shown(i.uri()))
    }
}

/// A proxy's URL as errors and logs show it: without its credentials.
pub fn shown(uri: &Uri) -> String {
    format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("http"),
        uri.authority()
            .map_or("", |a| a.as_str().rsplit('@').next().unwrap_or(""))
    )
}

/// A connector opening plain TCP connections, direct or tunnelled through the proxy
/// [`Proxies`] names for the destination.
#[derive(Clone)]
pub(crate) struct ProxyConnector {
    http: HttpConnector,
    proxies: Proxies,
}

impl ProxyConnector {
    pub(crate) fn new(proxies: Proxies) -> ProxyConnector {
        let mut http = HttpConnector::new();
        // The TLS layer above asks for `https` destinations too.
        http.enforce_http(false);
        ProxyConnector { http, proxies }
    }
}

impl tower::Service<Uri> for ProxyConnector {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let Some(intercept) = self.proxies.0.intercept(&dst) else {
            let connecting = self.http.call(dst);
            return Box::pin(async move { connecting.await.map_err(Into::into) });
        };
        let proxy = shown(intercept.uri());
        // The tunnel reaches the proxy over plain TCP: an https:// or socks proxy would get a
        // CONNECT (and the credentials) in the clear, or not understand it.
        if intercept.uri().scheme_str() != Some("http") {
            return Box::pin(async move {
                Err(format!("proxy {proxy}: only an http:// proxy is supported (CONNECT tunnels)").into())
            });
        }
        let target = dst.authority().map(ToString::to_string).unwrap_or_default();
        let mut tunnel = Tunnel::new(intercept.uri().clone(), self.http.clone());
        if let Some(auth) = intercept.basic_auth() {
            tunnel = tunnel.with_auth(auth.clone());
        }
        // The tunnel's default port is 443; a plain-HTTP registry without one is on 80.
        let dst = match (dst.port(), dst.scheme_str(), dst.host()) {
            (None, Some("http"), Some(host)) => Uri::builder()
                .scheme("http")
                .authority(format!("{host}:80"))
                .path_and_query("/")
                .build(),
            _ => Ok(dst),
        };
        Box::pin(async move {
            tunnel.call(dst?).await.map_err(|e| {
                format!(
                    "through proxy {proxy} to {target}: {}",
                    crate::error::with_causes(&e)
                )
                .into()
            })
        })
    }
}
