"""Scheduler backends behind one interface (:class:`base.Scheduler`)."""

from __future__ import annotations

from hyperpod_lab.errors import ConfigError
from hyperpod_lab.schedulers.base import Scheduler
from hyperpod_lab.submit.clusters import ClusterProfile


def for_profile(profile: ClusterProfile) -> Scheduler:
    """The backend for a cluster profile. Raises ConfigError for a field still holding a
    ``FILL-IN`` placeholder or an unknown orchestrator, ClusterUnreachable / HostKeyError if a
    Slurm login node cannot be reached safely (an EKS backend contacts nothing here)."""
    from hyperpod_lab.schedulers.remote import connect

    unfilled = profile.unfilled()
    if unfilled:
        raise ConfigError(f"cluster '{profile.name}': fill in {', '.join(unfilled)} in the cluster config "
                          f"(values starting with 'FILL-IN' were left by 'hyperpod-lab clusters discover', "
                          f"which cannot know them)")
    if profile.orchestrator == "eks":
        from hyperpod_lab.schedulers.eks.scheduler import EksScheduler

        return EksScheduler(profile)  # contacts nothing until the first API call
    if profile.orchestrator == "slurm":
        from hyperpod_lab.schedulers.slurm import SlurmScheduler

        return SlurmScheduler(profile, connect(profile))
    if profile.orchestrator == "local":
        from hyperpod_lab.schedulers.local import LocalScheduler

        return LocalScheduler(profile, connect(profile))
    raise ConfigError(f"cluster '{profile.name}': unknown orchestrator {profile.orchestrator!r}; "
                      f"use slurm, eks or local")
