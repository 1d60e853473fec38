"""Scheduler backends behind one interface (:class:`base.Scheduler`)."""

from __future__ import annotations

from hyperpod_lab.clusters import ClusterProfile
from hyperpod_lab.errors import ConfigError
from hyperpod_lab.schedulers.base import Scheduler


def for_profile(profile: ClusterProfile) -> Scheduler:
    """The backend for a cluster profile. Raises ConfigError for an orchestrator not built yet,
    ClusterUnreachable / HostKeyError if its login node cannot be reached safely."""
    from hyperpod_lab.schedulers.remote import connect

    if profile.orchestrator == "slurm":
        from hyperpod_lab.schedulers.slurm import SlurmScheduler

        return SlurmScheduler(profile, connect(profile))
    if profile.orchestrator == "local":
        from hyperpod_lab.schedulers.local import LocalScheduler

        return LocalScheduler(profile, connect(profile))
    raise ConfigError(f"cluster '{profile.name}': the {profile.orchestrator} backend is not available yet; "
                      f"use a slurm or local cluster")
