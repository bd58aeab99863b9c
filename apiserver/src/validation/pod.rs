//! Pods (`ValidatePodSpec`, `ValidatePodUpdate`): containers and init containers, ports, probes,
//! environment, volumes and mounts, resources, DNS names, restart and DNS policies; on update,
//! only images, `activeDeadlineSeconds` (lowered), tolerations (added) and
//! `terminationGracePeriodSeconds` (from a negative value) may change.

use std::collections::BTreeSet;

use serde_json::Value;
use slinky_api::{quantity::parse as quantity, validation as rules};

use super::{Errors, FieldError, Path, each_invalid, items, meta, str_of};

const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];
const VOLUME_SOURCES: [&str; 29] = [
    "hostPath",
    "emptyDir",
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "gitRepo",
    "secret",
    "nfs",
    "iscsi",
    "glusterfs",
    "persistentVolumeClaim",
    "rbd",
    "flexVolume",
    "cinder",
    "cephfs",
    "flocker",
    "downwardAPI",
    "fc",
    "azureFile",
    "configMap",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "projected",
    "portworxVolume",
    "scaleIO",
    "storageos",
    "csi",
    "ephemeral",
];
const MAX_INT32: i64 = i32::MAX as i64;

/// A pod on create.
pub(crate) fn pod(pod: &Value) -> Errors {
    let empty = Value::Null;
    pod_spec(pod.get("spec").unwrap_or(&empty), &Path::root("spec"))
}

/// `ValidatePodSpec`.
pub(crate) fn pod_spec(spec: &Value, field: &Path) -> Errors {
    let mut errs = Errors::new();
    let volumes = volumes(items(spec, "volumes"), &field.child("volumes"), &mut errs);
    let containers = items(spec, "containers");
    if containers.is_empty() {
        errs.push(FieldError::required(&field.child("containers"), ""));
    }
    let mut names = BTreeSet::new();
    for (i, c) in containers.iter().enumerate() {
        let p = field.child("containers").index(i);
        errs.extend(container(c, &volumes, &p));
        let name = str_of(c, "name").unwrap_or_default();
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(&p.child("name"), name));
        }
        for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
            if let Some(pr) = c.get(probe).filter(|v| !v.is_null()) {
                errs.extend(self::probe(pr, &p.child(probe)));
            }
        }
    }
    for (i, c) in items(spec, "initContainers").iter().enumerate() {
        let p = field.child("initContainers").index(i);
        errs.extend(container(c, &volumes, &p));
        let name = str_of(c, "name").unwrap_or_default();
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(&p.child("name"), name));
        }
    }
    if let Some(policy) = str_of(spec, "restartPolicy")
        && !["Always", "OnFailure", "Never"].contains(&policy)
    {
        errs.push(FieldError::not_supported(
            &field.child("restartPolicy"),
            policy,
            &["Always", "OnFailure", "Never"],
        ));
    }
    if let Some(policy) = str_of(spec, "dnsPolicy")
        && !["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"].contains(&policy)
    {
        errs.push(FieldError::not_supported(
            &field.child("dnsPolicy"),
            policy,
            &["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"],
        ));
    }
    errs.extend(meta::labels(
        spec.get("nodeSelector"),
        &field.child("nodeSelector"),
    ));
    for key in ["serviceAccountName", "nodeName"] {
        if let Some(v) = str_of(spec, key).filter(|v| !v.is_empty()) {
            errs.extend(each_invalid(&field.child(key), v, rules::dns1123_subdomain(v)));
        }
    }
    if let Some(d) = spec.get("activeDeadlineSeconds").and_then(Value::as_i64)
        && !(1..=MAX_INT32).contains(&d)
    {
        errs.push(FieldError::invalid(
            &field.child("activeDeadlineSeconds"),
            d,
            rules::inclusive_range_error(1, MAX_INT32),
        ));
    }
    for key in ["hostname", "subdomain"] {
        if let Some(v) = str_of(spec, key).filter(|v| !v.is_empty()) {
            errs.extend(each_invalid(&field.child(key), v, rules::dns1123_label(v)));
        }
    }
    errs
}

/// `ValidateVolumes`: names (DNS labels, unique) and exactly one source each; returns the names.
fn volumes(list: &[Value], field: &Path, errs: &mut Errors) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (i, v) in list.iter().enumerate() {
        let p = field.index(i);
        let name = str_of(v, "name").unwrap_or_default();
        if name.is_empty() {
            errs.push(FieldError::required(&p.child("name"), ""));
        } else {
            errs.extend(each_invalid(&p.child("name"), name, rules::dns1123_label(name)));
        }
        if !names.insert(name.to_string()) {
            errs.push(FieldError::duplicate(&p.child("name"), name));
        }
        let sources: Vec<&str> = VOLUME_SOURCES
            .iter()
            .copied()
            .filter(|s| v.get(*s).is_some_and(|x| !x.is_null()))
            .collect();
        match sources.as_slice() {
            [] => errs.push(FieldError::required(&p, "must specify a volume type")),
            [_] => {}
            [_, extra @ ..] => {
                for s in extra {
                    errs.push(FieldError::forbidden(
                        &p.child(s),
                        "may not specify more than 1 volume type",
                    ));
                }
            }
        }
    }
    names
}

/// `validateContainerCommon`.
fn container(c: &Value, volumes: &BTreeSet<String>, field: &Path) -> Errors {
    let mut errs = Errors::new();
    match str_of(c, "name").filter(|n| !n.is_empty()) {
        None => errs.push(FieldError::required(&field.child("name"), "")),
        Some(name) => errs.extend(each_invalid(
            &field.child("name"),
            name,
            rules::dns1123_label(name),
        )),
    }
    if str_of(c, "image").is_none_or(str::is_empty) {
        errs.push(FieldError::required(&field.child("image"), ""));
    }
    if let Some(p) = str_of(c, "terminationMessagePolicy")
        && !["File", "FallbackToLogsOnError"].contains(&p)
    {
        errs.push(FieldError::not_supported(
            &field.child("terminationMessagePolicy"),
            p,
            &["File", "FallbackToLogsOnError"],
        ));
    }
    errs.extend(ports(items(c, "ports"), &field.child("ports")));
    errs.extend(env(items(c, "env"), &field.child("env")));
    errs.extend(mounts(
        items(c, "volumeMounts"),
        volumes,
        &field.child("volumeMounts"),
    ));
    if let Some(p) = str_of(c, "imagePullPolicy")
        && !["Always", "IfNotPresent", "Never"].contains(&p)
    {
        errs.push(FieldError::not_supported(
            &field.child("imagePullPolicy"),
            p,
            &["Always", "IfNotPresent", "Never"],
        ));
    }
    if let Some(r) = c.get("resources") {
        errs.extend(resources(r, &field.child("resources")));
    }
    errs
}

/// `validateContainerPorts`.
fn ports(list: &[Value], field: &Path) -> Errors {
    let mut errs = Errors::new();
    let mut names = BTreeSet::new();
    for (i, port) in list.iter().enumerate() {
        let p = field.index(i);
        if let Some(name) = str_of(port, "name").filter(|n| !n.is_empty()) {
            let msgs = rules::port_name(name);
            if !msgs.is_empty() {
                errs.extend(each_invalid(&p.child("name"), name, msgs));
            } else if !names.insert(name.to_string()) {
                errs.push(FieldError::duplicate(&p.child("name"), name));
            }
        }
        match port.get("containerPort").and_then(Value::as_i64).unwrap_or(0) {
            0 => errs.push(FieldError::required(&p.child("containerPort"), "")),
            n => {
                for m in rules::port_number(n) {
                    errs.push(FieldError::invalid(&p.child("containerPort"), n, m));
                }
            }
        }
        if let Some(n) = port.get("hostPort").and_then(Value::as_i64).filter(|n| *n != 0) {
            for m in rules::port_number(n) {
                errs.push(FieldError::invalid(&p.child("hostPort"), n, m));
            }
        }
        if let Some(proto) = str_of(port, "protocol")
            && !PROTOCOLS.contains(&proto)
        {
            errs.push(FieldError::not_supported(&p.child("protocol"), proto, &PROTOCOLS));
        }
    }
    errs
}

/// `ValidateEnv`.
fn env(list: &[Value], field: &Path) -> Errors {
    let mut errs = Errors::new();
    for (i, e) in list.iter().enumerate() {
        let p = field.index(i).child("name");
        match str_of(e, "name").filter(|n| !n.is_empty()) {
            None => errs.push(FieldError::required(&p, "")),
            Some(n) => errs.extend(each_invalid(&p, n, rules::env_var_name(n))),
        }
    }
    errs
}

/// `ValidateVolumeMounts`: every mount names a volume of the pod; mount paths set and unique.
fn mounts(list: &[Value], volumes: &BTreeSet<String>, field: &Path) -> Errors {
    let mut errs = Errors::new();
    let mut paths = BTreeSet::new();
    for (i, m) in list.iter().enumerate() {
        let p = field.index(i);
        let name = str_of(m, "name").unwrap_or_default();
        if name.is_empty() {
            errs.push(FieldError::required(&p.child("name"), ""));
        }
        if !volumes.contains(name) {
            errs.push(FieldError::not_found(&p.child("name"), name));
        }
        let path = str_of(m, "mountPath").unwrap_or_default();
        if path.is_empty() {
            errs.push(FieldError::required(&p.child("mountPath"), ""));
        }
        if !paths.insert(path.to_string()) {
            errs.push(FieldError::invalid(&p.child("mountPath"), path, "must be unique"));
        }
    }
    errs
}

/// `validateProbe` / `validateHandler`: exactly one handler, non-negative counts.
fn probe(probe: &Value, field: &Path) -> Errors {
    let mut errs = Errors::new();
    let mut handlers = 0;
    for h in ["exec", "httpGet", "tcpSocket", "grpc"] {
        if probe.get(h).is_some_and(|v| !v.is_null()) {
            if handlers > 0 {
                errs.push(FieldError::forbidden(
                    &field.child(h),
                    "may not specify more than 1 handler type",
                ));
            } else {
                handlers += 1;
            }
        }
    }
    if handlers == 0 {
        errs.push(FieldError::required(field, "must specify a handler type"));
    }
    for key in [
        "initialDelaySeconds",
        "timeoutSeconds",
        "periodSeconds",
        "successThreshold",
        "failureThreshold",
    ] {
        if let Some(n) = probe.get(key).and_then(Value::as_i64)
            && n < 0
        {
            errs.push(FieldError::invalid(
                &field.child(key),
                n,
                "must be greater than or equal to 0",
            ));
        }
    }
    errs
}

/// `ValidateResourceRequirements`: non-negative quantities, requests within limits.
fn resources(r: &Value, field: &Path) -> Errors {
    let mut errs = Errors::new();
    let limits = r.get("limits").and_then(Value::as_object);
    for (kind, map) in [
        ("limits", limits),
        ("requests", r.get("requests").and_then(Value::as_object)),
    ] {
        for (name, q) in map.into_iter().flatten() {
            let p = field.child(kind).key(name);
            let text = q.as_str().map_or_else(|| q.to_string(), str::to_string);
            let Some(v) = quantity(&text) else { continue };
            if v < 0.0 {
                errs.push(FieldError::invalid(
                    &p,
                    text.as_str(),
                    "must be greater than or equal to 0",
                ));
            }
            if kind == "requests"
                && let Some(limit) = limits.and_then(|l| l.get(name))
            {
                let limit_text = limit.as_str().map_or_else(|| limit.to_string(), str::to_string);
                if quantity(&limit_text).is_some_and(|l| v > l) {
                    errs.push(FieldError::invalid(
                        &p,
                        text.as_str(),
                        format!("must be less than or equal to {name} limit of {limit_text}"),
                    ));
                }
            }
        }
    }
    errs
}

/// The quantities of a pod that do not parse: kube-apiserver refuses such a body with 400 when it
/// decodes it, before validation.
pub(crate) fn bad_quantities(pod: &Value) -> bool {
    let spec = &pod["spec"];
    ["containers", "initContainers"]
        .iter()
        .flat_map(|k| items(spec, k))
        .flat_map(|c| ["limits", "requests"].map(|k| c.pointer(&format!("/resources/{k}"))))
        .flatten()
        .filter_map(Value::as_object)
        .flat_map(|m| m.values())
        .any(|q| match q {
            Value::String(s) => quantity(s).is_none(),
            Value::Number(_) => false,
            _ => true,
        })
}

fn tolerations_key(t: &Value) -> Value {
    let mut t = t.clone();
    if let Value::Object(m) = &mut t {
        m.remove("tolerationSeconds");
    }
    t
}

/// `ValidatePodUpdate`: the pod is valid, and its spec changed only where a running pod can.
pub(crate) fn pod_update(new: &Value, old: &Value) -> Errors {
    let mut errs = pod(new);
    let spec = Path::root("spec");
    let (ns, os) = (&new["spec"], &old["spec"]);
    for key in ["containers", "initContainers"] {
        let (n, o) = (items(ns, key), items(os, key));
        if n.len() != o.len() {
            errs.push(FieldError::forbidden(
                &spec.child(key),
                "pod updates may not add or remove containers",
            ));
            return errs;
        }
    }
    match (
        ns.get("activeDeadlineSeconds").and_then(Value::as_i64),
        os.get("activeDeadlineSeconds").and_then(Value::as_i64),
    ) {
        (Some(n), _) if !(0..=MAX_INT32).contains(&n) => {
            errs.push(FieldError::invalid(
                &spec.child("activeDeadlineSeconds"),
                n,
                rules::inclusive_range_error(0, MAX_INT32),
            ));
            return errs;
        }
        (Some(n), Some(o)) if o < n => {
            errs.push(FieldError::invalid(
                &spec.child("activeDeadlineSeconds"),
                n,
                "must be less than or equal to previous value",
            ));
            return errs;
        }
        (None, Some(_)) => errs.push(FieldError::invalid(
            &spec.child("activeDeadlineSeconds"),
            Value::Null,
            "must not update from a positive integer to nil value",
        )),
        _ => {}
    }
    let new_tolerations: Vec<Value> = items(ns, "tolerations").iter().map(tolerations_key).collect();
    if items(os, "tolerations")
        .iter()
        .any(|t| !new_tolerations.contains(&tolerations_key(t)))
    {
        errs.push(FieldError::forbidden(
            &spec.child("tolerations"),
            "existing toleration can not be modified except its tolerationSeconds",
        ));
    }
    // Everything else must be as it was: copy the mutable fields from the old spec and compare.
    let mut munged = ns.clone();
    for key in ["containers", "initContainers"] {
        if let Some(list) = munged.get_mut(key).and_then(Value::as_array_mut) {
            for (c, o) in list.iter_mut().zip(items(os, key)) {
                c["image"] = o.get("image").cloned().unwrap_or(Value::Null);
            }
        }
    }
    if let Value::Object(m) = &mut munged {
        for key in ["activeDeadlineSeconds", "tolerations", "schedulingGates"] {
            match os.get(key) {
                Some(v) => m.insert(key.into(), v.clone()),
                None => m.remove(key),
            };
        }
        if os
            .get("terminationGracePeriodSeconds")
            .and_then(Value::as_i64)
            .is_some_and(|g| g < 0)
        {
            match os.get("terminationGracePeriodSeconds") {
                Some(v) => m.insert("terminationGracePeriodSeconds".into(), v.clone()),
                None => m.remove("terminationGracePeriodSeconds"),
            };
        }
    }
    if &munged != os {
        let mut changes = Vec::new();
        diff(os, &munged, "spec", &mut changes);
        errs.push(FieldError::forbidden(
            &spec,
            format!(
                "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)\n{}",
                changes.join("\n")
            ),
        ));
    }
    errs
}

/// The changed leaves between two values, as `-path: old` / `+path: new` lines.
fn diff(old: &Value, new: &Value, path: &str, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let (x, y) = (a.get(k).unwrap_or(&Value::Null), b.get(k).unwrap_or(&Value::Null));
                diff(x, y, &format!("{path}.{k}"), out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff(x, y, &format!("{path}[{i}]"), out);
            }
        }
        (a, b) if a != b => {
            out.push(format!("-  {path}: {a}"));
            out.push(format!("+  {path}: {b}"));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(quantity("500m"), Some(0.5));
        assert_eq!(quantity("1Gi"), Some(1024f64.powi(3)));
        assert_eq!(quantity("2e3"), Some(2000.0));
        assert_eq!(quantity("-1"), Some(-1.0));
        assert_eq!(quantity("abc"), None);
        assert_eq!(quantity("1Zi"), None);
    }
}
