#!/usr/bin/env bash
# The whole product on a real node, as a user installs it: builds the images (images.sh), starts the
# real single-node Kubernetes of ../shared/tools/realnode, installs slinky-host with
# `slinky-host manifests` (its image, ServiceAccount, RBAC, leader election), applies the example
# cluster for one node (cluster.yaml), waits for slurmctld, slurmd and slurmrestd to be Ready, runs a
# job across every worker (`srun -N3 hostname` in the slurmctld pod) and prints what happened.
#
#   deploy/realnode/run.sh            # everything, then leaves the node running
#   deploy/realnode/run.sh --stop     # stop the node (../shared/tools/realnode/stop.sh)
#
# Needs root, the realnode setup (../shared/tools/realnode/setup.sh), a real Slurm build
# (../shared/tools/realslurm/setup.sh) and the host binary its image holds: target/release/slinky-host
# (`cargo build --release -p slinky-host`, what users run) or target/debug/slinky-host.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
tools=${REALNODE_TOOLS:-$repo/../shared/tools/realnode}
R=${REALNODE_DIR:-$HOME/realnode}
export KUBECONFIG=$R/kube/kubeconfig
HOST=${SLINKY_HOST_BIN:-$( [ -x "$repo/target/release/slinky-host" ] && echo "$repo/target/release/slinky-host" || echo "$repo/target/debug/slinky-host")}
export SLINKY_HOST_BIN=$HOST
step() { printf '\n== %s (%ds)\n' "$*" "$SECONDS"; }

if [ "${1:-}" = --stop ]; then exec bash "$tools/stop.sh"; fi
[ -x "$HOST" ] || { echo "no $HOST: cargo build --release -p slinky-host" >&2; exit 1; }

step "the node"
if ! kubectl get nodes >/dev/null 2>&1; then bash "$tools/start.sh" --fresh; fi
kubectl get nodes -o wide

step "images (built from the real Slurm build and this checkout, imported into containerd)"
bash "$here/images.sh" --import

step "slinky-host, installed with its manifests"
"$HOST" manifests --image localhost/slinky/slinky-host:dev | kubectl apply --server-side --force-conflicts -f - >/dev/null
kubectl -n slinky-system rollout restart deploy/slinky-host >/dev/null
kubectl -n slinky-system rollout status deploy/slinky-host --timeout=600s
kubectl -n slinky-system get pods -o wide

step "the example cluster (cluster.yaml)"
# slurmctld runs as the slurm user (401): a hostPath volume ignores the pod's fsGroup, so its
# directory is made the slurm user's here (a provisioned volume is group-writable by fsGroup).
mkdir -p /var/lib/realnode-slurm/controller-state
chown 401:401 /var/lib/realnode-slurm/controller-state
kubectl apply --server-side --force-conflicts -f "$here/cluster.yaml"
for what in "statefulset/slurm-controller" "deploy/slurm-restapi"; do
  kubectl -n slurm rollout status "$what" --timeout=600s
done
kubectl -n slurm wait --for=condition=Ready pod -l app.kubernetes.io/name=slurmd --timeout=600s
kubectl -n slurm get pods -o wide

step "Slurm's view"
ctld() { kubectl -n slurm exec slurm-controller-0 -c slurmctld -- "$@"; }
for i in $(seq 1 60); do
  [ "$(ctld sinfo -h -o %D -t idle 2>/dev/null || echo 0)" -ge 3 ] && break
  sleep 2
done
ctld sinfo
ctld scontrol show nodes | grep -E "NodeName|State=" || true

step "a job across every worker"
ctld srun -p slurm-worker-slinky -N3 hostname | sort
kubectl -n slurm get nodeset slurm-worker-slinky -o jsonpath='{.status}'; echo

printf '\ndone in %ds; the node keeps running (deploy/realnode/run.sh --stop)\n' "$SECONDS"
