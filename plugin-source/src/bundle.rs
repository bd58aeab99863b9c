//! Sigstore bundles (v0.3), as cosign 3 makes them with a key (`--new-bundle-format`, its
//! default):
//! * `cosign sign --key` attaches to a manifest an OCI 1.1 **referrer**: a manifest whose
//!   `subject` is the signed manifest, `artifactType` and one layer of media type
//!   [`BUNDLE_TYPE`]; the bundle's `dsseEnvelope` signs (DSSE, `application/vnd.in-toto+json`) an
//!   in-toto Statement v1 whose subject is the manifest digest and whose predicate type is
//!   [`SIGN_PREDICATE`] (cosign's `signDigestBundle`).
//! * `cosign sign-blob --key --bundle FILE` writes a bundle whose `messageSignature` signs the
//!   blob's bytes (ECDSA P-256 over SHA-256, ASN.1 DER) and names their SHA-256.
//!
//! Trust is the configured key's, as `cosign verify --key --insecure-ignore-tlog` verifies:
//! transparency-log entries and timestamps in a bundle are neither needed nor checked.

use base64::Engine as _;
use ring::signature;
use serde_json::Value;

use crate::PublicKey;

/// A Sigstore bundle v0.3's media type: the referrer's `artifactType` and its layer's.
pub(crate) const BUNDLE_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The predicate type of cosign 3's image signature (a Statement of any other type is an
/// attestation: it says something about the image, it does not sign it).
pub(crate) const SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";
/// The DSSE payload type of an in-toto Statement.
const IN_TOTO: &str = "application/vnd.in-toto+json";
const STATEMENTS: [&str; 2] = [
    "https://in-toto.io/Statement/v1",
    "https://in-toto.io/Statement/v0.1",
];

/// Whether `media_type` is a Sigstore bundle's (v0.3 in either spelling the spec allows).
pub(crate) fn is_bundle_type(media_type: &str) -> bool {
    media_type == BUNDLE_TYPE || media_type == "application/vnd.dev.sigstore.bundle+json;version=0.3"
}

/// Whether a signature text is a bundle (JSON) rather than a bare base64 signature.
pub(crate) fn is_bundle(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

fn parse(bundle: &[u8]) -> Result<Value, String> {
    let b: Value = serde_json::from_slice(bundle).map_err(|e| format!("the bundle is not JSON: {e}"))?;
    let media = b["mediaType"].as_str().unwrap_or_default();
    if !media.starts_with("application/vnd.dev.sigstore.bundle") {
        return Err(format!(
            "not a Sigstore bundle (mediaType {media:?}; cosign 3 writes {BUNDLE_TYPE:?})"
        ));
    }
    Ok(b)
}

fn b64(field: &str, text: &Value) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::STANDARD
        .decode(text.as_str().unwrap_or_default())
        .map_err(|e| format!("the bundle's {field} is not base64: {e}"))
}

fn verifies(key: &PublicKey, message: &[u8], sig: &[u8]) -> bool {
    key.points.iter().any(|point| {
        signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_ASN1, point)
            .verify(message, sig)
            .is_ok()
    })
}

fn other_key(key: &PublicKey) -> String {
    format!(
        "the bundle's signature does not verify with the configured key{} (signed with another key, or altered)",
        if key.points.len() > 1 { "s" } else { "" }
    )
}

/// Check a blob's bundle (`cosign sign-blob --key --bundle`): its `messageSignature` verifies
/// over `bytes` with one of `key`'s keys, and the digest it names (when it names one) is theirs.
pub(crate) fn check_blob_bundle(key: &PublicKey, bundle: &[u8], bytes: &[u8]) -> Result<(), String> {
    let b = parse(bundle)?;
    let m = &b["messageSignature"];
    if m.is_null() {
        return Err(if b["dsseEnvelope"].is_null() {
            "the bundle has no messageSignature".to_string()
        } else {
            "the bundle is an attestation (a DSSE envelope), not a signature of the module: sign it with \
             `cosign sign-blob --key cosign.key --bundle plugin.wasm.sig plugin.wasm`"
                .to_string()
        });
    }
    let digest = &m["messageDigest"];
    if !digest.is_null() {
        let algorithm = digest["algorithm"].as_str().unwrap_or_default();
        if algorithm != "SHA2_256" {
            return Err(format!(
                "the bundle's message digest is {algorithm:?}; a P-256 key signs SHA2_256"
            ));
        }
        let named = b64("messageDigest", &digest["digest"])?;
        if named != sha2_256(bytes) {
            return Err(
                "the bundle signs other bytes (its messageDigest is not the module's sha256: sign the \
                        uncompressed component)"
                    .to_string(),
            );
        }
    }
    let sig = b64("signature", &m["signature"])?;
    if verifies(key, bytes, &sig) {
        Ok(())
    } else {
        Err(other_key(key))
    }
}

fn sha2_256(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).to_vec()
}

/// DSSE's pre-authentication encoding, what a DSSE signature signs.
pub(crate) fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!("DSSEv1 {} {payload_type} {} ", payload_type.len(), payload.len()).into_bytes();
    out.extend_from_slice(payload);
    out
}

/// Check a manifest's bundle (`cosign sign --key`, cosign 3): its DSSE envelope verifies with
/// one of `key`'s keys, and signs a Statement of cosign's signature type whose subject is
/// `manifest_digest`.
pub(crate) fn check_manifest_bundle(
    key: &PublicKey,
    bundle: &[u8],
    manifest_digest: &str,
) -> Result<(), String> {
    let b = parse(bundle)?;
    let envelope = &b["dsseEnvelope"];
    if envelope.is_null() {
        return Err("the bundle has no DSSE envelope (cosign 3 signs an image with one)".to_string());
    }
    let payload_type = envelope["payloadType"].as_str().unwrap_or_default();
    if payload_type != IN_TOTO {
        return Err(format!(
            "the bundle's envelope holds {payload_type:?}, not an in-toto Statement"
        ));
    }
    let payload = b64("payload", &envelope["payload"])?;
    let signed = pae(payload_type, &payload);
    let mut any = false;
    for s in envelope["signatures"]
        .as_array()
        .into_iter()
        .flatten()
        .take(crate::MAX_SIGNATURES)
    {
        any |= verifies(key, &signed, &b64("signature", &s["sig"])?);
    }
    if !any {
        return Err(other_key(key));
    }
    let statement: Value =
        serde_json::from_slice(&payload).map_err(|e| format!("the signed Statement is not JSON: {e}"))?;
    let kind = statement["_type"].as_str().unwrap_or_default();
    if !STATEMENTS.contains(&kind) {
        return Err(format!(
            "the signed payload is a {kind:?}, not an in-toto Statement"
        ));
    }
    let predicate = statement["predicateType"].as_str().unwrap_or_default();
    if predicate != SIGN_PREDICATE {
        return Err(format!(
            "a valid bundle is an attestation of {predicate:?}, not a signature ({SIGN_PREDICATE}): an \
             attestation says something about the artifact, it does not vouch for it (`cosign sign --key`)"
        ));
    }
    let hex = manifest_digest.trim_start_matches("sha256:");
    let names: Vec<&str> = statement["subject"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["digest"]["sha256"].as_str())
        .collect();
    if names.contains(&hex) {
        Ok(())
    } else {
        Err(format!(
            "a valid signature names {}, not {manifest_digest} (a signature copied from another artifact)",
            names
                .iter()
                .map(|h| format!("sha256:{h}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{OciError, SigningKey};

    type R = Result<(), Box<dyn std::error::Error>>;

    /// The refusal of a check that must refuse.
    fn refusal(checked: Result<(), String>) -> String {
        match checked {
            Ok(()) => panic!("accepted what must be refused"),
            Err(e) => e,
        }
    }

    fn parse_key(pem: &str) -> Result<PublicKey, OciError> {
        PublicKey::from_pem(pem)
    }

    /// A bundle sigstore-go (the library cosign 3 signs with) made: its `sigstore-go-signing`
    /// example signing `hello world` with a P-256 key and an RFC 3161 timestamp, as printed in
    /// sigstore-go's docs/signing.md. The timestamp is not checked (the key is the trust).
    const SIGSTORE_GO_KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEY51jsbL5o8ge+FAcxpYjQeDEe1n5
WK+8DzwCkLLPJHISIvsiS93PTVDPpmbAASOl2Y4ZHqRsxb3aPMaQmN4sew==
-----END PUBLIC KEY-----
";
    const SIGSTORE_GO_BUNDLE: &str = r#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json", "verificationMaterial":{"publicKey":{"hint":"WpMWlwBZxXlzAjt/fxK4Nd9VYm7PH3cnr3TTVmdQ5SQ="}, "timestampVerificationData":{"rfc3161Timestamps":[{"signedTimestamp":"MIIC0jADAgEAMIICyQYJKoZIhvcNAQcCoIICujCCArYCAQMxDTALBglghkgBZQMEAgIwgbwGCyqGSIb3DQEJEAEEoIGsBIGpMIGmAgEBBgkrBgEEAYO/MAIwMTANBglghkgBZQMEAgEFAAQgkaG6xajtAtsOoLy40vPZp+nDZRIWKnES2RqHDU7rmf4CFQC3ipDzPRUatDNLHxecg+XOCLSvWRgPMjAyNDA2MDcxNDExNTNaMAMCAQGgNqQ0MDIxFTATBgNVBAoTDEdpdEh1YiwgSW5jLjEZMBcGA1UEAxMQVFNBIFRpbWVzdGFtcGluZ6AAMYIB3zCCAdsCAQEwSjAyMRUwEwYDVQQKEwxHaXRIdWIsIEluYy4xGTAXBgNVBAMTEFRTQSBpbnRlcm1lZGlhdGUCFDz4J+p3q9T1P++QkPutn3Qbms2gMAsGCWCGSAFlAwQCAqCCAQUwGgYJKoZIhvcNAQkDMQ0GCyqGSIb3DQEJEAEEMBwGCSqGSIb3DQEJBTEPFw0yNDA2MDcxNDExNTNaMD8GCSqGSIb3DQEJBDEyBDCBYMVKhy7Mh+uUo0ycmn+Cl4swv4Z2t0TVuI+v0iNFJ4KTxB94bEALa2aaJZhNURswgYcGCyqGSIb3DQEJEAIvMXgwdjB0MHIEIHlI8iapfsPTNvwCoQbp1RaqmufUNHq7MbJ0CRlZCRsHME4wNqQ0MDIxFTATBgNVBAoTDEdpdEh1YiwgSW5jLjEZMBcGA1UEAxMQVFNBIGludGVybWVkaWF0ZQIUPPgn6ner1PU/75CQ+62fdBuazaAwCgYIKoZIzj0EAwMEaDBmAjEA3LlfE26IGKXCWgfGOxohAcz7/IlnRntEOI0lmknn5TgPa+VWfs1SqUBOKrYXPZutAjEAoNgsnlcSraDhAqdnv0llxvQLVEvZDBny1I1UgrtsAEnks9LWtH67bdwYrHRsCBAW"}]}}, "messageSignature":{"messageDigest":{"algorithm":"SHA2_256", "digest":"uU0nuZNNPgilLlLX2n2r+sSE7+N6U4DukIj3rOLvzek="}, "signature":"MEUCIQDlK0ZyYsGeh1NC7MiAL+mT54jdQakhelpy5Vz5MmWEbgIgRn51DlDW6rgIY7KMUq+7sC8BjZYzh4QtmcPjJiF4RSA="}}"#;

    #[test]
    fn a_bundle_sigstore_go_made_verifies_and_nothing_else_does() -> R {
        let key = parse_key(SIGSTORE_GO_KEY)?;
        check_blob_bundle(&key, SIGSTORE_GO_BUNDLE.as_bytes(), b"hello world")?;
        // Other bytes: the named digest is not theirs.
        let e = refusal(check_blob_bundle(
            &key,
            SIGSTORE_GO_BUNDLE.as_bytes(),
            b"hello world\n",
        ));
        assert!(e.contains("signs other bytes"), "{e}");
        // Without the digest the signature itself still refuses other bytes.
        let mut b: Value = serde_json::from_str(SIGSTORE_GO_BUNDLE)?;
        if let Some(m) = b["messageSignature"].as_object_mut() {
            m.remove("messageDigest");
        }
        let bare = b.to_string();
        check_blob_bundle(&key, bare.as_bytes(), b"hello world")?;
        let e = refusal(check_blob_bundle(&key, bare.as_bytes(), b"hello worle"));
        assert!(e.contains("does not verify"), "{e}");
        // Another key.
        let (_, other) = SigningKey::generate()?;
        let other = parse_key(&other)?;
        let e = refusal(check_blob_bundle(
            &other,
            SIGSTORE_GO_BUNDLE.as_bytes(),
            b"hello world",
        ));
        assert!(e.contains("another key"), "{e}");
        // Rotation: the old and the new key together.
        let both = parse_key(&format!("{}{SIGSTORE_GO_KEY}", other.to_pem()))?;
        check_blob_bundle(&both, SIGSTORE_GO_BUNDLE.as_bytes(), b"hello world")?;
        Ok(())
    }

    /// An image attestation the real cosign made, attached as an OCI referrer (cosign's
    /// `pkg/cosign/testdata/oci-attestation.sigstore.json`, Apache-2.0, `fetch
    /// github:sigstore/cosign`): keyless, so its key is its certificate's (extracted here). Its DSSE
    /// signature verifies (this checks our DSSE encoding against cosign's own), and it is then
    /// refused: an attestation (`https://cosign.sigstore.dev/attestation/v1`) vouches for nothing.
    const COSIGN_ATTESTATION: &str = include_str!("testdata/cosign-oci-attestation.sigstore.json");
    const COSIGN_ATTESTATION_KEY: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEk/CiYRmA9zsa7ams/+fI+wGeXOFx
ng4J0wSj1jub7kxArHhGwvgcVE3ubrGXNQB9X3ksG0F+MiXHG8gRzxrr0A==
-----END PUBLIC KEY-----
";

    #[test]
    fn an_attestation_the_real_cosign_made_verifies_and_is_refused_as_no_signature() -> R {
        let key = parse_key(COSIGN_ATTESTATION_KEY)?;
        let digest = "sha256:732112270d7e59418a8c080b134b24cabd67d250d0d0147a97ed95ba5c280aa4";
        let e = refusal(check_manifest_bundle(&key, COSIGN_ATTESTATION.as_bytes(), digest));
        assert!(
            e.contains("attestation of \"https://cosign.sigstore.dev/attestation/v1\""),
            "{e}"
        );
        // The same bundle altered by one byte of its payload does not verify at all.
        let mut b: Value = serde_json::from_str(COSIGN_ATTESTATION)?;
        let payload = b64("payload", &b["dsseEnvelope"]["payload"])?;
        let mut altered = payload.clone();
        altered[10] ^= 1;
        b["dsseEnvelope"]["payload"] =
            Value::String(base64::engine::general_purpose::STANDARD.encode(altered));
        let e = refusal(check_manifest_bundle(&key, b.to_string().as_bytes(), digest));
        assert!(e.contains("does not verify"), "{e}");
        Ok(())
    }

    /// A bundle as cosign 3's `signDigestBundle` makes it (the Statement as `protojson` writes
    /// it), signed here.
    fn image_bundle(key: &SigningKey, hex: &str, predicate: &str) -> Result<String, OciError> {
        let statement = format!(
            r#"{{"_type":"https://in-toto.io/Statement/v1","subject":[{{"digest":{{"sha256":"{hex}"}},"annotations":{{}}}}],"predicateType":"{predicate}","predicate":{{}}}}"#
        );
        let sig = key.sign(&pae(IN_TOTO, statement.as_bytes()))?;
        let e = base64::engine::general_purpose::STANDARD;
        Ok(serde_json::json!({
            "mediaType": BUNDLE_TYPE,
            "verificationMaterial": {"publicKey": {"hint": ""}},
            "dsseEnvelope": {
                "payload": e.encode(statement),
                "payloadType": IN_TOTO,
                "signatures": [{"sig": e.encode(sig), "keyid": ""}],
            },
        })
        .to_string())
    }

    #[test]
    fn an_image_bundle_verifies_for_its_digest_and_as_a_signature_only() -> R {
        let (private, public) = SigningKey::generate()?;
        let signer = SigningKey::from_pem(&private)?;
        let key = parse_key(&public)?;
        let hex = "ab".repeat(32);
        let digest = format!("sha256:{hex}");
        let good = image_bundle(&signer, &hex, SIGN_PREDICATE)?;
        check_manifest_bundle(&key, good.as_bytes(), &digest)?;
        let other_digest = format!("sha256:{}", "cd".repeat(32));
        let e = refusal(check_manifest_bundle(&key, good.as_bytes(), &other_digest));
        assert!(e.contains("copied from another artifact"), "{e}");
        let attestation = image_bundle(&signer, &hex, "https://slsa.dev/provenance/v1")?;
        let e = refusal(check_manifest_bundle(&key, attestation.as_bytes(), &digest));
        assert!(e.contains("attestation"), "{e}");
        let (_, other) = SigningKey::generate()?;
        let e = refusal(check_manifest_bundle(
            &parse_key(&other)?,
            good.as_bytes(),
            &digest,
        ));
        assert!(e.contains("another key"), "{e}");
        // The signed payload altered after signing.
        let mut b: Value = serde_json::from_str(&good)?;
        let swapped = image_bundle(&signer, &"cd".repeat(32), SIGN_PREDICATE)?;
        let swapped: Value = serde_json::from_str(&swapped)?;
        b["dsseEnvelope"]["payload"] = swapped["dsseEnvelope"]["payload"].clone();
        let e = refusal(check_manifest_bundle(
            &key,
            b.to_string().as_bytes(),
            &format!("sha256:{}", "cd".repeat(32)),
        ));
        assert!(e.contains("does not verify"), "{e}");
        // A blob's bundle is no image signature, and an image's no blob signature.
        let blob = refusal(check_manifest_bundle(
            &key,
            SIGSTORE_GO_BUNDLE.as_bytes(),
            &digest,
        ));
        assert!(blob.contains("no DSSE envelope"), "{blob}");
        let e = refusal(check_blob_bundle(&key, good.as_bytes(), b"x"));
        assert!(e.contains("attestation"), "{e}");
        Ok(())
    }
}
