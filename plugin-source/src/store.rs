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
    /// The most bytes kept (0: [`DEFAULT_LIMIT`]).
    limit: u64,
}

/// The most bytes a store keeps by default: within the chart's 256 MiB cache volume, with room
/// for the compiled artifacts beside it.
pub const DEFAULT_LIMIT: u64 = 128 << 20;

/// The hex part of `sha256:<hex>`, when `digest` is one.
fn hex_of(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(hex)
}

impl DigestStore {
    /// A store in `dir` (created on the first write); `None` keeps nothing.
    pub fn new(dir: Option<PathBuf>) -> DigestStore {
        DigestStore { dir, limit: 0 }
    }

    /// A store in `dir` that keeps at most `limit` bytes: past it, what was read or written
    /// least recently goes (content with its records), never what was just written.
    pub fn with_limit(dir: Option<PathBuf>, limit: u64) -> DigestStore {
        DigestStore { dir, limit }
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
        .find_map(|path| {
            let bytes = std::fs::read(&path).ok()?;
            (sha256(&bytes) == digest).then(|| {
                // Read now: the last to go when the store is pruned.
                touch(&path);
                bytes
            })
        })
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
            return;
        }
        self.prune(&dir, name);
    }

    /// Remove what was used least recently until the store holds at most its limit, but `kept`
    /// (just written) and the records of what stays.
    fn prune(&self, dir: &std::path::Path, kept: &str) {
        let limit = if self.limit == 0 {
            DEFAULT_LIMIT
        } else {
            self.limit
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut groups: std::collections::BTreeMap<String, Group> = std::collections::BTreeMap::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            let hex = name.split('.').next().unwrap_or_default().to_string();
            let g = groups
                .entry(hex)
                .or_insert((std::time::SystemTime::UNIX_EPOCH, 0, Vec::new()));
            g.0 =
                g.0.max(meta.modified().unwrap_or(std::time::SystemTime::UNIX_EPOCH));
            g.1 += meta.len();
            g.2.push(name);
        }
        let mut total: u64 = groups.values().map(|g| g.1).sum();
        if total <= limit {
            return;
        }
        let keep = kept.split('.').next().unwrap_or_default();
        let mut oldest: Vec<(String, Group)> = groups.into_iter().filter(|(hex, _)| hex != keep).collect();
        oldest.sort_by_key(|(_, g)| g.0);
        for (hex, (_, bytes, names)) in oldest {
            if total <= limit {
                break;
            }
            for n in &names {
                let _ = std::fs::remove_file(dir.join(n));
            }
            total = total.saturating_sub(bytes);
            tracing::info!(digest = %format!("sha256:{hex}"), bytes, "pruned from the plugin cache (least recently used)");
        }
    }
}

/// A content file with its records: its last use, their bytes, their names.
type Group = (std::time::SystemTime, u64, Vec<String>);

/// Mark `path` used now (its modification time), best effort.
fn touch(path: &std::path::Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_pruned_to_its_limit_least_recently_used_first() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let store = DigestStore::with_limit(Some(dir.path().to_path_buf()), 250);
        let a = store.put(&[b'a'; 100]);
        store.put_record(&a, "sig", b"r");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = store.put(&[b'b'; 100]);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // `a` read again: `b` is now the least recently used.
        assert!(store.get(&a).is_some());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let c = store.put(&[b'c'; 100]);
        assert!(store.get(&c).is_some(), "just written: kept");
        assert!(store.get(&a).is_some(), "read recently: kept");
        assert!(store.get(&b).is_none(), "least recently used: pruned");
        assert_eq!(
            store.get_record(&a, "sig").as_deref(),
            Some(&b"r"[..]),
            "a record stays with its content"
        );
        Ok(())
    }

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
