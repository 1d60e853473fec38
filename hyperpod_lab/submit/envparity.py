"""Environment parity: the notebook's Python environment against the cluster interpreter's.

What is compared (``docs/environment.md``): the Python version, torch's version and its CUDA
build (``torch.version.cuda``; None for a CPU build), hyperpod-lab's version and event schema
version, and the distributions of the packages a training script imports (found with
:mod:`ast`, mapped module -> distribution with ``importlib.metadata.packages_distributions()``,
the standard library skipped through ``sys.stdlib_module_names``, modules beside the script
skipped: they are the script's own).

Both sides are measured by the same standard-library program, :mod:`hyperpod_lab.submit.envprobe`:
in-process for the notebook (:func:`collect_local`), and for a cluster (:func:`probe_cluster`)
as **one** command through the cluster's command seam (``schedulers/remote/__init__.py``: over the same
SSH route as a submission, ~/.ssh/config, jump hosts, SSM), ``<profile.python> -I -c <probe
source> <modules as JSON>``, every word shell-quoted. On the local backend it is a subprocess.
EKS is not supported: the interpreter lives in the job's container image, which only a running
pod could be asked (:class:`EnvCheckUnsupported`).

Severity rules (:func:`diff`):

* ``error`` (the submission is refused, :class:`hyperpod_lab.errors.EnvironmentMismatch`):
  hyperpod-lab missing on the cluster, failing to import there, a different major.minor version
  (``0.1.x`` works with ``0.1.y``; the job's runtime, its events and the batch script the
  notebook renders are one release's), or a different event schema version
  (``hyperpod_lab.events.SCHEMA_VERSION``: the notebook could not read the job's events).
* ``warning``: torch version, torch CUDA build, Python major.minor, or an imported package's
  version differ, or a package (or torch) is missing on the cluster.
* ``ok``: the same (a different Python micro version is ok).

Submission (:func:`check_submission`, called by ``Client.submit`` for Slurm clusters unless
``--skip-env-check``) needs only the hyperpod-lab part: it probes with no modules and caches the
answer per cluster and interpreter for :data:`CACHE_TTL_S` seconds, so a submission adds at most
one exec (none within the TTL; ``Client.scheduler`` fetches it when it connects).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
import shlex
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from hyperpod_lab.errors import ClusterUnreachable, EnvironmentMismatch, HyperPodLabError, RemoteCommandError, SpecError
from hyperpod_lab.submit import envprobe

log = logging.getLogger("hyperpod_lab.submit.envparity")

OK, WARNING, ERROR = "ok", "warning", "error"
SEVERITIES = (OK, WARNING, ERROR)
CACHE_TTL_S = 60.0
PROBE_TIMEOUT_S = 60.0
ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
DEFAULT_ENV_NAME = "notebook"
#: reported on their own lines, not as imported packages
_OWN_ROWS = {"torch", "hyperpod_lab"}


class EnvCheckUnsupported(HyperPodLabError):
    """The cluster's interpreter cannot be probed from here (EKS: it is inside the job's
    container image; only a running pod could be asked)."""


@dataclass
class Difference:
    """One compared item.

    Attributes:
        item: ``python``, ``torch``, ``torch CUDA build``, ``hyperpod-lab``, ``event schema`` or
            ``package <module>`` (e.g. ``package yaml``).
        local, remote: the notebook's and the cluster's value as text (None: not installed /
            not known).
        severity: ``ok`` | ``warning`` | ``error``.
        message: one line naming both values and, for a warning or an error, the fix.
    """

    item: str
    local: str | None
    remote: str | None
    severity: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- the script's imports ----------------------------------------------------------------
def script_modules(script: str) -> list[str]:
    """Top-level modules ``script`` imports that are neither the standard library's, torch nor
    hyperpod-lab (reported on their own rows), sorted. A module beside the script (``model.py``)
    is listed too: only the script is staged, so the cluster must have it as well.

    A notebook (``.ipynb``) is read through its code cells, magics and shell lines dropped, as a
    submission reads it (``server.notebook_script.notebook_to_script``).

    Raises SpecError("script") when the file cannot be read or parsed.
    """
    path = os.path.expanduser(script)
    try:
        with open(path, "rb") as f:
            source = f.read()
        if path.endswith(".ipynb"):
            from hyperpod_lab.submit.notebook_script import load_notebook, notebook_to_script

            try:
                source = notebook_to_script(load_notebook(source, script, "script"), "script").encode()
            except (ValueError, TypeError, AttributeError, KeyError) as e:
                raise SpecError("script", f"{script} is not a readable notebook ({e}); give a .py script or a "
                                          f"notebook saved by Jupyter") from None
        tree = ast.parse(source, filename=path)
    except OSError as e:
        raise SpecError("script", f"{script} cannot be read ({e.strerror or e}); give the path of your training "
                                  f"script") from None
    except SpecError:
        raise
    except (SyntaxError, ValueError) as e:
        raise SpecError("script", f"{script} is not valid Python ({e}); fix the script") from None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    out = []
    for n in sorted(names):
        if n in sys.stdlib_module_names or n == "__future__" or n in _OWN_ROWS:
            continue
        out.append(n)
    return out


# ---- both sides --------------------------------------------------------------------------
def collect_local(script: str | None = None) -> dict[str, Any]:
    """The notebook's environment (this interpreter: the Lab kernel's or the CLI's), with the
    packages ``script`` imports. Returns :func:`hyperpod_lab.submit.envprobe.probe`'s dict plus
    ``"modules_asked"`` (the list looked up). Raises SpecError("script")."""
    modules = script_modules(script) if script else []
    out = envprobe.probe(modules)
    out["modules_asked"] = modules
    here = os.path.dirname(os.path.abspath(os.path.expanduser(script))) if script else ""
    for n in modules:  # the script's own modules: beside it, not on this interpreter's path
        for rel in (n + ".py", n):
            if not out["modules"][n]["found"] and os.path.exists(os.path.join(here, rel)):
                out["modules"][n] = {"found": True, "dists": {}, "beside_script": rel}
    return out


def probe_argv(python: str, modules: list[str]) -> list[str]:
    """``[python, "-I", "-c", <probe source>, <modules JSON>]``: -I ignores PYTHON* variables,
    the user's site directory and the current directory (the answer is the interpreter's)."""
    with open(envprobe.__file__, encoding="utf-8") as f:
        source = f.read()
    return [python, "-I", "-c", source, json.dumps(sorted(set(modules)))]


_cache: dict[tuple, list[tuple[float, frozenset, dict]]] = {}
_unanswered: dict[tuple, float] = {}  # when a probe of a cluster last got no answer (monotonic s)
_cache_lock = threading.Lock()


def _key(profile) -> tuple:
    return (profile.name, profile.orchestrator, profile.python, profile.host, profile.port, profile.ssm_target)


def cached(profile, modules: list[str] = ()) -> dict | None:
    """A probe answer of the last :data:`CACHE_TTL_S` seconds for this cluster and interpreter
    that covers ``modules``, or None."""
    want, now = frozenset(modules), time.monotonic()
    with _cache_lock:
        for t, mods, res in reversed(_cache.get(_key(profile), [])):
            if now - t < CACHE_TTL_S and want <= mods:
                return res
    return None


def forget(profile=None) -> None:
    """Drop the cached probe answers (of one cluster, or all)."""
    with _cache_lock:
        if profile is None:
            _cache.clear()
            _unanswered.clear()
        else:
            _cache.pop(_key(profile), None)
            _unanswered.pop(_key(profile), None)


def recently_unanswered(profile) -> bool:
    """Whether a probe of this cluster and interpreter got no answer (ClusterUnreachable) in the
    last :data:`CACHE_TTL_S` seconds: the connect-time probe and the submit check are then
    skipped rather than waiting out the login node's timeout again."""
    with _cache_lock:
        t = _unanswered.get(_key(profile))
    return t is not None and time.monotonic() - t < CACHE_TTL_S


def probe_answer(stdout: str) -> dict[str, Any] | None:
    """The probe's answer, its last line of ``stdout`` as JSON (:mod:`hyperpod_lab.submit.envprobe`
    of :data:`envprobe.PROBE_VERSION`), or None when that line is not one."""
    try:
        out = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return out if isinstance(out, dict) and out.get("probe") == envprobe.PROBE_VERSION else None


def probe_cluster(profile, modules: list[str] = (), remote=None, use_cache: bool = True) -> dict[str, Any]:
    """The cluster interpreter's environment (``profile.python`` on the login node; on the
    local backend the profile's interpreter here), with ``modules`` looked up.

    One command: ``remote.run(probe_argv(...))`` (``remote``: the cluster's
    :class:`~hyperpod_lab.schedulers.remote.Remote`, default ``remote.connect(profile)``).

    Returns:
        :func:`hyperpod_lab.submit.envprobe.probe`'s dict as the cluster's interpreter answered it,
        plus ``"modules_asked"``.

    Raises:
        EnvCheckUnsupported: an EKS cluster.
        EnvironmentMismatch: the interpreter is not there (exit 127) or its answer is not the
            probe's (not a Python 3.8+, or it failed).
        ClusterUnreachable, HostKeyError: the login node cannot be reached safely.
    """
    if profile.orchestrator == "eks":
        raise EnvCheckUnsupported(
            f"cluster '{profile.name}' is an EKS cluster: its Python is inside the job's container image "
            f"({profile.image or 'the profile has no image'}), which only a running pod could be asked; the "
            f"environment check is not supported there. Compare against the image's own requirements, or run "
            f"`hyperpod-lab env export` to build the image from the notebook's pins")
    modules = sorted(set(modules))
    if use_cache:
        hit = cached(profile, modules)
        if hit is not None:
            return hit
    if remote is None:
        from hyperpod_lab.schedulers.remote import connect

        remote = connect(profile)
    argv = probe_argv(profile.python, modules)
    try:
        res = remote.run(argv, check=False, timeout_s=PROBE_TIMEOUT_S, idempotent=True)
    except ClusterUnreachable:
        with _cache_lock:
            _unanswered[_key(profile)] = time.monotonic()
        raise
    except RemoteCommandError as e:
        if e.exit_status == 127:
            raise EnvironmentMismatch(_no_python(profile)) from None
        raise RemoteCommandError([profile.python, "-I", "-c", "<hyperpod-lab environment probe>"],
                                 e.exit_status, e.stderr) from None
    if res.exit_status == 127:
        raise EnvironmentMismatch(_no_python(profile))
    out = probe_answer(res.stdout)
    if out is None:
        raise EnvironmentMismatch(
            f"the cluster interpreter {profile.python} of '{profile.name}' did not answer the environment probe "
            f"(exit status {res.exit_status}: {(res.stderr or res.stdout).strip()[-500:]}); it must be a Python "
            f"3.11+ with hyperpod-lab and torch: set 'python' in the cluster profile, or --skip-env-check")
    out["modules_asked"] = modules
    with _cache_lock:
        _unanswered.pop(_key(profile), None)
        entries = [e for e in _cache.get(_key(profile), []) if time.monotonic() - e[0] < CACHE_TTL_S][-4:]
        _cache[_key(profile)] = entries + [(time.monotonic(), frozenset(modules), out)]
    return out


IMAGE_PROBE_TIMEOUT_S = 180.0
"""How long the container-image probe may take, seconds: srun's ``--immediate`` wait for a node
(60 s) plus enroot's import of the image on first use."""


def probe_image(profile, image: str, modules: list[str] = (), remote=None) -> dict[str, Any]:
    """The environment of ``image``'s interpreter (Slurm with pyxis/enroot), asked on a compute node:
    one command on the login node, ``srun --nodes=1 --ntasks=1 --immediate=60 <pyxis options>
    python -I -c <probe>`` (:func:`hyperpod_lab.schedulers.slurm.container_probe_argv`; every word
    shell-quoted). Never cached: it takes a node and may import the image.

    Args:
        profile: a Slurm :class:`~hyperpod_lab.submit.clusters.ClusterProfile` (its shared_root is
            bound into the container, its partition asked).
        image: a ``container_image`` value (a registry image or an enroot ``.sqsh`` path).
        modules: module names to look up inside the image.
        remote: the cluster's :class:`~hyperpod_lab.schedulers.remote.Remote` (default: connect).

    Returns:
        :func:`hyperpod_lab.submit.envprobe.probe`'s dict as the image's interpreter answered it,
        plus ``"modules_asked"`` and ``"container_image"``.

    Raises:
        EnvCheckUnsupported: not a Slurm cluster.
        SpecError: ``image`` is not an image reference (:func:`hyperpod_lab.spec.validate_container_image`).
        EnvironmentMismatch: srun does not know ``--container-image`` (pyxis is not installed: the
            message says so), no node was free within 60 s, or the image's ``python`` did not
            answer the probe (missing, or not a Python 3.8+).
        ClusterUnreachable, HostKeyError: the login node cannot be reached safely.
    """
    from hyperpod_lab.schedulers.slurm import CONTAINER_PYTHON, container_probe_argv

    if profile.orchestrator != "slurm":
        raise EnvCheckUnsupported(f"cluster '{profile.name}' is not a Slurm cluster: container images are probed "
                                  f"through pyxis's srun --container-image, on Slurm only")
    modules = sorted(set(modules))
    argv = container_probe_argv(image, profile.shared_root, probe_argv(profile.python, modules),
                                partition=getattr(profile, "partition", None))
    if remote is None:
        from hyperpod_lab.schedulers.remote import connect

        remote = connect(profile)
    try:
        res = remote.run(argv, check=False, timeout_s=IMAGE_PROBE_TIMEOUT_S, idempotent=True)
    except RemoteCommandError as e:
        res = e
    status = getattr(res, "exit_status", None)
    out_text, err_text = getattr(res, "stdout", "") or "", getattr(res, "stderr", "") or ""
    where = f"the image {image!r} on cluster '{profile.name}'"
    if re.search(r"(unrecognized|invalid|unknown) option.*container", err_text):
        raise EnvironmentMismatch(
            f"cannot probe {where}: the cluster's srun does not know --container-image, i.e. pyxis (and enroot) "
            f"are not installed there (srun said: {err_text.strip()[-300:]}). Install them on every node (HyperPod's "
            f"lifecycle scripts do: utils/install_enroot_pyxis.sh), or submit without container_image")
    if re.search(r"Unable to allocate resources|Immediate execution impossible|allocation failure", err_text):
        raise EnvironmentMismatch(
            f"cannot probe {where}: no node was free within 60 s to start the image on (srun: "
            f"{err_text.strip()[-300:]}); retry when a node is idle")
    out = probe_answer(out_text)
    if out is None:
        raise EnvironmentMismatch(
            f"{where}: its interpreter '{CONTAINER_PYTHON}' did not answer the environment probe (exit status "
            f"{status}: {(err_text or out_text).strip()[-500:]}); the image needs a Python 3.11+ with hyperpod-lab "
            f"and torch on its PATH as '{CONTAINER_PYTHON}'")
    out["modules_asked"] = modules
    out["container_image"] = image
    return out


def _no_python(profile) -> str:
    return (f"the cluster interpreter {profile.python!r} of cluster '{profile.name}' was not found on its login node; "
            f"set 'python' in the cluster profile to an interpreter with hyperpod-lab and torch (e.g. "
            f"/fsx/venv/bin/python), or build one with `hyperpod-lab env export --cluster {profile.name}`")


# ---- the comparison ----------------------------------------------------------------------
def _major_minor(version: str | None) -> tuple[int, ...] | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def _fmt(v) -> str | None:
    return None if v is None else str(v)


def diff(local: dict[str, Any], remote: dict[str, Any], python: str | None = None) -> list[Difference]:
    """Compare two probe answers (:func:`collect_local`, :func:`probe_cluster`).

    Args:
        local, remote: the notebook's and the cluster's environment.
        python: the cluster interpreter's path, named in the fixes (default: the remote's
            ``executable``).

    Returns:
        One :class:`Difference` per item: python, torch, torch CUDA build, hyperpod-lab, event
        schema, then ``package <module>`` for each module ``local["modules_asked"]`` names, in
        that order. Severity rules: see the module docstring.
    """
    py = python or remote.get("executable") or "python"
    pip = f"{shlex.quote(py)} -m pip install"
    out: list[Difference] = []

    lv, rv = local.get("python"), remote.get("python")
    if lv == rv:
        out.append(Difference("python", lv, rv, OK, f"Python {lv} on both"))
    elif _major_minor(lv) == _major_minor(rv):
        out.append(Difference("python", lv, rv, OK, f"Python {lv} (notebook) and {rv} (cluster): same minor version"))
    else:
        out.append(Difference("python", lv, rv, WARNING,
                              f"Python {lv} (notebook) but {rv} (cluster): pickled objects and compiled packages may "
                              f"not carry over; use Python {'.'.join(map(str, _major_minor(lv) or ()))} on the cluster"))

    lt, rt = local.get("torch") or {}, remote.get("torch") or {}
    ltv, rtv = lt.get("version"), rt.get("version")
    if not rt:
        out.append(Difference("torch", ltv, None, WARNING,
                              f"torch is not installed on the cluster (notebook: {ltv}); {pip} torch=={ltv}"
                              if ltv else "torch is installed on neither side; the runtime needs it"))
    elif ltv == rtv:
        out.append(Difference("torch", ltv, rtv, OK, f"torch {ltv} on both"))
    else:
        out.append(Difference("torch", ltv, rtv, WARNING,
                              f"torch {ltv} (notebook) but {rtv} (cluster): results and checkpoints may differ; "
                              f"{pip} torch=={ltv}" if ltv else f"torch {rtv} on the cluster, none in the notebook"))
    if rt or lt:
        lc, rc = (lt.get("cuda") if lt else None), (rt.get("cuda") if rt else None)
        lcs, rcs = ("CUDA " + lc if lc else "CPU"), ("CUDA " + rc if rc else "CPU")
        if not rt or not lt:
            out.append(Difference("torch CUDA build", lc if lt else None, rc if rt else None, WARNING if not rt else OK,
                                  "torch CUDA build: only one side has torch"))
        elif lc == rc:
            out.append(Difference("torch CUDA build", lcs, rcs, OK, f"torch build {lcs} on both"))
        else:
            out.append(Difference("torch CUDA build", lcs, rcs, WARNING,
                                  f"torch built for {lcs} (notebook) but {rcs} (cluster): install the torch wheel for "
                                  f"the cluster's GPUs, e.g. {pip} torch=={ltv} --index-url "
                                  f"https://download.pytorch.org/whl/{'cu' + rc.replace('.', '') if rc else 'cpu'}"))

    lh, rh = local.get("hyperpod_lab") or {}, remote.get("hyperpod_lab")
    lhv = lh.get("version")
    fix = f"pip install hyperpod-lab=={lhv} on the cluster interpreter ({py}) or --skip-env-check"
    if not rh:
        out.append(Difference("hyperpod-lab", lhv, None, ERROR,
                              f"hyperpod-lab is not installed on the cluster interpreter {py} (notebook: {lhv}); "
                              f"the job's runtime needs it: {fix}"))
    else:
        rhv = rh.get("version")
        if rh.get("error"):
            out.append(Difference("hyperpod-lab", lhv, rhv, ERROR,
                                  f"hyperpod-lab {rhv} on the cluster fails to import ({rh['error']}); notebook "
                                  f"{lhv}: {fix}"))
        elif _major_minor(lhv) != _major_minor(rhv):
            out.append(Difference("hyperpod-lab", lhv, rhv, ERROR,
                                  f"hyperpod-lab {lhv} (notebook) and {rhv} (cluster) are incompatible (a different "
                                  f"major.minor version): {fix}"))
        elif lhv != rhv:
            out.append(Difference("hyperpod-lab", lhv, rhv, OK,
                                  f"hyperpod-lab {lhv} (notebook) and {rhv} (cluster): same major.minor, compatible"))
        else:
            out.append(Difference("hyperpod-lab", lhv, rhv, OK, f"hyperpod-lab {lhv} on both"))
        ls, rs = lh.get("schema"), rh.get("schema")
        if rs is not None and ls != rs:
            out.append(Difference("event schema", _fmt(ls), _fmt(rs), ERROR,
                                  f"event schema v{ls} (notebook) but v{rs} (cluster): the notebook could not read the "
                                  f"job's events: {fix}"))
        elif rs is not None:
            out.append(Difference("event schema", _fmt(ls), _fmt(rs), OK, f"event schema v{ls} on both"))

    lm, rm = local.get("modules") or {}, remote.get("modules") or {}
    for name in local.get("modules_asked") or sorted(lm):
        lmod, rmod = lm.get(name) or {}, rm.get(name) or {}
        lvs = ", ".join(f"{d} {v}" for d, v in sorted((lmod.get("dists") or {}).items())) or None
        rvs = ", ".join(f"{d} {v}" for d, v in sorted((rmod.get("dists") or {}).items())) or None
        pins = " ".join(f"{d}=={v}" for d, v in sorted((lmod.get("dists") or {}).items()))
        item = f"package {name}"
        if not rmod.get("found") and lmod.get("beside_script"):
            out.append(Difference(item, lmod["beside_script"] + " (beside the script)", None, WARNING,
                                  f"the script imports {name} from {lmod['beside_script']} beside it, which the cluster "
                                  f"interpreter cannot import: only the script is staged; put it on the cluster's "
                                  f"shared storage and on the interpreter's path, or install it as a package"))
        elif not rmod.get("found"):
            out.append(Difference(item, lvs, None, WARNING,
                                  f"the script imports {name} ({lvs or 'not installed in the notebook either'}), which "
                                  f"is missing on the cluster" + (f": {pip} {pins}" if pins else "")))
        elif not lmod.get("found"):
            out.append(Difference(item, None, rvs, WARNING,
                                  f"the script imports {name}: on the cluster ({rvs or 'found'}) but not in the notebook"))
        elif lvs == rvs:
            out.append(Difference(item, lvs, rvs, OK, f"{name}: {lvs or 'found'} on both"))
        else:
            out.append(Difference(item, lvs, rvs, WARNING,
                                  f"{name}: {lvs} (notebook) but {rvs} (cluster)" + (f"; {pip} {pins}" if pins else "")))
    return out


def errors_of(diffs: list[Difference]) -> list[Difference]:
    return [d for d in diffs if d.severity == ERROR]


def summary(diffs: list[Difference]) -> str:
    """``ok`` | ``warning`` | ``error``: the worst severity."""
    worst = max((SEVERITIES.index(d.severity) for d in diffs), default=0)
    return SEVERITIES[worst]


def env_diff(profile, script: str | None = None, remote=None, use_cache: bool = False,
             container_image: str | None = None) -> dict[str, Any]:
    """The whole comparison for one cluster: ``{"cluster", "python" (the cluster interpreter),
    "container_image", "script", "summary" (worst severity), "differences":
    [Difference.to_dict()...], "local", "remote" (the two probe answers)}``. Probes afresh unless
    ``use_cache`` (one exec; the answer is cached for the next submission).

    With a container image (``container_image``, else the Slurm profile's ``container_image``)
    the training step's interpreter is the image's, so that one is probed (:func:`probe_image`:
    one srun on a compute node, never cached); ``"python"`` then names it.

    Raises as :func:`collect_local`, :func:`probe_cluster` and :func:`probe_image`."""
    local = collect_local(script)
    image = container_image or (getattr(profile, "container_image", None) if profile.orchestrator == "slurm" else None)
    if image:
        from hyperpod_lab.schedulers.slurm import CONTAINER_PYTHON

        remote_env = probe_image(profile, image, local["modules_asked"], remote=remote)
        python = f"{CONTAINER_PYTHON} in {image}"
    else:
        remote_env = probe_cluster(profile, local["modules_asked"], remote=remote, use_cache=use_cache)
        python = profile.python
    diffs = diff(local, remote_env, python=python)
    return {"cluster": profile.name, "python": python, "container_image": image, "script": script,
            "summary": summary(diffs), "differences": [d.to_dict() for d in diffs], "local": local,
            "remote": remote_env}


def check_submission(profile, remote=None) -> list[Difference]:
    """Refuse a submission to a cluster whose hyperpod-lab cannot run the notebook's job.

    Probes (cached, :data:`CACHE_TTL_S`) with no modules: the hyperpod-lab rows decide.

    Returns:
        The differences (none at error level).

    Raises:
        EnvironmentMismatch: an error-level difference, its message naming both versions and
            the fix; or the interpreter is missing.
        EnvCheckUnsupported: an EKS cluster.
        HostKeyError: the login node's key is refused. (A login node that does not answer,
            ClusterUnreachable, skips the check: the submission reports it.)
    """
    if cached(profile) is None and recently_unanswered(profile):
        log.warning("environment check of cluster '%s' skipped: its login node did not answer the probe "
                    "within the last %g s", profile.name, CACHE_TTL_S)
        return []
    local = envprobe.probe(())
    local["modules_asked"] = []
    try:
        remote_env = probe_cluster(profile, [], remote=remote)
    except ClusterUnreachable as e:
        # no answer is not an incompatibility: the submission goes on and reports the login
        # node's state itself (its one exec may still reach sbatch: CommandOutcomeUnknown)
        log.warning("environment check of cluster '%s' skipped: %s", profile.name, e)
        return []
    diffs = diff(local, remote_env, python=profile.python)
    bad = errors_of(diffs)
    if bad:
        forget(profile)  # the next submission probes again: the user may have fixed it meanwhile
        raise EnvironmentMismatch(f"submission to '{profile.name}' refused: " + "; ".join(d.message for d in bad))
    return diffs


# ---- export ------------------------------------------------------------------------------
def _direct_url(dist) -> dict | None:
    try:
        text = dist.read_text("direct_url.json")
        return json.loads(text) if text else None
    except (ValueError, OSError):
        return None


def requirements_text() -> str:
    """The notebook's requirements: one exact pin (``name==version``) per installed distribution
    (importlib.metadata, the first of a name on ``sys.path``), sorted; torch pinned with the
    index of its build (``+cpu`` / ``+cuXYZ`` wheels come from download.pytorch.org); editable or
    local-directory installs as comments naming their source (they are not on an index)."""
    import importlib.metadata as md

    seen, pins, notes = set(), [], []
    for dist in md.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if not name:
            continue
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        url = _direct_url(dist)
        if url and (url.get("dir_info") is not None or str(url.get("url", "")).startswith("file:")):
            how = "editable install" if (url.get("dir_info") or {}).get("editable") else "local install"
            notes.append(f"# {name}=={dist.version}: {how} from {url.get('url')}; not on an index: install it "
                         f"on the cluster from that source (pip install <its path or wheel>)")
            continue
        pins.append(f"{name}=={dist.version}")
    head = ["# written by `hyperpod-lab env export`: the notebook's installed distributions, exact pins",
            f"# notebook interpreter: {sys.executable} (Python {sys.version.split()[0]})"]
    tv = envprobe._dist_version("torch")
    m = re.search(r"\+(cpu|cu\d+|rocm[\d.]+)$", tv or "")
    if m:
        head.append(f"--extra-index-url https://download.pytorch.org/whl/{m.group(1)}")
    return "\n".join(head + sorted(pins, key=str.lower) + sorted(notes, key=str.lower)) + "\n"


def check_env_name(name: str) -> str:
    """``name`` if it is a valid environment name. Raises SpecError("name") otherwise."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        raise SpecError("name", f"an environment name is 1-64 letters, digits, '.', '_' or '-' (not starting with "
                                f"'.', '_' or '-'), got {name!r}")
    return name


def env_dir(profile, name: str, user: str) -> str:
    """``<shared_root>/hyperpod-lab/<user>/envs/<name>``: in the cluster user's own folder, beside
    their jobs (the shared ``hyperpod-lab/`` is never created private by one user, which would lock
    the others out). Raises SpecError("name") for a bad name, UntrustedDirError for a bad user name."""
    from hyperpod_lab.private_dir import user_folder_name

    return f"{profile.shared_root.rstrip('/')}/hyperpod-lab/{user_folder_name(user)}/envs/{check_env_name(name)}"


def export(profile, name: str = DEFAULT_ENV_NAME, remote=None) -> dict[str, Any]:
    """Write the notebook's requirements (:func:`requirements_text`) to the cluster's shared
    storage, ``<shared_root>/hyperpod-lab/<user>/envs/<name>/requirements.txt`` (atomic write, 0644,
    through the cluster's file access: SFTP, the local mount, or this machine's files), after the
    user's tree below the shared root was made or checked (``Remote.ensure_job_root``).

    Returns:
        ``{"cluster", "name", "path", "venv", "python" (the new env's interpreter), "command"
        (the shell command that builds the env on the cluster: ``<python> -m venv <venv> &&
        <venv>/bin/pip install -r <path>``, each word quoted), "pins" (lines pinned)}``.

    Raises:
        SpecError: a bad ``name``.
        EnvCheckUnsupported: an EKS cluster (its storage is reached only from pods).
        ClusterUnreachable, HostKeyError: as the cluster's file access.
    """
    if profile.orchestrator == "eks":
        raise EnvCheckUnsupported(
            f"cluster '{profile.name}' is an EKS cluster: its shared storage ({profile.pvc or 'its volume'}) is "
            f"reached only from pods; export is not supported there. Use `hyperpod-lab env export --cluster local` "
            f"for the file, and build the job's image from it")
    check_env_name(name)
    if remote is None:
        from hyperpod_lab.schedulers.remote import connect

        remote = connect(profile)
    remote.ensure_job_root(profile.shared_root)  # the shared hyperpod-lab/ and the user's folder, checked
    folder = env_dir(profile, name, remote.user_name())
    text = requirements_text()
    path = folder + "/requirements.txt"
    remote.makedirs(folder)
    remote.write_bytes(path, text.encode(), mode=0o644)
    venv = folder + "/venv"
    q = shlex.quote
    command = f"{q(profile.python)} -m venv {q(venv)} && {q(venv + '/bin/pip')} install -r {q(path)}"
    return {"cluster": profile.name, "name": name, "path": path, "venv": venv, "python": venv + "/bin/python",
            "command": command, "pins": sum(1 for line in text.splitlines() if "==" in line and not line.startswith("#"))}


def format_table(report: dict[str, Any]) -> str:
    """:func:`env_diff`'s report as a table for the CLI."""
    rows = [[d["severity"].upper(), d["item"], d["local"] or "-", d["remote"] or "-"] for d in report["differences"]]
    header = ["", "ITEM", "NOTEBOOK", f"CLUSTER ({report['cluster']})"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    lines = [fmt.format(*header).rstrip()] + [fmt.format(*r).rstrip() for r in rows]
    notes = [f"{d['severity']}: {d['message']}" for d in report["differences"] if d["severity"] != OK]
    return "\n".join(lines + ([""] + notes if notes else []) + [f"summary: {report['summary']} "
                                                                f"(cluster interpreter {report['python']})"])
