//! One digest store for everything the host keeps of plugins on disk: manifests and layers it
//! pulled, the modules that served (so a restart can load them again while their source has
//! moved on), and the signatures that verified. Content is addressed by its sha256 and
//! re-hashed on every read, so a file altered or cut short on disk is never returned.
//!
//! Layout: `<dir>/sha256/<hex>` for content, `<dir>/sha256/<hex>.<what>` for records about it
//! (such as its verified signatures), which the caller checks again when it reads them. Files a
//! host before this layout kept (`<dir>/<hex>.wasm`, `<dir>/<hex>.manifest`,
//! `<dir>/modules/<hex>.wasm`) are read too, verified the same way.

use std::path::PathBuf;

use crate::sha256;

/// A content-addressed store on disk; without a directory it keeps nothing.
#[derive(Debug, Clone, Default)]
pub struct DigestStore {
    dir: Option<PathBuf>,
}

/// The hex part of `sha256:<hex>`, when `digest` is one.
fn hex_of(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

impl DigestStore {
    /// A store in `dir` (created on the first write); `None` keeps nothing.
    pub fn new(dir: Option<PathBuf>) -> DigestStore {
        DigestStore { dir }
    }

    /// Its directory, if it keeps anything.
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref()
    }

    /// The content whose digest is `digest` (`sha256:<hex>`), if it is kept and intact.
    pub fn get(&self, digest: &str) -> Option<Vec<u8>> {
        let dir = self.dir.as_ref()?;
        let hex = hex_of(digest)?;
        [
            dir.join("sha256").join(hex),
            dir.join(format!("{hex}.wasm")),
            dir.join(format!("{hex}.manifest")),
            dir.join("modules").join(format!("{hex}.wasm")),
        ]
        .into_iter()
        .filter_map(|path| std::fs::read(path).ok())
        .find(|bytes| sha256(bytes) == digest)
    }

    /// Keep `bytes`; their digest. A failure to write is logged: the content is fetched again
    /// next time.
    pub fn put(&self, bytes: &[u8]) -> String {
        let digest = sha256(bytes);
        if let Some(hex) = hex_of(&digest) {
            self.write(hex, bytes);
        }
        digest
    }

    /// A record about `digest` (`what`: what it records), as written; the caller checks it.
    pub fn get_record(&self, digest: &str, what: &str) -> Option<Vec<u8>> {
        let path = self
            .dir
            .as_ref()?
            .join("sha256")
            .join(format!("{}.{what}", hex_of(digest)?));
        std::fs::read(path).ok()
    }

    /// Keep a record about `digest`.
    pub fn put_record(&self, digest: &str, what: &str, bytes: &[u8]) {
        if let Some(hex) = hex_of(digest) {
            self.write(&format!("{hex}.{what}"), bytes);
        }
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        let Some(dir) = self.dir.as_ref().map(|d| d.join("sha256")) else {
            return;
        };
        let path = dir.join(name);
        if path.exists() && !name.contains('.') {
            return;
        }
        let write = || -> std::io::Result<()> {
            std::fs::create_dir_all(&dir)?;
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, &path)
        };
        if let Err(error) = write() {
            tracing::warn!(dir = %dir.display(), %error, "cannot keep a plugin file on disk; it is fetched again when needed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_returned_only_while_it_hashes_to_its_digest() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = DigestStore::new(Some(dir.path().to_path_buf()));
        let digest = store.put(b"module");
        assert_eq!(store.get(&digest).as_deref(), Some(&b"module"[..]));
        let hex = digest.trim_start_matches("sha256:");
        std::fs::write(dir.path().join("sha256").join(hex), b"altered")?;
        assert_eq!(store.get(&digest), None, "altered on disk: not returned");
        assert_eq!(
            store.get("sha256:../../etc/passwd"),
            None,
            "not a digest: nothing read"
        );
        // A file of the layout before this one.
        std::fs::create_dir_all(dir.path().join("modules"))?;
        std::fs::write(dir.path().join("modules").join(format!("{hex}.wasm")), b"module")?;
        assert_eq!(store.get(&digest).as_deref(), Some(&b"module"[..]));
        store.put_record(&digest, "signatures.json", b"[]");
        assert_eq!(
            store.get_record(&digest, "signatures.json").as_deref(),
            Some(&b"[]"[..])
        );
        assert_eq!(DigestStore::new(None).get(&digest), None);
        Ok(())
    }
}
