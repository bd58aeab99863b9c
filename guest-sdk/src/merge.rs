//! Merging user-supplied partial objects over a builder's base, the way Slinky does it.
//!
//! Slinky strategic-merge-patches the user's pod spec (empty fields removed) over its base spec:
//! maps merge recursively, lists of objects with a *patch merge key* merge item by item (containers
//! by `name`, container ports by `containerPort`, env by `name`, mounts by `mountPath`, …), and
//! other lists are replaced. Containers and their `args` are exceptions: they are concatenated,
//! base first; and a user probe replaces only the probe handler. [`merge_container`] and
//! [`merge_pod_spec`] implement those rules on typed values.

use k8s_openapi::api::core::v1::{Container, PodSpec, ServiceSpec};
use serde_json::{Map, Value};

use crate::BuildError;

pub use slinky_api::merge_keys::{ListContext, patch_merge_key};

/// Remove nulls, empty strings, empty lists and empty maps (recursively): Slinky patches only
/// the fields a user actually set.
pub fn prune_empty(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for v in map.values_mut() {
                prune_empty(v);
            }
            map.retain(|_, v| !is_empty(v));
        }
        Value::Array(items) => items.iter_mut().for_each(prune_empty),
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

/// Container fields whose `false` is the API's own default: what a user's `false` there means
/// when the base sets nothing.
/// (Not `runAsNonRoot`: a container's `false` overrides the pod's `true`.)
const CONTAINER_DEFAULT_FALSE: [&str; 5] = [
    "/securityContext/privileged",
    "/securityContext/readOnlyRootFilesystem",
    "/stdin",
    "/stdinOnce",
    "/tty",
];
/// The same for a pod spec.
const POD_DEFAULT_FALSE: [&str; 5] = [
    "/hostNetwork",
    "/hostPID",
    "/hostIPC",
    "/shareProcessNamespace",
    "/setHostnameAsFQDN",
];

/// Drop from `user` each `false` at `paths` that `base` does not set: it is the API's default
/// and changes nothing, so leave it out as Slinky does (its merge drops every `false` and `0` a
/// user writes; here only those that mean the default, so a `false` that overrides the base, or
/// whose default is `true`, such as `allowPrivilegeEscalation`, still applies). A template that
/// said `privileged: false` then equals the one Slinky made from it.
fn drop_default_falses(user: &mut Value, base: &Value, paths: &[&str]) {
    for path in paths {
        if user.pointer(path) != Some(&Value::Bool(false)) || base.pointer(path).is_some() {
            continue;
        }
        if let Some((parent, key)) = path.rsplit_once('/')
            && let Some(Value::Object(m)) = user.pointer_mut(parent)
        {
            m.remove(key);
        }
    }
    prune_empty(user);
}

/// Strategic-merge `patch` into `base` (both JSON), with list merge keys from [`patch_merge_key`].
pub fn strategic_merge(base: &mut Value, patch: &Value, ctx: ListContext) {
    match (base, patch) {
        (_, Value::Null) => {}
        (Value::Object(base), Value::Object(patch)) => merge_maps(base, patch, ctx),
        (base, patch) => *base = patch.clone(),
    }
}

fn merge_maps(base: &mut Map<String, Value>, patch: &Map<String, Value>, ctx: ListContext) {
    for (key, pv) in patch {
        match (base.get_mut(key), pv) {
            (Some(bv @ Value::Object(_)), Value::Object(_)) => strategic_merge(bv, pv, ctx),
            (Some(Value::Array(bl)), Value::Array(pl)) => match patch_merge_key(key, ctx) {
                Some(mk) => merge_keyed_lists(bl, pl, mk, ctx),
                None => *bl = pl.clone(),
            },
            _ => {
                base.insert(key.clone(), pv.clone());
            }
        }
    }
}

fn merge_keyed_lists(base: &mut Vec<Value>, patch: &[Value], key: &str, ctx: ListContext) {
    for item in patch {
        let existing = item
            .get(key)
            .and_then(|k| base.iter_mut().find(|b| b.get(key) == Some(k)));
        match existing {
            Some(b) => strategic_merge(b, item, ctx),
            None => base.push(item.clone()),
        }
    }
}

const PROBE_HANDLERS: [&str; 4] = ["exec", "httpGet", "tcpSocket", "grpc"];
const PROBES: [&str; 3] = ["livenessProbe", "readinessProbe", "startupProbe"];

fn to_value<T: serde::Serialize>(what: &str, v: &T) -> Result<Value, BuildError> {
    serde_json::to_value(v).map_err(|e| BuildError::Internal(format!("cannot serialize {what}: {e}")))
}

fn from_value<T: serde::de::DeserializeOwned>(what: &str, v: Value) -> Result<T, BuildError> {
    serde_json::from_value(v).map_err(|e| BuildError::InvalidInput(format!("invalid merged {what}: {e}")))
}

/// Merge a user's (partial) container over a base container, Slinky's way: `args` concatenated
/// (base first), a user probe replaces only the probe handler, everything else strategic-merged.
/// The base's name is kept.
///
/// # Errors
/// [`BuildError::InvalidInput`] when the result is not a valid container.
pub fn merge_container(base: &Container, user: &Value) -> Result<Container, BuildError> {
    let mut merged = to_value("container", base)?;
    let mut user = user.clone();
    prune_empty(&mut user);
    drop_default_falses(&mut user, &merged, &CONTAINER_DEFAULT_FALSE);
    let Value::Object(user_map) = &mut user else {
        return if user.is_null() {
            Ok(base.clone())
        } else {
            Err(BuildError::invalid("a container must be an object"))
        };
    };
    user_map.remove("name");
    let user_args = user_map.remove("args");
    for probe in PROBES {
        let has_handler = user_map
            .get(probe)
            .is_some_and(|p| PROBE_HANDLERS.iter().any(|h| p.get(h).is_some()));
        if has_handler && let Some(Value::Object(base_probe)) = merged.get_mut(probe) {
            for h in PROBE_HANDLERS {
                base_probe.remove(h);
            }
        }
    }
    strategic_merge(&mut merged, &user, ListContext::Pod);
    let mut container: Container = from_value("container", merged)?;
    if let Some(args) = user_args {
        let args: Vec<String> = from_value("container args", args)?;
        container.args.get_or_insert_default().extend(args);
    }
    Ok(container)
}

/// Merge a user's (partial) pod spec over a base spec: containers and initContainers
/// concatenated (base first), everything else strategic-merged.
///
/// # Errors
/// [`BuildError::InvalidInput`] when the result is not a valid pod spec.
pub fn merge_pod_spec(base: &PodSpec, user: &Value) -> Result<PodSpec, BuildError> {
    let mut merged = to_value("pod spec", base)?;
    let mut user = user.clone();
    prune_empty(&mut user);
    drop_default_falses(&mut user, &merged, &POD_DEFAULT_FALSE);
    if let Value::Object(user_map) = &mut user {
        for list in ["containers", "initContainers"] {
            if let Some(Value::Array(extra)) = user_map.remove(list)
                && let Value::Object(m) = &mut merged
            {
                match m.entry(list.to_string()).or_insert_with(|| Value::Array(vec![])) {
                    Value::Array(items) => items.extend(extra),
                    other => *other = Value::Array(extra),
                }
            }
        }
    }
    strategic_merge(&mut merged, &user, ListContext::Pod);
    from_value("pod spec", merged)
}

/// Merge a user's (partial) service spec over a base spec (strategic merge, ports by `port`).
///
/// # Errors
/// [`BuildError::InvalidInput`] when the result is not a valid service spec.
pub fn merge_service_spec(base: &ServiceSpec, user: &Value) -> Result<ServiceSpec, BuildError> {
    let mut merged = to_value("service spec", base)?;
    let mut user = user.clone();
    prune_empty(&mut user);
    strategic_merge(&mut merged, &user, ListContext::Service);
    from_value("service spec", merged)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keyed_lists_merge_and_others_replace() {
        let mut base = json!({"ports": [{"containerPort": 1, "name": "a"}], "tolerations": [{"key": "x"}]});
        let patch = json!({"ports": [{"containerPort": 1, "protocol": "UDP"}, {"containerPort": 2}],
                           "tolerations": [{"key": "y"}]});
        strategic_merge(&mut base, &patch, ListContext::Pod);
        assert_eq!(
            base,
            json!({"ports": [{"containerPort": 1, "name": "a", "protocol": "UDP"}, {"containerPort": 2}],
                   "tolerations": [{"key": "y"}]})
        );
    }

    #[test]
    fn container_args_concatenate_and_probe_handler_is_replaced() -> Result<(), BuildError> {
        let base: Container = serde_json::from_value(json!({
            "name": "slurmd", "args": ["-Z"],
            "livenessProbe": {"httpGet": {"path": "/livez", "port": "slurmd"}, "failureThreshold": 6}
        }))
        .map_err(|e| BuildError::Internal(e.to_string()))?;
        let user = json!({"name": "ignored", "image": "img", "args": ["-vvv"],
                          "livenessProbe": {"tcpSocket": {"port": 6818}}});
        let merged = merge_container(&base, &user)?;
        assert_eq!(merged.name, "slurmd");
        assert_eq!(merged.image.as_deref(), Some("img"));
        assert_eq!(merged.args, Some(vec!["-Z".to_string(), "-vvv".to_string()]));
        let probe = merged.liveness_probe.ok_or(BuildError::invalid("probe lost"))?;
        assert!(
            probe.http_get.is_none(),
            "the user's handler replaces the base handler"
        );
        assert!(probe.tcp_socket.is_some());
        assert_eq!(probe.failure_threshold, Some(6), "thresholds stay");
        Ok(())
    }

    #[test]
    fn a_false_that_means_the_default_is_left_out_and_one_that_overrides_stays() -> Result<(), BuildError> {
        let bare = Container {
            name: "login".into(),
            ..Default::default()
        };
        let user = json!({"image": "img", "securityContext": {"privileged": false}});
        let merged = merge_container(&bare, &user)?;
        assert_eq!(
            merged.security_context, None,
            "privileged: false over nothing is nothing"
        );
        let user = json!({"securityContext": {"privileged": false, "allowPrivilegeEscalation": false}});
        let merged = merge_container(&bare, &user)?;
        assert_eq!(
            to_value("sc", &merged.security_context)?,
            json!({"allowPrivilegeEscalation": false}),
            "a false whose default is true stays"
        );
        let privileged: Container =
            serde_json::from_value(json!({"name": "slurmd", "securityContext": {"privileged": true}}))
                .map_err(|e| BuildError::Internal(e.to_string()))?;
        let merged = merge_container(&privileged, &json!({"securityContext": {"privileged": false}}))?;
        assert_eq!(
            merged.security_context.and_then(|s| s.privileged),
            Some(false),
            "a false over the base's true applies"
        );
        Ok(())
    }

    #[test]
    fn empty_user_fields_do_not_clear_base_fields() {
        let mut base = json!({"hostname": "a", "nodeSelector": {"k": "v"}});
        let mut patch = json!({"hostname": "", "nodeSelector": {}, "subdomain": null});
        prune_empty(&mut patch);
        strategic_merge(&mut base, &patch, ListContext::Pod);
        assert_eq!(base, json!({"hostname": "a", "nodeSelector": {"k": "v"}}));
        strategic_merge(&mut base, &Value::Null, ListContext::Pod);
        assert_eq!(
            base,
            json!({"hostname": "a", "nodeSelector": {"k": "v"}}),
            "no patch, no change"
        );
    }
}
