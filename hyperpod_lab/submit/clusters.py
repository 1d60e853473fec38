"""Cluster profiles: where jobs go.

Profiles live in one TOML file, ``$HYPERPOD_LAB_CONFIG`` or else
``$XDG_CONFIG_HOME/hyperpod-lab/clusters.toml`` (``~/.config/hyperpod-lab/clusters.toml``)::

    [clusters.local-slurm]
    orchestrator = "slurm"            # slurm | eks | local
    host = "127.0.0.1"                # login node
    port = 2222
    user = "root"
    key_file = "/path/to/private_key"
    known_hosts = "/path/to/known_hosts"   # host keys are verified, never auto-added
    shared_root = "/tmp/hyperpod-lab-dev/fsx"  # FSx-style storage, same path on every node
    python = "/opt/venv/bin/python"   # interpreter on the nodes with hyperpod-lab installed

    [clusters.local-slurm.defaults]
    partition = "dev"
    nodes = 2
    procs_per_node = 1

An EKS-orchestrated HyperPod cluster (see ``docs/eks.md``)::

    [clusters.hp-eks]
    orchestrator = "eks"
    eks_cluster = "my-eks"            # EKS cluster name (token made with boto3), or:
    kube_context = "arn:aws:eks:..."  # a context of ~/.kube/config (or of `kubeconfig`)
    region = "us-west-2"
    namespace = "default"
    operator = "hyperpod"             # hyperpod (HyperPodPyTorchJob) | kubeflow (PyTorchJob)
    image = "123456789012.dkr.ecr.us-west-2.amazonaws.com/train:latest"
    pvc = "fsx-claim"                 # FSx for Lustre persistent volume claim
    shared_mount = "/fsx"             # where the pods mount it

A Slurm login node reached the way ``ssh`` reaches it (see ``hyperpod_lab/schedulers/remote/route.py``
for the precedence of profile fields over the OpenSSH config)::

    [clusters.campus]
    orchestrator = "slurm"
    host = "login"                    # a Host entry of ~/.ssh/config (or of `ssh_config`):
    ssh_config = "~/.ssh/config"      #   HostName, Port, User, IdentityFile, ProxyJump, ProxyCommand,
    shared_root = "/shared"           #   ServerAlive*, ConnectTimeout, UserKnownHostsFile apply

A HyperPod Slurm cluster through AWS Systems Manager (written by ``clusters discover``)::

    [clusters.hp-slurm]
    orchestrator = "slurm"
    ssm_target = "sagemaker-cluster:abc123def456_controller-machine-i-0123456789abcdef0"
    region = "us-west-2"              # passed to `aws ssm start-session` (with aws_profile if set)
    user = "ubuntu"
    key_file = "~/.ssh/id_ed25519"    # its public key in the node's authorized_keys
    known_hosts = "~/.ssh/known_hosts"  # holding the node's key under the ssm_target (or `host`)
    shared_root = "/fsx"
    container_image = "/fsx/images/train.sqsh"  # optional: training steps run in it (pyxis; docs/containers.md)

Shared storage mounted on this machine too (SageMaker Studio with the cluster's FSx attached)::

    [clusters.hp-studio]
    orchestrator = "slurm"
    host = "login"
    shared_root = "/fsx"              # the cluster's path
    local_mount = "/mnt/fsx"          # the same directory here; or "auto": found by a probe file

A Studio space that mounts only a sub-directory of the FSx (``FileSystemPath``) at its own path::

    [clusters.hp-studio-team]
    orchestrator = "slurm"
    host = "login"
    shared_root = "/fsx/team-a/alice" # the cluster's path; jobs in <shared_root>/hyperpod-lab/<user>/jobs
    local_mount = "/mnt/studio-fsx"   # where the space shows it (look with `df` / `mount` in a terminal)
    local_mount_cluster_path = "/fsx/team-a"  # the cluster directory local_mount shows; or "auto"
    alerts_webhook_url_env = "TEAM_A_WEBHOOK"  # this cluster's jobs alert there (docs/alerts.md)

A built-in profile named ``local`` (the local backend: torchrun on this machine) always exists.
A value starting with :data:`PLACEHOLDER` (written by ``clusters discover`` for what the
SageMaker API cannot know, such as a Slurm login node) must be filled in before submitting.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from hyperpod_lab.atomicfile import write_atomic
from hyperpod_lab.errors import ConfigError, SpecError, UnknownCluster
from hyperpod_lab.jobdir import ENV_CONFIG, ENV_DATA_DIR
from hyperpod_lab.spec import validate_container_image

ORCHESTRATORS = ("slurm", "eks", "local")
OPERATORS = ("hyperpod", "kubeflow")
LOCAL = "local"
PLACEHOLDER = "FILL-IN"
# an SSM target goes into `aws ssm start-session --target` as one argv word: letters, digits and
# the separators SageMaker uses, never starting with '-' (which aws would read as an option)
_SSM_TARGET = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,255}")
_SHELL_META = re.compile(r"[\s'\"`$;&|<>*?(){}!\\#~]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_AWS_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+=@,-]{0,127}")


def config_path() -> str:
    """Path of the cluster config file (it may not exist yet)."""
    env = os.environ.get(ENV_CONFIG)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return os.path.join(base, "hyperpod-lab", "clusters.toml")


def data_dir() -> str:
    """Directory of this user's hyperpod-lab state (job records, local jobs)."""
    env = os.environ.get(ENV_DATA_DIR)
    if env:
        return os.path.abspath(os.path.expanduser(env))
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return os.path.join(base, "hyperpod-lab")


@dataclass
class ClusterDefaults:
    """Per-cluster defaults applied when a JobSpec leaves the field unset."""

    partition: str | None = None
    nodes: int = 1
    procs_per_node: int = 1


@dataclass
class ClusterProfile:
    """One cluster. See the module docstring for the file format.

    Attributes:
        name: profile name, e.g. ``local-slurm``.
        orchestrator: ``slurm`` (over SSH), ``eks`` or ``local``.
        host, port, user: SSH login node (slurm); ``host`` may name a ``Host`` entry of the
            OpenSSH config. ``port`` 22 (the default) lets the config's ``Port`` apply.
        key_file: private key for the login (slurm; else the config's ``IdentityFile``).
        known_hosts: known_hosts file holding the login node's host key (slurm; used together
            with the config's ``UserKnownHostsFile``, for every hop).
        ssh_config: (slurm) the OpenSSH config file to read (default ``~/.ssh/config`` if it
            exists).
        ssm_target: (slurm) an AWS Systems Manager target, e.g.
            ``sagemaker-cluster:<cluster-id>_<group>-<instance-id>``: SSH then runs over ``aws ssm
            start-session --document-name AWS-StartSSHSession`` (``region``, ``aws_profile``
            passed on); ``host`` becomes optional (the host key's name; default the target).
        shared_root: shared-storage directory, the same path on nodes and login node.
        python: Python interpreter on the nodes that has hyperpod-lab and torch.
        connect_timeout_s: SSH connect timeout, seconds.
        op_timeout_s: (slurm) seconds any one remote operation may go without an answer (an SFTP
            read, write, list, stat, mkdir, rename; an SSH channel or command request) before it
            fails with ClusterUnreachable and the connection is dropped (default 30). A command's
            own output timeout is the caller's ``timeout_s`` (see ``schedulers/remote/__init__.py``).
        local_mount: (slurm) where *this* machine mounts the cluster's shared storage (the local
            path of ``shared_root``; e.g. a SageMaker Studio space with the cluster's FSx
            attached), or ``"auto"`` (found by a probe file written over SFTP and looked for
            here). Staging, event and log reading then use the local file system and SSH
            carries only scheduler commands; the server learns of new events from file-system
            notifications (``schedulers/remote/__init__.py``'s ``MountedRemote``). The files are written
            as this machine's user, who must be the cluster user (same uid) there. Unset: SFTP.
        local_mount_cluster_path: (slurm, with a ``local_mount`` path) the cluster directory that
            ``local_mount`` shows (absolute POSIX path; default ``shared_root``): a SageMaker
            Studio space mounts a domain's FSx at its own path and may expose only a
            sub-directory (``FSxLustreFileSystemConfig.FileSystemPath``). It may be above
            ``shared_root`` or below it, as long as the user's job tree
            ``<shared_root>/hyperpod-lab/<user>/jobs`` is inside it (else connecting raises
            ConfigError). ``"auto"``: found by the probe file (``schedulers/remote/mounted.py``).
        alerts_webhook_url_env: the name of an environment variable of the Jupyter server
            holding the webhook URL that this cluster's jobs' alerts go to, instead of
            ``alerts.toml``'s (``server/alerts.py``, ``docs/alerts.md``). Only the name is kept here;
            the URL is never logged nor shown in an error.
        defaults: partition / nodes / procs_per_node defaults.
        kube_context, kubeconfig: (eks) a kubeconfig context, and the kubeconfig file
            (default ``$KUBECONFIG`` or ``~/.kube/config``).
        eks_cluster, region, aws_profile: (eks) without ``kube_context``, the EKS cluster
            whose endpoint/CA come from ``eks.describe_cluster`` and whose bearer token is made
            with boto3 (what ``aws eks get-token`` does).
        api_server: (eks) API server URL overriding the one ``describe_cluster`` returns.
        cluster_arn: (eks, slurm) the HyperPod cluster's ARN (written by discovery).
        namespace: (eks) Kubernetes namespace of the jobs (default ``default``).
        operator: (eks) ``hyperpod`` (HyperPodPyTorchJob, default) or ``kubeflow`` (PyTorchJob).
        image: (eks) container image with torch and hyperpod-lab (and, for ``hyperpod``,
            ``hyperpodrun`` from the hyperpod-elastic-agent package).
        pvc: (eks) persistent volume claim of the FSx for Lustre file system.
        shared_mount: (eks) its mount path inside the pods (default ``/fsx``).
        gpus_per_node: GPUs of a node: (eks) each pod requests them (``nvidia.com/gpu``); (slurm)
            the job asks ``--gpus-per-node`` = processes per node and ``--exclusive`` by default.
            Unset requests none.
        efa: the nodes have EFA network devices: (slurm) the batch script sets the ``FI_*``/NCCL
            variables of AWS's reference scripts; (eks) pods request ``vpc.amazonaws.com/efa``.
        efa_per_node: (eks) EFA devices each pod requests (default 1; p5.48xlarge has 32).
        shm_size: (eks) size limit of the pods' memory-backed ``/dev/shm`` (a Kubernetes
            quantity such as ``"64Gi"``): room for the memory checkpoint tier and NCCL.
        container_image: (slurm) run every job's training step in this container through
            pyxis/enroot (``srun --container-image``; ``docs/containers.md``): a registry image or
            the absolute path of an enroot ``.sqsh`` on shared storage. A JobSpec's own
            ``container_image`` overrides it. The image's ``python`` must have hyperpod-lab and
            torch; ``python`` above stays the login and batch nodes' interpreter.
    """

    name: str
    orchestrator: str
    host: str | None = None
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None
    ssm_target: str | None = None
    shared_root: str | None = None
    python: str = "python3"
    connect_timeout_s: float = 10.0
    op_timeout_s: float = 30.0
    local_mount: str | None = None
    local_mount_cluster_path: str | None = None
    alerts_webhook_url_env: str | None = None
    defaults: ClusterDefaults = field(default_factory=ClusterDefaults)
    kube_context: str | None = None
    kubeconfig: str | None = None
    eks_cluster: str | None = None
    region: str | None = None
    aws_profile: str | None = None
    api_server: str | None = None
    cluster_arn: str | None = None
    namespace: str | None = None
    operator: str | None = None
    image: str | None = None
    pvc: str | None = None
    shared_mount: str | None = None
    gpus_per_node: int | None = None
    efa: bool = False
    efa_per_node: int = 1
    shm_size: str | None = None
    container_image: str | None = None

    def unfilled(self) -> list[str]:
        """Names of the fields still holding a :data:`PLACEHOLDER` (to be filled in by hand)."""
        return [f.name for f in fields(self) if isinstance(getattr(self, f.name), str)
                and getattr(self, f.name).startswith(PLACEHOLDER)]

    def validate(self) -> "ClusterProfile":
        where = f"cluster profile '{self.name}' in {config_path()}"
        if self.orchestrator not in ORCHESTRATORS:
            raise ConfigError(f"{where}: orchestrator must be one of {', '.join(ORCHESTRATORS)}, got {self.orchestrator!r}")
        if self.orchestrator == "slurm":
            # user, key_file and known_hosts may come from the OpenSSH config instead; a login
            # that still lacks them fails at connect time naming the setting (ssh_route.py)
            if not self.host and not self.ssm_target:
                raise ConfigError(f"{where}: 'host' is required for a slurm cluster (a login node's name or "
                                  f"address, or a Host of your OpenSSH config), unless 'ssm_target' is set")
            if not self.shared_root:
                raise ConfigError(f"{where}: 'shared_root' is required for a slurm cluster")
            if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 < self.port < 65536:
                raise ConfigError(f"{where}: port must be 1-65535, got {self.port!r}")
            for key in ("host", "user", "key_file", "known_hosts", "ssh_config"):
                v = getattr(self, key)
                if v is not None and (not isinstance(v, str) or not v.strip() or v.startswith("-")):
                    raise ConfigError(f"{where}: '{key}' must be a non-empty string not starting with '-', got {v!r}")
            for key in ("host", "user"):  # both reach a config ProxyCommand's shell as %h / %r, as in OpenSSH
                v = getattr(self, key)
                if isinstance(v, str) and not v.startswith(PLACEHOLDER) and _SHELL_META.search(v):
                    raise ConfigError(f"{where}: '{key}' {v!r} contains characters a host or user name never has "
                                      f"(spaces, quotes or shell characters such as ; | $ `)")
            if self.ssm_target is not None and not self.ssm_target.startswith(PLACEHOLDER) \
                    and not _SSM_TARGET.fullmatch(str(self.ssm_target)):
                raise ConfigError(f"{where}: ssm_target must look like sagemaker-cluster:<cluster-id>_<group>-"
                                  f"<instance-id> (or an instance id such as i-0123456789abcdef0), got "
                                  f"{self.ssm_target!r}")
            if isinstance(self.op_timeout_s, bool) or not isinstance(self.op_timeout_s, (int, float)) \
                    or not 0 < self.op_timeout_s <= 3600:
                raise ConfigError(f"{where}: op_timeout_s must be a number of seconds, 0 < op_timeout_s <= 3600, "
                                  f"got {self.op_timeout_s!r}")
            lm = self.local_mount
            if lm is not None and lm != "auto" and not (isinstance(lm, str) and lm.strip()
                                                        and os.path.isabs(os.path.expanduser(lm))):
                raise ConfigError(f"{where}: local_mount must be the absolute local path of shared_root on this "
                                  f"machine (e.g. \"/mnt/fsx\") or \"auto\", got {lm!r}")
            lcp = self.local_mount_cluster_path
            if lcp is not None:
                if not lm or lm == "auto":
                    raise ConfigError(f"{where}: local_mount_cluster_path says which cluster directory local_mount "
                                      f"shows, so it needs local_mount set to a local path"
                                      + (" (local_mount = \"auto\" finds both; remove local_mount_cluster_path)"
                                         if lm == "auto" else ""))
                if lcp != "auto" and not (isinstance(lcp, str) and lcp.startswith("/") and "\0" not in lcp):
                    raise ConfigError(f"{where}: local_mount_cluster_path must be the absolute cluster path that "
                                      f"local_mount shows (e.g. \"/fsx/team-a\") or \"auto\", got {lcp!r}")
            for key in ("region", "aws_profile"):
                v = getattr(self, key)
                if v is not None and (not isinstance(v, str) or not _AWS_NAME.fullmatch(v)):
                    raise ConfigError(f"{where}: '{key}' must be a plain name such as us-west-2, got {v!r}")
        env = self.alerts_webhook_url_env
        if env is not None and not (isinstance(env, str) and _ENV_NAME.fullmatch(env)):
            raise ConfigError(f"{where}: alerts_webhook_url_env must name an environment variable of the Jupyter "
                              f"server (letters, digits, _), e.g. \"TEAM_A_WEBHOOK\"; the URL itself never goes in "
                              f"this file")
        if self.orchestrator == "eks":
            if not (self.kube_context or self.kubeconfig or self.eks_cluster):
                raise ConfigError(f"{where}: an eks cluster needs 'kube_context' (a context of your kubeconfig) "
                                  f"or 'eks_cluster' and 'region' (token made with boto3)")
            if self.eks_cluster and not self.kube_context and not self.kubeconfig and not self.region:
                raise ConfigError(f"{where}: 'region' is required with 'eks_cluster', e.g. region = \"us-west-2\"")
            if self.operator is not None and self.operator not in OPERATORS:
                raise ConfigError(f"{where}: operator must be one of {', '.join(OPERATORS)}, got {self.operator!r}")
            if self.gpus_per_node is not None and (isinstance(self.gpus_per_node, bool)
                                                   or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0):
                raise ConfigError(f"{where}: gpus_per_node must be a whole number >= 0, got {self.gpus_per_node!r}")
            if self.shared_mount is not None and not str(self.shared_mount).startswith("/"):
                raise ConfigError(f"{where}: shared_mount must be an absolute path such as /fsx, got {self.shared_mount!r}")
        if self.gpus_per_node is not None and (isinstance(self.gpus_per_node, bool)
                                               or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0):
            raise ConfigError(f"{where}: gpus_per_node must be a whole number >= 0, got {self.gpus_per_node!r}")
        if not isinstance(self.efa, bool):
            raise ConfigError(f"{where}: efa must be true or false, got {self.efa!r}")
        if isinstance(self.efa_per_node, bool) or not isinstance(self.efa_per_node, int) or self.efa_per_node < 1:
            raise ConfigError(f"{where}: efa_per_node must be a whole number >= 1, got {self.efa_per_node!r}")
        if self.container_image is not None:
            if self.orchestrator != "slurm":
                raise ConfigError(f"{where}: container_image is for slurm clusters (pyxis/enroot); an eks cluster "
                                  f"names its image with 'image'")
            try:
                validate_container_image("container_image", self.container_image)
            except SpecError as e:
                raise ConfigError(f"{where}: {e}") from None
        q = str(self.shm_size)
        num = q[:-2] if q[-2:] in ("Ki", "Mi", "Gi", "Ti") else q
        if self.shm_size is not None and not (num.isdigit() and not num.startswith("0")):
            raise ConfigError(f"{where}: shm_size must be a Kubernetes quantity such as \"64Gi\", got {self.shm_size!r}")
        return self

    def to_toml_table(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k != "name" and v is not None}
        d["defaults"] = {k: v for k, v in d["defaults"].items() if v is not None}
        return d

    @classmethod
    def from_toml_table(cls, name: str, table: dict[str, Any]) -> "ClusterProfile":
        if not isinstance(table, dict):
            raise ConfigError(f"[clusters.{name}] in {config_path()} must be a table")
        known = {f.name for f in fields(cls)} - {"name"}
        unknown = set(table) - known
        if unknown:
            raise ConfigError(f"[clusters.{name}] in {config_path()}: unknown keys {sorted(unknown)}; known keys are {sorted(known)}")
        table = dict(table)
        dft = table.pop("defaults", {}) or {}
        dknown = {f.name for f in fields(ClusterDefaults)}
        if not isinstance(dft, dict) or set(dft) - dknown:
            raise ConfigError(f"[clusters.{name}.defaults] in {config_path()}: known keys are {sorted(dknown)}")
        if "orchestrator" not in table:
            raise ConfigError(f"[clusters.{name}] in {config_path()}: 'orchestrator' is required (slurm | eks | local)")
        return cls(name=name, defaults=ClusterDefaults(**dft), **table).validate()


def builtin_local() -> ClusterProfile:
    """The always-present ``local`` profile: torchrun on this machine."""
    return ClusterProfile(name=LOCAL, orchestrator="local", python=sys.executable,
                          shared_root=os.path.join(data_dir(), "local"))


def _read_file(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML ({e}); fix the file or move it away") from None
    clusters = doc.get("clusters", {})
    if not isinstance(clusters, dict):
        raise ConfigError(f"{path}: 'clusters' must be a table of [clusters.NAME] tables")
    return doc


def load_profiles() -> dict[str, ClusterProfile]:
    """All profiles: ``local`` plus those in the config file. Raises ConfigError."""
    profiles = {LOCAL: builtin_local()}
    for name, table in _read_file(config_path()).get("clusters", {}).items():
        profiles[name] = ClusterProfile.from_toml_table(name, table)
    return profiles


def get_profile(name: str) -> ClusterProfile:
    """The profile called ``name``. Raises UnknownCluster listing the known names."""
    profiles = load_profiles()
    if name not in profiles:
        raise UnknownCluster(
            f"unknown cluster '{name}'; known clusters: {', '.join(sorted(profiles))}. "
            f"Add it to {config_path()} or run 'hyperpod-lab dev-cluster up' for 'local-slurm'.")
    return profiles[name]


def save_profile(profile: ClusterProfile) -> str:
    """Add or replace ``profile`` in the config file (atomically); keep the other entries.

    Returns the config file path. Raises ConfigError if the file exists but is malformed.
    """
    import tomli_w

    if profile.name == LOCAL:
        raise ConfigError("'local' is built in and cannot be overwritten; choose another name")
    profile.validate()
    path = config_path()
    doc = _read_file(path)
    doc.setdefault("clusters", {})[profile.name] = profile.to_toml_table()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, tomli_w.dumps(doc))
    return path
