//! The resource types the embedded API server serves: the built-in ones and those CRDs define.

use serde_json::{Value, json};

/// A served resource type.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceType {
    /// API group (`""` for core).
    pub group: String,
    /// The served (and stored) version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Plural resource name (URL segment).
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names (`kubectl get nss`).
    pub short_names: Vec<String>,
    /// Categories (`kubectl get all`, `kubectl get slurm`).
    pub categories: Vec<String>,
    /// Has a status subresource (spec/status split).
    pub status: bool,
    /// Scale subresource paths (spec replicas, status replicas, label selector), if any.
    pub scale: Option<ScalePaths>,
    /// The structural schema of a CRD version (`openAPIV3Schema`), if any.
    pub schema: Option<Value>,
    /// Printer columns (name, type, JSONPath) for tables.
    pub columns: Vec<(String, String, String)>,
    /// Defined by a CRD (served from JSON, merge patch only).
    pub custom: bool,
}

/// JSON paths of the scale subresource (`.spec.replicas` style).
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePaths {
    /// `.spec.replicas`.
    pub spec_replicas: String,
    /// `.status.replicas`.
    pub status_replicas: String,
    /// `.status.selector`, if any.
    pub label_selector: Option<String>,
}

/// The built-in resources kube-apiserver lists in the category `all`.
const ALL_CATEGORY: [&str; 10] = [
    "pods",
    "replicationcontrollers",
    "services",
    "daemonsets",
    "deployments",
    "replicasets",
    "statefulsets",
    "horizontalpodautoscalers",
    "cronjobs",
    "jobs",
];

impl ResourceType {
    fn builtin(
        group: &str,
        version: &str,
        kind: &str,
        plural: &str,
        namespaced: bool,
        short: &[&str],
        status: bool,
    ) -> Self {
        ResourceType {
            group: group.into(),
            version: version.into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            namespaced,
            short_names: short.iter().map(|s| s.to_string()).collect(),
            // kube-apiserver 1.28 puts these built-ins in the category `all`.
            categories: if ALL_CATEGORY.contains(&plural) {
                vec!["all".into()]
            } else {
                Vec::new()
            },
            status,
            scale: None,
            schema: None,
            columns: Vec::new(),
            custom: false,
        }
    }

    /// `group/version`, or `version` for core.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural` or `plural.group`: how errors name the resource.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The storage key.
    pub fn key(&self) -> ResKey {
        ResKey {
            group: self.group.clone(),
            plural: self.plural.clone(),
        }
    }

    /// The APIResource discovery entries (the resource and its subresources).
    pub fn discovery(&self) -> Vec<Value> {
        let mut resource = self.resource_entry();
        if !self.categories.is_empty()
            && let Some(o) = resource.as_object_mut()
        {
            o.insert("categories".into(), json!(self.categories));
        }
        let mut out = vec![resource];
        out.extend(self.subresource_entries());
        out
    }

    fn resource_entry(&self) -> Value {
        let verbs = json!([
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch"
        ]);
        json!({
            "name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
            "kind": self.kind, "verbs": verbs, "shortNames": self.short_names,
        })
    }

    fn subresource_entries(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if self.status {
            out.push(json!({"name": format!("{}/status", self.plural), "singularName": "", "namespaced": self.namespaced,
                "kind": self.kind, "verbs": ["get", "patch", "update"]}));
        }
        if self.scale.is_some() {
            out.push(json!({"name": format!("{}/scale", self.plural), "singularName": "", "namespaced": self.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
        out
    }
}

/// Storage key of a resource type: group and plural.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResKey {
    /// Group.
    pub group: String,
    /// Plural.
    pub plural: String,
}

/// The built-in types.
pub fn builtins() -> Vec<ResourceType> {
    use ResourceType as R;
    let replicas = || ScalePaths {
        spec_replicas: ".spec.replicas".into(),
        status_replicas: ".status.replicas".into(),
        label_selector: None,
    };
    let mut statefulsets = R::builtin("apps", "v1", "StatefulSet", "statefulsets", true, &["sts"], true);
    statefulsets.scale = Some(replicas());
    let mut deployments = R::builtin("apps", "v1", "Deployment", "deployments", true, &["deploy"], true);
    deployments.scale = Some(replicas());
    let mut replicasets = R::builtin("apps", "v1", "ReplicaSet", "replicasets", true, &["rs"], true);
    replicasets.scale = Some(replicas());
    vec![
        R::builtin("", "v1", "Namespace", "namespaces", false, &["ns"], true),
        R::builtin("", "v1", "Node", "nodes", false, &["no"], true),
        R::builtin("", "v1", "Pod", "pods", true, &["po"], true),
        R::builtin("", "v1", "Service", "services", true, &["svc"], true),
        R::builtin("", "v1", "ConfigMap", "configmaps", true, &["cm"], false),
        R::builtin("", "v1", "Secret", "secrets", true, &[], false),
        R::builtin("", "v1", "Event", "events", true, &["ev"], false),
        R::builtin(
            "",
            "v1",
            "PersistentVolumeClaim",
            "persistentvolumeclaims",
            true,
            &["pvc"],
            true,
        ),
        R::builtin(
            "",
            "v1",
            "ServiceAccount",
            "serviceaccounts",
            true,
            &["sa"],
            false,
        ),
        R::builtin("events.k8s.io", "v1", "Event", "events", true, &["ev"], false),
        statefulsets,
        R::builtin(
            "apps",
            "v1",
            "ControllerRevision",
            "controllerrevisions",
            true,
            &[],
            false,
        ),
        R::builtin(
            "policy",
            "v1",
            "PodDisruptionBudget",
            "poddisruptionbudgets",
            true,
            &["pdb"],
            true,
        ),
        R::builtin("coordination.k8s.io", "v1", "Lease", "leases", true, &[], false),
        deployments,
        replicasets,
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRole",
            "clusterroles",
            false,
            &[],
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            &[],
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "Role",
            "roles",
            true,
            &[],
            false,
        ),
        R::builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "RoleBinding",
            "rolebindings",
            true,
            &[],
            false,
        ),
        R::builtin(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
            false,
            &["crd", "crds"],
            true,
        ),
    ]
}

/// Every validation rule in `schema` is one this server evaluates ([`crate::cel`]): a CRD whose
/// rule it could not enforce is refused, never served with the rule skipped.
fn rules_parse(schema: &Value, path: &str) -> Result<(), String> {
    for (i, rule) in schema
        .get("x-kubernetes-validations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let text = rule.get("rule").and_then(Value::as_str).unwrap_or_default();
        crate::cel::parse(text).map_err(|e| {
            format!("{path}.x-kubernetes-validations[{i}].rule: Invalid value: {text:?}: this server evaluates a part of CEL only: {e}")
        })?;
    }
    let children = ["properties", "patternProperties"]
        .iter()
        .filter_map(|k| schema.get(*k).and_then(Value::as_object))
        .flatten()
        .map(|(k, v)| (format!("{path}.properties[{k}]"), v));
    let single = ["items", "additionalProperties"].iter().filter_map(|k| {
        schema
            .get(*k)
            .filter(|v| v.is_object())
            .map(|v| (format!("{path}.{k}"), v))
    });
    for (p, sub) in children.chain(single) {
        rules_parse(sub, &p)?;
    }
    Ok(())
}

/// The served type a CRD object defines (its first served version), or why it can't be served.
pub fn from_crd(crd: &Value) -> Result<ResourceType, String> {
    let spec = crd.get("spec").ok_or("spec is required")?;
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let group = s(spec.get("group")).ok_or("spec.group is required")?;
    let names = spec.get("names").ok_or("spec.names is required")?;
    let plural = s(names.get("plural")).ok_or("spec.names.plural is required")?;
    let kind = s(names.get("kind")).ok_or("spec.names.kind is required")?;
    let scope = s(spec.get("scope")).unwrap_or_else(|| "Namespaced".into());
    let versions = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("spec.versions is required")?;
    let version = versions
        .iter()
        .find(|v| v.get("served").and_then(Value::as_bool).unwrap_or(false))
        .ok_or("no served version")?;
    let expected = format!("{plural}.{group}");
    if s(crd.pointer("/metadata/name")).as_deref() != Some(expected.as_str()) {
        return Err(format!(
            "metadata.name must be {expected:?} (spec.names.plural + \".\" + spec.group)"
        ));
    }
    if let Some(schema) = version.pointer("/schema/openAPIV3Schema") {
        rules_parse(schema, "spec.versions[].schema.openAPIV3Schema")?;
    }
    let sub = version.get("subresources");
    let scale = sub.and_then(|s| s.get("scale")).map(|sc| ScalePaths {
        spec_replicas: s(sc.get("specReplicasPath")).unwrap_or_else(|| ".spec.replicas".into()),
        status_replicas: s(sc.get("statusReplicasPath")).unwrap_or_else(|| ".status.replicas".into()),
        label_selector: s(sc.get("labelSelectorPath")),
    });
    let columns = version
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .map(|cols| {
            cols.iter()
                .filter_map(|c| Some((s(c.get("name"))?, s(c.get("type"))?, s(c.get("jsonPath"))?)))
                .collect()
        })
        .unwrap_or_default();
    Ok(ResourceType {
        group,
        version: s(version.get("name")).ok_or("spec.versions[].name is required")?,
        singular: s(names.get("singular")).unwrap_or_else(|| kind.to_lowercase()),
        kind,
        plural,
        namespaced: scope != "Cluster",
        short_names: names
            .get("shortNames")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default(),
        categories: names
            .get("categories")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default(),
        status: sub.and_then(|s| s.get("status")).is_some(),
        scale,
        schema: version.pointer("/schema/openAPIV3Schema").cloned(),
        columns,
        custom: true,
    })
}
