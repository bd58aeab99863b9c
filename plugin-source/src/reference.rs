//! OCI references: `registry/repository[:tag][@sha256:hex]`.

use crate::OciError;

/// A parsed reference: `registry/repository[:tag][@sha256:hex]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]`.
    pub registry: String,
    /// `path/name`.
    pub repository: String,
    /// The tag, if any.
    pub tag: Option<String>,
    /// `sha256:<hex>`, if pinned.
    pub digest: Option<String>,
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl Reference {
    /// Parse `registry/repository[:tag][@sha256:<hex>]` (the registry is required: there is no
    /// default registry).
    ///
    /// # Errors
    /// [`OciError::Reference`] saying what is wrong.
    pub fn parse(text: &str) -> Result<Reference, OciError> {
        let bad = |why| OciError::Reference(text.to_string(), why);
        let (rest, digest) = match text.split_once('@') {
            Some((r, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("the digest must be sha256:<hex>"))?;
                if hex.len() != 64
                    || !hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(bad("the digest must be sha256: and 64 lower-case hex digits"));
                }
                (r, Some(d.to_string()))
            }
            None => (text, None),
        };
        let (registry, path) = rest.split_once('/').ok_or_else(|| bad("no registry host"))?;
        if !(registry.contains('.') || registry.contains(':') || registry == "localhost") {
            return Err(bad(
                "the first part must be a registry host (with a dot or a port)",
            ));
        }
        let (repository, tag) = match path.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t.to_string())),
            _ => (path, None),
        };
        if repository.is_empty()
            || !repository
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/".contains(&b))
        {
            return Err(bad(
                "the repository must be lower-case letters, digits, '.', '_', '-' and '/'",
            ));
        }
        Ok(Reference {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// The same repository pinned at `digest`.
    pub fn pinned(&self, digest: &str) -> Reference {
        Reference {
            tag: None,
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }
}
