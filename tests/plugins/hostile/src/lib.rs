//! A deliberately misbehaving `nodeset-pod` builder for slinky-host's tests. What it does is
//! chosen per call by the NodeSet annotation `hostile.test/behaviour`:
//!
//! | value | behaviour |
//! |---|---|
//! | `loop` | never returns (the deadline must stop it) |
//! | `spin:N` | loops N million times, then builds normally (obeys the deadline) |
//! | `alloc:N` | allocates and touches N MiB, then builds normally (a bomb when N > the cap) |
//! | `panic` | panics |
//! | `other-namespace` | builds the pod in namespace `kube-system` |
//! | `wrong-name` | names the pod `impostor` |
//! | `no-selector` | drops the selector labels |
//! | `error` | returns an invalid-input error |
//! | `print` | writes to stdout and stderr, then builds normally |
//! | `log` | logs `hostile says hello` at warn (the `log` import), then builds normally |
//! | `log-flood:N` | logs N lines at debug, then builds normally (past the host's limits when N > 32) |
//! | `count` | adds one to a static counter and puts its value in the annotation `hostile.test/calls` (state surviving between calls would show as a count above 1) |
//! | `host-network` | runs the pod in the node's network namespace |
//! | `host-pid` | runs the pod in the node's process namespace |
//! | `host-path` | mounts the node's `/` (a `hostPath` volume `node-root`) |
//! | `node-name` | binds the pod to the node `node-0`, past the scheduler |
//! | `service-account` | runs the pod as the service account `admin` |
//! | `automount-token` | sets `automountServiceAccountToken: true` (the service account's token is mounted) |
//! | `privileged-sidecar` | adds a privileged container `escape` |
//! | `capability` | adds the capability `SYS_PTRACE` to slurmd (beyond Slinky's) |
//! | `finalizer` | puts the finalizer `hostile.test/keep` on the pod |
//! | anything else | builds Slinky's pod |

use slinky_guest_sdk::{
    BuildContext, BuildError, NodeSetPodBuilder, PodIdentity,
    api::{Controller, NodeSet},
    k8s_openapi::api::core::v1::{Container, HostPathVolumeSource, Pod, SecurityContext, Volume},
    slinky,
};

/// Calls this instance has served (`count`): a fresh instance per call always starts at 0.
static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The hostile builder.
pub struct Hostile;

/// The behaviour asked for by the NodeSet.
fn behaviour(nodeset: &NodeSet) -> String {
    nodeset
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("hostile.test/behaviour"))
        .cloned()
        .unwrap_or_default()
}

impl NodeSetPodBuilder for Hostile {
    fn build_pod(
        ctx: &BuildContext,
        nodeset: &NodeSet,
        controller: &Controller,
        identity: &PodIdentity,
    ) -> Result<Pod, BuildError> {
        let b = behaviour(nodeset);
        let (what, arg) = b.split_once(':').unwrap_or((b.as_str(), ""));
        let n: u64 = arg.parse().unwrap_or(0);
        match what {
            "loop" => {
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            "spin" => {
                let mut x: u64 = 0;
                for i in 0..n * 1_000_000 {
                    x = std::hint::black_box(x.wrapping_add(i));
                }
                std::hint::black_box(x);
            }
            "alloc" => {
                let mut v = vec![0u8; (n as usize) << 20];
                for i in (0..v.len()).step_by(4096) {
                    v[i] = 1;
                }
                std::hint::black_box(&v);
            }
            "panic" => panic!("hostile plugin panicked on purpose"),
            "error" => {
                return Err(BuildError::invalid(
                    "spec.hostile: the hostile plugin refuses this NodeSet",
                ));
            }
            "print" => {
                println!("hello from stdout");
                eprintln!("hello from stderr");
            }
            "log" => slinky_guest_sdk::log::warn("hostile says hello"),
            "log-flood" => {
                for i in 0..arg.parse::<u32>().unwrap_or(1000) {
                    slinky_guest_sdk::log::debug(&format!("flood line {i}"));
                }
            }
            _ => {}
        }
        let mut pod = slinky::build_nodeset_pod(ctx, nodeset, controller, identity)?;
        match what {
            "other-namespace" => pod.metadata.namespace = Some("kube-system".into()),
            "wrong-name" => pod.metadata.name = Some("impostor".into()),
            "count" => {
                let calls = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                pod.metadata
                    .annotations
                    .get_or_insert_default()
                    .insert("hostile.test/calls".into(), calls.to_string());
            }
            "host-network" | "host-pid" | "host-path" | "node-name" | "service-account"
            | "automount-token" | "privileged-sidecar" | "capability" => {
                let spec = pod.spec.get_or_insert_default();
                match what {
                    "host-network" => spec.host_network = Some(true),
                    "host-pid" => spec.host_pid = Some(true),
                    "node-name" => spec.node_name = Some("node-0".into()),
                    "service-account" => spec.service_account_name = Some("admin".into()),
                    "automount-token" => spec.automount_service_account_token = Some(true),
                    "host-path" => spec.volumes.get_or_insert_default().push(Volume {
                        name: "node-root".into(),
                        host_path: Some(HostPathVolumeSource {
                            path: "/".into(),
                            type_: None,
                        }),
                        ..Default::default()
                    }),
                    "privileged-sidecar" => spec.containers.push(Container {
                        name: "escape".into(),
                        image: Some("busybox".into()),
                        security_context: Some(SecurityContext {
                            privileged: Some(true),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    _ => {
                        for c in spec.containers.iter_mut().filter(|c| c.name == "slurmd") {
                            c.security_context
                                .get_or_insert_default()
                                .capabilities
                                .get_or_insert_default()
                                .add
                                .get_or_insert_default()
                                .push("SYS_PTRACE".into());
                        }
                    }
                }
            }
            "finalizer" => pod
                .metadata
                .finalizers
                .get_or_insert_default()
                .push("hostile.test/keep".into()),
            "no-selector" => {
                if let Some(l) = pod.metadata.labels.as_mut() {
                    l.remove("app.kubernetes.io/name");
                }
            }
            _ => {}
        }
        Ok(pod)
    }
}

slinky_guest_sdk::export_plugin!(Hostile, kinds = [nodeset_pod]);
