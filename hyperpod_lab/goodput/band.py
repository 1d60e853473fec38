"""Projection bands: the failure rate and restart time a projection assumes, as a range.

A projection of goodput to another cluster rests on two numbers nobody knows exactly: the
failure rate of the cluster it will run on and how long a restart takes there. So a projection
is a band, never a single number (:func:`rate_band`, :func:`restart_band`):

* **failure rate**: a range the user gives (``"0.01%:0.06%"``, ``(lo, hi)``), its middle the
  geometric mean; or one value ``r``, taken as ``r / 2`` to ``2 r``: the published
  per-instance-hour rates span a factor of 3.7 (Llama 3 0.0161 %, OPT-175B 0.0588 %;
  docs/goodput.md, "Public figures"), about a factor of 2 either side of their geometric mean.
* **restart time**: a range the user gives; else the job's measured restarts (fewest to most
  seconds, the median in the middle) when it had two or more; else one value (given, the one
  measured restart, or the default) taken as half to twice it.

``low`` pairs the highest rate with the longest restart, ``high`` the lowest with the shortest,
``mid`` the middles: goodput falls with both, so ``low <= mid <= high``.

Units: a bare number above :data:`PLAUSIBLE_MAX_RATE` per instance-hour (0.067 %, the highest
published rate: docs/goodput.md, "Failure rates") is accepted but warned about
(:func:`rate_warning`): it is more likely a percentage written without ``%`` or a rate per day.
:func:`rate_from_per_day` converts a job's failures per day explicitly.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from hyperpod_lab.errors import GoodputInputError
from hyperpod_lab.goodput.scenario import RATE_UNIT, checked_instances, checked_seconds, parse_failure_rate

BAND_FACTOR = 2.0
"""A single value ``x`` spans ``x / BAND_FACTOR`` to ``x * BAND_FACTOR`` (see the module doc)."""

PLAUSIBLE_MAX_RATE = 0.00067
"""0.067 % per instance-hour: the highest published failure rate (docs/goodput.md, "Failure
rates"); a bare rate above it gets a warning that names the units."""

HOURS_PER_DAY = 24.0


def _pair(x: Any) -> tuple[Any, Any] | None:
    """``(lo, hi)`` of a range given as a 2-sequence or a ``"lo:hi"`` string, else None."""
    if isinstance(x, str) and ":" in x:
        lo, _, hi = x.partition(":")
        return lo.strip(), hi.strip()
    if isinstance(x, (list, tuple)):
        if len(x) != 2:
            raise GoodputInputError("band", f"{x!r}: a range is two values, low and high")
        return x[0], x[1]
    return None


def _middle(lo: float, hi: float) -> float:
    return math.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2.0


def _ordered(lo: float, hi: float, field: str) -> tuple[float, float, float]:
    if lo > hi:
        raise GoodputInputError(field, f"the range {lo:g}:{hi:g} runs backwards: give the low value first")
    return lo, _middle(lo, hi), hi


def rate_band(rate: Any, field: str = "failure_rate", factor: float = BAND_FACTOR) -> tuple[float, float, float]:
    """``(low, mid, high)`` failure rates per instance-hour (fractions) of ``rate``: a range
    (``"0.01%:0.06%"``, ``(0.0001, 0.0006)``) or one value (``r / factor, r, r * factor``, at most 1)."""
    pair = _pair(rate)
    if pair is not None:
        return _ordered(parse_failure_rate(pair[0], field), parse_failure_rate(pair[1], field), field)
    r = parse_failure_rate(rate, field)
    return r / factor, r, min(1.0, r * factor)


def restart_band(given: Any = None, measured: Sequence[float] = (), default: float | None = None,
                 factor: float = BAND_FACTOR, field: str = "restart_s") -> tuple[tuple[float, float, float], str]:
    """``((low, mid, high), source)`` restart seconds: the range or value ``given``, else the
    ``measured`` restarts (two or more: fewest, median, most), else the one measured or
    ``default``, each single value spanning ``x / factor`` to ``x * factor``."""
    pair = _pair(given)
    if pair is not None:
        lo, hi = (checked_seconds(float(v) if isinstance(v, str) else v, field) for v in pair)
        return _ordered(lo, hi, field), "given range"
    if given is not None:
        x = checked_seconds(float(given) if isinstance(given, str) else given, field)
        return (x / factor, x, x * factor), f"given, /{factor:g} to x{factor:g}"
    ms = sorted(float(m) for m in measured)
    if len(ms) >= 2:
        mid = ms[len(ms) // 2] if len(ms) % 2 else (ms[len(ms) // 2 - 1] + ms[len(ms) // 2]) / 2.0
        return (ms[0], mid, ms[-1]), f"measured: {len(ms)} restarts, fewest to most seconds"
    if ms:
        return (ms[0] / factor, ms[0], ms[0] * factor), f"measured once, /{factor:g} to x{factor:g}"
    if default is None:
        raise GoodputInputError(field, "no restart time given or measured")
    return (default / factor, default, default * factor), f"default, /{factor:g} to x{factor:g}"


def _bare(rate: Any) -> bool:
    """Whether ``rate`` is a number written without a unit (not ``"0.04%"``)."""
    return not (isinstance(rate, str) and rate.strip().endswith("%"))


def rate_warning(rate: Any, field: str = "--failure-rate") -> str | None:
    """A warning when a bare rate (each end of a range) is implausible per instance-hour: above
    :data:`PLAUSIBLE_MAX_RATE`. None when it is plausible, or written as a percentage."""
    pair = _pair(rate)
    for r in (pair if pair is not None else (rate,)):
        if not _bare(r):
            continue
        value = parse_failure_rate(r, field)
        if value > PLAUSIBLE_MAX_RATE:
            text = str(r).strip()
            return (f"{field} {text}: {value:g} failures per instance-hour ({value * 100:.3g} %) is above the "
                    f"highest published rate, {PLAUSIBLE_MAX_RATE * 100:.3g} % per instance-hour (docs/goodput.md, "
                    f"'Failure rates'): did you mean '{text}%' (a percentage), or {text} failures a day for the "
                    f"whole job (--failure-rate-per-day {text})? {RATE_UNIT}")
    return None


def rate_from_per_day(per_day: Any, instances: int, field: str = "failure_rate_per_day") -> Any:
    """A job's failures per day (all its ``instances``), as failures per instance-hour:
    ``per_day / (24 × instances)``; a range ``"lo:hi"`` or ``(lo, hi)`` gives a range. Llama 3's
    7.76 interruptions a day on 2,048 instances give 0.000158 (0.0158 %)."""
    n = checked_instances(instances)
    pair = _pair(per_day)

    def one(x: Any) -> float:
        try:
            v = float(x)
        except (TypeError, ValueError):
            raise GoodputInputError(field, f"{x!r} is not a number of failures a day (for the whole job)") from None
        if not math.isfinite(v) or v < 0:
            raise GoodputInputError(field, f"{x!r}: failures a day is a finite number, 0 or more")
        return v / (HOURS_PER_DAY * n)
    if pair is not None:
        return one(pair[0]), one(pair[1])
    return one(per_day)


def rate_inputs(instances: int, failure_rate: Any, per_day: Any, factor: float) -> tuple[tuple, str, list[str]]:
    """The failure-rate band of :func:`~hyperpod_lab.goodput.project` and
    :func:`~hyperpod_lab.goodput.advise` from exactly one of ``failure_rate`` (per instance-hour)
    and ``per_day`` (the job's failures a day): ``((low, mid, high), where it came from,
    warnings)``."""
    if (failure_rate is None) == (per_day is None):
        raise GoodputInputError("failure_rate", "give a failure rate per instance-hour (failure_rate, e.g. "
                                "'0.04%') or the job's failures a day (failure_rate_per_day), one of the two")
    if per_day is not None:
        rate = rate_from_per_day(per_day, instances)
        given = f"{per_day} failures a day on {checked_instances(instances)} instances"
        warnings = []
    else:
        rate, given = failure_rate, str(failure_rate)
        w = rate_warning(failure_rate, "failure_rate")
        warnings = [w] if w else []
    rates = rate_band(rate, factor=factor)
    kind = "range" if (isinstance(rate, (tuple, list)) or (isinstance(rate, str) and ":" in rate)) \
        else f"/{factor:g} to x{factor:g}"
    return rates, f"{given} ({kind})", warnings
