"""A checkpointless spec whose elastic minimum is not a majority of its replica groups is submitted
with a warning that says why and what to write (hyperpod_lab/spec.py ``split_quorum_risk``).

Why: torchft heals only the replica groups behind the highest step. With ``min_replicas`` at most
half the groups, survivors that notice a loss at different times can form two disjoint partial
quorums that each commit the same step from different gradients; no group is behind at the next
full quorum, so the replicas train on with different parameters. Seen once on the dev cluster's
16-node job with ``--elastic 1:17`` (fresh22, 2026-11-28: 15 of 16 groups ended different from
group 0; docs/scale.md). torchft's protocol: "it's only possible to increment a step by having a
majority agree on it" (torchft docs/source/protocol.rst).
"""

import os
import warnings

import pytest

from hyperpod_lab.spec import ElasticPolicy, JobSpec, ResiliencyPolicy, SplitQuorumWarning
from hyperpod_lab.submit.client import Client
from hyperpod_lab.submit.jobs import JobStore

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _spec(nodes: int, elastic: tuple[int, int] | None, recovery: str = "checkpointless") -> JobSpec:
    el = ElasticPolicy(min_nodes=elastic[0], max_nodes=elastic[1]) if elastic else ElasticPolicy()
    return JobSpec(script=os.path.join(REPO, "examples", "train_lm.py"), cluster="local", nodes=nodes,
                   resiliency=ResiliencyPolicy(recovery=recovery), elastic=el).validate()


def test_a_minimum_below_a_majority_is_named_with_the_fix():
    risk = _spec(16, None).split_quorum_risk()
    assert "16 replica groups with an elastic minimum of 1" in risk and "--elastic 9:16" in risk, risk
    risk = _spec(16, (1, 17)).split_quorum_risk()
    assert "minimum of 1" in risk and "--elastic 9:17" in risk, risk
    assert "--elastic 2:3" in _spec(3, (1, 3)).split_quorum_risk()


def test_a_majority_two_groups_and_restart_jobs_carry_no_warning():
    assert _spec(16, (9, 17)).split_quorum_risk() is None  # two disjoint quorums of 9 need 18 groups
    assert _spec(3, (2, 3)).split_quorum_risk() is None
    assert _spec(2, None).split_quorum_risk() is None  # the survivor of 2 must go on alone
    assert _spec(16, None, recovery="restart").split_quorum_risk() is None  # one world, no quorums


def test_submitting_warns_and_a_safe_spec_does_not(tmp_path):
    client = Client(JobStore(str(tmp_path / "store")))
    with pytest.warns(SplitQuorumWarning, match=r"--elastic 9:17"):
        client.render(_spec(16, (1, 17)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", SplitQuorumWarning)
        client.render(_spec(16, (9, 17)))
