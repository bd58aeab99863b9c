//! The hashes of Slinky's `*-hash` annotations.

use sha2::Digest;

/// sha256 of `data` as lower-case hex (for `*-hash` annotations).
pub fn sha256_hex(data: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = sha2::Sha256::digest(data);
    let mut out = String::with_capacity(2 * digest.len());
    for b in digest {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0xf)]));
    }
    out
}

/// sha256 of `data`'s values concatenated in key order, or empty when there are none: Slinky's
/// `CheckSumFromMap`, for the `*-hash` annotations of Secrets and ConfigMaps.
pub fn checksum_of_map<'a>(data: impl IntoIterator<Item = (&'a String, &'a [u8])>) -> String {
    let mut entries: Vec<(&String, &[u8])> = data.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    let bytes: Vec<u8> = entries.iter().flat_map(|(_, v)| v.iter().copied()).collect();
    if bytes.is_empty() {
        return String::new();
    }
    sha256_hex(&bytes)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn sha256_is_lower_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn map_checksum_concatenates_values_in_key_order() {
        let data = BTreeMap::from([("b".to_string(), b"2".to_vec()), ("a".to_string(), b"1".to_vec())]);
        assert_eq!(
            checksum_of_map(data.iter().map(|(k, v)| (k, v.as_slice()))),
            sha256_hex(b"12")
        );
        assert_eq!(checksum_of_map(std::iter::empty()), "");
    }
}
