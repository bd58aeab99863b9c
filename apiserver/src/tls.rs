//! TLS for the embedded API server: a fresh CA and a serving certificate for `127.0.0.1` and
//! `localhost`, generated at start. (kubectl sends bearer tokens over TLS only.)

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        ServerConfig,
        crypto::ring::default_provider,
        pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    },
};

/// The server's TLS material.
pub struct Tls {
    /// The CA certificate (PEM), for kubeconfigs.
    pub ca_pem: String,
    /// The CA certificate (DER), for kube clients.
    pub ca_der: Vec<u8>,
    /// The acceptor serving the certificate signed by the CA.
    pub acceptor: TlsAcceptor,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

/// Generate a CA and a serving certificate.
///
/// # Errors
/// A message when key generation or signing fails.
pub fn generate() -> Result<Tls, String> {
    let err = |e: rcgen::Error| format!("cannot generate the TLS certificate: {e}");
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "slinky-host embedded API server CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::from_params(&ca, &ca_key);
    let leaf_key = KeyPair::generate().map_err(err)?;
    let mut leaf =
        CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).map_err(err)?;
    leaf.distinguished_name
        .push(DnType::CommonName, "slinky-host embedded API server");
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(err)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let mut config = ServerConfig::builder_with_provider(Arc::new(default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?
        .with_no_client_auth()
        .with_single_cert(vec![CertificateDer::from(leaf_cert.der().to_vec())], key)
        .map_err(|e| format!("TLS configuration: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls {
        ca_pem: ca_cert.pem(),
        ca_der: ca_cert.der().to_vec(),
        acceptor: TlsAcceptor::from(Arc::new(config)),
    })
}
