//! sshd host keys for a LoginSet's login pods, made by the host (a builder has no randomness, and
//! the keys never reach a guest): RSA (3072 bits, `ssh-keygen`'s default), Ed25519 and ECDSA
//! P-256, each private key in OpenSSH's format and its public key as one `authorized_keys` line,
//! under the file names Slinky's login pods mount (`ssh_host_<type>_key[.pub]`).
//!
//! # Guarantees
//! * Keys come from the operating system's random source; the private keys are never logged.
//! * Generation is CPU work (RSA takes up to seconds): call it off the async threads.

use std::collections::BTreeMap;

use slinky_api::SSH_HOST_KEY_FILES;
use ssh_key::{Algorithm, EcdsaCurve, LineEnding, PrivateKey, private::RsaKeypair, rand_core::OsRng};

/// RSA host keys: `ssh-keygen`'s default size.
const RSA_BITS: usize = 3072;

/// Why host keys could not be made.
#[derive(Debug, thiserror::Error)]
#[error("cannot make the sshd host keys: {0}")]
pub struct HostKeyError(String);

fn err(e: ssh_key::Error) -> HostKeyError {
    HostKeyError(e.to_string())
}

/// A fresh set of host keys: the data of the Secret `<loginset>-ssh-host-keys`, keyed by file
/// name ([`SSH_HOST_KEY_FILES`]). `comment` ends each public key line.
///
/// # Errors
/// A key that could not be generated or encoded.
pub fn generate(comment: &str) -> Result<BTreeMap<String, Vec<u8>>, HostKeyError> {
    let mut rng = OsRng;
    let keys = [
        (
            "rsa",
            PrivateKey::from(RsaKeypair::random(&mut rng, RSA_BITS).map_err(err)?),
        ),
        (
            "ed25519",
            PrivateKey::random(&mut rng, Algorithm::Ed25519).map_err(err)?,
        ),
        (
            "ecdsa",
            PrivateKey::random(
                &mut rng,
                Algorithm::Ecdsa {
                    curve: EcdsaCurve::NistP256,
                },
            )
            .map_err(err)?,
        ),
    ];
    let mut out = BTreeMap::new();
    for (kind, mut key) in keys {
        key.set_comment(comment);
        let private = key.to_openssh(LineEnding::LF).map_err(err)?;
        let public = key.public_key().to_openssh().map_err(err)?;
        out.insert(format!("ssh_host_{kind}_key"), private.as_bytes().to_vec());
        out.insert(
            format!("ssh_host_{kind}_key.pub"),
            format!("{public}\n").into_bytes(),
        );
    }
    debug_assert!(SSH_HOST_KEY_FILES.iter().all(|f| out.contains_key(*f)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_slinky_mounts_is_made_and_parses_back() -> Result<(), Box<dyn std::error::Error>> {
        let keys = generate("login@slurm")?;
        let names: Vec<&str> = keys.keys().map(String::as_str).collect();
        assert_eq!(names, SSH_HOST_KEY_FILES);
        for kind in ["rsa", "ed25519", "ecdsa"] {
            let private = std::str::from_utf8(&keys[&format!("ssh_host_{kind}_key")])?;
            assert!(private.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----\n"));
            let parsed = PrivateKey::from_openssh(private)?;
            let public = std::str::from_utf8(&keys[&format!("ssh_host_{kind}_key.pub")])?;
            assert_eq!(public.trim_end(), parsed.public_key().to_openssh()?);
            assert!(public.ends_with(" login@slurm\n"), "{public}");
        }
        let again = generate("login@slurm")?;
        assert_ne!(again["ssh_host_ed25519_key"], keys["ssh_host_ed25519_key"]);
        Ok(())
    }
}
