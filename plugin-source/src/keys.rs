//! ECDSA P-256 keys in cosign's formats: the public key signatures verify with (`cosign.pub`),
//! the signing key `plugin push --sign-key` signs with.

use base64::Engine as _;
use ring::signature::{self, KeyPair};

use crate::OciError;

/// The fixed DER prefix of a P-256 SubjectPublicKeyInfo (id-ecPublicKey, prime256v1), before the
/// 65-byte uncompressed point.
const P256_SPKI_PREFIX: [u8; 26] = [
    0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86,
    0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00,
];

fn pem_body(pem: &str, label: &str) -> Result<Vec<u8>, OciError> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = pem
        .find(&begin)
        .ok_or_else(|| OciError::Key(format!("no {begin} block")))?
        + begin.len();
    let stop = pem[start..]
        .find(&end)
        .ok_or_else(|| OciError::Key(format!("no {end}")))?
        + start;
    let b64: String = pem[start..stop].split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| OciError::Key(format!("the {label} block is not base64: {e}")))
}

/// An ECDSA P-256 public key (cosign's `cosign.pub`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub(crate) point: Vec<u8>,
}

impl PublicKey {
    /// Parse a PEM `PUBLIC KEY` (P-256 SubjectPublicKeyInfo).
    ///
    /// # Errors
    /// [`OciError::Key`] when it is not one.
    pub fn from_pem(pem: &str) -> Result<PublicKey, OciError> {
        let der = pem_body(pem, "PUBLIC KEY")?;
        match der.strip_prefix(&P256_SPKI_PREFIX[..]) {
            Some(point) if point.len() == 65 && point[0] == 4 => Ok(PublicKey {
                point: point.to_vec(),
            }),
            _ => Err(OciError::Key(
                "not an ECDSA P-256 public key (cosign's keys are; `slinky-host plugin keygen` makes one)"
                    .into(),
            )),
        }
    }

    /// As PEM.
    pub fn to_pem(&self) -> String {
        let mut der = P256_SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.point);
        pem_wrap("PUBLIC KEY", &der)
    }
}

fn pem_wrap(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .filter_map(|c| std::str::from_utf8(c).ok())
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

/// An ECDSA P-256 signing key (PKCS#8, PEM `PRIVATE KEY`, as `slinky-host plugin keygen` or
/// `openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256` writes it).
pub struct SigningKey {
    pair: signature::EcdsaKeyPair,
    rng: ring::rand::SystemRandom,
}

impl SigningKey {
    /// Parse a PEM `PRIVATE KEY`.
    ///
    /// # Errors
    /// [`OciError::Key`] when it is not a P-256 PKCS#8 key.
    pub fn from_pem(pem: &str) -> Result<SigningKey, OciError> {
        let der = pem_body(pem, "PRIVATE KEY")?;
        let rng = ring::rand::SystemRandom::new();
        let pair =
            signature::EcdsaKeyPair::from_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &der, &rng)
                .map_err(|e| OciError::Key(format!("not an ECDSA P-256 PKCS#8 private key: {e}")))?;
        Ok(SigningKey { pair, rng })
    }

    /// A new key pair: (private key PEM, public key PEM).
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn generate() -> Result<(String, String), OciError> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = signature::EcdsaKeyPair::generate_pkcs8(&signature::ECDSA_P256_SHA256_ASN1_SIGNING, &rng)
            .map_err(|e| OciError::Key(format!("cannot generate a key: {e}")))?;
        let key = SigningKey::from_pem(&pem_wrap("PRIVATE KEY", pkcs8.as_ref()))?;
        Ok((pem_wrap("PRIVATE KEY", pkcs8.as_ref()), key.public().to_pem()))
    }

    /// Its public key.
    pub fn public(&self) -> PublicKey {
        PublicKey {
            point: self.pair.public_key().as_ref().to_vec(),
        }
    }

    pub(crate) fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, OciError> {
        self.pair
            .sign(&self.rng, payload)
            .map(|s| s.as_ref().to_vec())
            .map_err(|e| OciError::Key(format!("cannot sign: {e}")))
    }
}
