"""EKS authentication: a ``kubernetes`` client configuration for an ``eks`` cluster profile.

Either a kubeconfig context (``kube_context`` / ``kubeconfig`` in the profile, optionally with
``api_server`` overriding the context's server), or, for ``eks_cluster`` + ``region``, the
endpoint and CA from ``eks.describe_cluster`` and an EKS bearer token made with boto3 exactly as
``aws eks get-token`` makes it (:func:`eks_token`), refreshed every :data:`TOKEN_REFRESH_S`
seconds. Nothing here contacts a cluster until :func:`kube_configuration` is called.
"""

from __future__ import annotations

import atexit
import base64
import os
import tempfile
import time
from typing import Any

from hyperpod_lab.errors import ClusterUnreachable, ConfigError
from hyperpod_lab.submit.clusters import ClusterProfile

__all__ = ["TOKEN_PREFIX", "TOKEN_LIFETIME_S", "TOKEN_REFRESH_S", "eks_token", "kube_configuration"]

TOKEN_PREFIX = "k8s-aws-v1."
TOKEN_LIFETIME_S = 60  # presigned URL expiry; EKS accepts a token for up to 15 minutes
TOKEN_REFRESH_S = 600


def eks_token(cluster_name: str, region: str, session: Any = None) -> str:
    """A bearer token for an EKS cluster's API server, as ``aws eks get-token`` makes it.

    The token is ``k8s-aws-v1.`` + base64url (no padding) of a presigned STS
    ``GetCallerIdentity`` URL whose signed headers include ``x-k8s-aws-id: <cluster_name>``;
    EKS calls that URL to learn the caller's IAM identity. Valid for 15 minutes.

    Args:
        cluster_name: EKS cluster name.
        region: its AWS region.
        session: a ``boto3.Session`` (default: a new one, using the standard credential chain).

    Raises:
        ConfigError: no AWS credentials (names ``aws configure`` / ``AWS_PROFILE``).
    """
    import boto3
    import botocore.exceptions

    session = session or boto3.Session()
    sts = session.client("sts", region_name=region)

    def add_cluster_header(request, **_):
        request.headers["x-k8s-aws-id"] = cluster_name

    sts.meta.events.register("before-sign.sts.GetCallerIdentity", add_cluster_header)
    try:
        url = sts.generate_presigned_url("get_caller_identity", Params={}, ExpiresIn=TOKEN_LIFETIME_S,
                                         HttpMethod="GET")
    except botocore.exceptions.NoCredentialsError:
        raise ConfigError("no AWS credentials to make an EKS token; run 'aws configure' or set AWS_PROFILE "
                          "(or use a kubeconfig context: kube_context in the cluster profile)") from None
    return TOKEN_PREFIX + base64.urlsafe_b64encode(url.encode()).decode().rstrip("=")


def kube_configuration(profile: ClusterProfile):
    """A ``kubernetes.client.Configuration`` for the profile (kubeconfig context, or EKS token).

    Raises:
        ConfigError: the kubeconfig/context cannot be loaded, or no AWS credentials.
        ClusterUnreachable: ``eks.describe_cluster`` failed (wrong name or region, no network).
    """
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    cfg = kclient.Configuration()
    if profile.kube_context or profile.kubeconfig:
        try:
            kconfig.load_kube_config(config_file=os.path.expanduser(profile.kubeconfig) if profile.kubeconfig else None,
                                     context=profile.kube_context, client_configuration=cfg)
        except (kconfig.ConfigException, OSError, TypeError) as e:
            raise ConfigError(f"cluster profile '{profile.name}': cannot load kubeconfig "
                              f"{profile.kubeconfig or '$KUBECONFIG / ~/.kube/config'} context "
                              f"{profile.kube_context or '(current)'}: {e}. Fix 'kube_context'/'kubeconfig', or "
                              f"run 'aws eks update-kubeconfig --name CLUSTER --region REGION'") from None
        if profile.api_server:
            cfg.host = profile.api_server
            inner = cfg.refresh_api_key_hook  # the kubeconfig loader's hook resets host on each request

            def keep_host(conf):
                if inner:
                    inner(conf)
                conf.host = profile.api_server

            cfg.refresh_api_key_hook = keep_host
        return cfg
    import boto3
    import botocore.exceptions

    session = boto3.Session(profile_name=profile.aws_profile) if profile.aws_profile else boto3.Session()
    endpoint, ca_file = profile.api_server, None
    try:
        desc = session.client("eks", region_name=profile.region).describe_cluster(name=profile.eks_cluster)["cluster"]
    except botocore.exceptions.NoCredentialsError:
        raise ConfigError("no AWS credentials to reach EKS; run 'aws configure' or set AWS_PROFILE") from None
    except botocore.exceptions.ClientError as e:
        raise ClusterUnreachable(f"eks.describe_cluster({profile.eks_cluster!r}) in {profile.region} failed: "
                                 f"{e.response.get('Error', {}).get('Message', e)}; check 'eks_cluster' and 'region' "
                                 f"of cluster profile '{profile.name}'") from None
    except botocore.exceptions.EndpointConnectionError as e:
        raise ClusterUnreachable(f"cannot reach the EKS API in {profile.region}: {e}") from None
    endpoint = endpoint or desc.get("endpoint")
    ca = (desc.get("certificateAuthority") or {}).get("data")
    if ca:
        fd, ca_file = tempfile.mkstemp(prefix="hyperpod-lab-eks-ca-", suffix=".crt")
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(ca))
        atexit.register(_unlink_quietly, ca_file)
    if not endpoint:
        raise ClusterUnreachable(f"EKS cluster {profile.eks_cluster!r} has no API endpoint yet (is it ACTIVE?)")
    cfg.host = endpoint
    if ca_file:
        cfg.ssl_ca_cert = ca_file
    made = [0.0]

    def refresh(conf):
        if time.time() - made[0] > TOKEN_REFRESH_S:
            conf.api_key["authorization"] = eks_token(profile.eks_cluster, profile.region, session)
            made[0] = time.time()

    cfg.api_key_prefix["authorization"] = "Bearer"
    cfg.refresh_api_key_hook = refresh
    refresh(cfg)
    return cfg


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
