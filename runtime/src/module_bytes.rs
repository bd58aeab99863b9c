//! Component bytes before they are compiled: gzip, digest, custom sections.

use sha2::{Digest, Sha256};

/// Largest decompressed `*.wasm.gz` accepted.
const MAX_COMPONENT_BYTES: u64 = 64 << 20;

/// Decompress a gzipped component (bounded).
///
/// # Errors
/// Not gzip, or larger than 64 MiB decompressed; the message says how to fix it.
pub fn gunzip(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(MAX_COMPONENT_BYTES + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("not a valid gzip file ({e}): make it with `gzip -k FILE.wasm`"))?;
    if out.len() as u64 > MAX_COMPONENT_BYTES {
        return Err(format!(
            "it decompresses to more than {} MiB; a builder component is a few MiB at most",
            MAX_COMPONENT_BYTES >> 20
        ));
    }
    Ok(out)
}

/// The sha256 of a component, hex.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `component` with a custom section `name` holding `data` appended: the same behaviour under
/// another digest (custom sections are ignored when running). Stamps builds (a build id, a git
/// commit) and gives tests and benchmarks distinct versions of one plugin.
pub fn with_custom_section(component: &[u8], name: &str, data: &[u8]) -> Vec<u8> {
    fn leb128(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut payload = Vec::with_capacity(name.len() + data.len() + 5);
    leb128(name.len(), &mut payload);
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(data);
    let mut out = component.to_vec();
    out.push(0); // custom section id
    leb128(payload.len(), &mut out);
    out.extend_from_slice(&payload);
    out
}

/// `bytes`, gunzipped when they start with gzip's magic number (a `.wasm.gz` in a ConfigMap or a
/// registry); as they are otherwise.
///
/// # Errors
/// A gzip stream that does not decompress.
pub fn gunzip_if_gzipped(bytes: Vec<u8>) -> Result<Vec<u8>, String> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        gunzip(&bytes)
    } else {
        Ok(bytes)
    }
}
