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
//! | `count` | adds one to a static counter and puts its value in the annotation `hostile.test/calls` (state surviving between calls would show as a count above 1) |
//! | anything else | builds Slinky's pod |

use slinky_guest_sdk::{
    BuildContext, BuildError, NodeSetPodBuilder, PodIdentity,
    api::{Controller, NodeSet},
    k8s_openapi::api::core::v1::Pod,
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
