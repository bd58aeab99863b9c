#!/usr/bin/env bash
# Judge a render by a real Slurm (../shared/tools/realslurm, REALSLURM_DIR, default ~/realslurm):
# serve the rendered slurm.conf with slurmctld and start the first pod of the example NodeSet's
# slurmd with the pod's own arguments (evaluated as Slinky's image entrypoint does), each in
# private mount and UTS namespaces; print what Slurm says of the node (partition, state,
# features). Needs root and a `slurm` user (created when missing). This machine's hybrid cgroups
# need CgroupPlugin=disabled, ProctrackType=proctrack/linuxproc and TaskPlugin=task/none (added).
#
#   tests/slurm/judge.sh [MANIFEST]   (default examples/slurm-cluster.yaml)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
manifest=${1:-$root/examples/slurm-cluster.yaml}
S=${REALSLURM_DIR:-$HOME/realslurm}
J=$(mktemp -d /tmp/slurm-judge.XXXXXX)
[ -x "$S/sbin/slurmctld" ] || { echo "no Slurm build in $S: run ../shared/tools/realslurm/setup.sh" >&2; exit 2; }
id slurm >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin slurm
chmod o+x "$HOME" && chmod -R o+rX "$S"   # slurmctld re-executes itself as SlurmUser
"$root/target/debug/slinky-host" render -f "$manifest" > "$J/render.yaml"
python3 - "$J" "$manifest" <<'PY'
import sys, yaml, base64
j, manifest = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(f"{j}/render.yaml")) if d]
src = [d for d in yaml.safe_load_all(open(manifest)) if d]
for d in docs:
    if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config"):
        for f, v in d["data"].items():
            open(f"{j}/{f}", "w").write(v)
pod = next(d for d in docs if d["kind"] == "Pod")
c = next(c for c in pod["spec"]["containers"] if c["name"] == "slurmd")
args = c["args"]
i = args.index("--conf-server")
args[i + 1] = "127.0.0.1:6817"
open(f"{j}/args", "w").write(" ".join(args))
open(f"{j}/node", "w").write(pod["spec"]["hostname"])
for s in src:
    if s["kind"] == "Secret":
        for k, v in s["data"].items():
            name = "slurm.key" if k == "slurm.key" else "jwt.key"
            open(f"{j}/{name}", "wb").write(base64.b64decode(v))
PY
# A manifest without its key Secrets (the fixtures reference them): keys of our own.
[ -f "$J/slurm.key" ] || head -c 1024 /dev/urandom > "$J/slurm.key"
[ -f "$J/jwt.key" ] || head -c 32 /dev/urandom > "$J/jwt.key"
node=$(cat "$J/node")
ctl_names=$(grep -E '^Slurmctld(Host|Addr)=' "$J/slurm.conf" | sed -E 's/^[^=]*=//; s/[()]/ /g' | tr '\n' ' ')
unshare -m -u --propagation private bash -s "$J" "$S" "$node" "$ctl_names" <<'INNER'
set -u
J=$1 S=$2 NODE=$3 NAMES=$4
mount -t tmpfs tmpfs /etc/slurm 2>/dev/null || { mkdir -p /etc/slurm; mount -t tmpfs tmpfs /etc/slurm; }
cp "$J/slurm.conf" /etc/slurm/slurm.conf
printf 'ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n' >> /etc/slurm/slurm.conf
printf 'CgroupPlugin=disabled\nIgnoreSystemd=yes\n' > /etc/slurm/cgroup.conf
install -m 600 -o slurm "$J/slurm.key" /etc/slurm/slurm.key
install -m 600 -o slurm "$J/jwt.key" /etc/slurm/jwt.key
cp /etc/hosts "$J/hosts"; echo "127.0.0.1 $NAMES $NODE" >> "$J/hosts"; mount --bind "$J/hosts" /etc/hosts
state=$(sed -n 's/^StateSaveLocation=//p' /etc/slurm/slurm.conf)
mkdir -p "$state" /var/log/slurm /var/spool/slurmd /run/slurmctld
chown -R slurm "$state" /var/log/slurm /run/slurmctld
hostname "$(echo "$NAMES" | awk '{print $1}')"
"$S/sbin/slurmctld" -D -i > "$J/slurmctld.out" 2>&1 & ctl=$!
for _ in $(seq 30); do "$S/bin/scontrol" ping 2>/dev/null | grep -q UP && break; sleep 1; done
"$S/bin/scontrol" ping | head -1
SLINKY_TOPOLOGY="" unshare -u bash -c "hostname $NODE; eval \"exec $S/sbin/slurmd -D -N $NODE $(cat "$J/args")\"" > "$J/slurmd.out" 2>&1 & d=$!
for _ in $(seq 20); do "$S/bin/sinfo" -h -N -o %N 2>/dev/null | grep -qx "$NODE" && break; sleep 1; done
sleep 2
"$S/bin/sinfo" -N -o '%N %P %T %f'
kill $d $ctl 2>/dev/null; wait 2>/dev/null
INNER
echo "logs: $J"
