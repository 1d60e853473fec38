#!/bin/bash
# Rendered by hyperpod-lab 0.1.0 for job quick-start-20261123-010203-abcd. Resubmit instead of editing.
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=8
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --wait-all-nodes=1
#SBATCH --output="/fsx/hyperpod-lab/jobs/quick-start-20261123-010203-abcd/logs/slurm-%j.out"
#SBATCH --open-mode=append
#SBATCH --comment="hyperpod-lab:quick-start-20261123-010203-abcd"
#SBATCH --no-kill
#SBATCH --requeue
set -uo pipefail
umask 077  # what the job writes on shared storage is private to the user
JOB_DIR=/fsx/hyperpod-lab/jobs/quick-start-20261123-010203-abcd
echo "$SLURM_JOB_ID" > "$JOB_DIR/native_id"
export HYPERPOD_LAB_JOB_ID=quick-start-20261123-010203-abcd
export HYPERPOD_LAB_JOB_DIR="$JOB_DIR"
export HYPERPOD_LAB_SPEC="$JOB_DIR/spec.json"
export HYPERPOD_LAB_SHARED_ROOT=/fsx
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
export FI_PROVIDER=efa
export FI_EFA_USE_HUGE_PAGE=0
export FI_EFA_SET_CUDA_SYNC_MEMOPS=0
export NCCL_SOCKET_IFNAME='^docker,lo,veth'
export WANDB_MODE=off
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
head_addr=$(scontrol show node "$head_node" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
: "${head_addr:=$head_node}"
restart=${SLURM_RESTART_COUNT:-0}  # a requeue runs this script again with the count + 1
echo "hyperpod-lab: job $HYPERPOD_LAB_JOB_ID slurm $SLURM_JOB_ID restart $restart nodes $SLURM_JOB_NODELIST head $head_addr"
auto_resume=""
if [ -d /opt/sagemaker_cluster ]; then
    echo "hyperpod-lab: HyperPod cluster: srun --auto-resume=1"
    auto_resume="--auto-resume=1"
fi
/opt/venv/bin/python -m hyperpod_lab.node.supervisor \
    --job-dir="$JOB_DIR" \
    --job-id=quick-start-20261123-010203-abcd \
    --nodes=2 \
    --spares=0 \
    --mode=restart \
    --procs-per-node=8 \
    --python=/opt/venv/bin/python \
    --health-checks \
    --health-arg=--expect-gpus=8 \
    --health-arg=--expect-version=0.1.0 \
    --requeue \
    --srun-opt=--cpus-per-task=8 \
    --srun-opt=--kill-on-bad-exit=0 \
    --srun-opt=--label \
    ${auto_resume:+--srun-opt=$auto_resume} \
    -- \
    bash -c 'JOB_DIR="$HYPERPOD_LAB_JOB_DIR" head_addr=$1 restart=$2 step=${SLURM_STEP_ID:-0}
mkdir -p "$JOB_DIR/runs/$restart.$step"
counter="$JOB_DIR/runs/$restart.$step/node-${SLURM_NODEID:-0}"
attempt=$(cat "$counter" 2>/dev/null || echo 0)
echo $(( attempt + 1 )) > "$counter"
run=$restart.$step.$attempt
rdzv_port=$(( 29500 + (SLURM_JOB_ID + 7919 * (restart * 1009 + step * 31 + attempt)) % 3200 ))
echo "hyperpod-lab: run $run rendezvous $head_addr:$rdzv_port"
exec /opt/venv/bin/python -m hyperpod_lab.node.launch --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint="$head_addr:$rdzv_port" --rdzv-id="$SLURM_JOB_ID.$run" --rdzv-conf=join_timeout=120 --max-restarts=3 --log-dir="$JOB_DIR/logs/torchrun" --redirects=3 --tee=3 /fsx/hyperpod-lab/jobs/quick-start-20261123-010203-abcd/script/train_lm.py --steps 40 '"'"''"'"'"'"'"'"'"'"'; touch /tmp/x; '"'"'"'"'"'"'"'"''"'"' '"'"'$(id)'"'"' '"'"'a
b'"'"'' hyperpod-lab-step {head_addr} "$restart"
rc=$?
echo "hyperpod-lab: step exited with $rc"
exit $rc
