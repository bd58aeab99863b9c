#!/usr/bin/env bash
# Builds the images a Slurm cluster of slinky-host runs in, without a registry, for the real node of
# ../../../shared/tools/realnode (or any containerd: `ctr -n k8s.io images import`):
#
#   localhost/slinky/slurmctld:25.05   localhost/slinky/slurmd:25.05   localhost/slinky/slurmrestd:25.05
#   localhost/slinky/login:25.05 (the clients, sackd and sshd)
#   localhost/slinky/slurmdbd:25.05    localhost/slinky/mariadb:10.11 (this machine's mariadb-server, for slurmdbd)
#   localhost/slinky/slurm-tools:25.05 (busybox + the Slurm clients: the logfile sidecar, kubectl-exec checks)
#   localhost/slinky/slinky-host:dev   (this checkout's target/release/slinky-host, or target/debug/)
#
# from the real Slurm 25.05 build of ../../../shared/tools/realslurm ($REALSLURM_DIR, default
# ~/.cache/realslurm) and this machine's Debian libraries: each image holds the binaries, the shared
# libraries `ldd` names for them and for every Slurm plugin, bash and busybox, in the layout of Slinky's
# images (`fetch github:SlinkyProject/containers`): daemons and clients on PATH, `/etc/slurm` the
# sysconfdir, the `slurm` user (uid/gid 401), and an entrypoint with the same interface: its arguments
# join `SLURMCTLD_OPTIONS`/`SLURMD_OPTIONS` and a shell runs the daemon with them in the foreground (so
# the `--conf '…'"$SLINKY_TOPOLOGY"…'` a NodeSet pod passes is expanded as Slinky's supervisord does).
#
# Idempotent and cached: an image is rebuilt only when what goes into it changed (a hash of its inputs
# beside the archive). Usage: images.sh [--import]  (--import: also import into the node's containerd).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
S=${REALSLURM_DIR:-$HOME/.cache/realslurm}
R=${REALNODE_DIR:-$HOME/realnode}
OUT=${SLINKY_IMAGES_DIR:-$R/images/slinky}
# The release binary when there is one (what users run), else the debug one.
HOST_BIN=${SLINKY_HOST_BIN:-$( [ -x "$repo/target/release/slinky-host" ] && echo "$repo/target/release/slinky-host" || echo "$repo/target/debug/slinky-host")}
MKIMAGE=${MKIMAGE:-$repo/../shared/tools/realnode/mkimage.py}
TAG=25.05
[ -x "$S/sbin/slurmctld" ] || { echo "no Slurm build in $S: run ../shared/tools/realslurm/setup.sh (REALSLURM_DIR=$S)" >&2; exit 1; }
[ -f "$MKIMAGE" ] || { echo "no mkimage.py at $MKIMAGE (set MKIMAGE)" >&2; exit 1; }
[ -x /bin/busybox ] || { echo "busybox-static is not installed (apt-get install busybox-static)" >&2; exit 1; }
mkdir -p "$OUT"

# Copy FILE… into ROOT at the same paths, with every shared library ldd names for them.
with_libs() {
  local root=$1; shift
  local f lib
  for f in "$@"; do
    mkdir -p "$root$(dirname "$f")"
    cp -a "$f" "$root$f"
    { ldd "$f" 2>/dev/null || true; } | { grep -oE '/[^ ]+' || true; } | while read -r lib; do
      [ -e "$root$lib" ] && continue
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  done
}

# The base every image starts from: merged /usr as in Ubuntu 24.04, bash as sh's neighbour, busybox
# for the rest of the utilities, the users Slinky's images have.
base() {
  local root=$1
  rm -rf "$root"; mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib,usr/lib64,etc,tmp,root,proc,sys,dev,run,var/log,var/spool,usr/local/bin}
  ln -s usr/bin "$root/bin"; ln -s usr/sbin "$root/sbin"; ln -s usr/lib "$root/lib"; ln -s usr/lib64 "$root/lib64"
  chmod 1777 "$root/tmp"
  ln -s /run "$root/var/run"
  cp /bin/busybox "$root/usr/bin/busybox"
  local a
  for a in $(/bin/busybox --list); do
    [ -e "$root/usr/bin/$a" ] || ln -s busybox "$root/usr/bin/$a"
  done
  rm -f "$root/usr/bin/sh" "$root/usr/bin/bash"
  with_libs "$root" /usr/bin/bash /usr/bin/dash
  # coreutils' install (the Accounting pod's initconf runs `install -m 0600`; busybox has none).
  rm -f "$root/usr/bin/install"
  with_libs "$root" /usr/bin/install
  ln -s dash "$root/usr/bin/sh"
  printf 'root:x:0:0:root:/root:/bin/bash\nslurm:x:401:401:slurm:/nonexistent:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nslurm:x:401:\nnogroup:x:65534:\n' >"$root/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
}

# The Slurm install tree at its build path (the plugins' directory is compiled in), its daemons and
# clients on PATH, every plugin's libraries.
slurm() {
  local root=$1
  mkdir -p "$root$S"
  cp -a "$S/bin" "$S/sbin" "$root$S/"
  mkdir -p "$root$S/lib"
  cp -a "$S/lib/slurm" "$root$S/lib/"
  cp -a "$S"/lib/libslurm*.so* "$root$S/lib/" 2>/dev/null || true
  local f
  for f in "$S"/sbin/* "$S"/bin/* "$S"/lib/slurm/*.so; do
    [ -f "$f" ] || continue
    { LD_LIBRARY_PATH="$S/lib:$S/lib/slurm" ldd "$f" 2>/dev/null || true; } | { grep -oE '/[^ ]+' || true; } |
      while read -r lib; do
      case $lib in "$S"/*) continue ;; esac
      [ -e "$root$lib" ] && continue
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
  done
  for f in "$S"/sbin/*; do ln -sf "$f" "$root/usr/sbin/$(basename "$f")"; done
  for f in "$S"/bin/*; do ln -sf "$f" "$root/usr/bin/$(basename "$f")"; done
  mkdir -p "$root/etc/slurm" "$root/var/spool/slurmd" "$root/var/spool/slurmctld" "$root/run/slurm" "$root/var/log/slurm"
}

# image NAME ENTRYPOINT_JSON CMD_JSON BUILD_FN: build NAME's rootfs with BUILD_FN ROOT, archive it
# (skipped when its inputs' hash has not changed).
image() {
  local name=$1 ep=$2 cmd=$3 build=$4
  local archive="$OUT/${name//[\/:]/_}.tar"
  local inputs
  inputs=$( { declare -f base slurm with_libs sshd_root "$build"; echo "$ep $cmd $S"; ls -l --time-style=+%s "$S/sbin" "$S/bin";
              if [ "$name" = "localhost/slinky/slinky-host:dev" ]; then sha256sum "$HOST_BIN"; fi; } | sha256sum | cut -c1-16)
  if [ -f "$archive" ] && [ "$(cat "$archive.inputs" 2>/dev/null)" = "$inputs" ]; then
    echo "$name: unchanged ($archive)"; return
  fi
  local root="$OUT/rootfs"
  "$build" "$root"
  python3 "$MKIMAGE" "$archive" "$name" "$root" "$ep" "$cmd" >/dev/null
  echo "$inputs" >"$archive.inputs"
  rm -rf "$root"
  echo "$name: built ($(du -h "$archive" | cut -f1))"
}

entrypoint() { # ROOT DAEMON VAR: Slinky's interface (arguments join VAR, a shell runs the daemon)
  cat >"$1/usr/local/bin/entrypoint.sh" <<EOF
#!/usr/bin/env bash
# As Slinky's $2 image: the arguments join $3, and a shell runs the daemon with them, in the
# foreground (Slinky's supervisord runs \`bash -xc "exec $2 --systemd \$$3"\`).
set -euo pipefail
export $3="\${$3:-} \$*"
mkdir -p /run/slurm /run/$2 /var/spool/slurmd /var/log/slurm
exec bash -xc "exec $2 -D \$$3"
EOF
  chmod 755 "$1/usr/local/bin/entrypoint.sh"
}

build_slurmctld() { base "$1"; slurm "$1"; entrypoint "$1" slurmctld SLURMCTLD_OPTIONS; }
build_slurmd() { base "$1"; slurm "$1"; entrypoint "$1" slurmd SLURMD_OPTIONS; }
build_slurmrestd() { base "$1"; slurm "$1"; }
build_tools() { base "$1"; slurm "$1"; }
# Debian's sshd (openssh-server, unpacked: nothing is installed on this machine), cached.
sshd_root() {
  local d=$OUT/debs
  if [ ! -x "$d/root/usr/sbin/sshd" ]; then
    rm -rf "$d"; mkdir -p "$d"
    (cd "$d" && apt-get download -q openssh-server >/dev/null 2>&1) ||
      { echo "apt-get download openssh-server failed (the login image needs Debian's sshd)" >&2; return 1; }
    dpkg-deb -x "$d"/openssh-server_*.deb "$d/root"
  fi
  echo "$d/root"
}

# As Slinky's login image (FROM its sackd image): the Slurm clients, sackd and sshd, started as its
# login-entrypoint.sh and supervisord start them (`sshd -D -e $SSHD_OPTIONS`, `sackd --systemd
# $SACKD_OPTIONS` as the slurm user), without sssd (users come from /etc/passwd here). PAM keeps to
# pam_unix (no pam_loginuid or pam_systemd, which need a host's login session).
build_login() {
  base "$1"; slurm "$1"
  local deb lib sec=/usr/lib/x86_64-linux-gnu/security
  deb=$(sshd_root)
  cp -a "$deb/usr/sbin/sshd" "$1/usr/sbin/sshd"
  { ldd "$deb/usr/sbin/sshd" || true; } | { grep -oE '/[^ ]+' || true; } | while read -r lib; do
    [ -e "$1$lib" ] || { mkdir -p "$1$(dirname "$lib")"; cp -L "$lib" "$1$lib"; }
  done
  with_libs "$1" /usr/bin/ssh-keygen "$sec/pam_unix.so" "$sec/pam_env.so" "$sec/pam_permit.so" "$sec/pam_deny.so" /usr/sbin/unix_chkpwd
  mkdir -p "$1/etc/pam.d" "$1/etc/ssh/sshd_config.d" "$1/run/sshd" "$1/var/empty"
  printf 'auth required pam_unix.so\naccount required pam_unix.so\nsession required pam_unix.so\npassword required pam_unix.so\n' >"$1/etc/pam.d/sshd"
  cp "$1/etc/pam.d/sshd" "$1/etc/pam.d/other"
  echo 'sshd:x:100:65534::/run/sshd:/usr/sbin/nologin' >>"$1/etc/passwd"
  printf 'root:*:20000:0:99999:7:::\nslurm:!:20000::::::\nsshd:!:20000::::::\nnobody:!:20000::::::\n' >"$1/etc/shadow"
  chmod 640 "$1/etc/shadow"
  cat >"$1/usr/local/bin/entrypoint.sh" <<'EOF'
#!/usr/bin/env bash
# As Slinky's login image (login-entrypoint.sh, then supervisord's sshd and sackd programs): the
# container ends when either daemon does.
set -euo pipefail
export SSHD_OPTIONS="${SSHD_OPTIONS:-}" SACKD_OPTIONS="${SACKD_OPTIONS:-}"
mkdir -p /run/sshd /run/slurm
chmod 0755 /run/sshd
chown slurm:slurm /run/slurm
ssh-keygen -A
bash -xc "exec su -s /bin/sh slurm -c 'cd /run/slurm && exec sackd -D $SACKD_OPTIONS'" &
bash -xc "exec /usr/sbin/sshd -D -e $SSHD_OPTIONS" &
wait -n
echo "a daemon of the login container ended: the container ends" >&2
exit 1
EOF
  chmod 755 "$1/usr/local/bin/entrypoint.sh"
}

# As Slinky's slurmdbd image: `slurmdbd -D` (its `tini -g -- slurmdbd -D`); the plugins' libraries
# include the MariaDB client's (accounting_storage/mysql).
build_slurmdbd() { base "$1"; slurm "$1"; }

# A MariaDB for slurmdbd, from this machine's Debian mariadb-server: the entrypoint makes the data
# directory when it is empty (mariadb-install-db) and the database and user of MARIADB_DATABASE,
# MARIADB_USER, MARIADB_PASSWORD (an --init-file, at every start), then runs mariadbd as `mysql`.
build_mariadb() {
  base "$1"
  local f
  for f in /usr/sbin/mariadbd /usr/bin/mariadb-install-db /usr/bin/my_print_defaults /usr/bin/resolveip /usr/bin/mariadb; do
    [ -x "$f" ] || { echo "$f is missing: apt-get install mariadb-server (the MariaDB image is made from it)" >&2; return 1; }
  done
  with_libs "$1" /usr/sbin/mariadbd /usr/bin/my_print_defaults /usr/bin/resolveip /usr/bin/mariadb
  cp -a /usr/bin/mariadb-install-db "$1/usr/bin/"
  mkdir -p "$1/usr/share" "$1/var/lib/mysql" "$1/run/mysqld"
  cp -a /usr/share/mysql "$1/usr/share/"
  rm -f "$1"/usr/share/mysql/*.ini 2>/dev/null || true
  echo 'mysql:x:101:101:MariaDB:/nonexistent:/usr/sbin/nologin' >>"$1/etc/passwd"
  echo 'mysql:x:101:' >>"$1/etc/group"
  cat >"$1/usr/local/bin/entrypoint.sh" <<'EOF'
#!/usr/bin/env bash
set -euo pipefail
: "${MARIADB_DATABASE:?}" "${MARIADB_USER:?}" "${MARIADB_PASSWORD:?}"
d=/var/lib/mysql
mkdir -p "$d" /run/mysqld
chown mysql:mysql "$d" /run/mysqld
if [ ! -d "$d/mysql" ]; then
  mariadb-install-db --no-defaults --datadir="$d" --user=mysql --auth-root-authentication-method=socket \
    --skip-test-db --skip-name-resolve >/dev/null
fi
q() { printf '%s' "$1" | sed "s/'/''/g"; }
cat >/run/mysqld/init.sql <<SQL
CREATE DATABASE IF NOT EXISTS \`$MARIADB_DATABASE\`;
CREATE USER IF NOT EXISTS '$(q "$MARIADB_USER")'@'%' IDENTIFIED BY '$(q "$MARIADB_PASSWORD")';
ALTER USER '$(q "$MARIADB_USER")'@'%' IDENTIFIED BY '$(q "$MARIADB_PASSWORD")';
GRANT ALL ON \`$MARIADB_DATABASE\`.* TO '$(q "$MARIADB_USER")'@'%';
SQL
chown mysql /run/mysqld/init.sql; chmod 600 /run/mysqld/init.sql
exec mariadbd --no-defaults --datadir="$d" --user=mysql --bind-address=0.0.0.0 --port=3306 \
  --socket=/run/mysqld/mysqld.sock --skip-name-resolve --skip-log-bin \
  --innodb-lock-wait-timeout=900 --init-file=/run/mysqld/init.sql
EOF
  chmod 755 "$1/usr/local/bin/entrypoint.sh"
}

build_host() {
  base "$1"
  with_libs "$1" "$HOST_BIN"
  mv "$1$HOST_BIN" "$1/usr/bin/slinky-host"
  printf 'root:x:0:0:root:/root:/bin/bash\nnonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin\n' >"$1/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$1/etc/group"
  # The system's root certificates (registries over https).
  mkdir -p "$1/etc/ssl/certs"; cp -L /etc/ssl/certs/ca-certificates.crt "$1/etc/ssl/certs/" 2>/dev/null || true
}

image "localhost/slinky/slurmctld:$TAG" '["/usr/local/bin/entrypoint.sh"]' 'null' build_slurmctld
image "localhost/slinky/slurmd:$TAG" '["/usr/local/bin/entrypoint.sh"]' 'null' build_slurmd
image "localhost/slinky/slurmrestd:$TAG" '["slurmrestd"]' '["0.0.0.0:6820"]' build_slurmrestd
image "localhost/slinky/login:$TAG" '["/usr/local/bin/entrypoint.sh"]' 'null' build_login
image "localhost/slinky/slurmdbd:$TAG" '["slurmdbd", "-D"]' 'null' build_slurmdbd
image "localhost/slinky/mariadb:10.11" '["/usr/local/bin/entrypoint.sh"]' 'null' build_mariadb
image "localhost/slinky/slurm-tools:$TAG" 'null' '["sh"]' build_tools
if [ -x "$HOST_BIN" ]; then
  image "localhost/slinky/slinky-host:dev" '["/usr/bin/slinky-host"]' 'null' build_host
else
  echo "no $HOST_BIN: build it (cargo build --release -p slinky-host) for the host's image" >&2
fi

if [ "${1:-}" = --import ]; then
  for a in "$OUT"/*.tar; do
    ctr -n k8s.io images import --no-unpack=false "$a" >/dev/null
  done
  ctr -n k8s.io images ls -q | grep '^localhost/slinky/' || true
fi
