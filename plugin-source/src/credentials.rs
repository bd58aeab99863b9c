//! Registry credentials, as a `kubernetes.io/dockerconfigjson` Secret (`.dockerconfigjson`) or
//! `docker login` (`~/.docker/config.json`) keeps them: `{"auths": {"ghcr.io": {"auth":
//! base64("user:password")}}}` (or `username` and `password`; the older `.dockercfg` layout without
//! `auths` too). The file is read again whenever a registry asks for credentials, so a rotated
//! Secret is used without a restart. Credentials go only to the registry they are for, and to the
//! token realm it names (never along a redirect to a blob store).

use std::{collections::BTreeMap, path::PathBuf};

use base64::Engine as _;
use serde_json::Value;

use crate::OciError;

/// Where credentials come from.
#[derive(Clone, Default)]
pub struct Credentials {
    file: Option<PathBuf>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("file", &self.file).finish()
    }
}

impl Credentials {
    /// None: every request is anonymous.
    pub fn none() -> Credentials {
        Credentials::default()
    }

    /// The credentials in the Docker config file `file`, checked now (a file that cannot be read
    /// or parsed is an error at start, not a surprise at the first pull).
    ///
    /// # Errors
    /// [`OciError::Credentials`] naming the file and what is wrong with it.
    pub fn from_file(file: PathBuf) -> Result<Credentials, OciError> {
        read(&file)?;
        Ok(Credentials { file: Some(file) })
    }

    /// `Basic …` for `registry` (`host[:port]`), if the file has credentials for it.
    pub(crate) fn basic(&self, registry: &str) -> Option<String> {
        let file = self.file.as_ref()?;
        let auths = match read(file) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "registry credentials unreadable; the request goes without them");
                return None;
            }
        };
        let (user, password) = auths.get(&registry_key(registry))?;
        let pair = format!("{user}:{password}");
        Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        ))
    }

    /// Whether any credentials are configured.
    pub fn configured(&self) -> bool {
        self.file.is_some()
    }
}

/// A registry as the file's keys name it: no scheme, no path, Docker Hub's names made one.
fn registry_key(name: &str) -> String {
    let name = name
        .trim()
        .trim_start_matches("https://")
        .trim_start_matches("http://");
    let host = name.split('/').next().unwrap_or(name);
    match host {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => "docker.io".into(),
        other => other.to_ascii_lowercase(),
    }
}

/// The file's credentials by registry.
fn read(file: &std::path::Path) -> Result<BTreeMap<String, (String, String)>, OciError> {
    let bad = |why: String| OciError::Credentials(format!("{}: {why}", file.display()));
    let bytes = std::fs::read(file).map_err(|e| bad(format!("cannot read it: {e}")))?;
    parse(&bytes).map_err(bad)
}

/// Parse a Docker config's `auths` (or a `.dockercfg`'s top level).
pub(crate) fn parse(bytes: &[u8]) -> Result<BTreeMap<String, (String, String)>, String> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("not a Docker config (JSON with `auths`, as `kubectl create secret docker-registry` writes it): {e}"))?;
    let auths = v
        .get("auths")
        .unwrap_or(&v)
        .as_object()
        .ok_or("`auths` is not an object")?;
    let mut out = BTreeMap::new();
    for (registry, entry) in auths {
        let pair = match (
            entry.get("auth").and_then(Value::as_str),
            entry.get("username"),
            entry.get("password"),
        ) {
            (Some(auth), _, _) => {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .map_err(|e| format!("auths.{registry:?}.auth is not base64: {e}"))?;
                let text =
                    String::from_utf8(decoded).map_err(|_| format!("auths.{registry:?}.auth is not text"))?;
                let (user, password) = text
                    .split_once(':')
                    .ok_or_else(|| format!("auths.{registry:?}.auth is not base64 of user:password"))?;
                (user.to_string(), password.to_string())
            }
            (None, Some(Value::String(user)), Some(Value::String(password))) => {
                (user.clone(), password.clone())
            }
            // An entry for a credential helper (`{}`): nothing this host can use.
            _ => continue,
        };
        out.insert(registry_key(registry), pair);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_configs_parse_in_every_layout_and_name_what_is_wrong() {
        let b64 = base64::engine::general_purpose::STANDARD.encode("alice:s3:cret");
        let config = format!(
            r#"{{"auths": {{"https://index.docker.io/v1/": {{"auth": "{b64}"}},
                "ghcr.io": {{"username": "bob", "password": "pat"}}, "quay.io": {{}}}}}}"#
        );
        let auths = parse(config.as_bytes()).unwrap_or_default();
        assert_eq!(auths.get("docker.io"), Some(&("alice".into(), "s3:cret".into())));
        assert_eq!(auths.get("ghcr.io"), Some(&("bob".into(), "pat".into())));
        assert_eq!(auths.len(), 2, "a credential helper's entry is skipped");
        let old = format!(r#"{{"127.0.0.1:5000": {{"auth": "{b64}"}}}}"#);
        assert!(parse(old.as_bytes()).is_ok_and(|a| a.contains_key("127.0.0.1:5000")));
        assert!(
            parse(b"{\"auths\": {\"r.io\": {\"auth\": \"!!\"}}}").is_err_and(|e| e.contains("not base64"))
        );
        assert!(parse(b"[]").is_err());
        assert_eq!(
            registry_key("https://Registry.Example.com:5000/v2/"),
            "registry.example.com:5000"
        );
    }
}
