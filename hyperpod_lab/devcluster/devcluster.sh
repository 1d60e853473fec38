#!/usr/bin/env bash
# hyperpod-lab local dev cluster: Slurm 22.05 with three slurmd "nodes" (n1, n2, n3) on this host,
# MariaDB + slurmdbd (so sacct works), munge, a private sshd on 127.0.0.1 acting as the
# login node, and a second sshd acting as a bastion (jump host) in front of it. Everything lives under $HYPERPOD_LAB_DEV_DIR (default /var/tmp/hyperpod-lab-dev).
#
# Usage: devcluster.sh up|down|status        (up/down need root; all are idempotent)
#
# Environment:
#   HYPERPOD_LAB_DEV_DIR       base directory            (/var/tmp/hyperpod-lab-dev)
#   HYPERPOD_LAB_DEV_SSH_PORT  sshd port on 127.0.0.1    (up: 2222; status: the port up used)
#   HYPERPOD_LAB_DEV_BASTION_PORT  bastion sshd port     (up: 2223; status: the port up used)
#   HYPERPOD_LAB_DEV_DB_PORT   MariaDB port on 127.0.0.1 (3307; our own instance, not the system one)
#   HYPERPOD_LAB_DEV_NODES     up: how many slurmd nodes, 2-32 (3: a 2-node job plus a spare; 17 for
#                              tests/runtime/test_scale16_slurm.py's 16-node job and its spare);
#                              status/down: the nodes of the slurm.conf the last `up` wrote
#   HYPERPOD_LAB_DEV_CPUS      up: CPUs each node declares, 1-64 (default: this host's, `nproc`);
#                              more than the host has takes `SlurmdParameters=config_overrides`
#                              (slurm.conf(5): slurmd registers the configured counts, not the
#                              hardware's), so 8 processes a node (the production shape, 8 GPUs a
#                              node) can be placed on a 2-core host: they share its cores
#
# Each slurmd runs in its own mount namespace (`unshare --mount --propagation private`), so a
# test can give one node its own mounts (a tiny /dev/shm, read-only shared storage) the way a
# real node differs from its peers: `nsenter --mount --target <pid of slurmd-nK> mount ...`.
#
# Layout of the base directory:
#   fsx/            shared storage (same path for the nodes and the notebook)
#   ssh/            host key, client key (id_ed25519), authorized_keys, known_hosts, sshd_config;
#                   the bastion's bastion_host_ed25519_key, bastion_known_hosts, bastion_sshd_config
#                   (it accepts the same client key and forwards only to the login node's port)
#   slurm/state     slurmctld StateSaveLocation      } wipe both or neither: wiping only the
#   db/data         MariaDB datadir (slurm_acct_db)  } state restarts JobIDs at 1 -> duplicates
#   slurm/spool/N   per-node slurmd spool; run/ pid files; log/ daemon logs
#
# Exit status: 0 ok; 1 failure; 2 usage; 3 not root. `status` exits 1 if anything is down.
set -euo pipefail

BASE=${HYPERPOD_LAB_DEV_DIR:-/var/tmp/hyperpod-lab-dev}
SSH_PORT=${HYPERPOD_LAB_DEV_SSH_PORT:-}
if [ -z "$SSH_PORT" ] && [ "${1:-}" != up ]; then   # status/down: the port the last `up` used
  SSH_PORT=$(awk '$1=="Port"{print $2; exit}' "$BASE/ssh/sshd_config" 2>/dev/null || true)
fi
SSH_PORT=${SSH_PORT:-2222}
BASTION_PORT=${HYPERPOD_LAB_DEV_BASTION_PORT:-}
if [ -z "$BASTION_PORT" ] && [ "${1:-}" != up ]; then
  BASTION_PORT=$(awk '$1=="Port"{print $2; exit}' "$BASE/ssh/bastion_sshd_config" 2>/dev/null || true)
fi
BASTION_PORT=${BASTION_PORT:-2223}
DB_PORT=${HYPERPOD_LAB_DEV_DB_PORT:-3307}
CLUSTER=hyperpod-dev
PARTITION=dev
CTLD_PORT=6817
DBD_PORT=6819
CONF=/etc/slurm/slurm.conf          # default path compiled into the binaries: ssh commands find it
NNODES=${HYPERPOD_LAB_DEV_NODES:-}
if [ -z "$NNODES" ]; then
  if [ "${1:-}" != up ] && [ -r "$CONF" ]; then NNODES=$(grep -c '^NodeName=n[0-9]' "$CONF" || true); fi
  [ -n "$NNODES" ] && [ "$NNODES" != 0 ] || NNODES=3
fi
[[ $NNODES =~ ^[0-9]{1,2}$ ]] && (( 10#$NNODES >= 2 && 10#$NNODES <= 32 )) \
  || { echo "[dev-cluster] ERROR: HYPERPOD_LAB_DEV_NODES must be 2 to 32, got '$NNODES'" >&2; exit 2; }
NNODES=$(( 10#$NNODES ))
NCPUS=${HYPERPOD_LAB_DEV_CPUS:-$(nproc)}
[[ $NCPUS =~ ^[0-9]{1,2}$ ]] && (( 10#$NCPUS >= 1 && 10#$NCPUS <= 64 )) \
  || { echo "[dev-cluster] ERROR: HYPERPOD_LAB_DEV_CPUS must be 1 to 64, got '$NCPUS'" >&2; exit 2; }
NCPUS=$(( 10#$NCPUS ))
NODES=(); declare -A NODE_PORT=()
for i in $(seq 1 "$NNODES"); do   # n1 6818, n2 6820, n3 6821, ..., n32 6850 (6819 is slurmdbd's)
  NODES+=("n$i"); NODE_PORT[n$i]=$(( i == 1 ? 6818 : 6818 + i ))
done
DBD_CONF=/etc/slurm/slurmdbd.conf
RUN=$BASE/run
LOG=$BASE/log
SSH_DIR=$BASE/ssh
DB_DIR=$BASE/db
DB_SOCK=$DB_DIR/mysqld.sock
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH

say() { echo "[dev-cluster] $*"; }
die() { echo "[dev-cluster] ERROR: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }

# A pid is alive if /proc has it, it is not a zombie (PID 1 here reaps orphans lazily, so
# `kill -0` on a killed daemon still succeeds) and, if given, its command name matches
# (guards against a stale pid file whose pid was reused).
alive_pid() {  # PID [COMM]
  local pid=$1 comm=${2:-}
  [[ $pid =~ ^[0-9]+$ ]] && [ -r "/proc/$pid/stat" ] || return 1
  awk '{exit ($3=="Z")?0:1}' "/proc/$pid/stat" 2>/dev/null && return 1
  [ -z "$comm" ] || [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ]
}
pidof_file() { cat "$1" 2>/dev/null | tr -dc '0-9' || true; }
alive_file() { local p; p=$(pidof_file "$1"); [ -n "$p" ] && alive_pid "$p" "${2:-}"; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() {  # TIMEOUT_S DESCRIPTION COMMAND...
  local t=$1 what=$2; shift 2
  local end; end=$(awk -v n="$(now)" -v t="$t" 'BEGIN{printf "%.2f", n+t}')
  until "$@"; do
    awk -v n="$(now)" -v e="$end" 'BEGIN{exit !(n>e)}' && return 1
    sleep 0.1
  done
}
stop_pid() {  # PID COMM NAME : SIGTERM, wait up to 15 s, then SIGKILL
  local pid=$1 comm=$2 name=$3 i
  alive_pid "$pid" "$comm" || return 0
  kill "$pid" 2>/dev/null || true
  for i in $(seq 150); do alive_pid "$pid" "$comm" || { say "$name: stopped (pid $pid)"; return 0; }; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  for i in $(seq 50); do alive_pid "$pid" "$comm" || break; sleep 0.1; done
  say "$name: killed (pid $pid)"
}
stop_if_changed() {  # PIDFILE COMM CHANGED NAME : stop the daemon of PIDFILE when CHANGED=1 (its config changed)
  if [ "$3" = 1 ] && alive_file "$1" "$2"; then stop_pid "$(pidof_file "$1")" "$2" "$4 (config changed)"; fi
}
start_daemon() {  # NAME PIDFILE COMM PORT LOG WAIT_S READY -- COMMAND...
  # Unless the daemon of PIDFILE runs: start COMMAND (it daemonizes and writes PIDFILE; output to
  # LOG; no inherited lock fd 9, which would outlive this script), then wait up to WAIT_S s until
  # the shell condition READY holds. On failure show LOG's tail and die.
  local name=$1 pidfile=$2 comm=$3 port=$4 log=$5 wait_s=$6 ready=$7
  shift 7; [ "${1:-}" = -- ] && shift
  if alive_file "$pidfile" "$comm"; then say "$name: running (pid $(pidof_file "$pidfile"))"; return 0; fi
  port_open "$port" && die "port $port ($name) is taken by a process we did not start (another Slurm on this host?); stop it first"
  "$@" </dev/null >>"$log" 2>&1 9>&- || { tail -n 20 "$log" >&2; die "$name failed to start"; }
  wait_for "$wait_s" "$name" eval "$ready" \
    || { tail -n 20 "$log" >&2; die "$name is not ready after $wait_s s: $ready (see $log)"; }
  say "$name: started (pid $(pidof_file "$pidfile"))"
}
replace_if_changed() {  # FILE : install FILE.new as FILE if they differ (status 0), else drop FILE.new (status 1)
  if cmp -s "$1.new" "$1"; then rm -f "$1.new"; return 1; fi
  mv "$1.new" "$1"
}

# ---------------------------------------------------------------- packages
ensure_packages() {
  local -A need=() ; local missing=()
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sinfo >/dev/null \
    || need[slurm-wlm]=1
  command -v munged >/dev/null || need[munge]=1
  command -v slurmdbd >/dev/null || need[slurmdbd]=1
  { command -v mariadbd && command -v mariadb-install-db && command -v mariadb; } >/dev/null || need[mariadb-server]=1
  { [ -x /usr/sbin/sshd ] && command -v ssh-keygen && command -v ssh; } >/dev/null || need[openssh-server]=1
  missing=("${!need[@]}")
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  say "installing ${missing[*]} (apt)"
  local t0; t0=$(now)
  # keep package scripts from starting system daemons (munge, mariadb, sshd on :22) that we
  # would neither use nor stop: deny service starts while apt runs, unless a policy exists
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >"$LOG/apt.log" 2>&1; then
    say "apt-get install failed; running apt-get update and retrying"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >>"$LOG/apt.log" 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >>"$LOG/apt.log" 2>&1 \
      || { tail -n 20 "$LOG/apt.log" >&2; die "apt-get install ${missing[*]} failed (see $LOG/apt.log)"; }
  fi
  say "packages installed in $(since "$t0") s"
  if [ "$(trap -p EXIT)" ]; then rm -f /usr/sbin/policy-rc.d; trap - EXIT; fi
}

# ---------------------------------------------------------------- munge (system daemon, shared)
start_munge() {
  if alive_file /run/munge/munged.pid munged; then
    if [ "$(pidof_file "$RUN/munged.ours")" = "$(pidof_file /run/munge/munged.pid)" ]; then
      say "munged: running (pid $(pidof_file /run/munge/munged.pid))"
    else
      say "munged: running, not started by us (pid $(pidof_file /run/munge/munged.pid)); using it"
    fi
  else
    [ -s /etc/munge/munge.key ] || { mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
      || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge      # /run is tmpfs; no systemd creates it
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    rm -f /run/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged </dev/null >>"$LOG/munged.out" 2>&1 9>&-
    wait_for 5 munged alive_file /run/munge/munged.pid munged || die "munged did not start (see /var/log/munge/munged.log)"
    pidof_file /run/munge/munged.pid >"$RUN/munged.ours"
    say "munged: started (pid $(pidof_file /run/munge/munged.pid))"
  fi
  munge_ok() { munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; }
  wait_for 5 munge munge_ok || die "munge does not answer (munge -n | unmunge fails)"
}

# ---------------------------------------------------------------- MariaDB (own instance) + slurmdbd
db() { mariadb --no-defaults --protocol=socket --socket="$DB_SOCK" -uroot "$@"; }
start_mariadb() {
  local pidf=$DB_DIR/mysqld.pid
  if alive_file "$pidf" mariadbd; then say "mariadb: running (pid $(pidof_file "$pidf"))"; return 0; fi
  install -d -o mysql -g mysql -m 0755 "$DB_DIR"   # mariadbd writes its socket and pid file here
  if [ ! -d "$DB_DIR/data/mysql" ]; then
    local t0; t0=$(now)
    install -d -o mysql -g mysql -m 0750 "$DB_DIR/data"
    mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR/data" --skip-test-db \
      --auth-root-authentication-method=socket >"$LOG/mariadb-install.log" 2>&1 \
      || { tail -n 20 "$LOG/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    say "mariadb: datadir initialised in $(since "$t0") s"
  fi
  chown -R mysql:mysql "$DB_DIR/data"
  [ -S "$DB_SOCK" ] && ! alive_file "$pidf" mariadbd && rm -f "$DB_SOCK"
  # --no-defaults: ignore /etc/mysql (system socket/port); our own socket, port and pid file
  setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DB_DIR/data" \
    --socket="$DB_SOCK" --pid-file="$pidf" --port="$DB_PORT" --bind-address=127.0.0.1 \
    --skip-name-resolve --log-error="$LOG/mariadb.log" --innodb-buffer-pool-size=64M \
    --max-connections=50 </dev/null >>"$LOG/mariadb.log" 2>&1 9>&- &
  wait_for 20 mariadb eval 'db -e "select 1" >/dev/null 2>&1' \
    || { tail -n 20 "$LOG/mariadb.log" >&2; die "mariadb did not start (see $LOG/mariadb.log)"; }
  say "mariadb: started on 127.0.0.1:$DB_PORT (pid $(pidof_file "$pidf"))"
}

write_dbd_conf() {
  [ -s "$DB_DIR/slurm.pw" ] || { (umask 077; head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' >"$DB_DIR/slurm.pw"); }
  local pw; pw=$(cat "$DB_DIR/slurm.pw")
  db -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
    ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  (umask 077; cat >"$DBD_CONF.new" <<EOF
# written by hyperpod-lab devcluster.sh -- do not edit (regenerated by 'dev-cluster up')
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$pw
StorageLoc=slurm_acct_db
EOF
  )
  chmod 600 "$DBD_CONF.new"          # slurmdbd refuses a group/world-readable conf
  replace_if_changed "$DBD_CONF"
}

start_slurmdbd() {
  stop_if_changed "$RUN/slurmdbd.pid" slurmdbd "$1" slurmdbd
  start_daemon slurmdbd "$RUN/slurmdbd.pid" slurmdbd "$DBD_PORT" "$LOG/slurmdbd.log" 20 \
    "port_open $DBD_PORT" -- slurmdbd
}

# ---------------------------------------------------------------- slurm.conf
write_slurm_conf() {
  local ncpu mem_total mem_node defmem overrides=
  ncpu=$NCPUS
  # more CPUs than the host has: slurmd would register the hardware's count and the node drain
  # ("Low CPUs"); config_overrides makes it register the configured one
  if (( ncpu > $(nproc) )); then overrides="SlurmdParameters=config_overrides"; fi
  mem_total=$(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo)
  # the slurmd share this host's memory; give each an equal part (minus 1 GiB slack), at least 256 MB
  mem_node=$(( (mem_total - 1024) / NNODES )); [ "$mem_node" -ge 256 ] || mem_node=256
  # DefMemPerCPU is required with CR_CPU_Memory, else every job takes the whole node's memory
  defmem=$(( mem_node / ncpu )); [ "$defmem" -le 1024 ] || defmem=1024
  mkdir -p "$(dirname "$CONF")"
  cat >"$CONF.new" <<EOF
# written by hyperpod-lab devcluster.sh -- do not edit (regenerated by 'dev-cluster up')
ClusterName=$CLUSTER
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
AuthType=auth/munge
StateSaveLocation=$BASE/slurm/state
SlurmdSpoolDir=$BASE/slurm/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
# two slurmd on one host: no cgroups, no CPU binding (task/affinity would pin the tasks of
# n1 and n2 to the same core, since each node allocates "its" CPU 0)
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=$defmem
MpiDefault=none
$overrides
MailProg=/bin/true
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
JobAcctGatherType=jobacct_gather/linux
JobCompType=jobcomp/none
# keep finished jobs visible to scontrol/squeue -t all for an hour
MinJobAge=3600
ReturnToService=2
JobRequeue=1
KillWait=10
SlurmdTimeout=30
SlurmctldTimeout=30
MessageTimeout=10
InactiveLimit=0
$(for n in "${NODES[@]}"; do echo "NodeName=$n NodeAddr=127.0.0.1 Port=${NODE_PORT[$n]} CPUs=$ncpu RealMemory=$mem_node State=UNKNOWN"; done)
PartitionName=$PARTITION Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  replace_if_changed "$CONF"
}

start_slurm() {
  local changed=$1 n
  # plugin/node changes need restarts, not `scontrol reconfigure`
  for n in "${NODES[@]}"; do
    stop_if_changed "$RUN/slurmd-$n.pid" slurmd "$changed" "slurmd $n"
    # a slurmd of an older `up` that shares our mount namespace: restart it in its own
    if alive_file "$RUN/slurmd-$n.pid" slurmd \
        && [ "$(readlink "/proc/$(pidof_file "$RUN/slurmd-$n.pid")/ns/mnt")" = "$(readlink /proc/self/ns/mnt)" ]; then
      stop_pid "$(pidof_file "$RUN/slurmd-$n.pid")" slurmd "slurmd $n (not in its own mount namespace)"
    fi
  done
  # slurmd of nodes beyond NNODES (an earlier `up` with more nodes)
  local pf
  for pf in "$RUN"/slurmd-n*.pid; do
    [ -e "$pf" ] || continue
    n=$(basename "$pf" .pid); n=${n#slurmd-}
    [ -n "${NODE_PORT[$n]:-}" ] || { alive_file "$pf" slurmd && stop_pid "$(pidof_file "$pf")" slurmd "slurmd $n (not in slurm.conf)"; rm -f "$pf"; }
  done
  stop_if_changed "$RUN/slurmctld.pid" slurmctld "$changed" slurmctld
  start_daemon slurmctld "$RUN/slurmctld.pid" slurmctld "$CTLD_PORT" "$LOG/slurmctld.log" 20 \
    'scontrol ping 2>/dev/null | grep -q UP' -- slurmctld
  for n in "${NODES[@]}"; do
    mkdir -p "$BASE/slurm/spool/$n"
    start_daemon "slurmd $n" "$RUN/slurmd-$n.pid" slurmd "${NODE_PORT[$n]}" "$LOG/slurmd-$n.log" 10 \
      "alive_file '$RUN/slurmd-$n.pid' slurmd" -- unshare --mount --propagation private slurmd -N "$n"
  done
}

node_state() { sinfo -h -N -n "$1" -o '%T' 2>/dev/null | head -n1 || true; }
node_ready() { case "$1" in idle|mixed|allocated|completing) return 0;; esac; return 1; }
nodes_ready() {
  local n st ok=0
  for n in "${NODES[@]}"; do
    st=$(node_state "$n")
    node_ready "$st" && continue
    ok=1
    case "$st" in   # a node left down/drained by an earlier crash: bring it back
      down|drained|drain|idle+drain|down\*|drained\*) scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true;;
    esac
  done
  return $ok
}

# ---------------------------------------------------------------- sshd (login node and bastion)
# sshd_config lines both sshds share: key-only root login with our client key on 127.0.0.1
sshd_conf_head() {  # PORT HOSTKEY PIDFILE
  cat <<EOF
# written by hyperpod-lab devcluster.sh -- do not edit (regenerated by 'dev-cluster up')
Port $1
ListenAddress 127.0.0.1
HostKey $2
PidFile $3
AuthorizedKeysFile $SSH_DIR/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitUserEnvironment no
EOF
}
sshd_conf_limits() {
  printf '%s\n' "MaxStartups 50:30:100" "MaxSessions 50" "ClientAliveInterval 30"
}
write_known_hosts() {  # PORT HOSTKEY.pub FILE: our known_hosts, for strict verification by clients
  echo "[127.0.0.1]:$1 $(cut -d' ' -f1,2 "$2")" >"$3.new"
  replace_if_changed "$3" || true
  chmod 644 "$3"
}
login_ok() {  # PORT KNOWN_HOSTS
  ssh -q -p "$1" -i "$SSH_DIR/id_ed25519" -o BatchMode=yes -o IdentitiesOnly=yes \
    -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$2" \
    -o GlobalKnownHostsFile=/dev/null -o ConnectTimeout=3 root@127.0.0.1 true </dev/null 2>/dev/null
}
start_an_sshd() {  # LABEL PORT PORT-VARIABLE CONFIG PIDFILE LOGFILE CHANGED KNOWN_HOSTS
  local label=$1 port=$2 var=$3 conf=$4 pidf=$5 logf=$6 changed=$7 kh=$8
  stop_if_changed "$pidf" sshd "$changed" "$label"
  if alive_file "$pidf" sshd; then
    say "$label: running on 127.0.0.1:$port (pid $(pidof_file "$pidf"))"
  else
    port_open "$port" && die "port $port ($label) is taken by a process we did not start; set $var"
    # daemonizes, writes PidFile; no inherited stdout (a caller reading our pipe would hang)
    # and no inherited lock fd 9 (the lock would outlive this script)
    /usr/sbin/sshd -f "$conf" -E "$logf" </dev/null >>"$logf" 2>&1 9>&-
    wait_for 5 "$label" alive_file "$pidf" sshd || die "$label did not start (see $logf)"
    say "$label: started on 127.0.0.1:$port (pid $(pidof_file "$pidf"))"
  fi
  wait_for 10 "$label login" login_ok "$port" "$kh" \
    || die "ssh root@127.0.0.1 -p $port ($label) with $SSH_DIR/id_ed25519 fails (see $logf)"
}

write_sshd_conf() {
  install -d -m 0700 "$SSH_DIR"
  install -d -m 0755 /run/sshd        # privilege-separation dir; sshd refuses to start without it
  [ -s "$SSH_DIR/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C hyperpod-dev-host -f "$SSH_DIR/ssh_host_ed25519_key"
  [ -s "$SSH_DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C hyperpod-lab-dev-client -f "$SSH_DIR/id_ed25519"
  install -m 0600 "$SSH_DIR/id_ed25519.pub" "$SSH_DIR/authorized_keys"
  write_known_hosts "$SSH_PORT" "$SSH_DIR/ssh_host_ed25519_key.pub" "$SSH_DIR/known_hosts"
  {
    sshd_conf_head "$SSH_PORT" "$SSH_DIR/ssh_host_ed25519_key" "$RUN/sshd.pid"
    echo "X11Forwarding no"
    sshd_conf_limits
    printf '%s\n' "Subsystem sftp internal-sftp" "LogLevel INFO"
  } >"$SSH_DIR/sshd_config.new"
  /usr/sbin/sshd -t -f "$SSH_DIR/sshd_config.new" || die "sshd rejects its config ($SSH_DIR/sshd_config.new)"
  replace_if_changed "$SSH_DIR/sshd_config"
}
ssh_ok() { login_ok "$SSH_PORT" "$SSH_DIR/known_hosts"; }
start_sshd() {  # CHANGED
  start_an_sshd sshd "$SSH_PORT" HYPERPOD_LAB_DEV_SSH_PORT "$SSH_DIR/sshd_config" "$RUN/sshd.pid" "$LOG/sshd.log" \
    "$1" "$SSH_DIR/known_hosts"
}

# ---------------------------------------------------------------- bastion (jump host)
# A second sshd with its own host key, in front of the login node: key-only root login with the
# same client key, no TTY, no agent or X11 forwarding, commands forced to /bin/true, and TCP
# forwarding only to the login node's port (PermitOpen): ProxyJump / `ssh -W` through it reach
# the login node and nothing else. Added beside the login node's sshd: starting it never
# restarts or reconfigures the other daemons.
write_bastion_conf() {
  [ -s "$SSH_DIR/bastion_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C hyperpod-dev-bastion -f "$SSH_DIR/bastion_host_ed25519_key"
  write_known_hosts "$BASTION_PORT" "$SSH_DIR/bastion_host_ed25519_key.pub" "$SSH_DIR/bastion_known_hosts"
  {
    sshd_conf_head "$BASTION_PORT" "$SSH_DIR/bastion_host_ed25519_key" "$RUN/bastion-sshd.pid"
    printf '%s\n' "PermitTTY no" "X11Forwarding no" "AllowAgentForwarding no" "AllowStreamLocalForwarding no" \
      "AllowTcpForwarding local" "PermitOpen 127.0.0.1:$SSH_PORT" "ForceCommand /bin/true"
    sshd_conf_limits
    echo "LogLevel INFO"
  } >"$SSH_DIR/bastion_sshd_config.new"
  /usr/sbin/sshd -t -f "$SSH_DIR/bastion_sshd_config.new" || die "sshd rejects the bastion's config ($SSH_DIR/bastion_sshd_config.new)"
  replace_if_changed "$SSH_DIR/bastion_sshd_config"
}
bastion_ok() { login_ok "$BASTION_PORT" "$SSH_DIR/bastion_known_hosts"; }
start_bastion() {  # CHANGED
  start_an_sshd bastion "$BASTION_PORT" HYPERPOD_LAB_DEV_BASTION_PORT "$SSH_DIR/bastion_sshd_config" \
    "$RUN/bastion-sshd.pid" "$LOG/bastion-sshd.log" "$1" "$SSH_DIR/bastion_known_hosts"
}

# ---------------------------------------------------------------- state we did not create
# Another user could plant a directory or a key where the state goes (e.g. under /var/tmp)
# before the first 'up' and so hold the login node's keys. Everything the script keeps must be
# ours (same uid), no symbolic link, and not writable (keys: not readable) by others; what fails
# is refused, never adopted or "fixed". sshd's own StrictModes stays off only because /var/tmp
# (1777) is in the path of AuthorizedKeysFile; these checks are the ones it would make.
own_path() {  # PATH FORBIDDEN-MODE-BITS (octal)
  local p=$1 forbid=$2 uid mode
  [ -e "$p" ] || [ -L "$p" ] || return 0
  [ -L "$p" ] && die "$p is a symbolic link, which dev-cluster never creates; remove it, or set HYPERPOD_LAB_DEV_DIR to a new directory"
  uid=$(stat -c %u "$p"); mode=$(stat -c %a "$p")
  [ "$uid" = "$(id -u)" ] || die "$p belongs to uid $uid, not to $(id -un): dev-cluster did not create it; remove it, or set HYPERPOD_LAB_DEV_DIR to a new directory"
  if (( 8#$mode & 8#$forbid )); then
    die "$p has mode $mode (group/others may $( (( 8#$forbid & 044 )) && echo read || echo write) it), which dev-cluster never sets; remove it, or set HYPERPOD_LAB_DEV_DIR to a new directory"
  fi
  return 0
}

check_state() {
  local f
  own_path "$BASE" 022
  for f in "$RUN" "$LOG" "$BASE/slurm" "$BASE/slurm/state" "$BASE/slurm/spool"; do own_path "$f" 022; done
  own_path "$SSH_DIR" 077
  for f in ssh_host_ed25519_key id_ed25519 authorized_keys bastion_host_ed25519_key; do own_path "$SSH_DIR/$f" 077; done
  for f in ssh_host_ed25519_key.pub id_ed25519.pub known_hosts sshd_config \
           bastion_host_ed25519_key.pub bastion_known_hosts bastion_sshd_config; do own_path "$SSH_DIR/$f" 022; done
}

# ---------------------------------------------------------------- commands
need_root() {
  [ "$(id -u)" = 0 ] || { echo "[dev-cluster] ERROR: dev-cluster needs root to install and start Slurm; run it with sudo" >&2; exit 3; }
}

lock() {  # serialise concurrent up/down
  mkdir -p "$BASE"
  exec 9>"$BASE/.lock"
  flock -w 120 9 || die "another dev-cluster up/down holds $BASE/.lock"
}

cmd_up() {
  need_root
  local t0 c
  t0=$(now)
  umask 022
  check_state
  install -d -m 0755 "$BASE" "$RUN" "$LOG" "$BASE/slurm" "$BASE/slurm/state" "$BASE/slurm/spool"
  lock
  install -d -m 1777 "$BASE/fsx"
  ensure_packages
  t0=$(now)          # readiness time is measured once packages are there
  start_munge
  start_mariadb
  c=0; write_dbd_conf && c=1
  start_slurmdbd "$c"
  c=0; write_slurm_conf && c=1
  [ "$c" = 1 ] && say "slurm.conf: written ($CONF)"
  start_slurm "$c"
  c=0; write_sshd_conf && c=1
  start_sshd "$c"
  c=0; write_bastion_conf && c=1
  start_bastion "$c"
  if ! wait_for 30 "nodes idle" nodes_ready; then
    sinfo -N -o '%N %T %E' >&2 || true
    die "nodes did not become idle (see $LOG/slurmd-n*.log, $LOG/slurmctld.log)"
  fi
  sinfo -N -o '%N %P %T %c %m' | sed 's/^/[dev-cluster]   /'
  say "login: ssh -p $SSH_PORT -i $SSH_DIR/id_ed25519 -o UserKnownHostsFile=$SSH_DIR/known_hosts root@127.0.0.1"
  say "bastion: 127.0.0.1:$BASTION_PORT (host key in $SSH_DIR/bastion_known_hosts; forwards only to 127.0.0.1:$SSH_PORT)"
  say "shared storage: $BASE/fsx"
  say "ready in $(since "$t0") s"
}

cmd_down() {
  need_root
  lock
  local n
  if alive_file "$RUN/slurmctld.pid" slurmctld; then
    local jobs; jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ' || true)
    if [ -n "${jobs// /}" ]; then
      say "cancelling jobs: $jobs"
      scancel $jobs 2>/dev/null || true
      wait_for 20 "jobs gone" eval '[ -z "$(squeue -h -o %i 2>/dev/null)" ]' || say "some jobs still running"
    fi
  fi
  alive_file "$RUN/bastion-sshd.pid" sshd && stop_pid "$(pidof_file "$RUN/bastion-sshd.pid")" sshd bastion
  alive_file "$RUN/sshd.pid" sshd && stop_pid "$(pidof_file "$RUN/sshd.pid")" sshd sshd
  for n in "${NODES[@]}"; do
    alive_file "$RUN/slurmd-$n.pid" slurmd && stop_pid "$(pidof_file "$RUN/slurmd-$n.pid")" slurmd "slurmd $n"
  done
  alive_file "$RUN/slurmctld.pid" slurmctld && stop_pid "$(pidof_file "$RUN/slurmctld.pid")" slurmctld slurmctld
  alive_file "$RUN/slurmdbd.pid" slurmdbd && stop_pid "$(pidof_file "$RUN/slurmdbd.pid")" slurmdbd slurmdbd
  alive_file "$DB_DIR/mysqld.pid" mariadbd && stop_pid "$(pidof_file "$DB_DIR/mysqld.pid")" mariadbd mariadb
  local mp; mp=$(pidof_file "$RUN/munged.ours")
  if [ -n "$mp" ] && [ "$mp" = "$(pidof_file /run/munge/munged.pid)" ]; then
    stop_pid "$mp" munged munged
  fi
  rm -f "$RUN/munged.ours"
  say "down (state kept in $BASE; Slurm state and accounting DB are kept together)"
}

cmd_status() {
  local bad=0 p n st
  row() { printf '%-12s %-8s %s\n' "$1" "$2" "$3"; }
  daemon() {  # NAME PIDFILE COMM [EXTRA]
    if alive_file "$2" "$3"; then row "$1" running "pid $(pidof_file "$2")${4:+ $4}"
    else row "$1" stopped "${4:-}"; bad=1; fi
  }
  if alive_file /run/munge/munged.pid munged; then row munged running "pid $(pidof_file /run/munge/munged.pid)"
  else row munged stopped ""; bad=1; fi
  if [ -e "$DB_DIR/mysqld.pid" ] && [ ! -r "$DB_DIR/mysqld.pid" ]; then   # mode 660: not root
    if port_open "$DB_PORT"; then row mariadb running "127.0.0.1:$DB_PORT"; else row mariadb stopped "127.0.0.1:$DB_PORT"; bad=1; fi
  else
    daemon mariadb "$DB_DIR/mysqld.pid" mariadbd "127.0.0.1:$DB_PORT"
  fi
  daemon slurmdbd "$RUN/slurmdbd.pid" slurmdbd "127.0.0.1:$DBD_PORT"
  daemon slurmctld "$RUN/slurmctld.pid" slurmctld "127.0.0.1:$CTLD_PORT"
  for n in "${NODES[@]}"; do daemon "slurmd@$n" "$RUN/slurmd-$n.pid" slurmd "127.0.0.1:${NODE_PORT[$n]}"; done
  if alive_file "$RUN/sshd.pid" sshd; then
    if [ -r "$SSH_DIR/id_ed25519" ] && ssh_ok; then row sshd running "pid $(pidof_file "$RUN/sshd.pid") 127.0.0.1:$SSH_PORT"
    elif [ -r "$SSH_DIR/id_ed25519" ]; then row sshd failing "pid $(pidof_file "$RUN/sshd.pid") login fails"; bad=1
    else row sshd running "pid $(pidof_file "$RUN/sshd.pid") 127.0.0.1:$SSH_PORT (login not checked: key unreadable)"; fi
  else row sshd stopped "127.0.0.1:$SSH_PORT"; bad=1; fi
  if alive_file "$RUN/bastion-sshd.pid" sshd; then
    if [ -r "$SSH_DIR/id_ed25519" ] && bastion_ok; then row bastion running "pid $(pidof_file "$RUN/bastion-sshd.pid") 127.0.0.1:$BASTION_PORT"
    elif [ -r "$SSH_DIR/id_ed25519" ]; then row bastion failing "pid $(pidof_file "$RUN/bastion-sshd.pid") login fails"; bad=1
    else row bastion running "pid $(pidof_file "$RUN/bastion-sshd.pid") 127.0.0.1:$BASTION_PORT (login not checked: key unreadable)"; fi
  else row bastion stopped "127.0.0.1:$BASTION_PORT"; bad=1; fi
  for n in "${NODES[@]}"; do
    st=""
    alive_file "$RUN/slurmctld.pid" slurmctld && st=$(node_state "$n")
    [ -n "$st" ] || st=unknown
    row "node:$n" "$st" ""
    node_ready "$st" || bad=1
  done
  echo "--- sinfo ---"
  if alive_file "$RUN/slurmctld.pid" slurmctld; then sinfo -N -o '%N %P %T %c %m %E' 2>&1 || true
  else echo "(slurmctld not running)"; fi
  return $bad
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
