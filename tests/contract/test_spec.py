import json

import pytest

from hyperpod_lab.errors import SpecError
from hyperpod_lab.spec import CheckpointPolicy, ElasticPolicy, JobSpec, ResiliencyPolicy, parse_elastic


def full_spec():
    return JobSpec(script="train.py", name="run 1", cluster="local-slurm", nodes=2, procs_per_node=2,
                   args=["--lr", "3e-4", "'; touch /tmp/x; '"], env={"FOO": "a b"},
                   resiliency=ResiliencyPolicy(max_retries=5),
                   checkpoint=CheckpointPolicy(every_steps=10, keep_last=3, memory_every_steps=2,
                                               s3_uri="s3://bucket/ckpt", s3_every_steps=50),
                   elastic=ElasticPolicy(min_nodes=1, max_nodes=4, global_batch_size=64, lr_rule="sqrt")).validate()


def test_json_round_trip_is_exact():
    spec = full_spec()
    again = JobSpec.from_json(spec.to_json())
    assert again == spec
    assert json.loads(again.to_json()) == json.loads(spec.to_json())
    assert again.world_size == 4


@pytest.mark.parametrize("mutate, field, words", [
    (lambda s: setattr(s, "nodes", 0), "nodes", "--nodes 1"),
    (lambda s: setattr(s, "procs_per_node", -1), "procs_per_node", ">= 1"),
    (lambda s: setattr(s, "name", "a\nb"), "name", "newlines"),
    (lambda s: setattr(s, "name", ""), "name", "--name"),
    (lambda s: setattr(s, "script", " "), "script", "path"),
    (lambda s: setattr(s.resiliency, "max_retries", -1), "resiliency.max_retries", "--max-retries"),
    (lambda s: setattr(s.checkpoint, "every_steps", 0), "checkpoint.every_steps", "--checkpoint-every"),
    (lambda s: setattr(s.checkpoint, "s3_uri", "http://x"), "checkpoint.s3_uri", "s3://bucket"),
    (lambda s: setattr(s.checkpoint, "s3_every_steps", 15), "checkpoint.s3_every_steps", "multiple of"),
    (lambda s: setattr(s.elastic, "lr_rule", "cubic"), "elastic.lr_rule", "none, linear, sqrt"),
    (lambda s: setattr(s.elastic, "global_batch_size", 63), "elastic.global_batch_size", "multiple of 4"),
    (lambda s: setattr(s, "env", {"1BAD": "x"}), "env", "variable names"),
])
def test_validation_names_field_and_fix(mutate, field, words):
    spec = full_spec()
    mutate(spec)
    with pytest.raises(SpecError) as e:
        spec.validate()
    assert e.value.field == field
    assert words in str(e.value)


def test_elastic_bounds():
    assert parse_elastic("1:2") == (1, 2)
    with pytest.raises(SpecError) as e:
        parse_elastic("4:2")
    assert "--elastic 2:4" in str(e.value)
    with pytest.raises(SpecError):
        parse_elastic("two")
    spec = JobSpec(script="t.py", nodes=3, elastic=ElasticPolicy(1, 2))
    with pytest.raises(SpecError, match="outside --elastic 1:2"):
        spec.validate()


def test_from_json_rejects_unknown_and_malformed():
    with pytest.raises(SpecError, match="checkpoint.evry_steps: unknown field"):
        JobSpec.from_dict({"script": "t.py", "checkpoint": {"evry_steps": 3}})
    with pytest.raises(SpecError, match="not valid JSON"):
        JobSpec.from_json("{nope")
    with pytest.raises(SpecError, match="script"):
        JobSpec.from_dict({"name": "x"})
    with pytest.raises(SpecError, match="version"):
        JobSpec.from_dict({"script": "t.py", "version": 99})


def test_host_code_env_names_the_variables_that_run_code():
    """Issue 13, finding 10: variables that make the job's processes run code besides the script."""
    from hyperpod_lab.spec import host_code_env

    names = ["LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONSTARTUP", "PYTHONPATH", "BROWSER", "BASH_ENV", "PATH",
             "NODE_OPTIONS", "HF_TOKEN", "OMP_NUM_THREADS", "MYPATH", "NCCL_DEBUG"]
    assert host_code_env(names) == ["BASH_ENV", "BROWSER", "LD_LIBRARY_PATH", "LD_PRELOAD", "NODE_OPTIONS", "PATH",
                                    "PYTHONPATH", "PYTHONSTARTUP"]
