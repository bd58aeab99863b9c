#!/usr/bin/env bash
# The whole product on a real node, as a user installs it: builds the images (images.sh), starts the
# real single-node Kubernetes of ../shared/tools/realnode, installs slinky-host with its Helm chart
# (its image, ServiceAccount, RBAC, leader election), applies the example cluster for one node
# (cluster.yaml), waits for slurmctld, slurmd and slurmrestd to be Ready, runs a job across every
# worker (`srun -N3 hostname` in the slurmctld pod), logs into a login pod over ssh and runs one
# from there (login.yaml), adds accounting (accounting.yaml: slurmdbd, a MariaDB, sacct), then the
# drains with a job running (drains.sh: scale-in, rolling update, kubectl drain, NodeSet
# deletion), and prints what happened.
#
#   deploy/realnode/run.sh              # everything, then leaves the node running
#   deploy/realnode/run.sh --manifests  # the same, installed with `slinky-host manifests` instead
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
. "$here/lib.sh"

install=helm
case ${1:-} in
  --stop) exec bash "$tools/stop.sh" ;;
  --manifests) install=manifests ;;
  "") ;;
  *) fail "unknown option $1 (--manifests, --stop)" ;;
esac
[ -x "$HOST" ] || { echo "no $HOST: cargo build --release -p slinky-host" >&2; exit 1; }

step "the node"
if ! kubectl get nodes >/dev/null 2>&1; then bash "$tools/start.sh" --fresh; fi
kubectl get nodes -o wide

step "images (built from the real Slurm build and this checkout, imported into containerd)"
bash "$here/images.sh" --import

# The image's tag stays `dev`: its inputs' hash, as a pod annotation, rolls the host's pods when
# the binary changed (what a new tag does for users).
image_inputs=$(sha256sum <"${SLINKY_IMAGES_DIR:-$R/images/slinky}/localhost_slinky_slinky-host_dev.tar.inputs" | cut -c1-16)
helm_managed=$(kubectl -n slinky-system get deploy slinky-host -o jsonpath='{.metadata.annotations.meta\.helm\.sh/release-name}' 2>/dev/null || true)
if [ "$install" = helm ]; then
  step "slinky-host, installed with its Helm chart (deploy/helm/slinky-host)"
  if kubectl -n slinky-system get deploy slinky-host >/dev/null 2>&1 && [ -z "$helm_managed" ]; then
    # Installed by `manifests` before: its objects go (not the CRDs, which keep the cluster's
    # objects, and which Helm leaves alone when they exist), so that Helm owns the install.
    echo "removing the install of \`slinky-host manifests\` first (CRDs kept)"
    "$HOST" manifests | awk 'BEGIN{RS="\n---\n"; ORS="\n---\n"} !/\nkind: (CustomResourceDefinition|Namespace)\n/ && !/^kind: (CustomResourceDefinition|Namespace)\n/' |
      kubectl delete --ignore-not-found --wait=true -f - >/dev/null
  fi
  py=$R/py-env/bin/python
  # The same helm-python-sdk as the chart tests (tests/common/python.rs).
  if ! { [ -x "$py" ] && "$py" -c 'import helm_python' 2>/dev/null; }; then
    python3 -m venv "$R/py-env" && "$R/py-env/bin/pip" install -q helm-python-sdk==0.2.2
  fi
  "$py" "$here/helm_install.py" "$repo/deploy/helm/slinky-host" slinky-host slinky-system \
    "{\"image\":{\"repository\":\"localhost/slinky/slinky-host\",\"tag\":\"dev\"},\"podAnnotations\":{\"realnode/image-inputs\":\"$image_inputs\"}}" 600
else
  step "slinky-host, installed with its manifests"
  [ -z "$helm_managed" ] || fail "slinky-host is installed with Helm here (release $helm_managed): uninstall it first"
  "$HOST" manifests --image localhost/slinky/slinky-host:dev | kubectl apply --server-side --force-conflicts -f - >/dev/null
  kubectl -n slinky-system rollout restart deploy/slinky-host >/dev/null
fi
kubectl -n slinky-system rollout status deploy/slinky-host --timeout=600s
kubectl -n slinky-system get pods -o wide

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
for i in $(seq 1 60); do
  # Three idle nodes that respond (`idle*`: a record whose slurmd has not registered again).
  [ "$(ctld sinfo -h -N -o %t 2>/dev/null | grep -cx idle)" -ge 3 ] && break
  sleep 2
done
[ "$(ctld sinfo -h -N -o %t 2>/dev/null | grep -cx idle)" -ge 3 ] || { ctld sinfo -N; fail "the three workers are not idle in Slurm"; }
ctld sinfo
ctld scontrol show nodes | grep -E "NodeName|State=" || true

step "a job across every worker"
ctld timeout 120 srun -p slurm-worker-slinky -N3 hostname | sort

step "login nodes: ssh in as root with a key, a job from there"
key=$R/ssh/id_ed25519
[ -f "$key" ] || { mkdir -p "$R/ssh"; ssh-keygen -q -t ed25519 -N "" -C realnode -f "$key"; }
# login.yaml with root's authorized key at the end of the LoginSet's spec.
{ cat "$here/login.yaml"; printf '  rootSshAuthorizedKeys: |\n    %s\n' "$(cat "$key.pub")"; } |
  kubectl apply --server-side --force-conflicts -f - >/dev/null
exists -n "$NS" get deploy/slurm-login-slinky
kubectl -n "$NS" rollout status deploy/slurm-login-slinky --timeout=300s
# A Running pod that is not being deleted (an old one may stay Terminating on this machine).
login_ip=$(kubectl -n "$NS" get pods -l app.kubernetes.io/name=login,app.kubernetes.io/instance=slurm-login-slinky \
  --field-selector=status.phase=Running \
  -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}|{.status.podIP}{"\n"}{end}' | awk -F'|' '$1 == "" && $2 != "" {print $2; exit}')
[ -n "$login_ip" ] || fail "no running login pod"
# The host key the host made (the Secret no builder sees) is the one sshd serves.
echo "$login_ip $(kubectl -n "$NS" get secret slurm-login-slinky-ssh-host-keys -o jsonpath='{.data.ssh_host_ed25519_key\.pub}' | base64 -d)" >"$R/ssh/known_hosts"
ssh_login() {
  ssh -i "$key" -o UserKnownHostsFile="$R/ssh/known_hosts" -o StrictHostKeyChecking=yes -o BatchMode=yes \
    -o ConnectTimeout=10 "root@$login_ip" "$@"
}
for _ in $(seq 1 30); do ssh_login true 2>/dev/null && break; sleep 2; done
ssh_login 'hostname; sinfo'
ssh_login "timeout 120 srun -p $PARTITION -N3 hostname" | sort

step "accounting: slurmdbd and its MariaDB, a job read back with sacct"
kubectl apply --server-side --force-conflicts -f "$here/accounting.yaml" >/dev/null
kubectl -n "$NS" rollout status deploy/mariadb --timeout=300s
exists -n "$NS" get statefulset/slurm-accounting
kubectl -n "$NS" rollout status statefulset/slurm-accounting --timeout=300s
# Accounting added to a cluster that ran without it: slurmctld made itself a ClusterID at its first
# start (StateSaveLocation/clustername), and slurmdbd gives the cluster another one at its first
# registration; slurmctld then refuses to start ("fatal: CLUSTER ID MISMATCH") until that file is
# removed. Slurm's own safety check, which no API can answer: remove the file first, as a user
# must (docs/slurm.md). A cluster made with its accountingRef from the start needs none of it.
if [ -z "$(kubectl -n "$NS" get controller slurm -o jsonpath='{.spec.accountingRef.name}')" ]; then
  state_dir=$(ctld scontrol show config | awk '$1 == "StateSaveLocation" {print $3}')
  ctld rm -f "$state_dir/clustername"
  echo "removed $state_dir/clustername (the ClusterID slurmctld made without accounting)"
fi
kubectl -n "$NS" patch controller slurm --type merge -p '{"spec":{"accountingRef":{"name":"slurm"}}}' >/dev/null
# slurmctld restarts on its new slurm.conf (without in-place reconfigure) and registers the cluster
# with slurmdbd itself.
for _ in $(seq 1 120); do
  ctld sacctmgr -n -P show cluster format=Cluster 2>/dev/null | grep -qx slurm && break; sleep 2
done
ctld scontrol show config | grep -E "^AccountingStorage(Type|Host) "
ctld sacctmgr -n -P show cluster format=Cluster | grep -qx slurm || fail "the cluster is not registered in slurmdbd"
ctld_answers
for _ in $(seq 1 60); do [ "$(ctld sinfo -h -N -p "$PARTITION" -o %t 2>/dev/null | grep -cx idle)" -ge 3 ] && break; sleep 2; done
job=$(ctld sbatch --parsable -p "$PARTITION" -N3 --chdir=/tmp -o /dev/null --wrap "srun true")
for _ in $(seq 1 60); do
  line=$(ctld sacct -X -n -P -j "$job" -o JobID,State,NodeList 2>/dev/null || true)
  grep -q "|COMPLETED|" <<<"$line" && break; sleep 2
done
echo "sacct -X -n -P -j $job -o JobID,State,NodeList: $line"
grep -q "|COMPLETED|" <<<"$line" || fail "sacct does not list job $job as COMPLETED"

bash "$here/drains.sh"

printf '\ndone in %ds; the node keeps running (deploy/realnode/run.sh --stop)\n' "$SECONDS"
