//! Validation like kube-apiserver's: each case is sent to the embedded server (or, with
//! `SLINKY_TEST_KUBECONFIG`, to a real kube-apiserver) and must get the same status code and the
//! same `details.causes` (reason, field, message) as the real server gives. The expectations were
//! recorded from kube-apiserver v1.28.7.

use anyhow::{Context, Result, bail, ensure};
use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams, PostParams},
    discovery::ApiResource,
};
use serde_json::{Value, json};
use slinky_apiserver::testing::TestCluster;

const DNS1123_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const NAME_PART: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";

/// The causes of a refusal: (reason, field, message).
type Causes = Vec<(String, String, String)>;

/// A refusal: the status code and its causes.
type Refusal = Option<(u16, Causes)>;

fn resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn pod(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
}

/// An Event regarding a pod of `ns`, in the field names of `api_version` (`v1` or
/// `events.k8s.io/v1`), with `extra` fields on top.
fn event(api_version: &str, name: &str, ns: &str, note: &str, extra: Value) -> Value {
    let core = api_version == "v1";
    let mut e = json!({"apiVersion": api_version, "kind": "Event", "metadata": {"name": name},
        "eventTime": "2026-01-02T03:04:05.000000Z", "type": "Normal", "reason": "Scaled", "action": "Scale",
        "reportingInstance": "slinky-host-0"});
    let fields = [
        (
            if core { "involvedObject" } else { "regarding" },
            json!({"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": ns}),
        ),
        (if core { "message" } else { "note" }, json!(note)),
        (
            if core {
                "reportingComponent"
            } else {
                "reportingController"
            },
            json!("slinky-host"),
        ),
    ];
    if let (Value::Object(m), Value::Object(x)) = (&mut e, extra) {
        m.extend(fields.into_iter().map(|(k, v)| (k.to_string(), v)));
        m.extend(x);
    }
    e
}

fn c(extra: Value) -> Value {
    let mut c = json!({"name": "c", "image": "x"});
    if let (Value::Object(m), Value::Object(e)) = (&mut c, extra) {
        m.extend(e);
    }
    c
}

/// `message` with Go pointers (`(*T)(0xc00b06a3e0)`, printed by `%#v` of a struct) as `(0x…)`:
/// their addresses differ from run to run.
fn without_addresses(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("(0x") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 3..];
        let hex = after
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(after.len());
        out.push_str("(0x…");
        rest = &after[hex..];
    }
    out.push_str(rest);
    out
}

/// The code and the causes (reason, field, message) of a refused write, or `None` when it passed.
fn refusal(result: std::result::Result<DynamicObject, kube::Error>) -> Result<Refusal> {
    match result {
        Ok(_) => Ok(None),
        Err(kube::Error::Api(s)) => Ok(Some((
            s.code,
            s.details
                .map(|d| {
                    d.causes
                        .into_iter()
                        .map(|c| (c.reason, c.field, without_addresses(&c.message)))
                        .collect()
                })
                .unwrap_or_default(),
        ))),
        Err(e) => bail!("not an API error: {e}"),
    }
}

async fn create(c: &TestCluster, ns: &str, obj: &Value) -> Result<Refusal> {
    let api_version = obj["apiVersion"].as_str().context("apiVersion")?;
    let kind = obj["kind"].as_str().context("kind")?;
    let plural = match kind {
        "Pod" => "pods",
        "Service" => "services",
        "ConfigMap" => "configmaps",
        "Secret" => "secrets",
        "Lease" => "leases",
        "Namespace" => "namespaces",
        "Event" => "events",
        "Deployment" => "deployments",
        "StatefulSet" => "statefulsets",
        "ReplicaSet" => "replicasets",
        "PodDisruptionBudget" => "poddisruptionbudgets",
        "ControllerRevision" => "controllerrevisions",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        other => bail!("no plural for {other}"),
    };
    let ar = resource(api_version, kind, plural);
    let api: Api<DynamicObject> = if matches!(kind, "Namespace" | "ClusterRole" | "ClusterRoleBinding") {
        Api::all_with(c.client.clone(), &ar)
    } else {
        Api::namespaced_with(c.client.clone(), ns, &ar)
    };
    refusal(
        api.create(&PostParams::default(), &serde_json::from_value(obj.clone())?)
            .await,
    )
}

/// Create each case's object: each must be refused with its code and causes (every mismatch
/// reported at once).
async fn refused_as_expected(c: &TestCluster, ns: &str, cases: &[(&str, Value, u16, Causes)]) -> Result<()> {
    let mut failures = Vec::new();
    for (what, obj, code, expected) in cases {
        match create(c, ns, obj).await? {
            None => failures.push(format!("{what}: accepted, expected {code}")),
            Some((got, causes)) if got != *code || causes != *expected => failures.push(format!(
                "{what}: got {got} {causes:#?}\n  expected {code} {expected:#?}"
            )),
            Some(_) => {}
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

/// `n` zero bytes, base64-encoded (a `binaryData` or Secret `data` value).
fn base64_of(n: usize) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(vec![0u8; n])
}

fn causes(list: &[(&str, &str, &str)]) -> Causes {
    list.iter()
        .map(|(r, f, m)| (r.to_string(), f.to_string(), m.to_string()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_get_kube_apiservers_causes() -> Result<()> {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace("validation").await;
    let svc = |name: &str, spec: Value| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec});
    let cases: Vec<(&str, Value, u16, Causes)> = vec![
        (
            "no image",
            pod("p1", json!({"containers": [{"name": "c"}]})),
            422,
            causes(&[("FieldValueRequired", "spec.containers[0].image", "Required value")]),
        ),
        (
            "duplicate container names",
            pod("p2", json!({"containers": [c(json!({})), c(json!({}))]})),
            422,
            causes(&[(
                "FieldValueDuplicate",
                "spec.containers[1].name",
                "Duplicate value: \"c\"",
            )]),
        ),
        (
            "invalid hostname",
            pod(
                "p3",
                json!({"hostname": "Bad_Host", "containers": [c(json!({}))]}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.hostname",
                &format!("Invalid value: \"Bad_Host\": {DNS1123_LABEL}"),
            )]),
        ),
        (
            "64-character label value",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p4", "labels": {"a": "x".repeat(64)}}, "spec": {"containers": [c(json!({}))]}}),
            422,
            causes(&[(
                "FieldValueInvalid",
                "metadata.labels",
                &format!(
                    "Invalid value: \"{}\": must be no more than 63 characters",
                    "x".repeat(64)
                ),
            )]),
        ),
        (
            "service port 70000",
            svc("s1", json!({"ports": [{"port": 70000}]})),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "spec.ports[0].port",
                    "Invalid value: 70000: must be between 1 and 65535, inclusive",
                ),
                (
                    "FieldValueInvalid",
                    "spec.ports[0].targetPort",
                    "Invalid value: 70000: must be between 1 and 65535, inclusive",
                ),
            ]),
        ),
        (
            "configmap key",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}, "data": {"bad key!": "v"}}),
            422,
            causes(&[(
                "FieldValueInvalid",
                "data[bad key!]",
                "Invalid value: \"bad key!\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
            )]),
        ),
        (
            "no containers",
            pod("p5", json!({"containers": []})),
            422,
            causes(&[("FieldValueRequired", "spec.containers", "Required value")]),
        ),
        (
            "container name",
            pod("p6", json!({"containers": [c(json!({"name": "Bad_Name"}))]})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.containers[0].name",
                &format!("Invalid value: \"Bad_Name\": {DNS1123_LABEL}"),
            )]),
        ),
        (
            "ports",
            pod(
                "p7",
                json!({"containers": [c(json!({"ports": [{"containerPort": 0}, {"containerPort": 70000, "name": "x--y"}]}))]}),
            ),
            422,
            causes(&[
                (
                    "FieldValueRequired",
                    "spec.containers[0].ports[0].containerPort",
                    "Required value",
                ),
                (
                    "FieldValueInvalid",
                    "spec.containers[0].ports[1].name",
                    "Invalid value: \"x--y\": must not contain consecutive hyphens",
                ),
                (
                    "FieldValueInvalid",
                    "spec.containers[0].ports[1].containerPort",
                    "Invalid value: 70000: must be between 1 and 65535, inclusive",
                ),
            ]),
        ),
        (
            "duplicate port names",
            pod(
                "p8",
                json!({"containers": [c(json!({"ports": [{"containerPort": 80, "name": "http"}, {"containerPort": 81, "name": "http"}]}))]}),
            ),
            422,
            causes(&[(
                "FieldValueDuplicate",
                "spec.containers[0].ports[1].name",
                "Duplicate value: \"http\"",
            )]),
        ),
        (
            "probe with two handlers",
            pod(
                "p9",
                json!({"containers": [c(json!({"livenessProbe": {"exec": {"command": ["x"]}, "tcpSocket": {"port": 80}}}))]}),
            ),
            422,
            causes(&[(
                "FieldValueForbidden",
                "spec.containers[0].livenessProbe.tcpSocket",
                "Forbidden: may not specify more than 1 handler type",
            )]),
        ),
        (
            "probe without a handler",
            pod(
                "p10",
                json!({"containers": [c(json!({"readinessProbe": {"periodSeconds": 5}}))]}),
            ),
            422,
            causes(&[(
                "FieldValueRequired",
                "spec.containers[0].readinessProbe",
                "Required value: must specify a handler type",
            )]),
        ),
        (
            "env names",
            pod(
                "p11",
                json!({"containers": [c(json!({"env": [{"name": "1X", "value": "v"}, {"name": ""}]}))]}),
            ),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "spec.containers[0].env[0].name",
                    "Invalid value: \"1X\": a valid environment variable name must consist of alphabetic characters, digits, '_', '-', or '.', and must not start with a digit (e.g. 'my.env-name',  or 'MY_ENV.NAME',  or 'MyEnvName1', regex used for validation is '[-._a-zA-Z][-._a-zA-Z0-9]*')",
                ),
                (
                    "FieldValueRequired",
                    "spec.containers[0].env[1].name",
                    "Required value",
                ),
            ]),
        ),
        (
            "volumes and mounts",
            pod(
                "p12",
                json!({"volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}], "containers": [c(json!({"volumeMounts": [{"name": "w", "mountPath": "/w"}]}))]}),
            ),
            422,
            causes(&[
                (
                    "FieldValueDuplicate",
                    "spec.volumes[1].name",
                    "Duplicate value: \"v\"",
                ),
                (
                    "FieldValueNotFound",
                    "spec.containers[0].volumeMounts[0].name",
                    "Not found: \"w\"",
                ),
            ]),
        ),
        (
            "quantity that does not parse",
            pod(
                "p13",
                json!({"containers": [c(json!({"resources": {"limits": {"cpu": "abc"}}}))]}),
            ),
            400,
            vec![],
        ),
        (
            "restart policy",
            pod(
                "p14",
                json!({"restartPolicy": "Sometimes", "containers": [c(json!({}))]}),
            ),
            422,
            causes(&[(
                "FieldValueNotSupported",
                "spec.restartPolicy",
                "Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
            )]),
        ),
        (
            "subdomain",
            pod("p15", json!({"subdomain": "a.b", "containers": [c(json!({}))]})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.subdomain",
                "Invalid value: \"a.b\": must not contain dots",
            )]),
        ),
        (
            "pod name",
            pod("Bad_Name", json!({"containers": [c(json!({}))]})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "metadata.name",
                &format!("Invalid value: \"Bad_Name\": {SUBDOMAIN}"),
            )]),
        ),
        (
            "annotation key",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p16", "annotations": {"bad key": "v"}}, "spec": {"containers": [c(json!({}))]}}),
            422,
            causes(&[(
                "FieldValueInvalid",
                "metadata.annotations",
                &format!("Invalid value: \"bad key\": {NAME_PART}"),
            )]),
        ),
        (
            "init container without an image",
            pod(
                "p18",
                json!({"initContainers": [{"name": "i"}], "containers": [c(json!({}))]}),
            ),
            422,
            causes(&[(
                "FieldValueRequired",
                "spec.initContainers[0].image",
                "Required value",
            )]),
        ),
        (
            "init container named like a container",
            pod(
                "p19",
                json!({"initContainers": [c(json!({}))], "containers": [c(json!({}))]}),
            ),
            422,
            causes(&[(
                "FieldValueDuplicate",
                "spec.initContainers[0].name",
                "Duplicate value: \"c\"",
            )]),
        ),
        (
            "service ports, protocols and selector",
            svc(
                "s2",
                json!({"ports": [{"port": 80, "name": "a", "protocol": "FOO"}, {"port": 81, "name": "a"}, {"port": 82}], "selector": {"bad key": "v"}}),
            ),
            422,
            causes(&[
                (
                    "FieldValueNotSupported",
                    "spec.ports[0].protocol",
                    "Unsupported value: \"FOO\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                ),
                (
                    "FieldValueDuplicate",
                    "spec.ports[1].name",
                    "Duplicate value: \"a\"",
                ),
                ("FieldValueRequired", "spec.ports[2].name", "Required value"),
                (
                    "FieldValueInvalid",
                    "spec.selector",
                    &format!("Invalid value: \"bad key\": {NAME_PART}"),
                ),
            ]),
        ),
        (
            "service without ports",
            svc("s3", json!({})),
            422,
            causes(&[("FieldValueRequired", "spec.ports", "Required value")]),
        ),
        (
            "service name",
            svc("1svc", json!({"ports": [{"port": 80}]})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "metadata.name",
                "Invalid value: \"1svc\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
            )]),
        ),
        (
            "secret key",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s1"}, "data": {"..x": "dg=="}}),
            422,
            causes(&[(
                "FieldValueInvalid",
                "data[..x]",
                "Invalid value: \"..x\": must not start with '..'",
            )]),
        ),
        (
            "lease",
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l1"}, "spec": {"leaseDurationSeconds": 0, "leaseTransitions": -1}}),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "spec.leaseDurationSeconds",
                    "Invalid value: 0: must be greater than 0",
                ),
                (
                    "FieldValueInvalid",
                    "spec.leaseTransitions",
                    "Invalid value: -1: must be greater than or equal to 0",
                ),
            ]),
        ),
        (
            // `len()` in Go counts bytes: 513 two-byte characters are over the limit.
            "events.k8s.io event note over 1024 bytes",
            event("events.k8s.io/v1", "e1", &ns, &"é".repeat(513), json!({})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "message",
                "Invalid value: \"\": can have at most 1024 characters",
            )]),
        ),
        (
            "events.k8s.io event reason and action over 128",
            event(
                "events.k8s.io/v1",
                "e2",
                &ns,
                "n",
                json!({"reason": "R".repeat(129), "action": "A".repeat(129), "reportingInstance": "I".repeat(129)}),
            ),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "reportingInstance",
                    "Invalid value: \"\": can have at most 128 characters",
                ),
                (
                    "FieldValueInvalid",
                    "action",
                    "Invalid value: \"\": can have at most 128 characters",
                ),
                (
                    "FieldValueInvalid",
                    "reason",
                    "Invalid value: \"\": can have at most 128 characters",
                ),
            ]),
        ),
        (
            "events.k8s.io event without action, reason, reportingInstance",
            {
                let mut e = event("events.k8s.io/v1", "e3", &ns, "n", json!({}));
                for f in ["action", "reason", "reportingInstance"] {
                    e.as_object_mut().map(|m| m.remove(f));
                }
                e
            },
            422,
            causes(&[
                ("FieldValueRequired", "reportingInstance", "Required value"),
                ("FieldValueRequired", "action", "Required value"),
                ("FieldValueRequired", "reason", "Required value"),
            ]),
        ),
        (
            "core event with an eventTime and a message over 1024 bytes",
            event("v1", "e4", &ns, &"m".repeat(1025), json!({})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "message",
                "Invalid value: \"\": can have at most 1024 characters",
            )]),
        ),
        (
            "namespace name",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a.b"}}),
            422,
            causes(&[(
                "FieldValueInvalid",
                "metadata.name",
                "Invalid value: \"a.b\": must not contain dots",
            )]),
        ),
        (
            "configmap key in data and binaryData",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c2"}, "data": {"k": "v"}, "binaryData": {"k": "dg=="}}),
            422,
            causes(&[(
                "FieldValueInvalid",
                "data[k]",
                "Invalid value: \"k\": duplicate of key present in binaryData",
            )]),
        ),
        (
            "configmap over 1 MiB",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c3"},
                "data": {"a": "x".repeat(1 << 19)}, "binaryData": {"b": base64_of((1 << 19) + 1)}}),
            422,
            causes(&[(
                "FieldValueTooLong",
                "[]",
                "Too long: must have at most 1048576 bytes",
            )]),
        ),
        (
            "secret over 1 MiB",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s3"},
                "data": {"a": base64_of((1 << 20) + 1)}}),
            422,
            causes(&[(
                "FieldValueTooLong",
                "data",
                "Too long: must have at most 1048576 bytes",
            )]),
        ),
        (
            "owner references and finalizers",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "own", "ownerReferences": [{"apiVersion": "v1", "kind": "", "name": "x", "uid": ""}], "finalizers": ["bad finalizer"]}, "spec": {"containers": [c(json!({}))]}}),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "metadata.ownerReferences.kind",
                    "Invalid value: \"\": kind must not be empty",
                ),
                (
                    "FieldValueInvalid",
                    "metadata.ownerReferences.uid",
                    "Invalid value: \"\": uid must not be empty",
                ),
                (
                    "FieldValueInvalid",
                    "metadata.finalizers",
                    &format!("Invalid value: \"bad finalizer\": {NAME_PART}"),
                ),
                (
                    "FieldValueInvalid",
                    "metadata.finalizers[0]",
                    "Invalid value: \"bad finalizer\": name is neither a standard finalizer name nor is it fully qualified",
                ),
            ]),
        ),
    ];
    refused_as_expected(&cluster, &ns, &cases).await?;
    // A valid pod of the same shapes passes.
    let good = pod(
        "good",
        json!({"hostname": "h", "subdomain": "s", "containers": [c(json!({"ports": [{"containerPort": 80, "name": "http"}],
        "env": [{"name": "A", "value": "1"}], "volumeMounts": [{"name": "v", "mountPath": "/v"}],
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "500m"}},
        "livenessProbe": {"tcpSocket": {"port": 80}}}))], "volumes": [{"name": "v", "emptyDir": {}}]}),
    );
    ensure!(
        create(&cluster, &ns, &good).await?.is_none(),
        "a valid pod is accepted"
    );
    // At the limits, Events pass; a core Event without an eventTime (the legacy kind) has no
    // message limit.
    for (what, obj) in [
        (
            "a 1024-byte note",
            event("events.k8s.io/v1", "ok1", &ns, &"é".repeat(512), json!({})),
        ),
        (
            "128-character reason, action and reportingInstance",
            event(
                "events.k8s.io/v1",
                "ok2",
                &ns,
                "n",
                json!({"reason": "R".repeat(128), "action": "A".repeat(128), "reportingInstance": "I".repeat(128)}),
            ),
        ),
        ("a legacy core event", {
            let mut e = event("v1", "ok3", &ns, &"m".repeat(2000), json!({}));
            for f in ["eventTime", "action", "reportingInstance", "reportingComponent"] {
                e.as_object_mut().map(|m| m.remove(f));
            }
            e
        }),
    ] {
        ensure!(create(&cluster, &ns, &obj).await?.is_none(), "{what} is accepted");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_and_service_updates_keep_immutable_fields() -> Result<()> {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace("immutable").await;
    let pods: Api<DynamicObject> =
        Api::namespaced_with(cluster.client.clone(), &ns, &resource("v1", "Pod", "pods"));
    let p = pod(
        "p",
        json!({"containers": [c(json!({}))], "tolerations": [{"key": "a", "operator": "Exists"}]}),
    );
    pods.create(&PostParams::default(), &serde_json::from_value(p)?)
        .await?;
    // A change of restartPolicy is refused: 422, one cause on `spec`.
    let r = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"restartPolicy": "Never"}})),
        )
        .await;
    let Some((code, got)) = refusal(r)? else {
        bail!("a restartPolicy change was accepted")
    };
    assert_eq!(code, 422);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].0.as_str(), got[0].1.as_str()),
        ("FieldValueForbidden", "spec")
    );
    assert!(
        got[0].2.starts_with(
            "Forbidden: pod updates may not change fields other than `spec.containers[*].image`"
        ),
        "{}",
        got[0].2
    );
    // Images, a lower activeDeadlineSeconds and an added toleration may change; labels too.
    let patch = json!({"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "c", "image": "y"}],
        "activeDeadlineSeconds": 30, "tolerations": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}]}});
    let changed = pods
        .patch("p", &PatchParams::default(), &Patch::Strategic(patch))
        .await?;
    assert_eq!(
        changed.data.pointer("/spec/containers/0/image"),
        Some(&json!("y"))
    );
    // Adding a container is not a change a pod can take.
    let r = pods
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "d", "image": "d"}]}})),
        )
        .await;
    let Some((code, got)) = refusal(r)? else {
        bail!("an added container was accepted")
    };
    assert_eq!((code, got[0].1.as_str()), (422, "spec.containers"), "{got:?}");

    // A Service's cluster IP may not change once set; an update without it keeps it.
    let services: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        &ns,
        &resource("v1", "Service", "services"),
    );
    let s = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}], "selector": {"a": "b"}}});
    let created = services
        .create(&PostParams::default(), &serde_json::from_value(s)?)
        .await?;
    let ip = created
        .data
        .pointer("/spec/clusterIP")
        .cloned()
        .context("a cluster IP")?;
    let r = services
        .patch(
            "svc",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterIP": "10.96.200.200", "clusterIPs": ["10.96.200.200"]}})),
        )
        .await;
    assert_eq!(
        refusal(r)?,
        Some((
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.clusterIPs[0]",
                "Invalid value: []string{\"10.96.200.200\"}: may not change once set"
            )])
        ))
    );
    let mut without = services.get("svc").await?;
    if let Some(spec) = without.data.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("clusterIP");
        spec.remove("clusterIPs");
    }
    let replaced = services.replace("svc", &PostParams::default(), &without).await?;
    assert_eq!(replaced.data.pointer("/spec/clusterIP"), Some(&ip));
    Ok(())
}

/// Deployments, their ReplicaSets and StatefulSets (slurmrestd's and slurmctld's workloads):
/// their selector, pod template, counters and a Deployment's strategy as kube-apiserver checks
/// them, and a Deployment's immutable selector.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployments_and_statefulsets_get_kube_apiservers_causes() -> Result<()> {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace("workloads").await;
    let workload = |kind: &str, name: &str, spec: Value| json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name}, "spec": spec});
    let pod_spec = json!({"containers": [{"name": "c", "image": "i"}]});
    let ab = json!({"metadata": {"labels": {"a": "b"}}, "spec": pod_spec});
    let mismatch =
        "Invalid value: map[string]string{\"a\":\"b\"}: `selector` does not match template `labels`";
    let empty = "Invalid value: v1.LabelSelector{MatchLabels:map[string]string(nil), MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: empty selector is invalid for";
    let cases: Vec<(&str, Value, u16, Causes)> = vec![
        (
            "deployment without a selector",
            workload("Deployment", "d1", json!({"template": ab})),
            422,
            causes(&[
                ("FieldValueRequired", "spec.selector", "Required value"),
                ("FieldValueInvalid", "spec.template.metadata.labels", mismatch),
            ]),
        ),
        (
            "deployment with an empty selector",
            workload("Deployment", "d2", json!({"selector": {}, "template": ab})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.selector",
                &format!("{empty} deployment"),
            )]),
        ),
        (
            "deployment selecting other labels",
            workload(
                "Deployment",
                "d3",
                json!({"selector": {"matchLabels": {"a": "x"}}, "template": ab}),
            ),
            422,
            causes(&[("FieldValueInvalid", "spec.template.metadata.labels", mismatch)]),
        ),
        (
            "deployment counters and restart policy",
            workload(
                "Deployment",
                "d4",
                json!({"replicas": -1, "revisionHistoryLimit": -2,
                "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}),
            ),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "spec.replicas",
                    "Invalid value: -1: must be greater than or equal to 0",
                ),
                (
                    "FieldValueNotSupported",
                    "spec.template.spec.restartPolicy",
                    "Unsupported value: \"Never\": supported values: \"Always\"",
                ),
                (
                    "FieldValueInvalid",
                    "spec.revisionHistoryLimit",
                    "Invalid value: -2: must be greater than or equal to 0",
                ),
            ]),
        ),
        (
            "deployment pod without an image",
            workload(
                "Deployment",
                "d5",
                json!({"selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}}}),
            ),
            422,
            causes(&[(
                "FieldValueRequired",
                "spec.template.spec.containers[0].image",
                "Required value",
            )]),
        ),
        (
            "deployment progress deadline",
            workload(
                "Deployment",
                "d6",
                json!({"minReadySeconds": 10, "progressDeadlineSeconds": 5,
                "selector": {"matchLabels": {"a": "b"}}, "template": ab}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.progressDeadlineSeconds",
                "Invalid value: 5: must be greater than minReadySeconds",
            )]),
        ),
        (
            "a Recreate deployment with rolling update bounds",
            workload(
                "Deployment",
                "d7",
                json!({"selector": {"matchLabels": {"a": "b"}}, "template": ab,
                    "strategy": {"type": "Recreate", "rollingUpdate": {"maxSurge": 1}}}),
            ),
            422,
            causes(&[(
                "FieldValueForbidden",
                "spec.strategy.rollingUpdate",
                "Forbidden: may not be specified when strategy `type` is 'Recreate'",
            )]),
        ),
        (
            "a rolling update that may neither surge nor be unavailable",
            workload(
                "Deployment",
                "d8",
                json!({"selector": {"matchLabels": {"a": "b"}}, "template": ab,
                    "strategy": {"rollingUpdate": {"maxSurge": 0, "maxUnavailable": "0%"}}}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.strategy.rollingUpdate.maxUnavailable",
                "Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"0%\"}: may not be 0 when `maxSurge` is 0",
            )]),
        ),
        (
            "rolling update bounds out of range",
            workload(
                "Deployment",
                "d9",
                json!({"selector": {"matchLabels": {"a": "b"}}, "template": ab,
                    "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "x", "maxUnavailable": "120%"}}}),
            ),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "spec.strategy.rollingUpdate.maxSurge",
                    "Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"x\"}: a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')",
                ),
                (
                    "FieldValueInvalid",
                    "spec.strategy.rollingUpdate.maxUnavailable",
                    "Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"120%\"}: must not be greater than 100%",
                ),
            ]),
        ),
        (
            "a negative surge",
            workload(
                "Deployment",
                "d10",
                json!({"selector": {"matchLabels": {"a": "b"}}, "template": ab,
                    "strategy": {"rollingUpdate": {"maxSurge": -1}}}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.strategy.rollingUpdate.maxSurge",
                "Invalid value: -1: must be greater than or equal to 0",
            )]),
        ),
        (
            "an unknown strategy",
            workload(
                "Deployment",
                "d11",
                json!({"selector": {"matchLabels": {"a": "b"}}, "template": ab, "strategy": {"type": "Sometimes"}}),
            ),
            422,
            causes(&[(
                "FieldValueNotSupported",
                "spec.strategy",
                "Unsupported value: apps.DeploymentStrategy{Type:\"Sometimes\", RollingUpdate:(*apps.RollingUpdateDeployment)(nil)}: supported values: \"Recreate\", \"RollingUpdate\"",
            )]),
        ),
        (
            "a replicaset with an empty selector and a deadline",
            workload(
                "ReplicaSet",
                "r1",
                json!({"replicas": -1, "selector": {}, "template": {"metadata": {"labels": {"a": "b"}},
                    "spec": {"activeDeadlineSeconds": 5, "containers": [{"name": "c", "image": "i"}]}}}),
            ),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "spec.replicas",
                    "Invalid value: -1: must be greater than or equal to 0",
                ),
                (
                    "FieldValueInvalid",
                    "spec.selector",
                    &format!("{empty} deployment"),
                ),
                (
                    "FieldValueForbidden",
                    "spec.template.spec.activeDeadlineSeconds",
                    "Forbidden: activeDeadlineSeconds in ReplicaSet is not Supported",
                ),
            ]),
        ),
        (
            "statefulset without a selector",
            workload(
                "StatefulSet",
                "s1",
                json!({"serviceName": "s",
                "template": {"metadata": {"labels": {"a": "b", "c": "d"}}, "spec": pod_spec}}),
            ),
            422,
            causes(&[
                ("FieldValueRequired", "spec.selector", "Required value"),
                (
                    "FieldValueInvalid",
                    "spec.template.metadata.labels",
                    "Invalid value: map[string]string{\"a\":\"b\", \"c\":\"d\"}: `selector` does not match template `labels`",
                ),
            ]),
        ),
        (
            "statefulset with an empty selector",
            workload(
                "StatefulSet",
                "s2",
                json!({"serviceName": "s", "selector": {}, "template": ab}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.selector",
                &format!("{empty} statefulset"),
            )]),
        ),
        (
            "statefulset counters and restart policy",
            workload(
                "StatefulSet",
                "s3",
                json!({"replicas": -1, "serviceName": "s", "selector": {"matchLabels": {"a": "b"}},
                "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}),
            ),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "spec.replicas",
                    "Invalid value: -1: must be greater than or equal to 0",
                ),
                (
                    "FieldValueNotSupported",
                    "spec.template.spec.restartPolicy",
                    "Unsupported value: \"Never\": supported values: \"Always\"",
                ),
            ]),
        ),
        (
            "statefulset template without labels",
            workload(
                "StatefulSet",
                "s4",
                json!({"selector": {"matchLabels": {"a": "b"}}, "template": {"spec": pod_spec}}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.template.metadata.labels",
                "Invalid value: map[string]string(nil): `selector` does not match template `labels`",
            )]),
        ),
    ];
    refused_as_expected(&cluster, &ns, &cases).await?;
    // Valid ones pass; a Deployment's selector then stays.
    let good = workload(
        "Deployment",
        "ok",
        json!({"selector": {"matchLabels": {"a": "b"}}, "template": ab}),
    );
    ensure!(
        create(&cluster, &ns, &good).await?.is_none(),
        "a valid Deployment is accepted"
    );
    // A StatefulSet's mounts may name its volume claim templates (kube-apiserver does not check
    // its pod spec).
    let sts = workload(
        "StatefulSet",
        "ok",
        json!({"serviceName": "s", "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}}}}]}),
    );
    ensure!(
        create(&cluster, &ns, &sts).await?.is_none(),
        "a valid StatefulSet is accepted"
    );
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        &ns,
        &resource("apps/v1", "Deployment", "deployments"),
    );
    let r = deployments
        .patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": {"matchLabels": {"a": "b", "x": "y"}},
                "template": {"metadata": {"labels": {"a": "b", "x": "y"}}}}})),
        )
        .await;
    let Some((code, got)) = refusal(r)? else {
        bail!("a changed Deployment selector was accepted")
    };
    assert_eq!(code, 422);
    assert_eq!(
        got,
        causes(&[(
            "FieldValueInvalid",
            "spec.selector",
            "Invalid value: v1.LabelSelector{MatchLabels:map[string]string{\"a\":\"b\", \"x\":\"y\"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: field is immutable",
        )])
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disruption_budgets_get_kube_apiservers_causes() -> Result<()> {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace("budgets").await;
    let budget = |name: &str, spec: Value| json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name}, "spec": spec});
    let percent = "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')";
    let label = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
    let cases: Vec<(&str, Value, u16, Causes)> = vec![
        (
            "both bounds",
            budget(
                "b1",
                json!({"minAvailable": 1, "maxUnavailable": 1, "selector": {"matchLabels": {"a": "b"}}}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec",
                "Invalid value: policy.PodDisruptionBudgetSpec{MinAvailable:(*intstr.IntOrString)(0x…), Selector:(*v1.LabelSelector)(0x…), MaxUnavailable:(*intstr.IntOrString)(0x…), UnhealthyPodEvictionPolicy:(*policy.UnhealthyPodEvictionPolicyType)(nil)}: minAvailable and maxUnavailable cannot be both set",
            )]),
        ),
        (
            "a negative minimum",
            budget("b2", json!({"minAvailable": -1})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.minAvailable",
                "Invalid value: -1: must be greater than or equal to 0",
            )]),
        ),
        (
            "more than 100%",
            budget("b3", json!({"maxUnavailable": "120%"})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.maxUnavailable",
                "Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:\"120%\"}: must not be greater than 100%",
            )]),
        ),
        (
            "not a percentage",
            budget("b4", json!({"minAvailable": "abc"})),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.minAvailable",
                &format!("Invalid value: intstr.IntOrString{{Type:1, IntVal:0, StrVal:\"abc\"}}: {percent}"),
            )]),
        ),
        (
            "a selector label value with a space",
            budget(
                "b5",
                json!({"minAvailable": 1, "selector": {"matchLabels": {"a": "b c"}}}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.selector.matchLabels",
                &format!("Invalid value: \"b c\": {label}"),
            )]),
        ),
        (
            "a selector expression's value with a space",
            budget(
                "b7",
                json!({"minAvailable": 1, "selector": {"matchExpressions": [
                    {"key": "a", "operator": "In", "values": ["ok", "b c"]}]}}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "spec.selector.matchExpressions[0].values[1]",
                &format!("Invalid value: \"b c\": {label}"),
            )]),
        ),
        (
            "an unknown eviction policy",
            budget(
                "b6",
                json!({"minAvailable": 1, "unhealthyPodEvictionPolicy": "Sometimes"}),
            ),
            422,
            causes(&[(
                "FieldValueNotSupported",
                "spec.unhealthyPodEvictionPolicy",
                "Unsupported value: \"Sometimes\": supported values: \"AlwaysAllow\", \"IfHealthyBudget\"",
            )]),
        ),
    ];
    refused_as_expected(&cluster, &ns, &cases).await?;
    // What the host builds (a percentage, a selector) passes.
    let ok = budget(
        "fine",
        json!({"maxUnavailable": "100%", "selector": {"matchLabels": {"app.kubernetes.io/name": "slurmd"}}}),
    );
    ensure!(
        create(&cluster, &ns, &ok).await?.is_none(),
        "a valid budget was refused"
    );
    Ok(())
}

/// ControllerRevisions (a NodeSet's history): `data` required and immutable, `revision` not
/// negative but free to change (a rollback renumbers one), the name a DNS subdomain; `data` kept
/// as sent, its explicit nulls included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_revisions_get_kube_apiservers_causes() -> Result<()> {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace("revisions").await;
    let revision = |name: &str, rest: Value| {
        let mut r =
            json!({"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": {"name": name}});
        if let (Value::Object(m), Value::Object(x)) = (&mut r, rest) {
            m.extend(x);
        }
        r
    };
    let required = ("FieldValueRequired", "data", "Required value: data is mandatory");
    let negative = |n: i64| {
        (
            "FieldValueInvalid".to_string(),
            "revision".to_string(),
            format!("Invalid value: {n}: must be greater than or equal to 0"),
        )
    };
    let cases: Vec<(&str, Value, u16, Causes)> = vec![
        (
            "no data",
            revision("r1", json!({"revision": 1})),
            422,
            causes(&[required]),
        ),
        (
            "null data",
            revision("r2", json!({"data": null, "revision": 1})),
            422,
            causes(&[required]),
        ),
        (
            "a negative revision",
            revision("r3", json!({"data": {}, "revision": -1})),
            422,
            vec![negative(-1)],
        ),
        (
            "a bad name, no data and a negative revision",
            revision("R_3", json!({"revision": -3})),
            422,
            [
                (
                    "FieldValueInvalid".to_string(),
                    "metadata.name".to_string(),
                    format!("Invalid value: \"R_3\": {SUBDOMAIN}"),
                ),
                (
                    required.0.to_string(),
                    required.1.to_string(),
                    required.2.to_string(),
                ),
                negative(-3),
            ]
            .into(),
        ),
    ];
    refused_as_expected(&cluster, &ns, &cases).await?;
    // Any JSON is data; a revision not sent is 0.
    for (name, data) in [
        ("d1", json!({})),
        ("d2", json!("x")),
        ("d3", json!(5)),
        ("d4", json!([1])),
    ] {
        ensure!(
            create(&cluster, &ns, &revision(name, json!({"data": data})))
                .await?
                .is_none(),
            "data {data} was refused"
        );
    }
    let api: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        &ns,
        &resource("apps/v1", "ControllerRevision", "controllerrevisions"),
    );
    assert_eq!(api.get("d1").await?.data["revision"], 0);

    // What the host records: a merge patch whose absent fields are explicit nulls, kept.
    let data = json!({"spec": {"extraConf": null, "template": {"metadata": {"labels": {"a": "b"}}}}});
    api.create(
        &PostParams::default(),
        &serde_json::from_value(revision("h", json!({"data": data, "revision": 1})))?,
    )
    .await?;
    assert_eq!(api.get("h").await?.data["data"], data, "nulls are kept");
    let patch = |p: Value| {
        let api = api.clone();
        async move { api.patch("h", &PatchParams::default(), &Patch::Merge(p)).await }
    };
    // The number changes (a rollback), labels too; data stays as it was.
    let bumped = patch(json!({"revision": 3, "metadata": {"labels": {"x": "y"}}})).await?;
    assert_eq!(
        (&bumped.data["revision"], &bumped.data["data"]),
        (&json!(3), &data)
    );
    let bytes = |v: &str| -> String {
        v.bytes()
            .map(|b| format!("{b:#x}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let immutable = |raw: &str| {
        (
            "FieldValueInvalid".to_string(),
            "data".to_string(),
            format!(
                "Invalid value: runtime.Unknown{{TypeMeta:runtime.TypeMeta{{APIVersion:\"\", Kind:\"\"}}, \
                 Raw:[]uint8{{{}}}, ContentEncoding:\"\", ContentType:\"application/json\"}}: field is immutable",
                bytes(raw)
            ),
        )
    };
    let updates: Vec<(&str, Value, Causes)> = vec![
        ("a negative revision", json!({"revision": -1}), vec![negative(-1)]),
        (
            "other data",
            json!({"data": {"spec": {"extraConf": "X=1"}}}),
            vec![immutable(
                r#"{"spec":{"extraConf":"X=1","template":{"metadata":{"labels":{"a":"b"}}}}}"#,
            )],
        ),
        (
            "data removed",
            json!({"data": null}),
            [
                (
                    required.0.to_string(),
                    required.1.to_string(),
                    required.2.to_string(),
                ),
                (
                    "FieldValueInvalid".to_string(),
                    "data".to_string(),
                    "Invalid value: \"null\": field is immutable".to_string(),
                ),
            ]
            .into(),
        ),
        (
            "other data and a negative revision",
            json!({"revision": -2, "data": {"spec": {"extraConf": "X=2"}}}),
            vec![
                negative(-2),
                immutable(r#"{"spec":{"extraConf":"X=2","template":{"metadata":{"labels":{"a":"b"}}}}}"#),
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (what, p, expected) in updates {
        match refusal(patch(p).await)? {
            None => failures.push(format!("{what}: accepted")),
            Some((code, got)) if code != 422 || got != expected => failures.push(format!(
                "{what}: got {code} {got:#?}\n  expected 422 {expected:#?}"
            )),
            Some(_) => {}
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    let kept = api.get("h").await?;
    assert_eq!((&kept.data["revision"], &kept.data["data"]), (&json!(3), &data));
    Ok(())
}

/// Roles, ClusterRoles and their bindings (what `slinky-host manifests` installs): rules, the
/// aggregation rule, `roleRef` and subjects as kube-apiserver checks them, and a binding's
/// `roleRef` that may not change. An update's causes come twice: kube-apiserver's RBAC strategies
/// validate the object in `ValidateUpdate` and again inside `Validate…Update`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_objects_get_kube_apiservers_causes() -> Result<()> {
    let cluster = TestCluster::start().await;
    let ns = cluster.namespace("rbac").await;
    const RBAC: &str = "rbac.authorization.k8s.io/v1";
    let object = |kind: &str, name: &str, body: Value| {
        let mut o = json!({"apiVersion": RBAC, "kind": kind, "metadata": {"name": name}});
        if let (Value::Object(m), Value::Object(b)) = (&mut o, body) {
            m.extend(b);
        }
        o
    };
    let get = json!(["get"]);
    // Cluster-scoped objects outlive the namespace: named after it, so runs do not collide.
    let cluster_name = |what: &str| format!("{ns}-{what}");
    let cases: Vec<(&str, Value, u16, Causes)> = vec![
        (
            "a role rule without verbs, groups or resources",
            object("Role", "r1", json!({"rules": [{}]})),
            422,
            causes(&[
                (
                    "FieldValueRequired",
                    "rules[0].verbs",
                    "Required value: verbs must contain at least one value",
                ),
                (
                    "FieldValueRequired",
                    "rules[0].apiGroups",
                    "Required value: resource rules must supply at least one api group",
                ),
                (
                    "FieldValueRequired",
                    "rules[0].resources",
                    "Required value: resource rules must supply at least one resource",
                ),
            ]),
        ),
        (
            "a role rule for a non-resource URL",
            object(
                "Role",
                "r2",
                json!({"rules": [{"verbs": get, "nonResourceURLs": ["/healthz"]}]}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "rules[0].nonResourceURLs",
                "Invalid value: []string{\"/healthz\"}: namespaced rules cannot apply to non-resource URLs",
            )]),
        ),
        (
            "a role name that is not a path segment",
            object(
                "Role",
                "r%3",
                json!({"rules": [{"verbs": get, "apiGroups": [""], "resources": ["pods"]}]}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "metadata.name",
                "Invalid value: \"r%3\": may not contain '%'",
            )]),
        ),
        (
            "a generateName that is not a path segment (RBAC checks a prefix as a name)",
            json!({"apiVersion": RBAC, "kind": "Role", "metadata": {"generateName": ".."}}),
            422,
            causes(&[(
                "FieldValueInvalid",
                "metadata.generateName",
                "Invalid value: \"..\": may not be '..'",
            )]),
        ),
        (
            "a cluster role rule for resources and URLs",
            object(
                "ClusterRole",
                &cluster_name("cr1"),
                json!({"rules": [{"verbs": get, "apiGroups": [""], "resources": ["pods"], "nonResourceURLs": ["/metrics"]}]}),
            ),
            422,
            causes(&[(
                "FieldValueInvalid",
                "rules[0].nonResourceURLs",
                "Invalid value: []string{\"/metrics\"}: rules cannot apply to both regular resources and non-resource URLs",
            )]),
        ),
        (
            "an aggregation rule without selectors",
            object(
                "ClusterRole",
                &cluster_name("cr2"),
                json!({"aggregationRule": {}}),
            ),
            422,
            causes(&[(
                "FieldValueRequired",
                "aggregationRule.clusterRoleSelectors",
                "Required value: at least one clusterRoleSelector required if aggregationRule is non-nil",
            )]),
        ),
        (
            "an aggregation rule with an invalid selector",
            object(
                "ClusterRole",
                &cluster_name("cr3"),
                json!({"aggregationRule": {"clusterRoleSelectors": [
                    {"matchLabels": {"ok": "yes"}},
                    {"matchExpressions": [{"key": "a", "operator": "Near", "values": ["b"]}]}]}}),
            ),
            422,
            causes(&[
                (
                    "FieldValueInvalid",
                    "aggregationRule.clusterRoleSelectors[1].matchExpressions[0].operator",
                    "Invalid value: \"Near\": not a valid selector operator",
                ),
                (
                    "FieldValueInvalid",
                    "aggregationRule.clusterRoleSelectors[1]",
                    "Invalid value: \"null\": invalid label selector.",
                ),
            ]),
        ),
        (
            "a role binding without a role and with bad subjects",
            object(
                "RoleBinding",
                "rb1",
                json!({"roleRef": {}, "subjects": [
                    {"kind": "Robot", "name": "x"},
                    {"kind": "ServiceAccount", "name": "Bad_Name", "apiGroup": "rbac.authorization.k8s.io"},
                    {"kind": "User", "name": "", "apiGroup": "example.com"}]}),
            ),
            422,
            causes(&[
                (
                    "FieldValueNotSupported",
                    "roleRef.kind",
                    "Unsupported value: \"\": supported values: \"Role\", \"ClusterRole\"",
                ),
                ("FieldValueRequired", "roleRef.name", "Required value"),
                (
                    "FieldValueNotSupported",
                    "subjects[0].kind",
                    "Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
                ),
                (
                    "FieldValueInvalid",
                    "subjects[1].name",
                    &format!("Invalid value: \"Bad_Name\": {SUBDOMAIN}"),
                ),
                (
                    "FieldValueNotSupported",
                    "subjects[1].apiGroup",
                    "Unsupported value: \"rbac.authorization.k8s.io\": supported values: \"\"",
                ),
                ("FieldValueRequired", "subjects[2].name", "Required value"),
                (
                    "FieldValueNotSupported",
                    "subjects[2].apiGroup",
                    "Unsupported value: \"example.com\": supported values: \"rbac.authorization.k8s.io\"",
                ),
            ]),
        ),
        (
            "a role binding to another group's role",
            object(
                "RoleBinding",
                "rb2",
                json!({"roleRef": {"apiGroup": "example.com", "kind": "Role", "name": "a/b"}}),
            ),
            422,
            causes(&[
                (
                    "FieldValueNotSupported",
                    "roleRef.apiGroup",
                    "Unsupported value: \"example.com\": supported values: \"rbac.authorization.k8s.io\"",
                ),
                (
                    "FieldValueInvalid",
                    "roleRef.name",
                    "Invalid value: \"a/b\": may not contain '/'",
                ),
            ]),
        ),
        (
            "a cluster role binding to a Role, for a ServiceAccount without a namespace",
            object(
                "ClusterRoleBinding",
                &cluster_name("crb1"),
                json!({"roleRef": {"kind": "Role", "name": "r"},
                    "subjects": [{"kind": "ServiceAccount", "name": "sa"}, {"kind": "Group", "name": "g"}]}),
            ),
            422,
            causes(&[
                (
                    "FieldValueNotSupported",
                    "roleRef.kind",
                    "Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                ),
                ("FieldValueRequired", "subjects[0].namespace", "Required value"),
            ]),
        ),
    ];
    refused_as_expected(&cluster, &ns, &cases).await?;

    // What the host installs passes: a Role, a ClusterRole with a URL rule, their bindings (a
    // subject's and the roleRef's apiGroup defaulted).
    let role = object(
        "Role",
        "system:slinky:reader",
        json!({"rules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]}),
    );
    let cluster_role = object(
        "ClusterRole",
        &cluster_name("reader"),
        json!({"rules": [{"verbs": ["get"], "nonResourceURLs": ["/metrics"]},
            {"verbs": ["list"], "apiGroups": ["apps"], "resources": ["statefulsets"], "resourceNames": ["x"]}],
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"slinky.net/aggregate": "true"}}]}}),
    );
    let binding = object(
        "RoleBinding",
        "reader",
        json!({"roleRef": {"kind": "Role", "name": "system:slinky:reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "slinky-host"}, {"kind": "User", "name": "alice"}]}),
    );
    let cluster_binding = object(
        "ClusterRoleBinding",
        &cluster_name("reader"),
        json!({"roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_name("reader")},
            "subjects": [{"kind": "ServiceAccount", "name": "slinky-host", "namespace": ns}]}),
    );
    for obj in [&role, &cluster_role, &binding, &cluster_binding] {
        if let Some((code, got)) = create(&cluster, &ns, obj).await? {
            bail!("a valid {} was refused: {code} {got:#?}", obj["kind"]);
        }
    }
    let api = |kind: &str, plural: &str, namespaced: bool| -> Api<DynamicObject> {
        let ar = resource(RBAC, kind, plural);
        if namespaced {
            Api::namespaced_with(cluster.client.clone(), &ns, &ar)
        } else {
            Api::all_with(cluster.client.clone(), &ar)
        }
    };
    let bindings = api("RoleBinding", "rolebindings", true);
    let cluster_bindings = api("ClusterRoleBinding", "clusterrolebindings", false);
    let cluster_roles = api("ClusterRole", "clusterroles", false);
    let stored = bindings.get("reader").await?;
    ensure!(
        stored.data.pointer("/roleRef/apiGroup") == Some(&json!("rbac.authorization.k8s.io"))
            && stored.data.pointer("/subjects/1/apiGroup") == Some(&json!("rbac.authorization.k8s.io"))
            && stored.data.pointer("/subjects/0/apiGroup").is_none(),
        "the apiGroups are defaulted: {:?}",
        stored.data
    );

    // Updates: the roleRef stays; an invalid update's causes come twice.
    let role_ref = "roleRef: Invalid value: rbac.RoleRef{APIGroup:\"rbac.authorization.k8s.io\", Kind:\"ClusterRole\", Name:\"view\"}: cannot change roleRef";
    let (field, message) = role_ref.split_once(": ").context("a field and a message")?;
    let updates: Vec<(&str, &Api<DynamicObject>, String, Value, Causes)> = vec![
        (
            "a role binding's changed roleRef",
            &bindings,
            "reader".to_string(),
            json!({"roleRef": {"kind": "ClusterRole", "name": "view"}}),
            causes(&[("FieldValueInvalid", field, message)]),
        ),
        (
            "a cluster role binding's unknown subject",
            &cluster_bindings,
            cluster_name("reader"),
            json!({"subjects": [{"kind": "Robot", "name": "r2"}]}),
            causes(&[
                (
                    "FieldValueNotSupported",
                    "subjects[0].kind",
                    "Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
                ),
                (
                    "FieldValueNotSupported",
                    "subjects[0].kind",
                    "Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
                ),
            ]),
        ),
        (
            "a cluster role's rule without verbs",
            &cluster_roles,
            cluster_name("reader"),
            json!({"rules": [{"nonResourceURLs": ["/metrics"]}]}),
            causes(&[
                (
                    "FieldValueRequired",
                    "rules[0].verbs",
                    "Required value: verbs must contain at least one value",
                ),
                (
                    "FieldValueRequired",
                    "rules[0].verbs",
                    "Required value: verbs must contain at least one value",
                ),
            ]),
        ),
    ];
    let mut failures = Vec::new();
    for (what, api, name, patch, expected) in updates {
        let r = api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await;
        match refusal(r)? {
            None => failures.push(format!("{what}: accepted, expected 422")),
            Some((code, got)) if code != 422 || got != expected => failures.push(format!(
                "{what}: got {code} {got:#?}\n  expected 422 {expected:#?}"
            )),
            Some(_) => {}
        }
    }
    // The message names a repeated cause once, as kube-apiserver's does.
    let r = cluster_roles
        .patch(
            &cluster_name("reader"),
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": [{"nonResourceURLs": ["/metrics"]}]})),
        )
        .await;
    match r {
        Err(kube::Error::Api(s)) => ensure!(
            s.message
                == format!(
                    "ClusterRole.rbac.authorization.k8s.io \"{}\" is invalid: rules[0].verbs: Required value: verbs must contain at least one value",
                    cluster_name("reader")
                ),
            "{}",
            s.message
        ),
        other => bail!("expected a 422, got {other:?}"),
    }
    for (api, name) in [
        (&cluster_bindings, cluster_name("reader")),
        (&cluster_roles, cluster_name("reader")),
    ] {
        api.delete(&name, &Default::default()).await?;
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}
