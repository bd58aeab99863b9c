//! Kinds served in two API versions over one storage, as kube-apiserver serves them: the
//! `events.k8s.io/v1` Events are the core `v1` Events seen with other field names (`regarding`
//! for `involvedObject`, `note` for `message`, `deprecated…` for the old counters), so
//! `kubectl get events` shows what a client wrote through either API.

use serde_json::{Map, Value};

use crate::resources::ResKey;

/// (`events.k8s.io/v1` name, core `v1` name) of the fields that differ.
const EVENT_FIELDS: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// The storage of a type served as a view of another: `events.k8s.io` Events are core Events.
pub(crate) fn storage_of(res: &ResKey) -> Option<ResKey> {
    (res.group == "events.k8s.io" && res.plural == "events").then(|| ResKey {
        group: String::new(),
        plural: "events".into(),
    })
}

fn rename(
    obj: &Value,
    api_version: &str,
    pairs: impl Iterator<Item = (&'static str, &'static str)>,
) -> Value {
    let Value::Object(m) = obj else {
        return obj.clone();
    };
    let mut out: Map<String, Value> = m.clone();
    for (from, to) in pairs {
        if let Some(v) = out.remove(from) {
            out.insert(to.into(), v);
        }
    }
    out.insert("apiVersion".into(), api_version.into());
    out.insert("kind".into(), "Event".into());
    Value::Object(out)
}

/// A stored (core `v1`) Event as an `events.k8s.io/v1` Event.
pub(crate) fn to_view(obj: &Value) -> Value {
    rename(
        obj,
        "events.k8s.io/v1",
        EVENT_FIELDS.iter().map(|(v1, core)| (*core, *v1)),
    )
}

/// An `events.k8s.io/v1` Event as the core `v1` Event stored.
pub(crate) fn to_storage(obj: &Value) -> Value {
    rename(obj, "v1", EVENT_FIELDS.iter().copied())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn events_convert_both_ways() {
        let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hello", "reason": "Started",
            "reportingController": "slinky-host", "type": "Normal"});
        let core = to_storage(&v1);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hello");
        assert_eq!(core["reportingComponent"], "slinky-host");
        assert_eq!(to_view(&core), v1);
    }
}
