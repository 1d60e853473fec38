#!/bin/bash
# Rendered by hyperpod-lab 0.1.0 for job quick-start-20261123-010203-abcd (nodes joining as replica groups from 2). Resubmit instead of editing.
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=1
#SBATCH --wait-all-nodes=1
#SBATCH --output="/fsx/hyperpod-lab/jobs/quick-start-20261123-010203-abcd/logs/slurm-join-%j.out"
#SBATCH --open-mode=append
#SBATCH --partition=dev
#SBATCH --comment="hyperpod-lab:quick-start-20261123-010203-abcd"
#SBATCH --no-kill
#SBATCH --no-requeue
set -uo pipefail
umask 077  # what the job writes on shared storage is private to the user
JOB_DIR=/fsx/hyperpod-lab/jobs/quick-start-20261123-010203-abcd
export HYPERPOD_LAB_JOB_ID=quick-start-20261123-010203-abcd
export HYPERPOD_LAB_JOB_DIR="$JOB_DIR"
export HYPERPOD_LAB_SPEC="$JOB_DIR/spec.json"
export HYPERPOD_LAB_SHARED_ROOT=/fsx
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
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
export HYPERPOD_LAB_REPLICA_GROUP=slurm
export HYPERPOD_LAB_REPLICA_GROUP_OFFSET=2
srun --nodes=$SLURM_JOB_NUM_NODES --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=0 --label $auto_resume \
    /opt/venv/bin/python -m hyperpod_lab.node.launch --standalone --nnodes=1 --nproc-per-node=1 --max-restarts=3 --monitor-interval=0.1 --log-dir="$JOB_DIR/logs/torchrun" --redirects=3 --tee=3 /fsx/hyperpod-lab/jobs/quick-start-20261123-010203-abcd/script/train_lm.py --steps 40 ''"'"'; touch /tmp/x; '"'"'' '$(id)' 'a
b'
rc=$?
echo "hyperpod-lab: step exited with $rc"
exit $rc
