"""What a training state may hold, decided once, and the two ways the tiers take it apart.

A *training state* is what a checkpoint tier protects: a non-empty dict with string keys whose
values are each one of

=============== ===========================================================================
kind            value
=============== ===========================================================================
``module``      a ``torch.nn.Module`` (its ``state_dict``; DDP/FSDP-aware in the persistent tier)
``optimizer``   a ``torch.optim.Optimizer`` (its ``state_dict``)
``stateful``    any object with ``state_dict()`` and ``load_state_dict()`` (DCP's ``Stateful``)
``dict``        a plain dict of tensors, numbers, strings, lists, nested dicts; restored in
                place (tensors are ``copy_``-ed into the existing ones, so references the
                caller holds stay valid)
=============== ===========================================================================

:func:`classify` is the one judge of that (every tier calls it, so every tier rejects the same
values with the same ``TypeError``). The tiers then take the state apart their own way:

* the persistent tier (DCP) through :func:`to_dcp`: modules and optimizers become ``Stateful``
  adapters (an optimizer is keyed by the parameter FQNs of the module that owns all its
  parameters, so it reshards);
* the memory tier through :func:`capture` / :func:`unflatten` / :func:`apply`: the state's
  tensors laid out in one flat byte buffer (each at a multiple of :data:`ALIGN` bytes) and a
  JSON skeleton of everything else (:func:`_enc`: never pickle, so reading a layout back
  cannot run code). Tensors must be dense (strided) plain tensors; sharded
  ones (DTensor, ShardedTensor) raise ``TypeError`` (the memory tier holds this rank's state, so
  DDP-style replication is the supported case).

torch.distributed.checkpoint costs ~1.3 s to import (it pulls in DTensor); it is imported on
first use so that importing this module (e.g. by the launcher) stays cheap.
"""

from __future__ import annotations

import base64
import json
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

KIND_MODULE, KIND_OPTIMIZER, KIND_STATEFUL, KIND_DICT = "module", "optimizer", "stateful", "dict"
FORMAT = 3
"""Version of the flat layout (:func:`capture`) and of the memory tier's slot files that hold it
(3: JSON layout, HMAC-signed records; 2: pickled layout, XXH3 checksums; 1 held zlib CRC-32s).
A layout or slot of another format is never read."""
ALIGN = 64
"""Byte alignment of every tensor in a flat layout (any dtype's element size divides it)."""


# ---- classification -----------------------------------------------------------------------------
def is_stateful(value: Any) -> bool:
    """Whether ``value`` has callable ``state_dict()`` and ``load_state_dict()`` (DCP's ``Stateful``)."""
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def classify(state: dict[str, Any]) -> dict[str, str]:
    """The kind of each value of a training state (see the module docstring).

    Args:
        state: ``{name: nn.Module | Optimizer | Stateful | dict}``.

    Returns:
        ``{name: kind}``, kind one of :data:`KIND_MODULE`, :data:`KIND_OPTIMIZER`,
        :data:`KIND_STATEFUL`, :data:`KIND_DICT`, in ``state``'s order.

    Raises:
        TypeError: ``state`` is not a non-empty dict, a key is not a string, or a value is none
            of the kinds above.
    """
    if not isinstance(state, dict) or not state:
        raise TypeError("state must be a non-empty dict such as {'model': model, 'optim': optimizer}")
    kinds = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"state keys must be strings, got {key!r}")
        if isinstance(value, torch.nn.Module):
            kinds[key] = KIND_MODULE
        elif isinstance(value, torch.optim.Optimizer):
            kinds[key] = KIND_OPTIMIZER
        elif is_stateful(value):
            kinds[key] = KIND_STATEFUL
        elif isinstance(value, dict):
            kinds[key] = KIND_DICT
        else:
            raise TypeError(f"state[{key!r}] is a {type(value).__name__}; give an nn.Module, an Optimizer, "
                            f"an object with state_dict()/load_state_dict(), or a dict of tensors/numbers")
    return kinds


def copy_into(dst: dict[str, Any], src: dict[str, Any]) -> None:
    """Update a user's plain dict in place from a loaded one: tensors of the same shape are
    ``copy_``-ed (so references the caller holds stay valid), nested dicts updated the same
    way, everything else replaced."""
    for k, v in src.items():
        cur = dst.get(k)
        if isinstance(cur, torch.Tensor) and isinstance(v, torch.Tensor) and cur.shape == v.shape:
            with torch.no_grad():
                cur.copy_(v)
        elif isinstance(cur, dict) and isinstance(v, dict):
            copy_into(cur, v)
        else:
            dst[k] = v


# ---- the persistent tier's view: DCP Stateful adapters ---------------------------------------------
# They satisfy DCP's runtime-checkable ``Stateful`` protocol structurally.
class _ModelState:
    """An ``nn.Module`` as DCP state, via ``get/set_model_state_dict`` (FQN keys; DDP/FSDP aware)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(self.model)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict

        set_model_state_dict(self.model, state_dict)


class _OptimState:
    """An optimizer as DCP state, keyed by parameter FQNs of ``model`` (so it reshards)."""

    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer):
        self.model, self.optim = model, optim

    def state_dict(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.optim)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optim, state_dict)


class _PlainOptimState:
    """An optimizer whose parameters belong to no module in the state: its own state_dict."""

    def __init__(self, optim: torch.optim.Optimizer):
        self.optim = optim

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)


def to_dcp(state: dict[str, Any]) -> dict[str, Any]:
    """Map a training state to DCP state: modules and optimizers become Stateful adapters,
    pairing each optimizer with the module that owns all its parameters; Stateful objects and
    plain dicts pass through (the same objects).

    Raises:
        TypeError: as :func:`classify`.
    """
    kinds = classify(state)
    modules = [v for k, v in state.items() if kinds[k] == KIND_MODULE]
    out: dict[str, Any] = {}
    for key, value in state.items():
        if kinds[key] == KIND_MODULE:
            out[key] = _ModelState(value)
        elif kinds[key] == KIND_OPTIMIZER:
            params = {id(p) for g in value.param_groups for p in g["params"]}
            owner = next((m for m in modules if params <= {id(p) for p in m.parameters()}), None)
            out[key] = _OptimState(owner, value) if owner is not None else _PlainOptimState(value)
        else:
            out[key] = value
    return out


# ---- the memory tier's view: one flat buffer plus a JSON skeleton ------------------------------
class _Ref:
    """Placeholder for the ``i``-th tensor in a state skeleton."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i


_MAX_DEPTH = 200


def _enc(obj: Any, path: tuple, depth: int = 0) -> Any:
    """One value of a skeleton as JSON: None, bools, ints, strings and finite floats as they are,
    lists as arrays, everything else as a one-key tagged object (``{"t": i}`` a tensor
    reference, ``{"f": "nan"}`` a non-finite float, ``{"tu": [...]}`` a tuple, ``{"d": [[k, v],
    ...], "o": ordered, "m": _metadata}`` a dict, ``{"b": base64}`` bytes, ``{"dt": name}`` a
    dtype, ``{"dev": name}`` a device, ``{"c": [re, im]}`` a complex)."""
    if depth > _MAX_DEPTH:
        raise TypeError(f"the state is nested more than {_MAX_DEPTH} levels deep at {'/'.join(map(str, path))}")
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else {"f": repr(float(obj))}
    if isinstance(obj, _Ref):
        return {"t": obj.i}
    if isinstance(obj, list):
        return [_enc(v, path + (i,), depth + 1) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):  # a namedtuple comes back as a plain tuple
        return {"tu": [_enc(v, path + (i,), depth + 1) for i, v in enumerate(obj)]}
    if isinstance(obj, dict):
        out: dict[str, Any] = {"d": [[_enc(k, path, depth + 1), _enc(v, path + (k,), depth + 1)]
                                     for k, v in obj.items()]}
        meta = getattr(obj, "_metadata", None)
        if meta is not None:
            out["m"] = _enc(meta, path + ("_metadata",), depth + 1)
        if meta is not None or type(obj) is not dict:
            out["o"] = True
        return out
    if isinstance(obj, (bytes, bytearray)):
        return {"b": base64.b64encode(bytes(obj)).decode()}
    if isinstance(obj, torch.dtype):
        return {"dt": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"dev": str(obj)}
    if isinstance(obj, complex):
        return {"c": [obj.real, obj.imag]}
    raise TypeError(f"the memory tier stores tensors, numbers, strings, bytes, lists, tuples and dicts; "
                    f"{'/'.join(map(str, path)) or 'a value'} is a {type(obj).__name__}")


def _dec(obj: Any) -> Any:
    """Inverse of :func:`_enc`; builds only the types listed there.

    Raises:
        ValueError: an unknown tag or a malformed value.
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [_dec(v) for v in obj]
    if not isinstance(obj, dict) or len(obj) not in (1, 2, 3):
        raise ValueError(f"malformed layout value {str(obj)[:80]!r}")
    if "t" in obj and len(obj) == 1 and isinstance(obj["t"], int) and not isinstance(obj["t"], bool):
        return _Ref(obj["t"])
    if "f" in obj and len(obj) == 1 and obj["f"] in ("nan", "inf", "-inf"):
        return float(obj["f"])
    if "tu" in obj and len(obj) == 1 and isinstance(obj["tu"], list):
        return tuple(_dec(v) for v in obj["tu"])
    if "d" in obj and isinstance(obj["d"], list) and set(obj) <= {"d", "o", "m"}:
        out: dict = OrderedDict() if obj.get("o") else {}
        for pair in obj["d"]:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ValueError("malformed dict entry in a layout")
            key = _dec(pair[0])
            if isinstance(key, (dict, list)):
                raise ValueError("unhashable dict key in a layout")
            out[key] = _dec(pair[1])
        if "m" in obj:
            out._metadata = _dec(obj["m"])  # type: ignore[attr-defined]
        return out
    if "b" in obj and len(obj) == 1 and isinstance(obj["b"], str):
        return base64.b64decode(obj["b"], validate=True)
    if "dt" in obj and len(obj) == 1 and isinstance(obj["dt"], str):
        return _dtype(obj["dt"])
    if "dev" in obj and len(obj) == 1 and isinstance(obj["dev"], str):
        return torch.device(obj["dev"])
    if "c" in obj and len(obj) == 1 and isinstance(obj["c"], list) and len(obj["c"]) == 2:
        return complex(float(obj["c"][0]), float(obj["c"][1]))
    raise ValueError(f"unknown layout value {str(obj)[:80]!r}")


@dataclass
class Captured:
    """A state taken apart for copying: the tensors, where they go, and everything else as JSON.

    Attributes:
        tensors: the state's tensors, in layout order (references to the live tensors, not copies).
        deferrable: per tensor, whether overlap mode may copy it after ``snapshot`` returned
            (parameters and optimizer ``state`` tensors: only the optimizer step changes them).
        offsets: byte offset of each tensor in the flat buffer (multiples of :data:`ALIGN`).
        nbytes: bytes the flat buffer must hold.
        meta: the skeleton {format, kinds, tree, layout, nbytes} as UTF-8 JSON (:func:`load_meta`);
            non-tensor values are encoded here, i.e. captured when :func:`capture` runs.
        layout: ``((offset, dtype name, shape), ...)`` per tensor.
    """

    tensors: list[torch.Tensor]
    deferrable: list[bool]
    offsets: list[int]
    nbytes: int
    meta: bytes
    layout: tuple = ()


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _strip(obj: Any, tensors: list[torch.Tensor], deferrable: list[bool],
           defer: Callable[[torch.Tensor, tuple], bool], path: tuple) -> Any:
    """``obj`` with each tensor replaced by a :class:`_Ref`; the tensors appended to ``tensors``."""
    if isinstance(obj, torch.Tensor):
        if type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise TypeError(f"the memory tier holds plain tensors; {'/'.join(map(str, path))} is a "
                            f"{type(obj).__name__} (sharded state is not supported yet)")
        if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta":
            raise TypeError(f"the memory tier holds dense tensors; {'/'.join(map(str, path))} is "
                            f"{obj.layout}/{obj.device.type}")
        tensors.append(obj)  # copied under no_grad: no need to detach
        deferrable.append(bool(defer(obj, path)))
        return _Ref(len(tensors) - 1)
    if isinstance(obj, dict):
        try:
            out = type(obj)()
        except TypeError:
            out = {}
        for k, v in obj.items():
            out[k] = _strip(v, tensors, deferrable, defer, path + (k,))
        meta = getattr(obj, "_metadata", None)  # nn.Module.state_dict() versions (load_state_dict uses them)
        if meta is not None:
            try:
                out._metadata = meta
            except AttributeError:
                pass
        return out
    if isinstance(obj, list):
        return [_strip(v, tensors, deferrable, defer, path + (i,)) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        items = [_strip(v, tensors, deferrable, defer, path + (i,)) for i, v in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def capture(state: dict[str, Any]) -> Captured:
    """Take ``state`` apart: its tensors (not copied) and a JSON skeleton of everything else.

    Args:
        state: ``{name: nn.Module | Optimizer | Stateful | dict}``.

    Returns:
        A :class:`Captured`.

    Raises:
        TypeError: an unsupported value (:func:`classify`), a sharded or non-dense tensor, or a
            non-tensor value the JSON skeleton cannot hold (see :func:`_enc`: e.g. an arbitrary
            object).
    """
    kinds = classify(state)
    tensors: list[torch.Tensor] = []
    deferrable: list[bool] = []
    tree: dict[str, Any] = {}
    for key, value in state.items():
        kind = kinds[key]
        if kind == KIND_MODULE:
            params = {p.data_ptr() for p in value.parameters() if p.numel()}
            sd = value.state_dict()
            tree[key] = _strip(sd, tensors, deferrable, lambda t, _p, s=params: t.data_ptr() in s, (key,))
        elif kind == KIND_OPTIMIZER:
            # only the optimizer step changes its per-parameter state; param_groups may hold tensors
            # an LR scheduler changes between steps: copied at once
            tree[key] = _strip(value.state_dict(), tensors, deferrable,
                               lambda _t, p: len(p) > 1 and p[1] == "state", (key,))
        elif kind == KIND_STATEFUL:
            tree[key] = _strip(value.state_dict(), tensors, deferrable, lambda _t, _p: False, (key,))
        else:
            tree[key] = _strip(value, tensors, deferrable, lambda _t, _p: False, (key,))
    offsets, layout, pos = [], [], 0
    for t in tensors:
        offsets.append(pos)
        layout.append((pos, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        pos = _round_up(pos + t.numel() * t.element_size(), ALIGN)
    body = {"format": FORMAT, "kinds": kinds, "tree": _enc(tree, ()), "layout": [list(x) for x in layout],
            "nbytes": pos}
    meta = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    return Captured(tensors, deferrable, offsets, pos, meta, tuple(layout))


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a snapshot layout")
    return dt


def tensor_view(buf: torch.Tensor, offset: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor of ``dtype``/``shape`` stored at byte ``offset`` of the uint8 buffer ``buf``
    (a view, no copy)."""
    nb = math.prod(shape) * dtype.itemsize
    return buf[offset:offset + nb].view(dtype).view(shape)


def load_meta(meta: bytes) -> dict[str, Any]:
    """Parse a layout skeleton written by :func:`capture` (JSON: reading it runs no code; the
    tiers authenticate it before they get here).

    Returns:
        ``{format, kinds, tree, layout: [(offset, dtype name, shape), ...], nbytes}``.

    Raises:
        ValueError: not JSON, not a layout of this :data:`FORMAT`, or malformed (a bad tag, a
            tensor outside ``nbytes``, an unknown dtype).
    """
    try:
        out = json.loads(meta)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"not a hyperpod-lab memory-tier layout: {type(e).__name__}") from None
    if not isinstance(out, dict) or out.get("format") != FORMAT:
        raise ValueError("not a hyperpod-lab memory-tier layout (format mismatch)")
    nbytes, kinds, layout = out.get("nbytes"), out.get("kinds"), out.get("layout")
    if (not isinstance(nbytes, int) or nbytes < 0 or not isinstance(kinds, dict) or not isinstance(layout, list)
            or not isinstance(out.get("tree"), dict)):
        raise ValueError("malformed memory-tier layout")
    checked = []
    for item in layout:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], int) and item[0] >= 0
                and isinstance(item[1], str) and isinstance(item[2], list)
                and all(isinstance(d, int) and d >= 0 for d in item[2])):
            raise ValueError("malformed tensor entry in a memory-tier layout")
        dt = _dtype(item[1])
        if item[0] + math.prod(item[2]) * dt.itemsize > nbytes:
            raise ValueError("a tensor of the layout lies outside its buffer")
        checked.append((item[0], item[1], tuple(item[2])))
    try:
        tree = _dec(out["tree"])
    except RecursionError:
        raise ValueError("memory-tier layout nested too deeply") from None
    refs = len(checked)

    def check_refs(obj: Any) -> None:
        if isinstance(obj, _Ref):
            if not 0 <= obj.i < refs:
                raise ValueError("a layout references a tensor it does not list")
        elif isinstance(obj, dict):
            for v in obj.values():
                check_refs(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                check_refs(v)

    check_refs(tree)
    if not isinstance(tree, dict):
        raise ValueError("malformed memory-tier layout")
    out["tree"], out["layout"] = tree, checked
    return out


def unflatten(meta: dict[str, Any], buf: torch.Tensor) -> dict[str, Any]:
    """Rebuild the state tree from a flat buffer: every tensor a fresh CPU copy (the buffer is
    reused later).

    Args:
        meta: :func:`load_meta` of the layout.
        buf: the data, a CPU uint8 tensor of at least ``meta["nbytes"]`` bytes.

    Returns:
        ``{name: state_dict or dict}``, the structure :func:`capture` saw.

    Raises:
        ValueError: ``buf`` is shorter than the layout, or the layout names an unknown dtype.
    """
    if buf.numel() < meta["nbytes"]:
        raise ValueError(f"slot holds {buf.numel()} bytes, the layout needs {meta['nbytes']}")
    tensors = [tensor_view(buf, off, _dtype(dt), tuple(shape)).clone() for off, dt, shape in meta["layout"]]

    def fill(obj: Any) -> Any:
        if isinstance(obj, _Ref):
            return tensors[obj.i]
        if isinstance(obj, dict):
            for k in list(obj):
                obj[k] = fill(obj[k])
            return obj
        if isinstance(obj, list):
            return [fill(v) for v in obj]
        if isinstance(obj, tuple):
            items = [fill(v) for v in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
        return obj

    return {k: fill(v) for k, v in meta["tree"].items()}


def compatible(meta: dict[str, Any], state: dict[str, Any]) -> str | None:
    """None when a layout with ``meta`` can be loaded into ``state`` (same keys and kinds), else
    the reason.

    Raises:
        TypeError: as :func:`classify`.
    """
    kinds = classify(state)
    if kinds != meta.get("kinds"):
        return f"the snapshot holds {meta.get('kinds')}, the state is {kinds}"
    return None


def apply(state: dict[str, Any], tree: dict[str, Any]) -> None:
    """Load a tree from :func:`unflatten` into the live ``state`` (modules, optimizers, ... in place).

    Raises:
        TypeError: as :func:`classify`.
        ValueError: the tree does not have the state's keys.
        RuntimeError: ``load_state_dict`` rejected it (e.g. the model changed shape).
    """
    kinds = classify(state)
    if set(tree) != set(kinds):
        raise ValueError(f"the snapshot holds {sorted(tree)}, the state has {sorted(kinds)}")
    for key, value in state.items():
        if kinds[key] == KIND_DICT:
            copy_into(value, tree[key])
        else:
            value.load_state_dict(tree[key])
