//! Persistence (`--state-dir`): a snapshot plus a write-ahead log of JSON lines.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Inner, meta_str};
use crate::resources::{self, ResKey};

const SNAPSHOT: &str = "snapshot.json";
const WAL: &str = "wal.jsonl";

impl Inner {
    /// Put or remove an object while loading state (no events, no checks).
    fn restore(&mut self, res: ResKey, op: &str, obj: Value) {
        let key = (
            meta_str(&obj, "namespace").unwrap_or_default().to_string(),
            meta_str(&obj, "name").unwrap_or_default().to_string(),
        );
        if res.plural == "customresourcedefinitions"
            && res.group == "apiextensions.k8s.io"
            && let Ok(served) = resources::from_crd(&obj)
        {
            if op == "delete" {
                self.types.remove(&served.key());
                let keys: Vec<_> = self
                    .objects
                    .get(&served.key())
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_default();
                for k in keys {
                    self.take(&served.key(), &k);
                }
            } else {
                self.types.insert(served.key(), served);
            }
        }
        if op == "delete" {
            self.take(&res, &key);
        } else {
            self.put(&res, key, Arc::new(obj));
        }
    }

    pub(super) fn load(&mut self, dir: &std::path::Path) -> std::io::Result<()> {
        use std::io::{BufRead, Write};
        std::fs::create_dir_all(dir)?;
        let snapshot = dir.join(SNAPSHOT);
        if snapshot.is_file() {
            let v: Value = serde_json::from_slice(&std::fs::read(&snapshot)?).map_err(|e| {
                std::io::Error::other(format!("{}: not a state snapshot: {e}", snapshot.display()))
            })?;
            self.rev = v["rev"].as_u64().unwrap_or(1);
            let mut items: Vec<&Value> = v["objects"]
                .as_array()
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            // CRDs first, so their resources are served when their objects are restored.
            items.sort_by_key(|i| i["plural"] != "customresourcedefinitions");
            for item in items {
                let res = ResKey {
                    group: item["group"].as_str().unwrap_or_default().into(),
                    plural: item["plural"].as_str().unwrap_or_default().into(),
                };
                self.restore(res, "put", item["obj"].clone());
            }
        }
        let wal_path = dir.join(WAL);
        if wal_path.is_file() {
            let file = std::fs::File::open(&wal_path)?;
            for line in std::io::BufReader::new(file).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    tracing::warn!(path = %wal_path.display(), "dropping a torn record at the end of the write-ahead log");
                    break;
                };
                let rev = v["rev"].as_u64().unwrap_or(0);
                if rev <= self.rev && snapshot.is_file() {
                    continue;
                }
                let res = ResKey {
                    group: v["group"].as_str().unwrap_or_default().into(),
                    plural: v["plural"].as_str().unwrap_or_default().into(),
                };
                self.restore(res, v["op"].as_str().unwrap_or("put"), v["obj"].clone());
                self.rev = self.rev.max(rev);
            }
        }
        self.compacted = self.rev;
        self.next_ip = 1 + self.objects.values().map(|m| m.len() as u32).sum::<u32>();
        // Compact: a new snapshot (atomically), then an empty log.
        let objects: Vec<Value> = self
            .objects
            .iter()
            .flat_map(|(res, m)| {
                m.values()
                    .map(move |o| json!({"group": res.group, "plural": res.plural, "obj": &**o}))
            })
            .collect();
        let tmp = dir.join(format!("{SNAPSHOT}.tmp"));
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(
                json!({"rev": self.rev, "objects": objects})
                    .to_string()
                    .as_bytes(),
            )?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &snapshot)?;
        let wal = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .open(&wal_path)?;
        wal.sync_all()?;
        self.wal = Some(std::fs::OpenOptions::new().append(true).open(&wal_path)?);
        Ok(())
    }
}
