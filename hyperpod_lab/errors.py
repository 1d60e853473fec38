"""Domain errors of hyperpod-lab.

Every error a user can cause names the problem and the fix in its message. The CLI prints
``str(error)`` and exits 2; the magics print it; the server (issue 6) maps each class to one
HTTP status in one place.
"""

from __future__ import annotations


class HyperPodLabError(Exception):
    """Base class of every error hyperpod-lab raises on purpose."""


class SpecError(HyperPodLabError, ValueError):
    """A JobSpec (or a CLI flag that builds one) is invalid.

    Attributes:
        field: dotted name of the offending field, e.g. ``"elastic.min_nodes"``.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class GoodputInputError(SpecError):
    """An input of the goodput model (``hyperpod_lab.goodput``) is out of range or in the wrong
    unit; the message names the unit expected (e.g. failure rates are fractions per
    instance-hour, ``0.0004``, or explicit percentages, ``"0.04%"``)."""


class ConfigError(HyperPodLabError):
    """The cluster config file is malformed or a profile is incomplete."""


class UnknownCluster(HyperPodLabError, KeyError):
    """No cluster profile has that name; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class ClusterUnreachable(HyperPodLabError):
    """The login node did not answer (connection refused, timeout, DNS)."""


class HostKeyError(HyperPodLabError):
    """The login node's SSH host key is unknown or does not match known_hosts."""


class RemoteCommandError(HyperPodLabError):
    """A command on the cluster exited non-zero.

    Attributes:
        argv: the command as an argv list; exit_status: its exit code; stderr: its error text.
    """

    def __init__(self, argv: list[str], exit_status: int, stderr: str):
        self.argv, self.exit_status, self.stderr = list(argv), exit_status, stderr
        super().__init__(f"`{argv[0]}` failed with exit status {exit_status}: {stderr.strip()[-2000:]}")


class UnknownJob(HyperPodLabError, KeyError):
    """No job record has that id; the message lists recent ones."""

    def __str__(self) -> str:
        return str(self.args[0])


class JobStateError(HyperPodLabError):
    """The operation does not fit the job's state (e.g. inject a fault into a finished job)."""


class NotAllowed(HyperPodLabError):
    """The user may not do this (the server answers 403); the message names the permission."""


class DuplicateJob(JobStateError):
    """A job record with that id exists already; the new one is refused, the old one kept."""


class EnvironmentMismatch(HyperPodLabError):
    """The cluster interpreter's hyperpod-lab cannot run the notebook's job (missing, failing
    to import, another major.minor version or event schema version; see
    ``hyperpod_lab.submit.envparity``), or the interpreter is missing: the submission is refused
    before anything is staged. The message names both versions and the fix."""


class CheckpointStateMismatch(HyperPodLabError):
    """A checkpoint is intact (its commit marker authenticated, every file matching it) but does
    not fit the training state it is restored into: a key missing or added, a shape changed, a
    data loader of another kind. Nothing is renamed, removed or overwritten and no older step is
    tried in its place (that would silently restart the job from an older step, or from step 0,
    and later saves would overwrite the newer steps). The message names the step, its directory,
    DCP's reason and the fixes."""

