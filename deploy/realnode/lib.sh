# Shared by run.sh and drains.sh (sourced).
NS=slurm NODESET=slurm-worker-slinky PARTITION=slurm-worker-slinky
step() { printf '\n== %s (%ds)\n' "$*" "$SECONDS"; }
fail() { echo "FAILED: $*" >&2; exit 1; }
ctld() { kubectl -n "$NS" exec slurm-controller-0 -c slurmctld -- "$@"; }
workers() { kubectl -n "$NS" get pods -l app.kubernetes.io/name=slurmd "$@"; }
# This machine's PID 1 keeps a copy of the network namespaces' mounts, so the kubelet sometimes
# cannot remove a deleted pod's namespace ("unlinkat /run/netns/cni-…: device or resource busy")
# and the pod stays Terminating for good. Such a pod (a minute after its deletion) is removed by
# force: what the host decided is done; only the node's teardown is helped.
unstick() {
  local pod
  for _ in $(seq 1 30); do
    [ -z "$(kubectl -n "$NS" get pods -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name}{" "}{end}')" ] && return 0
    sleep 2
  done
  for pod in $(kubectl -n "$NS" get pods -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name}{" "}{end}'); do
    echo "pod $pod is still Terminating a minute after its deletion (the node could not remove its network namespace): removed by force"
    kubectl -n "$NS" delete pod "$pod" --force --grace-period=0 >/dev/null 2>&1 || true
  done
}

# slurmctld answers (after a restart for a slurm.conf change).
ctld_answers() {
  for _ in $(seq 1 90); do ctld scontrol ping >/dev/null 2>&1 && return 0; sleep 2; done
  fail "slurmctld does not answer"
}
