//! HS256 JSON Web Tokens as slurmctld's `auth/jwt` accepts them: signed with the cluster's JWT
//! key (the `jwt.key` slurmctld reads), claims `iat`, `exp` and `sun` (the Slurm user name).
//! Slinky's tokens live 15 minutes and are renewed at 80 % of their life; so are these.

use std::{
    sync::Mutex,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use ring::hmac;

/// How long a token lives (Slinky's lifetime).
pub const LIFETIME: Duration = Duration::from_secs(15 * 60);

/// Sign a token for `user` valid from `now` (seconds since the epoch) for `lifetime`.
pub fn sign(key: &[u8], user: &str, now: u64, lifetime: Duration) -> String {
    signed(
        key,
        &serde_json::json!({"iat": now, "exp": now + lifetime.as_secs(), "sun": user}),
    )
}

/// The claims of a token that [`verify`] accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// Issued at (seconds since the epoch).
    pub iat: u64,
    /// Expires at.
    pub exp: u64,
    /// The Slurm user.
    pub sun: String,
}

/// Issue a token as Slinky's Token kind does (`slurmjwt.NewSignedToken`): claims `jti` (`id`),
/// `iss`, `iat`, `nbf`, `exp` and `sun`, HS256 with `key`.
pub fn issue(key: &[u8], user: &str, now: u64, lifetime: Duration, id: &str) -> String {
    let claims = serde_json::json!({
        "jti": id, "iss": ISSUER, "iat": now, "nbf": now,
        "exp": now.saturating_add(lifetime.as_secs()), "sun": user,
    });
    signed(key, &claims)
}

/// The `iss` of the tokens the Token kind issues.
pub const ISSUER: &str = "slinky-host";

fn signed(key: &[u8], claims: &serde_json::Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signing_input = format!("{header}.{payload}");
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), signing_input.as_bytes());
    format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
}

/// The claims of `token` when it is an HS256 JWT signed with `key` that has `iat`, `exp` and
/// `sun` (expired or not: the caller decides); `None` for anything else.
pub fn verify(key: &[u8], token: &str) -> Option<Claims> {
    let mut parts = token.trim().split('.');
    let (header, payload, tag) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let head: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).ok()?).ok()?;
    if head.get("alg").and_then(serde_json::Value::as_str) != Some("HS256") {
        return None;
    }
    let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
    hmac::verify(
        &hmac::Key::new(hmac::HMAC_SHA256, key),
        format!("{header}.{payload}").as_bytes(),
        &tag,
    )
    .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    Some(Claims {
        iat: claims.get("iat")?.as_u64()?,
        exp: claims.get("exp")?.as_u64()?,
        sun: claims.get("sun")?.as_str()?.to_string(),
    })
}

/// Seconds since the epoch, now.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// A token kept for reuse and renewed at 80 % of its life.
pub struct Tokens {
    key: Vec<u8>,
    user: String,
    lifetime: Duration,
    /// The current token and the second after which it is renewed.
    current: Mutex<Option<(String, u64)>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key nor a token.
        f.debug_struct("Tokens")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Tokens {
    /// Tokens for `user` signed with `key`.
    pub fn new(key: Vec<u8>, user: impl Into<String>, lifetime: Duration) -> Self {
        Tokens {
            key,
            user: user.into(),
            lifetime,
            current: Mutex::new(None),
        }
    }

    /// One token given as it is (a Token kind's Secret), for `user`: never renewed.
    pub fn fixed(token: String, user: impl Into<String>) -> Self {
        Tokens {
            key: Vec::new(),
            user: user.into(),
            lifetime: Duration::ZERO,
            current: Mutex::new(Some((token, u64::MAX))),
        }
    }

    /// The Slurm user the tokens are for.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Whether these tokens are signed with `key`.
    pub fn signs_with(&self, key: &[u8]) -> bool {
        self.key == key
    }

    /// A token valid for at least a fifth of its lifetime.
    pub fn token(&self) -> String {
        let now = now_secs();
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match current.as_ref() {
            Some((token, renew_at)) if now < *renew_at => token.clone(),
            _ => {
                let token = sign(&self.key, &self.user, now, self.lifetime);
                let renew_at = now + self.lifetime.as_secs() * 4 / 5;
                *current = Some((token.clone(), renew_at));
                token
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_header_claims_and_an_hmac_of_both() {
        let t = sign(b"secret", "slurm", 1_000, Duration::from_secs(900));
        let parts: Vec<&str> = t.split('.').collect();
        assert_eq!(parts.len(), 3);
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap_or_default()).unwrap_or_default();
        assert_eq!(
            claims,
            serde_json::json!({"iat": 1000, "exp": 1900, "sun": "slurm"})
        );
        let key = hmac::Key::new(hmac::HMAC_SHA256, b"secret");
        let tag = URL_SAFE_NO_PAD.decode(parts[2]).unwrap_or_default();
        assert!(hmac::verify(&key, format!("{}.{}", parts[0], parts[1]).as_bytes(), &tag).is_ok());
        let other = hmac::Key::new(hmac::HMAC_SHA256, b"other");
        assert!(hmac::verify(&other, format!("{}.{}", parts[0], parts[1]).as_bytes(), &tag).is_err());
    }

    #[test]
    fn an_issued_token_verifies_with_its_key_only() {
        let t = issue(b"secret", "exporter", 1_000, Duration::from_secs(60), "id-1");
        assert_eq!(
            verify(b"secret", &t),
            Some(Claims {
                iat: 1000,
                exp: 1060,
                sun: "exporter".into()
            })
        );
        assert_eq!(verify(b"other", &t), None, "another key");
        assert_eq!(verify(b"secret", &format!("{t}x")), None, "a changed signature");
        assert_eq!(verify(b"secret", "a.b"), None);
        assert_eq!(
            verify(b"k", &sign(b"k", "slurm", 5, Duration::from_secs(1))).map(|c| c.sun),
            Some("slurm".into())
        );
    }

    #[test]
    fn a_token_is_reused_until_four_fifths_of_its_life_then_renewed() {
        let tokens = Tokens::new(b"k".to_vec(), "slurm", Duration::from_secs(900));
        let a = tokens.token();
        assert_eq!(a, tokens.token());
        // Pretend the renewal time has passed.
        if let Ok(mut c) = tokens.current.lock()
            && let Some((_, at)) = c.as_mut()
        {
            *at = 0;
        }
        // A new token (signed now: its iat may equal the old one within the same second, so
        // compare the renewal time instead).
        let _ = tokens.token();
        let renew_at = tokens
            .current
            .lock()
            .map(|c| c.as_ref().map(|(_, at)| *at))
            .ok()
            .flatten();
        assert!(renew_at.is_some_and(|at| at >= now_secs() + 700));
    }
}
