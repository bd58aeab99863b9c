//! What kube-apiserver does to a body on its way in, before validation: it refuses what does not
//! decode, sets the server-side defaults of the built-in types, and stores quantities in their
//! canonical form.

use serde_json::{Value, json};

use super::Inner;
use crate::{ApiError, resources::ResourceType, validation};

impl Inner {
    /// Server-side defaults for the built-in types the host uses.
    pub(super) fn defaults(&mut self, rt: &ResourceType, obj: &mut Value) {
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("", "namespaces") => {
                obj["spec"] = json!({"finalizers": ["kubernetes"]});
                obj["status"] = json!({"phase": "Active"});
            }
            ("", "pods") => {
                if obj.pointer("/status/phase").is_none() {
                    obj["status"] = json!({"phase": "Pending", "qosClass": "BestEffort"});
                }
                pod_defaults(obj);
            }
            ("", "persistentvolumeclaims") => {
                // A new claim is Pending until bound, whatever status the client sent.
                obj["status"] = json!({"phase": "Pending"});
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.entry("volumeMode").or_insert("Filesystem".into());
                }
            }
            ("", "secrets") => secret_defaults(obj),
            ("rbac.authorization.k8s.io", _) => validation::rbac_defaults(rt, obj),
            ("apps", "controllerrevisions") => revision_defaults(obj),
            ("apps", "statefulsets") => statefulset_defaults(obj),
            ("", "services") => {
                let ip = self.next_ip;
                self.next_ip += 1;
                if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.entry("type").or_insert("ClusterIP".into());
                    spec.entry("sessionAffinity").or_insert("None".into());
                    if spec
                        .get("clusterIP")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        let addr = format!("10.96.{}.{}", ip / 250, ip % 250 + 1);
                        spec.insert("clusterIP".into(), addr.clone().into());
                        spec.insert("clusterIPs".into(), json!([addr]));
                    }
                    if let Some(Value::Array(ports)) = spec.get_mut("ports") {
                        for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                            p.entry("protocol").or_insert("TCP".into());
                            if let Some(port) = p.get("port").cloned() {
                                p.entry("targetPort").or_insert(port);
                            }
                        }
                    }
                }
                obj["status"] = json!({"loadBalancer": {}});
            }
            _ => {}
        }
    }
}

/// Pod spec defaults kube-apiserver sets (and the immutability check compares with).
fn pod_defaults(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("restartPolicy").or_insert("Always".into());
    spec.entry("dnsPolicy").or_insert("ClusterFirst".into());
    spec.entry("schedulerName").or_insert("default-scheduler".into());
    spec.entry("terminationGracePeriodSeconds").or_insert(30.into());
    default_toleration_seconds(spec);
    for key in ["containers", "initContainers"] {
        for c in spec
            .get_mut(key)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(Value::as_object_mut)
        {
            c.entry("terminationMessagePath")
                .or_insert("/dev/termination-log".into());
            c.entry("terminationMessagePolicy").or_insert("File".into());
            if !c.contains_key("imagePullPolicy") {
                let image = c.get("image").and_then(Value::as_str).unwrap_or_default();
                let tag = image
                    .rsplit('/')
                    .next()
                    .and_then(|last| last.split_once(':'))
                    .map(|(_, t)| t);
                let latest = !image.contains('@') && tag.is_none_or(|t| t == "latest");
                let policy = if latest { "Always" } else { "IfNotPresent" };
                c.insert("imagePullPolicy".into(), policy.into());
            }
            for p in c
                .get_mut("ports")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
                .filter_map(Value::as_object_mut)
            {
                p.entry("protocol").or_insert("TCP".into());
            }
        }
    }
}

/// The `DefaultTolerationSeconds` admission plugin (on by default): a pod that does not
/// tolerate a node being not ready or unreachable (`NoExecute`) tolerates it for 300 s, so it is
/// evicted from such a node after five minutes.
fn default_toleration_seconds(spec: &mut serde_json::Map<String, Value>) {
    let tolerates = |spec: &serde_json::Map<String, Value>, key: &str| {
        spec.get("tolerations")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|t| {
                let field = |f: &str| t.get(f).and_then(Value::as_str).unwrap_or_default();
                (field("key") == key || field("key").is_empty())
                    && (field("effect") == "NoExecute" || field("effect").is_empty())
            })
    };
    for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
        if !tolerates(spec, key) {
            let t =
                json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300});
            match spec.get_mut("tolerations").and_then(Value::as_array_mut) {
                Some(list) => list.push(t),
                None => {
                    spec.insert("tolerations".into(), json!([t]));
                }
            }
        }
    }
}

/// A ControllerRevision's `revision` is an `int64` Go always writes: 0 when none was sent.
fn revision_defaults(obj: &mut Value) {
    if let Some(m) = obj.as_object_mut()
        && m.get("revision").is_none_or(Value::is_null)
    {
        m.insert("revision".into(), 0.into());
    }
}

/// `stringData` is write-only: merged into `data` (base64), as kube-apiserver does.
fn secret_defaults(obj: &mut Value) {
    use base64::Engine;
    let Some(string_data) = obj.as_object_mut().and_then(|m| m.remove("stringData")) else {
        return;
    };
    if !obj.get("data").is_some_and(Value::is_object) {
        obj["data"] = json!({});
    }
    for (k, v) in string_data.as_object().into_iter().flatten() {
        let text = v.as_str().unwrap_or_default();
        obj["data"][k] = base64::engine::general_purpose::STANDARD.encode(text).into();
    }
}

/// A StatefulSet's spec defaults as kube-apiserver 1.28 sets them (`SetDefaults_StatefulSet`,
/// with `StatefulSetAutoDeletePVC` on, its default since 1.27): one replica, `OrderedReady`, a
/// rolling update from partition 0, ten revisions kept, claims retained. A writer that leaves
/// them out changes nothing; one that sends them as defaulted changes nothing either (so a
/// StatefulSet another manager made without them keeps its generation under our apply).
fn statefulset_defaults(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    spec.entry("replicas").or_insert(1.into());
    spec.entry("podManagementPolicy").or_insert("OrderedReady".into());
    spec.entry("revisionHistoryLimit").or_insert(10.into());
    let strategy = spec.entry("updateStrategy").or_insert_with(|| json!({}));
    if let Some(strategy) = strategy.as_object_mut() {
        // A `rollingUpdate` only when the type was left out too.
        if strategy
            .get("type")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            strategy.insert("type".into(), "RollingUpdate".into());
            strategy.entry("rollingUpdate").or_insert_with(|| json!({}));
        }
        if strategy.get("type").and_then(Value::as_str) == Some("RollingUpdate")
            && let Some(rolling) = strategy.get_mut("rollingUpdate").and_then(Value::as_object_mut)
        {
            rolling.entry("partition").or_insert(0.into());
        }
    }
    let retention = spec
        .entry("persistentVolumeClaimRetentionPolicy")
        .or_insert_with(|| json!({}));
    if let Some(retention) = retention.as_object_mut() {
        retention.entry("whenDeleted").or_insert("Retain".into());
        retention.entry("whenScaled").or_insert("Retain".into());
    }
}

/// Defaults of an update: what create defaults, and a Service keeps the cluster IP it has
/// when the update leaves it out.
pub(super) fn update_defaults(rt: &ResourceType, new: &mut Value, old: &Value) {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => pod_defaults(new),
        ("", "secrets") => secret_defaults(new),
        ("rbac.authorization.k8s.io", _) => validation::rbac_defaults(rt, new),
        ("apps", "controllerrevisions") => revision_defaults(new),
        ("apps", "statefulsets") => statefulset_defaults(new),
        ("", "services") => {
            let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else {
                return;
            };
            if spec
                .get("clusterIP")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                for key in ["clusterIP", "clusterIPs"] {
                    if let Some(v) = old.pointer(&format!("/spec/{key}")) {
                        spec.insert(key.into(), v.clone());
                    }
                }
            }
            spec.entry("type").or_insert("ClusterIP".into());
            spec.entry("sessionAffinity").or_insert("None".into());
            if let Some(Value::Array(ports)) = spec.get_mut("ports") {
                for p in ports.iter_mut().filter_map(Value::as_object_mut) {
                    p.entry("protocol").or_insert("TCP".into());
                    if let Some(port) = p.get("port").cloned() {
                        p.entry("targetPort").or_insert(port);
                    }
                }
            }
        }
        _ => {}
    }
}

/// What kube-apiserver refuses while decoding a body (400 BadRequest), before validation: for
/// pods, resource quantities that do not parse.
pub(super) fn decodable(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    if rt.group.is_empty() && rt.plural == "pods" && validation::bad_quantities(obj) {
        return Err(ApiError::bad_request(
            "Pod in version \"v1\" cannot be handled as a Pod: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
        ));
    }
    Ok(())
}

/// Quantities of built-in types in the form kube-apiserver stores them (`1024Mi` as `1Gi`, `1.5`
/// as `1500m`): its typed decoding canonicalises every `resource.Quantity`. The fields covered
/// are those of pods, pod templates and claims: container resources, pod overhead, `emptyDir`
/// size limits, and claim (template) resources.
pub(super) fn canonical_quantities(rt: &ResourceType, obj: &mut Value) {
    fn values(map: Option<&mut Value>) {
        for v in map
            .and_then(Value::as_object_mut)
            .into_iter()
            .flat_map(|m| m.values_mut())
        {
            if let Some(c) = v.as_str().and_then(slinky_api::quantity::canonical) {
                *v = c.into();
            }
        }
    }
    fn claim(spec: Option<&mut Value>) {
        if let Some(spec) = spec {
            values(spec.pointer_mut("/resources/requests"));
            values(spec.pointer_mut("/resources/limits"));
        }
    }
    fn pod_spec(spec: Option<&mut Value>) {
        let Some(spec) = spec else { return };
        for list in ["containers", "initContainers", "ephemeralContainers"] {
            for c in spec
                .get_mut(list)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                values(c.pointer_mut("/resources/requests"));
                values(c.pointer_mut("/resources/limits"));
            }
        }
        values(spec.get_mut("overhead"));
        for v in spec
            .get_mut("volumes")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(q) = v.pointer_mut("/emptyDir/sizeLimit")
                && let Some(c) = q.as_str().and_then(slinky_api::quantity::canonical)
            {
                *q = c.into();
            }
            claim(v.pointer_mut("/ephemeral/volumeClaimTemplate/spec"));
        }
    }
    if rt.custom {
        return;
    }
    pod_spec(pod_spec_pointer(rt).and_then(|at| obj.pointer_mut(at)));
    match rt.plural.as_str() {
        "persistentvolumeclaims" => claim(obj.get_mut("spec")),
        "statefulsets" => {
            for t in obj
                .pointer_mut("/spec/volumeClaimTemplates")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                claim(t.get_mut("spec"));
                // kube-apiserver converts each template to its internal type and back: whatever
                // type fields a client sent, it stores and returns `v1`/`PersistentVolumeClaim`
                // (pkg/apis/apps/v1/conversion.go).
                if let Some(m) = t.as_object_mut() {
                    m.insert("apiVersion".into(), "v1".into());
                    m.insert("kind".into(), "PersistentVolumeClaim".into());
                }
            }
        }
        _ => {}
    }
}

/// Where a pod spec is in an object of the type (a pod's own, or a workload's template).
fn pod_spec_pointer(rt: &ResourceType) -> Option<&'static str> {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => Some("/spec"),
        ("", "podtemplates") => Some("/template/spec"),
        ("", "replicationcontrollers")
        | ("apps", "statefulsets" | "deployments" | "daemonsets" | "replicasets")
        | ("batch", "jobs") => Some("/spec/template/spec"),
        ("batch", "cronjobs") => Some("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    }
}

/// With the `SidecarContainers` feature gate off, what kube-apiserver 1.28's
/// `dropDisabledFields` does: the `restartPolicy` of every init container goes, unless the object
/// updated (`old`) already has an init container with one.
pub(super) fn drop_sidecars(rt: &ResourceType, obj: &mut Value, old: Option<&Value>) {
    let Some(at) = pod_spec_pointer(rt) else {
        return;
    };
    let in_use = old
        .and_then(|o| o.pointer(at))
        .and_then(|spec| spec.get("initContainers"))
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.get("restartPolicy").and_then(Value::as_str) == Some("Always"))
        });
    if in_use {
        return;
    }
    let inits = obj
        .pointer_mut(at)
        .and_then(|spec| spec.get_mut("initContainers"))
        .and_then(Value::as_array_mut);
    for c in inits.into_iter().flatten().filter_map(Value::as_object_mut) {
        c.remove("restartPolicy");
    }
}
