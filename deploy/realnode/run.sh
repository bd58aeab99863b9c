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

# This machine's PID 1 keeps a copy of the network namespaces' mounts, so the kubelet sometimes
# cannot remove a deleted pod's namespace ("unlinkat /run/netns/cni-…: device or resource busy")
# and the pod stays Terminating for good. Such a pod (a minute after its deletion) is removed by
# force: what the host decided is done; only the node's teardown is helped.
unstick() {
  local pod since
  for _ in $(seq 1 30); do
    [ -z "$(kubectl -n slurm get pods -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name}{" "}{end}')" ] && return 0
    sleep 2
  done
  for pod in $(kubectl -n slurm get pods -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name}{" "}{end}'); do
    since=$(kubectl -n slurm get pod "$pod" -o jsonpath='{.metadata.deletionTimestamp}')
    echo "pod $pod, deleted at $since, is still Terminating (the node could not remove its network namespace): removed by force"
    kubectl -n slurm delete pod "$pod" --force --grace-period=0 >/dev/null 2>&1 || true
  done
}

step "the example cluster (cluster.yaml)"
kubectl get ns slurm >/dev/null 2>&1 && unstick
# slurmctld runs as the slurm user (401): a hostPath volume ignores the pod's fsGroup, so its
# directory is made the slurm user's here (a provisioned volume is group-writable by fsGroup).
mkdir -p /var/lib/realnode-slurm/controller-state
chown 401:401 /var/lib/realnode-slurm/controller-state
kubectl apply --server-side --force-conflicts -f "$here/cluster.yaml"
# The host makes them: wait until they exist, then until they are rolled out.
exists() { for _ in $(seq 1 300); do kubectl "$@" >/dev/null 2>&1 && return 0; sleep 1; done; kubectl "$@"; }
for what in "statefulset/slurm-controller" "deploy/slurm-restapi"; do
  exists -n slurm get "$what"
  kubectl -n slurm rollout status "$what" --timeout=600s
done
for i in 0 1 2; do exists -n slurm get pod "slurm-worker-slinky-$i"; done
kubectl -n slurm wait --for=condition=Ready pod -l app.kubernetes.io/name=slurmd --timeout=600s
kubectl -n slurm get pods -o wide

step "Slurm's view"
ctld() { kubectl -n slurm exec slurm-controller-0 -c slurmctld -- "$@"; }
for i in $(seq 1 60); do
  # Three idle nodes that respond (`idle*`: a record whose slurmd has not registered again).
  [ "$(ctld sinfo -h -N -o %t 2>/dev/null | grep -cx idle)" -ge 3 ] && break
  sleep 2
done
ctld sinfo
ctld scontrol show nodes | grep -E "NodeName|State=" || true

step "a job across every worker"
ctld timeout 120 srun -p slurm-worker-slinky -N3 hostname | sort

step "a scale-in while a job runs on every worker"
# An idle worker would go first (as in Slinky): a job on all three makes the one that goes busy.
job=$(ctld sbatch --parsable -p slurm-worker-slinky -N3 --chdir=/tmp -o /tmp/job-%j.out --wrap "srun sleep 30")
for _ in $(seq 1 30); do [ "$(ctld squeue -h -j "$job" -o %T)" = RUNNING ] && break; sleep 1; done
kubectl -n slurm patch nodeset slurm-worker-slinky --type merge -p '{"spec":{"replicas":2}}' >/dev/null
ended=""; deleted=""
for _ in $(seq 1 120); do
  state=$(ctld squeue -h -j "$job" -o %T 2>/dev/null || true)
  nodes=$(ctld sinfo -h -N -o '%N:%t' 2>/dev/null | tr '\n' ' ')
  # A pod being deleted is marked `(deleted)`: the host's decision, whatever the kubelet's
  # teardown takes.
  pods=$(kubectl -n slurm get pods -l app.kubernetes.io/name=slurmd \
    -o jsonpath='{range .items[*]}{.metadata.name}{.metadata.deletionTimestamp}{" "}{end}' 2>/dev/null |
    sed -E 's/20[0-9]{2}-[0-9T:-]+Z/(deleted)/g')
  printf '%s job %s %-9s | %s| pods %s\n' "$(date +%T)" "$job" "${state:-done}" "$nodes" "$pods"
  [ -z "$state" ] && [ -z "$ended" ] && ended=$(date +%s)
  # Deleted: marked, or already gone.
  if grep -q "(deleted)" <<<"$pods" || [ "$(wc -w <<<"$pods")" -lt 3 ]; then
    [ -n "$ended" ] || { echo "a worker's pod was deleted while the job ran on it" >&2; exit 1; }
    deleted=$(date +%s); break
  fi
  sleep 2
done
ctld scontrol show job "$job" | grep -E "JobState|RunTime"
[ -n "$deleted" ] || { echo "no worker's pod was deleted" >&2; exit 1; }
echo "the pod was deleted $((deleted - ended)) s after the job ended (polled every 2 s)"
unstick
ctld scontrol show job "$job" | grep -q "JobState=COMPLETED" || { echo "the job did not complete" >&2; exit 1; }
kubectl -n slurm patch nodeset slurm-worker-slinky --type merge -p '{"spec":{"replicas":3}}' >/dev/null
kubectl -n slurm get nodeset slurm-worker-slinky -o jsonpath='{.status}'; echo

printf '\ndone in %ds; the node keeps running (deploy/realnode/run.sh --stop)\n' "$SECONDS"
