"""Find the user's SageMaker HyperPod clusters through the SageMaker API and write profiles.

``discover_clusters`` calls (boto3 ``sagemaker`` client) ``list_clusters``, then per cluster
``describe_cluster`` (status, orchestrator, instance groups, node recovery),
``list_cluster_nodes`` (node health) and ``list_cluster_events`` where the API (and endpoint)
has it. ``write_profiles`` turns the result into cluster profiles
(:func:`hyperpod_lab.submit.clusters.save_profile`); what the API cannot know (an SSH user and key, the
node's host key, an EKS job's container image and FSx claim) is written as a ``FILL-IN``
placeholder that the scheduler refuses to use, naming the field.

A Slurm cluster's profile reaches its controller node the way HyperPod's own tooling does, over
AWS Systems Manager: ``ssm_target = "sagemaker-cluster:<cluster-id>_<group>-<instance-id>"``
(cluster id = the last part of the cluster ARN; the controller instance group and its instance
id from ``list_cluster_nodes``; see :func:`ssm_target_for`).

Throttling is retried by botocore's ``standard`` retry mode (exponential backoff with jitter,
``max_attempts`` calls in all); errors a user can fix become :class:`ConfigError` naming the
fix.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from hyperpod_lab.errors import ClusterUnreachable, ConfigError
from hyperpod_lab.submit.clusters import PLACEHOLDER, ClusterProfile, load_profiles, save_profile

DEFAULT_MAX_ATTEMPTS = 6
_THROTTLING = {"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
               "TooManyRequestsException", "RequestLimitExceeded", "SlowDown"}


@dataclass
class DiscoveredCluster:
    """One HyperPod cluster as the SageMaker API describes it.

    Attributes:
        name, arn, status: ``ClusterName``, ``ClusterArn``, ``ClusterStatus`` (InService, ...).
        region: the AWS region it lives in.
        orchestrator: ``eks`` or ``slurm`` (the API names an ``Orchestrator`` only for EKS
            clusters, so ``slurm`` is the default); eks_cluster_arn: ``Orchestrator.Eks.ClusterArn``.
        node_recovery: ``NodeRecovery`` (Automatic / None), or None when not reported.
        instance_groups: [{name, instance_type, current_count, target_count}].
        nodes: [{instance_id, group, instance_type, status, hostname}] (``list_cluster_nodes``).
        node_health: node count per ``InstanceStatus.Status`` (Running, Failure, Pending, ...).
        events: ``list_cluster_events`` summaries, or None where the API lacks the call;
            events_note says why they are missing.
        ssm_target: (slurm) the SSM target of the controller node (:func:`ssm_target_for`), or
            None when no instance group looks like the controller's.
    """

    name: str
    arn: str
    status: str
    region: str
    orchestrator: str = "slurm"
    eks_cluster_arn: str | None = None
    node_recovery: str | None = None
    instance_groups: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    node_health: dict[str, int] = field(default_factory=dict)
    events: list[dict[str, Any]] | None = None
    events_note: str | None = None
    ssm_target: str | None = None

    @property
    def eks_cluster_name(self) -> str | None:
        return self.eks_cluster_arn.rsplit("/", 1)[-1] if self.eks_cluster_arn else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _session(profile: str | None, region: str | None):
    import boto3
    import botocore.exceptions

    try:
        return boto3.Session(profile_name=profile, region_name=region)
    except botocore.exceptions.ProfileNotFound:
        raise ConfigError(f"AWS profile {profile!r} is not configured; run 'aws configure --profile {profile}' "
                          f"or pick one from ~/.aws/config") from None


def sagemaker_client(region: str | None = None, profile: str | None = None, endpoint_url: str | None = None,
                     max_attempts: int = DEFAULT_MAX_ATTEMPTS):
    """A boto3 ``sagemaker`` client with standard-mode retries (throttling backs off).

    Raises:
        ConfigError: unknown AWS profile, no region, or a malformed region name.
    """
    import botocore.config
    import botocore.exceptions

    session = _session(profile, region)
    region = region or session.region_name
    if not region:
        raise ConfigError("no AWS region; pass --region us-west-2, set AWS_REGION, or run 'aws configure'")
    cfg = botocore.config.Config(retries={"mode": "standard", "total_max_attempts": max_attempts})
    try:
        return session.client("sagemaker", region_name=region, endpoint_url=endpoint_url, config=cfg)
    except botocore.exceptions.InvalidRegionError:
        raise ConfigError(f"{region!r} is not an AWS region name; use e.g. --region us-west-2") from None


def _call(client, op: str, **kwargs) -> dict[str, Any]:
    """One SageMaker call with our errors for missing credentials, throttling and bad regions."""
    import botocore.exceptions

    region = client.meta.region_name
    try:
        return getattr(client, op)(**kwargs)
    except botocore.exceptions.NoCredentialsError:
        raise ConfigError("no AWS credentials found; run 'aws configure' or set AWS_PROFILE "
                          "(or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)") from None
    except botocore.exceptions.ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        msg = e.response.get("Error", {}).get("Message", str(e))
        if code in _THROTTLING:
            attempts = e.response.get("ResponseMetadata", {}).get("RetryAttempts", 0) + 1
            raise ClusterUnreachable(f"the SageMaker API throttled {op} in {region} {attempts} times in a row "
                                     f"(retried with backoff); try again in a minute") from None
        if code in ("UnrecognizedClientException", "InvalidClientTokenId", "InvalidSignatureException",
                    "ExpiredTokenException", "AccessDeniedException"):
            raise ConfigError(f"AWS refused {op} in {region} ({code}: {msg}); check your credentials "
                              f"('aws configure', AWS_PROFILE) and that they allow sagemaker:{op[0].upper()}"
                              f"{re.sub(r'_(.)', lambda m: m.group(1).upper(), op[1:])}") from None
        raise
    except botocore.exceptions.EndpointConnectionError:
        raise ClusterUnreachable(f"cannot reach the SageMaker API in region {region!r}; check --region "
                                 f"(HyperPod regions look like us-west-2) and your network") from None


def _pages(client, op: str, key: str, **kwargs) -> list[dict[str, Any]]:
    out, token = [], None
    while True:
        res = _call(client, op, **kwargs, **({"NextToken": token} if token else {}))
        out += res.get(key) or []
        token = res.get("NextToken")
        if not token:
            return out


def discover_clusters(region: str | None = None, profile: str | None = None, endpoint_url: str | None = None,
                      max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> list[DiscoveredCluster]:
    """The HyperPod clusters of one region, described.

    Args:
        region: AWS region (default: the profile's / ``$AWS_REGION``).
        profile: AWS named profile (default: the standard credential chain).
        endpoint_url: SageMaker API endpoint override (e.g. a moto server in tests).
        max_attempts: calls per request including retries (throttling backs off exponentially).

    Returns:
        One :class:`DiscoveredCluster` per cluster, in ``list_clusters`` order.

    Raises:
        ConfigError: no credentials, unknown profile, no or malformed region, access denied.
        ClusterUnreachable: the endpoint cannot be reached, or throttling outlasted the retries.
    """
    client = sagemaker_client(region, profile, endpoint_url, max_attempts)
    # events are optional: a second client that gives up after 2 attempts, so an endpoint
    # without the call (a 5xx, which standard mode retries) costs one short retry, once
    events_client = sagemaker_client(region, profile, endpoint_url, 2) if hasattr(client, "list_cluster_events") else None
    out = []
    for summary in _pages(client, "list_clusters", "ClusterSummaries"):
        name = summary["ClusterName"]
        d = _call(client, "describe_cluster", ClusterName=name)
        eks_arn = ((d.get("Orchestrator") or {}).get("Eks") or {}).get("ClusterArn")
        groups = [{"name": g.get("InstanceGroupName"), "instance_type": g.get("InstanceType"),
                   "current_count": g.get("CurrentCount"), "target_count": g.get("TargetCount")}
                  for g in d.get("InstanceGroups") or []]
        nodes = [{"instance_id": n.get("InstanceId"), "group": n.get("InstanceGroupName"),
                  "instance_type": n.get("InstanceType"),
                  "status": (n.get("InstanceStatus") or {}).get("Status"),
                  "hostname": n.get("PrivateDnsHostname")}
                 for n in _pages(client, "list_cluster_nodes", "ClusterNodeSummaries", ClusterName=name)]
        health: dict[str, int] = {}
        for n in nodes:
            health[n["status"] or "Unknown"] = health.get(n["status"] or "Unknown", 0) + 1
        c = DiscoveredCluster(name=name, arn=d.get("ClusterArn") or summary.get("ClusterArn"),
                              status=d.get("ClusterStatus") or summary.get("ClusterStatus"),
                              region=client.meta.region_name, orchestrator="eks" if eks_arn else "slurm",
                              eks_cluster_arn=eks_arn, node_recovery=d.get("NodeRecovery"),
                              instance_groups=groups, nodes=nodes, node_health=health)
        c.ssm_target = ssm_target_for(c) if c.orchestrator == "slurm" else None
        c.events, c.events_note = _events(events_client, name)
        if c.events is None and events_client is not None and "unavailable" in (c.events_note or ""):
            events_client = None  # this endpoint lacks the call: do not ask again for every cluster
        out.append(c)
    return out


def _events(client, name: str) -> tuple[list[dict[str, Any]] | None, str | None]:
    """``list_cluster_events`` where the client and endpoint have it; else (None, why)."""
    import botocore.exceptions

    if client is None:
        return None, "list_cluster_events is not available (older boto3, or this endpoint lacks it)"
    try:
        res = client.list_cluster_events(ClusterName=name, MaxResults=20)
    except (botocore.exceptions.ClientError, botocore.exceptions.EndpointConnectionError) as e:
        err = getattr(e, "response", {}).get("Error", {})
        first = ((err.get("Message") or str(e)).strip().splitlines() or [""])[0][:120]
        return None, f"list_cluster_events unavailable here ({err.get('Code') or type(e).__name__}: {first})"
    return [{k: (str(v) if not isinstance(v, (str, int, float, bool, type(None))) else v) for k, v in ev.items()}
            for ev in res.get("Events") or res.get("ClusterEventSummaries") or []], None


CONTROLLER_GROUP_WORDS = ("controller", "head")


def ssm_target_for(cluster: DiscoveredCluster, controller_group: str | None = None) -> str | None:
    """The SSM target of a Slurm cluster's controller node:
    ``sagemaker-cluster:<cluster-id>_<group>-<instance-id>``.

    Args:
        cluster: from :func:`discover_clusters` (its ``arn``, ``instance_groups`` and ``nodes``).
        controller_group: the controller's instance group; default the first group whose name
            contains ``controller`` (HyperPod's examples call it ``controller-machine``), else
            ``head``.

    Returns:
        The target (a Running node preferred, else the group's first), or None when no group
        matches or the group has no node.
    """
    cluster_id = (cluster.arn or "").rsplit("/", 1)[-1]
    names = [g["name"] for g in cluster.instance_groups if g.get("name")]
    names += [n["group"] for n in cluster.nodes if n.get("group") and n["group"] not in names]
    group = controller_group
    for word in CONTROLLER_GROUP_WORDS:
        group = group or next((g for g in names if word in g.lower()), None)
    if not cluster_id or not group:
        return None
    nodes = [n for n in cluster.nodes if n.get("group") == group and n.get("instance_id")]
    nodes.sort(key=lambda n: n.get("status") != "Running")  # stable: API order among equals
    if not nodes:
        return None
    return f"sagemaker-cluster:{cluster_id}_{group}-{nodes[0]['instance_id']}"


def profile_for(cluster: DiscoveredCluster, name: str | None = None) -> ClusterProfile:
    """A cluster profile for a discovered cluster; unknown fields hold ``FILL-IN`` placeholders.

    Slurm: the controller node over SSM (``ssm_target`` and ``region``; ``user``, ``key_file``
    and ``known_hosts`` to fill in), or, when no controller group was found, a login node that
    is not in the API (``host`` to fill in too); ``shared_root`` defaults to ``/fsx``. EKS: the
    EKS cluster name and region (token made with boto3); ``image`` and ``pvc`` to fill in.
    """
    name = name or re.sub(r"[^A-Za-z0-9_.-]+", "-", cluster.name)
    if cluster.orchestrator == "eks":
        return ClusterProfile(name=name, orchestrator="eks", eks_cluster=cluster.eks_cluster_name,
                              region=cluster.region, cluster_arn=cluster.arn, operator="hyperpod",
                              image=f"{PLACEHOLDER}: container image with torch, hyperpod-lab and hyperpodrun",
                              pvc=f"{PLACEHOLDER}: the FSx for Lustre persistent volume claim",
                              shared_mount="/fsx")
    if cluster.ssm_target:
        return ClusterProfile(name=name, orchestrator="slurm", region=cluster.region, cluster_arn=cluster.arn,
                              ssm_target=cluster.ssm_target,
                              user=f"{PLACEHOLDER}: your user on the node (ubuntu on HyperPod's default image)",
                              key_file=f"{PLACEHOLDER}: path of your SSH private key (its public key in the "
                                       f"node's ~/.ssh/authorized_keys)",
                              known_hosts=f"{PLACEHOLDER}: known_hosts file with the node's host key under the "
                                          f"name {cluster.ssm_target}",
                              shared_root="/fsx")
    return ClusterProfile(name=name, orchestrator="slurm", region=cluster.region, cluster_arn=cluster.arn,
                          host=f"{PLACEHOLDER}: the login node's host name or IP",
                          user=f"{PLACEHOLDER}: your user on the login node",
                          key_file=f"{PLACEHOLDER}: path of your SSH private key",
                          known_hosts=f"{PLACEHOLDER}: known_hosts file with the login node's host key",
                          shared_root="/fsx")


def write_profiles(clusters: list[DiscoveredCluster], overwrite: bool = False) -> list[tuple[str, str]]:
    """Write a profile per cluster to the cluster config file.

    Args:
        clusters: from :func:`discover_clusters`.
        overwrite: replace profiles of the same name (default: keep them; you may have filled them in).

    Returns:
        [(profile name, "written" | "kept")].
    """
    existing = load_profiles()
    out = []
    for c in clusters:
        prof = profile_for(c)
        if prof.name in existing and not overwrite:
            out.append((prof.name, "kept"))
            continue
        save_profile(prof)
        out.append((prof.name, "written"))
    return out
