import pytest

from hyperpod_lab.errors import ConfigError, UnknownCluster
from hyperpod_lab.submit import clusters
from hyperpod_lab.submit.clusters import ClusterDefaults, ClusterProfile


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    monkeypatch.setenv("HYPERPOD_LAB_CONFIG", str(path))
    return path


def test_local_always_exists_and_unknown_lists_known(cfg):
    assert clusters.get_profile("local").orchestrator == "local"
    clusters.save_profile(ClusterProfile("hp", "slurm", host="h", port=22, user="u", key_file="/k",
                                         known_hosts="/kh", shared_root="/fsx",
                                         defaults=ClusterDefaults(partition="p", nodes=4)))
    with pytest.raises(UnknownCluster) as e:
        clusters.get_profile("nope")
    assert "unknown cluster 'nope'" in str(e.value) and "hp, local" in str(e.value)
    hp = clusters.get_profile("hp")
    assert hp.defaults.nodes == 4 and hp.defaults.partition == "p" and hp.port == 22


def test_save_keeps_other_entries(cfg):
    for n in ("a", "b"):
        clusters.save_profile(ClusterProfile(n, "slurm", host=n, user="u", key_file="/k", known_hosts="/kh",
                                             shared_root="/fsx"))
    clusters.save_profile(ClusterProfile("a", "slurm", host="a2", user="u", key_file="/k", known_hosts="/kh",
                                         shared_root="/fsx"))
    profs = clusters.load_profiles()
    assert profs["a"].host == "a2" and profs["b"].host == "b"


@pytest.mark.parametrize("text, words", [
    ("[clusters.x]\norchestrator='pbs'\n", "orchestrator must be one of"),
    ("[clusters.x]\norchestrator='slurm'\n", "'host' is required"),
    ("[clusters.x]\nhost='h'\n", "'orchestrator' is required"),
    ("[clusters.x]\norchestrator='local'\ncolour='red'\n", "unknown keys ['colour']"),
    ("not toml [", "not valid TOML"),
])
def test_malformed_config_is_a_clear_error(cfg, text, words):
    cfg.write_text(text)
    with pytest.raises(ConfigError) as e:
        clusters.load_profiles()
    assert words in str(e.value) and str(cfg) in str(e.value)


def test_local_cannot_be_overwritten(cfg):
    with pytest.raises(ConfigError):
        clusters.save_profile(ClusterProfile("local", "local"))


def test_ssh_config_and_ssm_profiles_round_trip(cfg, tmp_path):
    """Issue 16: a slurm profile may leave user/key/known_hosts to the OpenSSH config, and an
    SSM profile needs no host."""
    clusters.save_profile(ClusterProfile("alias", "slurm", host="login", ssh_config=str(tmp_path / "ssh_config"),
                                         shared_root="/shared"))
    clusters.save_profile(ClusterProfile("ssm", "slurm", ssm_target="sagemaker-cluster:abc_controller-machine-i-0a1",
                                         region="us-west-2", user="ubuntu", key_file="/k", known_hosts="/kh",
                                         shared_root="/fsx"))
    profs = clusters.load_profiles()
    assert (profs["alias"].host, profs["alias"].ssh_config, profs["alias"].user) == \
        ("login", str(tmp_path / "ssh_config"), None)
    assert profs["ssm"].host is None and profs["ssm"].ssm_target.endswith("-i-0a1")


@pytest.mark.parametrize("text, words", [
    ("[clusters.x]\norchestrator='slurm'\nshared_root='/f'\n", "'host' is required"),
    ("[clusters.x]\norchestrator='slurm'\nhost='h'\n", "'shared_root' is required"),
    ("[clusters.x]\norchestrator='slurm'\nssm_target='-h'\nshared_root='/f'\n", "ssm_target must look like"),
    ("[clusters.x]\norchestrator='slurm'\nhost='a b'\nshared_root='/f'\n", "shell characters"),
    ("[clusters.x]\norchestrator='slurm'\nhost='h'\nuser='-oProxyCommand=x'\nshared_root='/f'\n",
     "not starting with '-'"),
])
def test_slurm_access_fields_are_validated(cfg, text, words):
    cfg.write_text(text)
    with pytest.raises(ConfigError) as e:
        clusters.load_profiles()
    assert words in str(e.value), str(e.value)
