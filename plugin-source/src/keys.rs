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

/// The bodies of every `label` block of `pem`, in order.
fn pem_bodies(pem: &str, label: &str) -> Result<Vec<Vec<u8>>, OciError> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut out = Vec::new();
    let mut rest = pem;
    while let Some(at) = rest.find(&begin) {
        let start = at + begin.len();
        let stop = rest[start..]
            .find(&end)
            .ok_or_else(|| OciError::Key(format!("block {} has no {end}", out.len() + 1)))?
            + start;
        let b64: String = rest[start..stop].split_whitespace().collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| OciError::Key(format!("{label} block {} is not base64: {e}", out.len() + 1)))?;
        out.push(der);
        rest = &rest[stop + end.len()..];
    }
    if out.is_empty() {
        return Err(OciError::Key(format!("no {begin} block")));
    }
    Ok(out)
}

fn pem_body(pem: &str, label: &str) -> Result<Vec<u8>, OciError> {
    pem_bodies(pem, label)?
        .into_iter()
        .next()
        .ok_or_else(|| OciError::Key(format!("no {label} block")))
}

/// The ECDSA P-256 public keys a signature may verify with (cosign's `cosign.pub`): one, or
/// several while a key is rotated (the PEM blocks of the old and the new key, one after the
/// other: a module signed with either verifies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub(crate) points: Vec<Vec<u8>>,
}

impl PublicKey {
    /// Parse every PEM `PUBLIC KEY` block (P-256 SubjectPublicKeyInfo) of `pem`.
    ///
    /// # Errors
    /// [`OciError::Key`] when there is none or one is not a P-256 key, naming which.
    pub fn from_pem(pem: &str) -> Result<PublicKey, OciError> {
        let points = pem_bodies(pem, "PUBLIC KEY")?
            .into_iter()
            .enumerate()
            .map(|(i, der)| match der.strip_prefix(&P256_SPKI_PREFIX[..]) {
                Some(point) if point.len() == 65 && point[0] == 4 => Ok(point.to_vec()),
                _ => Err(OciError::Key(format!(
                    "PUBLIC KEY block {} is not an ECDSA P-256 public key (cosign's keys are; `slinky-host \
                     plugin keygen` makes one)",
                    i + 1
                ))),
            })
            .collect::<Result<_, _>>()?;
        Ok(PublicKey { points })
    }

    /// How many keys the set has.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// Whether the set has no key (never: parsing refuses that).
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// As PEM, one block per key.
    pub fn to_pem(&self) -> String {
        self.points
            .iter()
            .map(|point| {
                let mut der = P256_SPKI_PREFIX.to_vec();
                der.extend_from_slice(point);
                pem_wrap("PUBLIC KEY", &der)
            })
            .collect()
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
            points: vec![self.pair.public_key().as_ref().to_vec()],
        }
    }

    /// A signature of `bytes` as `cosign sign-blob --key --output-signature` writes it (base64
    /// ASN.1 DER ECDSA P-256 over SHA-256), for a ConfigMap module's `<key>.sig`.
    ///
    /// # Errors
    /// The system's random source failed.
    pub fn sign_blob(&self, bytes: &[u8]) -> Result<String, OciError> {
        Ok(base64::engine::general_purpose::STANDARD.encode(self.sign(bytes)?))
    }

    pub(crate) fn sign(&self, payload: &[u8]) -> Result<Vec<u8>, OciError> {
        self.pair
            .sign(&self.rng, payload)
            .map(|s| s.as_ref().to_vec())
            .map_err(|e| OciError::Key(format!("cannot sign: {e}")))
    }
}
