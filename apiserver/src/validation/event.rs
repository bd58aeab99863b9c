//! Events: the length limits of `legacyValidateEvent` (`pkg/apis/core/validation/events.go`),
//! which kube-apiserver applies to every create and update of an Event that has an `eventTime`,
//! through the core `v1` API and `events.k8s.io/v1` (where `eventTime` is required) alike.
//!
//! Events are stored as core `v1` Events (see [`crate::convert`]), so the fields are the core
//! names; kube-apiserver names them so too, whichever API the client used (`message`, not
//! `note`). Its limits count bytes (Go's `len`) although the messages say "characters".
//!
//! Not mirrored: `reportingController` (required, a qualified name; its field name in the errors
//! depends on the API the request came through), the namespace agreement with the regarding
//! object, and `events.k8s.io`'s stricter create rules (`type`, the deprecated fields, `series`).

use serde_json::Value;

use super::{Errors, FieldError, Path, str_of};

/// `ReportingInstanceLengthLimit`, `ActionLengthLimit`, `ReasonLengthLimit` (bytes).
const SHORT_LIMIT: usize = 128;
/// `NoteLengthLimit` (bytes).
const NOTE_LIMIT: usize = 1024;

/// The rules of an Event with an `eventTime`: `reportingInstance`, `action` and `reason`
/// required and at most 128 bytes, the message at most 1024 bytes, in kube-apiserver's order.
pub(crate) fn event(ev: &Value) -> Errors {
    let mut errs = Errors::new();
    let has_time = ev
        .get("eventTime")
        .is_some_and(|t| !t.is_null() && t.as_str() != Some(""));
    if !has_time {
        // A legacy Event (the old API's counters and timestamps): no limits.
        return errs;
    }
    let too_long = |limit: usize| format!("can have at most {limit} characters");
    for field in ["reportingInstance", "action", "reason"] {
        let path = Path::root(field);
        let value = str_of(ev, field).unwrap_or_default();
        if value.is_empty() {
            errs.push(FieldError::required(&path, ""));
        }
        if value.len() > SHORT_LIMIT {
            errs.push(FieldError::invalid(&path, "", too_long(SHORT_LIMIT)));
        }
    }
    if str_of(ev, "message").is_some_and(|m| m.len() > NOTE_LIMIT) {
        errs.push(FieldError::invalid(
            &Path::root("message"),
            "",
            too_long(NOTE_LIMIT),
        ));
    }
    errs
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn messages(ev: &Value) -> Vec<String> {
        event(ev)
            .iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    /// Recorded from kube-apiserver v1.28.7.
    #[test]
    fn limits_count_bytes_and_read_like_kube_apiservers() {
        let base = |message: String| {
            json!({"eventTime": "2026-01-02T03:04:05.000000Z", "reportingInstance": "i", "action": "A",
                "reason": "R", "message": message})
        };
        assert!(messages(&base("é".repeat(512))).is_empty(), "1024 bytes pass");
        assert_eq!(
            messages(&base("é".repeat(513))),
            ["message: Invalid value: \"\": can have at most 1024 characters"]
        );
        assert_eq!(
            messages(&json!({"eventTime": "2026-01-02T03:04:05.000000Z", "action": "A".repeat(129)})),
            [
                "reportingInstance: Required value",
                "action: Invalid value: \"\": can have at most 128 characters",
                "reason: Required value",
            ]
        );
        assert!(
            messages(&json!({"message": "m".repeat(2000)})).is_empty(),
            "a legacy Event has no limit"
        );
    }
}
