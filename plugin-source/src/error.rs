//! What can go wrong fetching a module or checking it.

/// What can go wrong talking to a registry or checking what it sent.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference does not parse.
    #[error("{0:?} is not an OCI reference like registry.example.com/site/plugin@sha256:<64 hex>: {1}")]
    Reference(String, &'static str),
    /// An HTTP request failed.
    #[error("{method} {url}: {reason}")]
    Http {
        /// The method.
        method: &'static str,
        /// The URL.
        url: String,
        /// Why.
        reason: String,
    },
    /// The registry sent something that is not what was asked for.
    #[error("{0}")]
    Content(String),
    /// The artifact the digest pins is not a plugin (no or several `application/wasm` layers, not
    /// JSON): it never will be, so it is not fetched again until the reference changes.
    #[error("{0}")]
    NotAPlugin(String),
    /// The signature is missing or does not verify.
    #[error("signature: {0}")]
    Signature(String),
    /// A key does not parse.
    #[error("key: {0}")]
    Key(String),
    /// The registry credentials cannot be read or parsed.
    #[error("registry credentials: {0}")]
    Credentials(String),
}

/// An error with its causes (a connection error says only "client error (Connect)" by itself).
pub(crate) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
