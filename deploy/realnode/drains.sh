#!/usr/bin/env bash
# The drains on the real node, each with a batch job running on every worker of the example cluster
# (run.sh brings it up and then runs this; it can also run alone on a running cluster):
#
#   scale-in         the NodeSet goes from 3 to 2: the worker that goes is drained, kept until the job
#                    ends, then deleted
#   rolling update   the slurmd container's template changes: no pod is replaced while the job runs on
#                    it; afterwards every pod is on the new revision and its node idle again
#   kubectl drain    `kubectl drain` of the node (the workers' pods only): every eviction is refused by
#                    the pod-protect budget while the job runs, the drain goes through after it; the
#                    node's cordon drains the Slurm nodes (printed: `drng`), and after its uncordon
#                    the three are idle (undrained) again
#   NodeSet deletion `kubectl delete nodeset`: the NodeSet stays (its finalizer), its pods too, until the
#                    job ends; then both go; the NodeSet is applied again
#
# Each prints what Slurm and the pods do every 2 s and fails when a pod whose node runs the job is
# deleted before the job ends, or when the job does not complete.
#
#   deploy/realnode/drains.sh [scale-in|rolling-update|kubectl-drain|nodeset-deletion]…   (default: all)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
R=${REALNODE_DIR:-$HOME/realnode}
export KUBECONFIG=${KUBECONFIG:-$R/kube/kubeconfig}
. "$here/lib.sh"

# Three Ready workers whose Slurm nodes respond idle (`idle*` is a record whose slurmd is gone).
three_idle() {
  unstick
  ctld_answers
  local i
  for i in 0 1 2; do
    for _ in $(seq 1 120); do workers -o name 2>/dev/null | grep -qx "pod/$NODESET-$i" && break; sleep 1; done
  done
  kubectl -n "$NS" wait --for=condition=Ready pod -l app.kubernetes.io/name=slurmd --timeout=300s >/dev/null
  for _ in $(seq 1 90); do
    [ "$(ctld sinfo -h -N -p "$PARTITION" -o %t 2>/dev/null | grep -cx idle)" -ge 3 ] && return 0
    sleep 2
  done
  ctld sinfo -N -p "$PARTITION"; fail "the three workers are not idle in Slurm"
}

# A batch job on all three workers, RUNNING when this returns; its id in $JOB.
job_on_every_worker() {
  JOB=$(ctld sbatch --parsable -p "$PARTITION" -N3 --chdir=/tmp -o /tmp/job-%j.out --wrap "srun sleep ${1:-30}")
  for _ in $(seq 1 60); do [ "$(ctld squeue -h -j "$JOB" -o %T)" = RUNNING ] && return 0; sleep 1; done
  fail "job $JOB is not RUNNING: $(ctld squeue -j "$JOB")"
}

# Follows job $JOB and the workers' pods of the moment it is called every 2 s until DONE (a command)
# succeeds or LIMIT seconds pass. Fails when one of those pods is deleted before the job ended (its
# deletionTimestamp, or when it was seen gone, before Slurm's EndTime of the job), or when the job
# did not complete. Sets TOUCHED (epoch seconds) to the first deletion among those pods.
follow() {
  local done=$1 limit=${2:-240} uids out state nodes pods line at grace ended
  uids=$(workers -o jsonpath='{range .items[*]}{.metadata.uid}{" "}{end}')
  TOUCHED=""
  local start=$SECONDS
  while :; do
    # The pods first, then the job: a deletion seen with the job still RUNNING after it happened
    # before the job's end. A failed read of the pods is no evidence: read again.
    if ! pods=$(workers -o jsonpath='{range .items[*]}{.metadata.uid}={.metadata.name}={.metadata.deletionTimestamp}={.metadata.deletionGracePeriodSeconds}{" "}{end}' 2>/dev/null); then
      [ $((SECONDS - start)) -lt "$limit" ] || fail "the API server did not answer for $limit s"
      sleep 2; continue
    fi
    # `done`: the job left the queue; `?`: slurmctld did not answer (it restarts for a slurm.conf
    # change without in-place reconfigure).
    if out=$(ctld squeue -h -j "$JOB" -o %T 2>/dev/null); then state=${out:-done}; else state="?"; fi
    nodes=$({ ctld sinfo -h -N -p "$PARTITION" -o '%N:%t' 2>/dev/null || echo "?"; } | sed "s/^$NODESET-//" | tr '\n' ' ')
    for uid in $uids; do
      line=$(tr ' ' '\n' <<<"$pods" | grep "^$uid=" || true)
      # Deleted at its deletionTimestamp less its grace period (the timestamp is when the kubelet's
      # grace ends), or when it was seen gone.
      if [ -z "$line" ]; then at=$(date +%s)
      else
        IFS== read -r _ _ at grace <<<"$line"
        [ -n "$at" ] && at=$(( $(date -d "$at" +%s) - ${grace:-0} ))
      fi
      if [ -n "$at" ] && { [ -z "$TOUCHED" ] || [ "$at" -lt "$TOUCHED" ]; }; then TOUCHED=$at; fi
    done
    printf '%s job %s %-9s | nodes %s| pods %s\n' "$(date +%T)" "$JOB" "$state" "$nodes" \
      "$(tr ' ' '\n' <<<"$pods" | sed -E "s/^[^=]*=$NODESET-//; s/=20[0-9]{2}-[0-9T:-]+Z=[0-9]*/(deleted)/; s/==$//" | tr '\n' ' ')"
    if [ -n "$TOUCHED" ] && [ "$state" = RUNNING ]; then fail "a worker's pod was deleted while job $JOB ran on it"; fi
    if eval "$done"; then break; fi
    [ $((SECONDS - start)) -lt "$limit" ] || fail "not done within $limit s: $done"
    sleep 2
  done
  ctld_answers
  # slurmctld may restart again just now (the NodeSet's nodes leave slurm.conf): ask until it answers.
  out=""
  for _ in $(seq 1 60); do out=$(ctld scontrol show job "$JOB" 2>/dev/null) && break; sleep 2; done
  [ -n "$out" ] || fail "slurmctld does not show job $JOB"
  grep -q "JobState=COMPLETED" <<<"$out" || fail "job $JOB did not complete: $(grep JobState <<<"$out")"
  # slurmctld's clock is UTC (the images have no zoneinfo).
  ended=$(date -u -d "$(grep -oE 'EndTime=[0-9T:-]+' <<<"$out" | cut -d= -f2)" +%s)
  if [ -n "$TOUCHED" ]; then
    [ "$TOUCHED" -ge "$ended" ] || fail "a worker's pod was deleted $((ended - TOUCHED)) s before job $JOB ended"
    echo "job $JOB COMPLETED; the first of its pods was deleted $((TOUCHED - ended)) s after it ended (Slurm's EndTime; the pod's deletionTimestamp less its grace period)"
  else
    echo "job $JOB COMPLETED"
  fi
}

scale_in() {
  step "a scale-in while a job runs on every worker"
  three_idle
  # An idle worker would go first (as in Slinky): a job on all three makes the one that goes busy.
  job_on_every_worker 30
  kubectl -n "$NS" patch nodeset "$NODESET" --type merge -p '{"spec":{"replicas":2}}' >/dev/null
  follow '[ -n "$TOUCHED" ]'
  kubectl -n "$NS" patch nodeset "$NODESET" --type merge -p '{"spec":{"replicas":3}}' >/dev/null
}

rolling_update() {
  step "a rolling update while a job runs on every worker"
  three_idle
  local before after
  before=$(kubectl -n "$NS" get nodeset "$NODESET" -o jsonpath='{.status.nodeSetHash}')
  job_on_every_worker 30
  # A change of the pod template: the slurmd container gets one more environment variable.
  kubectl -n "$NS" patch nodeset "$NODESET" --type merge \
    -p "{\"spec\":{\"slurmd\":{\"env\":[{\"name\":\"REALNODE_ROLL\",\"value\":\"$(date +%s)\"}]}}}" >/dev/null
  updated() {
    after=$(kubectl -n "$NS" get nodeset "$NODESET" -o jsonpath='{.status.nodeSetHash} {.status.updatedReplicas} {.status.readyReplicas}')
    [ "${after%% *}" != "$before" ] && [ "${after#* }" = "3 3" ]
  }
  follow updated 360
  echo "NodeSet $NODESET: revision $before -> ${after%% *}, 3 updated and Ready"
  three_idle
}

kubectl_drain() {
  step "kubectl drain of the node while a job runs on every worker"
  three_idle
  local node log=/tmp/realnode-drain.log
  node=$(workers -o jsonpath='{.items[0].spec.nodeName}')
  job_on_every_worker 30
  # pod-protect follows a job within the node list's refresh: wait for it on all three.
  for _ in $(seq 1 30); do
    [ "$(workers -l nodeset.slinky.slurm.net/pod-protect=true -o name | wc -l)" -eq 3 ] && break; sleep 1
  done
  [ "$(workers -l nodeset.slinky.slurm.net/pod-protect=true -o name | wc -l)" -eq 3 ] ||
    fail "pod-protect is not on the three busy workers: $(workers --show-labels)"
  kubectl drain "$node" --pod-selector=app.kubernetes.io/name=slurmd --ignore-daemonsets \
    --delete-emptydir-data --timeout=300s >"$log" 2>&1 &
  DRAIN_PID=$! DRAINED_NODE=$node
  # Whatever happens next, the node does not stay cordoned (the next run would wait for ever).
  trap 'kill "$DRAIN_PID" 2>/dev/null; kubectl uncordon "$DRAINED_NODE" >/dev/null 2>&1' EXIT
  follow "! kill -0 $DRAIN_PID 2>/dev/null" 360
  wait "$DRAIN_PID" || { cat "$log"; fail "kubectl drain failed"; }
  echo "kubectl drain: $(grep -c "disruption budget" "$log") evictions refused by the budget while the job ran; then: $(grep -c evicted "$log") pods evicted"
  kubectl uncordon "$node" >/dev/null
  trap - EXIT
  three_idle
  echo "after the uncordon the three workers are back, idle (undrained) in Slurm"
}

nodeset_deletion() {
  step "a NodeSet deletion while a job runs on every worker"
  three_idle
  job_on_every_worker 30
  kubectl -n "$NS" delete nodeset "$NODESET" --wait=false >/dev/null
  sleep 2
  kubectl -n "$NS" get nodeset "$NODESET" -o jsonpath='deleted at {.metadata.deletionTimestamp}, held by {.metadata.finalizers}{"\n"}' ||
    fail "the NodeSet went at once, while its job ran"
  # Its partition takes no new job (slurmctld reads the closed partition from its new slurm.conf).
  for _ in $(seq 1 60); do
    ctld scontrol show partition "$PARTITION" 2>/dev/null | grep -q "State=DRAIN" && break; sleep 2
  done
  ctld scontrol show partition "$PARTITION" | grep -o "State=[A-Z]*" | head -1
  ! ctld sbatch -p "$PARTITION" --wrap true 2>/dev/null || fail "the deleted NodeSet's partition took a new job"
  follow "! kubectl -n $NS get nodeset $NODESET >/dev/null 2>&1 && [ -z \"\$(workers -o name)\" ]" 360
  echo "the NodeSet and its pods went after the job; applying it again"
  kubectl apply --server-side --force-conflicts -f "$here/cluster.yaml" >/dev/null
  three_idle
}

[ $# -gt 0 ] || set -- scale-in rolling-update kubectl-drain nodeset-deletion
for what in "$@"; do
  case $what in
    scale-in) scale_in ;;
    rolling-update) rolling_update ;;
    kubectl-drain) kubectl_drain ;;
    nodeset-deletion) nodeset_deletion ;;
    *) fail "unknown: $what (scale-in, rolling-update, kubectl-drain, nodeset-deletion)" ;;
  esac
done
printf '\ndrains done in %ds\n' "$SECONDS"
