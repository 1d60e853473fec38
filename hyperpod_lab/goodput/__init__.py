"""Goodput model and checkpoint-interval advisor, calibrated from a job's own events.

*Goodput* is the fraction of wall time a job spends on useful training steps: steps that are
never lost. Time is lost to checkpoint stalls (the seconds the training loop is blocked by a
save), and on every failure to detection, restart (or peer healing), checkpoint restore and the
recomputation of the steps since the restore point.

The model (formulas and the public figures it reproduces: ``docs/goodput.md``):

* Failures are a Poisson process per instance with rate ``failure_rate_per_instance_hour``
  (a fraction, ``0.0004`` = 0.04 %); a cluster of ``instances`` fails at ``instances × rate``
  per hour: the cluster MTBF is ``1 / (instances × rate)`` hours.
* Checkpoint tiers (``memory``, ``peer``, ``persistent``, ``s3``) each save every
  ``interval_steps`` steps and block training ``blocked_s`` seconds per save.
* Recovery mode ``"checkpoint-restart"``: the whole job restarts (``detect_s + restart_s``),
  restores the newest surviving checkpoint (``restore_s`` of its tier) and recomputes the steps
  since it (on average half the tier's interval).
* Recovery mode ``"checkpointless"``: surviving data-parallel replicas heal the replacement
  (``detect_s + heal_s``, at most the step in flight is recomputed); when every replica of some
  state is lost (probability ``fallback_probability``, or modeled from ``replicas``) it falls
  back to checkpoint-restart from a tier.

:func:`expected_goodput` is the first-order closed form; :func:`exponential_goodput` the exact
expected value for one tier and checkpoint-restart (Daly 2006); :func:`simulate` a seeded
Monte Carlo simulator of the same model (per-instance failure times, several tiers, peers lost
within the healing window) that checks both. :func:`measure_from_events` measures a job from
its events, :class:`GoodputMeter` the same folded one event at a time in bounded memory; :func:`project` and :func:`advise` give the goodput at N instances,
as a band (low, mid, high) over the failure rate and the restart time (``band``), with a
node-local tier (``memory``) lost with its node (:func:`tier_survival`).

The package, one module per idea (``from hyperpod_lab.goodput import X`` works for each public
name): ``scenario`` (units, failure arithmetic, :class:`Tier`, :class:`Scenario`),
``closed_form`` (Young/Daly intervals, the exact one-tier form, the multi-tier breakdown),
``simulation`` (Monte Carlo), ``band`` (the failure-rate and restart-time bands of a
projection, the per-day rate, the implausible-rate warning), ``measure`` (a job's events, through the job facts fold of
:mod:`hyperpod_lab.fold.facts`, and projection), ``advice`` (advice, curve, plot, report) and
``figures`` (the public-figures table; ``python -m hyperpod_lab.goodput --table``).

Pure Python + numpy (matplotlib only inside :func:`plot_goodput_vs_interval`); no torch, no
Jupyter.

Sources: J. W. Young, "A first order approximation to the optimum checkpoint interval",
CACM 17(9):530-531, 1974. J. T. Daly, "A higher order estimate of the optimum checkpoint
interval for restart dumps", Future Generation Computer Systems 22(3):303-312, 2006.
"""

from __future__ import annotations

import importlib
from typing import Any

from hyperpod_lab.goodput import band

#: public name -> the module of this package that defines it, imported on first use (PEP 562): one
#: table instead of a re-export list per module
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(['advise', 'figure_png', 'goodput_curve', 'plot_goodput_vs_interval', 'report_text'], "advice"),
    **dict.fromkeys(['BAND_FACTOR', 'PLAUSIBLE_MAX_RATE', 'rate_band', 'rate_from_per_day', 'rate_warning', 'restart_band'], "band"),
    **dict.fromkeys(['daly_interval_s', 'expected_goodput', 'exponential_goodput', 'goodput_breakdown', 'training_days', 'young_daly_interval', 'young_interval_s'], "closed_form"),
    **dict.fromkeys(['LLAMA3_ASSUMPTIONS', 'figures_table_markdown', 'main', 'public_figures'], "figures"),
    **dict.fromkeys(['GoodputMeter', 'measure_from_events', 'project'], "measure"),
    **dict.fromkeys(['CHECKPOINTLESS', 'CHECKPOINT_RESTART', 'DEFAULT_DETECT_S', 'DEFAULT_GPUS_PER_INSTANCE', 'DEFAULT_HEAL_S', 'DEFAULT_MAX_INTERVAL_S', 'DEFAULT_REPLICAS', 'DEFAULT_RESTART_S', 'LOST_KINDS', 'MODEL_MODES', 'NODE_LOCAL_TIERS', 'SECONDS_PER_HOUR', 'Scenario', 'TIER_ORDER', 'Tier', 'cluster_mtbf_hours', 'failure_rate_from_counts', 'parse_failure_rate', 'tier_survival'], "scenario"),
    **dict.fromkeys(['simulate'], "simulation"),
}

__all__ = [
    "BAND_FACTOR", "NODE_LOCAL_TIERS", "PLAUSIBLE_MAX_RATE", "band", "rate_band", "rate_from_per_day",
    "rate_warning", "restart_band", "tier_survival",
    "CHECKPOINTLESS", "CHECKPOINT_RESTART", "DEFAULT_DETECT_S", "DEFAULT_GPUS_PER_INSTANCE", "DEFAULT_HEAL_S",
    "DEFAULT_MAX_INTERVAL_S", "DEFAULT_REPLICAS", "DEFAULT_RESTART_S", "GoodputMeter", "LLAMA3_ASSUMPTIONS",
    "LOST_KINDS",
    "MODEL_MODES", "SECONDS_PER_HOUR", "TIER_ORDER", "Scenario", "Tier", "advise", "cluster_mtbf_hours",
    "daly_interval_s", "expected_goodput", "exponential_goodput", "failure_rate_from_counts", "figure_png",
    "figures_table_markdown", "goodput_breakdown", "goodput_curve", "main", "measure_from_events",
    "parse_failure_rate", "plot_goodput_vs_interval", "project", "public_figures", "report_text", "simulate",
    "training_days", "young_daly_interval", "young_interval_s",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hyperpod_lab.goodput' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"hyperpod_lab.goodput.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
