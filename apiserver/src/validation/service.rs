//! Services (`ValidateService`, `ValidateServiceUpdate`): ports (numbers, names, protocols,
//! target ports), the selector, the type and session affinity, and a cluster IP that may not
//! change once set.

use std::collections::BTreeSet;

use serde_json::Value;
use slinky_api::validation as rules;

use super::{Errors, FieldError, Path, each_invalid, items, meta, str_of};

const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];
const TYPES: [&str; 4] = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];

fn headless(spec: &Value) -> bool {
    str_of(spec, "clusterIP") == Some("None")
}

/// A Service on create (`old` `None`) or update.
pub(crate) fn service(svc: &Value, old: Option<&Value>) -> Errors {
    let mut errs = Errors::new();
    let field = Path::root("spec");
    let empty = Value::Null;
    let spec = svc.get("spec").unwrap_or(&empty);
    if let Some(old) = old {
        let before = items(&old["spec"], "clusterIPs");
        let after = items(spec, "clusterIPs");
        if !before.is_empty() && before.first() != after.first() {
            errs.push(FieldError::invalid(
                &field.child("clusterIPs").index(0),
                Value::Array(after.to_vec()),
                "may not change once set",
            ));
        }
    }
    let kind = str_of(spec, "type").unwrap_or("ClusterIP");
    let ports = items(spec, "ports");
    if ports.is_empty() && !headless(spec) && kind != "ExternalName" {
        errs.push(FieldError::required(&field.child("ports"), ""));
    }
    let mut names = BTreeSet::new();
    let mut seen = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let p = field.child("ports").index(i);
        let name = str_of(port, "name").unwrap_or_default();
        if ports.len() > 1 && name.is_empty() {
            errs.push(FieldError::required(&p.child("name"), ""));
        } else if !name.is_empty() {
            errs.extend(each_invalid(&p.child("name"), name, rules::dns1123_label(name)));
            if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(&p.child("name"), name));
            }
        }
        let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
        for m in rules::port_number(number) {
            errs.push(FieldError::invalid(&p.child("port"), number, m));
        }
        let proto = str_of(port, "protocol").unwrap_or("TCP");
        if !PROTOCOLS.contains(&proto) {
            errs.push(FieldError::not_supported(&p.child("protocol"), proto, &PROTOCOLS));
        }
        match port.get("targetPort") {
            Some(Value::Number(n)) => {
                let n = n.as_i64().unwrap_or(0);
                for m in rules::port_number(n) {
                    errs.push(FieldError::invalid(&p.child("targetPort"), n, m));
                }
            }
            Some(Value::String(s)) => {
                errs.extend(each_invalid(&p.child("targetPort"), s, rules::port_name(s)));
            }
            _ => {}
        }
        if kind == "ClusterIP"
            && port
                .get("nodePort")
                .and_then(Value::as_i64)
                .is_some_and(|n| n != 0)
        {
            errs.push(FieldError::forbidden(
                &p.child("nodePort"),
                "may not be used when `type` is 'ClusterIP'",
            ));
        }
        if !seen.insert((proto.to_string(), number)) {
            errs.push(FieldError::duplicate(
                &p,
                format!("{{Protocol: {proto:?}, Port: {number}}}"),
            ));
        }
    }
    errs.extend(meta::labels(spec.get("selector"), &field.child("selector")));
    if let Some(affinity) = str_of(spec, "sessionAffinity")
        && !["ClientIP", "None"].contains(&affinity)
    {
        errs.push(FieldError::not_supported(
            &field.child("sessionAffinity"),
            affinity,
            &["ClientIP", "None"],
        ));
    }
    if !TYPES.contains(&kind) {
        errs.push(FieldError::not_supported(&field.child("type"), kind, &TYPES));
    }
    errs
}
