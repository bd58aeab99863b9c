//! A registry that answers as an attacker would: a 10 MiB error body (copied into the error, an
//! Event and a status, it would cost the host that memory each retry), a redirect to plain HTTP
//! elsewhere (a downgrade, and a way to make the host fetch internal URLs), and a token realm on
//! another plain-HTTP host. The client quotes a short excerpt and follows neither.

use std::net::SocketAddr;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use slinky_plugin_source::{DigestStore, Oci, Reference};

/// Serve every connection with `answer` (the raw HTTP response), reading the request first.
async fn serve(answer: Vec<u8>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let addr = listener.local_addr().unwrap_or_else(|e| panic!("addr: {e}"));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(&answer).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

fn pinned(addr: SocketAddr) -> Reference {
    Reference::parse(&format!("{addr}/site/gpu@sha256:{}", "0".repeat(64)))
        .unwrap_or_else(|e| panic!("reference: {e}"))
}

fn client() -> Oci {
    Oci::new(DigestStore::new(None), Vec::new()).unwrap_or_else(|e| panic!("client: {e}"))
}

#[tokio::test]
async fn a_huge_error_body_is_quoted_as_a_short_excerpt() {
    let body = vec![b'E'; 10 << 20];
    let mut answer = format!(
        "HTTP/1.1 500 Internal Server Error\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    let addr = serve(answer).await;
    let e = client()
        .pull(&pinned(addr))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("500"), "{e}");
    assert!(e.len() < 1000, "the error quotes {} bytes", e.len());
}

#[tokio::test]
async fn a_redirect_to_plain_http_elsewhere_is_not_followed() {
    let target = serve(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}".to_vec()).await;
    // Another host (by name) over plain HTTP: a downgrade for a real registry.
    let location = format!("http://localhost:{}/internal", target.port());
    let addr = serve(
        format!("HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n")
            .into_bytes(),
    )
    .await;
    let e = client()
        .pull(&pinned(addr))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("not followed"), "{e}");
}

#[tokio::test]
async fn a_token_realm_on_another_plain_host_is_not_asked() {
    let addr = serve(
        b"HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Bearer realm=\"http://localhost:9/token\",service=\"r\",scope=\"repository:site/gpu:pull\"\r\ncontent-length: 0\r\n\r\n"
            .to_vec(),
    )
    .await;
    let e = client()
        .pull(&pinned(addr))
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("token realm") && e.contains("not followed"), "{e}");
}
