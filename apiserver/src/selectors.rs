//! Label selectors (equality- and set-based) and field selectors, as in `?labelSelector=` and
//! `?fieldSelector=`.

use serde_json::Value;
use slinky_api::selectors::Operator;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Req>);

/// Split on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().map(str::trim).filter(|p| !p.is_empty()).collect()
}

fn set_values(s: &str) -> Result<Vec<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a (value, …) list, got {s:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parse `a=b,c!=d,e in (f,g),h notin (i),j,!k`.
    ///
    /// # Errors
    /// A message naming the requirement that can't be parsed.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = if let Some(key) = part.strip_prefix('!') {
                Req::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set_values(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set_values(v)?)
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
            {
                Req::Exists(part.to_string())
            } else {
                return Err(format!("unable to parse requirement {part:?}"));
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether an object's labels match.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => Operator::In.holds(vs, get(k)),
            Req::NotIn(k, vs) => Operator::NotIn.holds(vs, get(k)),
            Req::Exists(k) => Operator::Exists.holds::<&str>(&[], get(k)),
            Req::NotExists(k) => Operator::DoesNotExist.holds::<&str>(&[], get(k)),
        })
    }
}

/// A parsed field selector (`metadata.name`, `metadata.namespace`, and for pods `spec.nodeName`
/// and `status.phase`), with `=`, `==` and `!=`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parse; only supported fields are accepted.
    ///
    /// # Errors
    /// An unsupported field or malformed requirement.
    pub fn parse(s: &str, plural: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let (field, eq, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, true, v)
            } else {
                return Err(format!("invalid field selector requirement {part:?}"));
            };
            let field = field.trim();
            let supported = matches!(field, "metadata.name" | "metadata.namespace")
                || (plural == "pods" && matches!(field, "spec.nodeName" | "status.phase"));
            if !supported {
                return Err(format!("field label not supported: {field}"));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether an object matches.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, value)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let have = obj.pointer(&pointer).and_then(Value::as_str).unwrap_or_default();
            (have == value) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn label_selectors_equality_and_sets() -> Result<(), String> {
        let obj = json!({"metadata": {"labels": {"app": "slurmd", "tier": "a"}}});
        for (sel, want) in [
            ("app=slurmd", true),
            ("app==slurmd,tier!=b", true),
            ("app in (slurmd, other),tier", true),
            ("app notin (slurmd)", false),
            ("!tier", false),
            ("!missing,tier in (a)", true),
            ("", true),
        ] {
            assert_eq!(LabelSelector::parse(sel)?.matches(&obj), want, "{sel}");
        }
        assert!(LabelSelector::parse("a in b").is_err());
        Ok(())
    }

    #[test]
    fn field_selectors() -> Result<(), String> {
        let obj = json!({"metadata": {"name": "x", "namespace": "n"}, "spec": {"nodeName": "node-1"}});
        assert!(FieldSelector::parse("metadata.name=x,metadata.namespace!=m", "pods")?.matches(&obj));
        assert!(FieldSelector::parse("spec.nodeName=node-1", "pods")?.matches(&obj));
        assert!(FieldSelector::parse("spec.nodeName=node-1", "services").is_err());
        Ok(())
    }
}
