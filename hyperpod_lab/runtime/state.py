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
  cannot run code). Tensors must be dense (strided). Plain tensors are stored whole. A
  ``DTensor`` (FSDP2 ``fully_shard`` parameters and the optimizer state that follows them,
  HSDP's (replicate, shard) meshes, tensor parallelism) is stored as this rank's *local shard*
  (``to_local()``) plus its placement in the skeleton: the placements, global shape and stride,
  and its mesh (shape, dimension names, global ranks, device type). :func:`unflatten` gives a
  :class:`LocalShard` for it; :func:`apply` rebuilds it on the *live* state's mesh
  (``DTensor.from_local(..., run_check=False)``) and loads it bit for bit, after checking that
  the live tensor at the same place has the same mesh, placements and global shape (else
  ``ValueError`` naming the first mismatches; :func:`compatible` reports the same without
  loading, which is how the tiered checkpointer falls back to an older snapshot or the
  persistent tier, which reshards). ``ShardedTensor`` (FSDP1's sharded state dicts) raises
  ``TypeError``: use FSDP2, or the persistent tier.

torch.distributed.checkpoint costs ~1.3 s to import (it pulls in DTensor); it is imported on
first use so that importing this module (e.g. by the launcher) stays cheap.
"""

from __future__ import annotations

import base64
import json
import math
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import torch

KIND_MODULE, KIND_OPTIMIZER, KIND_STATEFUL, KIND_DICT = "module", "optimizer", "stateful", "dict"
FORMAT = 4
"""Version of the flat layout (:func:`capture`) and of the memory tier's slot files that hold it
(4: DTensor local shards with their placements; 3: JSON layout, HMAC-signed records; 2: pickled
layout, XXH3 checksums; 1 held zlib CRC-32s). A layout or slot of another format is never read."""
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


# ---- sharded tensors (DTensor): this rank's local shard plus its placement --------------------
def dtensor_type() -> type | None:
    """The DTensor class when ``torch.distributed.tensor`` is imported, else None (no DTensor
    can exist then; importing it costs ~1 s, which a plain state must not pay)."""
    mod = sys.modules.get("torch.distributed.tensor")
    return getattr(mod, "DTensor", None) if mod is not None else None


def _local_of(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (the tensor itself otherwise). ``_local_tensor`` is the attribute
    ``to_local()`` returns (FSDP2 reads it too); ``to_local()`` is an autograd function that costs
    ~10x more per call, which the snapshot's stall would pay per tensor."""
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return t
    local = getattr(t, "_local_tensor", None)
    if local is None:
        to_local = getattr(t, "to_local", None)
        if to_local is None:
            return t  # another tensor subclass: _strip names it
        with torch.no_grad():
            local = to_local()
    return local


def _enc_placement(p: Any, where: str) -> list:
    """A placement as JSON: ``["s", dim]`` Shard, ``["ss", dim, split_factor]`` _StridedShard (FSDP2
    over tensor parallelism), ``["r"]`` Replicate, ``["p", reduce_op]`` Partial.

    Raises:
        TypeError: another placement type.
    """
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard

    kind = type(p)
    if kind is _StridedShard:
        return ["ss", int(p.dim), int(p.split_factor)]
    if kind is Shard:
        return ["s", int(p.dim)]
    if kind is Replicate:
        return ["r"]
    if kind is Partial:
        return ["p", str(p.reduce_op)]
    raise TypeError(f"the memory tier stores DTensors placed by Shard, _StridedShard, Replicate or Partial; "
                    f"{where} has a {kind.__name__} placement")


def _placement_ok(x: Any) -> bool:
    if not isinstance(x, list) or not x or x[0] not in ("s", "ss", "r", "p"):
        return False
    ints = [v for v in x[1:] if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    return ((x[0] == "r" and len(x) == 1) or (x[0] == "s" and len(x) == 2 and len(ints) == 1)
            or (x[0] == "ss" and len(x) == 3 and len(ints) == 2)
            or (x[0] == "p" and len(x) == 2 and isinstance(x[1], str)))


def _mesh_desc(mesh: Any) -> dict[str, Any]:
    """``{"shape", "dims", "ranks", "device"}`` of a DeviceMesh: its shape, dimension names (or
    None), the global ranks it spans (row-major) and its device type."""
    dims = mesh.mesh_dim_names
    return {"shape": [int(d) for d in mesh.mesh.shape], "dims": None if dims is None else [str(d) for d in dims],
            "ranks": [int(r) for r in mesh.mesh.flatten().tolist()], "device": str(mesh.device_type)}


def _dtensor_spec(t: Any, where: str, meshes: dict[int, tuple[Any, dict]]) -> dict[str, Any]:
    """``{"mesh": mesh description, "placements", "shape", "stride"}`` of a DTensor (global shape
    and stride); ``meshes`` caches the descriptions by ``id(mesh)``."""
    mesh = t.device_mesh
    got = meshes.get(id(mesh))
    if got is None or got[0] is not mesh:
        got = meshes[id(mesh)] = (mesh, _mesh_desc(mesh))
    return {"mesh": got[1], "placements": [_enc_placement(p, where) for p in t.placements],
            "shape": [int(d) for d in t.shape], "stride": [int(d) for d in t.stride()]}


def _describe(spec: dict[str, Any] | None) -> str:
    """A placement spec in words, for error messages."""
    if spec is None:
        return "a plain (unsharded) tensor"
    names = {"s": "Shard", "ss": "_StridedShard", "r": "Replicate", "p": "Partial"}
    pl = ", ".join(f"{names[p[0]]}({', '.join(map(str, p[1:]))})" for p in spec["placements"])
    m = spec["mesh"]
    dims = "" if m["dims"] is None else f" {tuple(m['dims'])}"
    return (f"a DTensor [{pl}] of global shape {tuple(spec['shape'])} on a {m['device']} mesh of shape "
            f"{tuple(m['shape'])}{dims} over ranks {_ranks_text(m['ranks'])}")


def _ranks_text(ranks: list[int]) -> str:
    return str(ranks) if len(ranks) <= 8 else f"[{ranks[0]}, {ranks[1]}, ..., {ranks[-1]}] ({len(ranks)})"


@dataclass
class LocalShard:
    """A DTensor's local shard read back from a snapshot by :func:`unflatten`; :func:`apply`
    rebuilds the DTensor on the live state's mesh.

    Attributes:
        local: this rank's shard, a fresh CPU tensor (the local shape, which may have 0 elements).
        spec: ``{"mesh": {"shape", "dims", "ranks", "device"}, "placements": [[kind, ...], ...],
            "shape": global shape, "stride": global stride}`` as the snapshot recorded it.
    """

    local: torch.Tensor
    spec: dict[str, Any]


# ---- the flat layout ----------------------------------------------------------------------------
@dataclass
class Captured:
    """A state taken apart for copying: the tensors, where they go, and everything else as JSON.

    Attributes:
        tensors: the state's tensors, in layout order (references to the live tensors, not copies;
            a DTensor's entry is its local shard).
        deferrable: per tensor, whether overlap mode may copy it after ``snapshot`` returned
            (parameters and optimizer ``state`` tensors: only the optimizer step changes them).
        offsets: byte offset of each tensor in the flat buffer (multiples of :data:`ALIGN`).
        nbytes: bytes the flat buffer must hold.
        meta: the skeleton {format, kinds, tree, layout, nbytes, dtensors, meshes} as UTF-8 JSON
            (:func:`load_meta`); non-tensor values are encoded here, i.e. captured when
            :func:`capture` runs.
        layout: ``((offset, dtype name, local shape), ...)`` per tensor.
    """

    tensors: list[torch.Tensor]
    deferrable: list[bool]
    offsets: list[int]
    nbytes: int
    meta: bytes
    layout: tuple = ()


class _Acc:
    """What :func:`_strip` collects: the tensors, their deferrability, and DTensor placements."""

    __slots__ = ("tensors", "deferrable", "specs", "meshes", "dtensor")

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.deferrable: list[bool] = []
        self.specs: dict[int, dict[str, Any]] = {}
        self.meshes: dict[int, tuple[Any, dict]] = {}
        self.dtensor = dtensor_type()


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


def _check_dense(t: torch.Tensor, path: tuple) -> None:
    if t.layout != torch.strided or t.is_quantized or t.device.type == "meta":
        raise TypeError(f"the memory tier holds dense tensors; {'/'.join(map(str, path))} is "
                        f"{t.layout}/{t.device.type}")


def _strip(obj: Any, acc: _Acc, defer: Callable[[torch.Tensor, tuple], bool], path: tuple) -> Any:
    """``obj`` with each tensor replaced by a :class:`_Ref`; the tensors (a DTensor's local shard)
    appended to ``acc``."""
    if isinstance(obj, torch.Tensor):
        kind = type(obj)
        if kind not in (torch.Tensor, torch.nn.Parameter):
            where = "/".join(map(str, path))
            if acc.dtensor is not None and isinstance(obj, acc.dtensor):
                local = _local_of(obj)
                _check_dense(local, path)
                acc.specs[len(acc.tensors)] = _dtensor_spec(obj, where, acc.meshes)
                obj = local
            elif any(c.__name__ == "ShardedTensor" for c in kind.__mro__):
                raise TypeError(f"the memory tier does not hold ShardedTensor (FSDP1's sharded state dict): "
                                f"{where}; shard with FSDP2 (fully_shard, DTensor state), or checkpoint "
                                f"this state with the persistent tier only")
            else:
                raise TypeError(f"the memory tier holds plain tensors and DTensors; {where} is a {kind.__name__}")
        else:
            _check_dense(obj, path)
        acc.tensors.append(obj)  # copied under no_grad: no need to detach
        acc.deferrable.append(bool(defer(obj, path)))
        return _Ref(len(acc.tensors) - 1)
    if isinstance(obj, dict):
        try:
            out = type(obj)()
        except TypeError:
            out = {}
        for k, v in obj.items():
            out[k] = _strip(v, acc, defer, path + (k,))
        meta = getattr(obj, "_metadata", None)  # nn.Module.state_dict() versions (load_state_dict uses them)
        if meta is not None:
            try:
                out._metadata = meta
            except AttributeError:
                pass
        return out
    if isinstance(obj, list):
        return [_strip(v, acc, defer, path + (i,)) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        items = [_strip(v, acc, defer, path + (i,)) for i, v in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def capture(state: dict[str, Any]) -> Captured:
    """Take ``state`` apart: its tensors (not copied; a DTensor's local shard) and a JSON
    skeleton of everything else, with each DTensor's placement.

    Args:
        state: ``{name: nn.Module | Optimizer | Stateful | dict}``.

    Returns:
        A :class:`Captured`.

    Raises:
        TypeError: an unsupported value (:func:`classify`), a ShardedTensor, another tensor
            subclass, a non-dense tensor, a DTensor placement other than Shard/_StridedShard/
            Replicate/Partial, or a non-tensor value the JSON skeleton cannot hold (see
            :func:`_enc`: e.g. an arbitrary object).
    """
    kinds = classify(state)
    acc = _Acc()
    tree: dict[str, Any] = {}
    for key, value in state.items():
        kind = kinds[key]
        if kind == KIND_MODULE:
            params = {loc.data_ptr() for loc in map(_local_of, value.parameters()) if loc.numel()}
            sd = value.state_dict()
            tree[key] = _strip(sd, acc, lambda t, _p, s=params: t.data_ptr() in s, (key,))
        elif kind == KIND_OPTIMIZER:
            # only the optimizer step changes its per-parameter state; param_groups may hold tensors
            # an LR scheduler changes between steps: copied at once
            tree[key] = _strip(value.state_dict(), acc, lambda _t, p: len(p) > 1 and p[1] == "state", (key,))
        elif kind == KIND_STATEFUL:
            tree[key] = _strip(value.state_dict(), acc, lambda _t, _p: False, (key,))
        else:
            tree[key] = _strip(value, acc, lambda _t, _p: False, (key,))
    offsets, layout, pos = [], [], 0
    for t in acc.tensors:
        offsets.append(pos)
        layout.append((pos, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
        pos = _round_up(pos + t.numel() * t.element_size(), ALIGN)
    mesh_index = {id(d): i for i, (_m, d) in enumerate(acc.meshes.values())}
    dtensors = [[i, {"m": mesh_index[id(sp["mesh"])], "p": sp["placements"], "g": sp["shape"], "st": sp["stride"]}]
                for i, sp in acc.specs.items()]
    body = {"format": FORMAT, "kinds": kinds, "tree": _enc(tree, ()), "layout": [list(x) for x in layout],
            "nbytes": pos, "dtensors": dtensors, "meshes": [d for _m, d in acc.meshes.values()]}
    meta = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    return Captured(acc.tensors, acc.deferrable, offsets, pos, meta, tuple(layout))


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


def _nat(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _load_dtensors(out: dict[str, Any], n_tensors: int) -> dict[int, dict[str, Any]]:
    """The ``dtensors``/``meshes`` entries of a layout, checked: ``{tensor index: spec}``
    (spec as :class:`LocalShard` describes it)."""
    meshes, dts = out.get("meshes"), out.get("dtensors")
    if not isinstance(meshes, list) or not isinstance(dts, list):
        raise ValueError("malformed memory-tier layout (DTensor entries)")
    for m in meshes:
        if not (isinstance(m, dict) and set(m) == {"shape", "dims", "ranks", "device"}
                and isinstance(m["shape"], list) and m["shape"] and all(_nat(d) and d > 0 for d in m["shape"])
                and isinstance(m["ranks"], list) and len(m["ranks"]) == math.prod(m["shape"])
                and all(_nat(r) for r in m["ranks"]) and isinstance(m["device"], str)
                and (m["dims"] is None or (isinstance(m["dims"], list) and len(m["dims"]) == len(m["shape"])
                                           and all(isinstance(d, str) for d in m["dims"])))):
            raise ValueError("malformed device mesh in a memory-tier layout")
    specs: dict[int, dict[str, Any]] = {}
    for item in dts:
        if not (isinstance(item, list) and len(item) == 2 and _nat(item[0]) and item[0] < n_tensors
                and item[0] not in specs and isinstance(item[1], dict) and set(item[1]) == {"m", "p", "g", "st"}):
            raise ValueError("malformed DTensor entry in a memory-tier layout")
        i, d = item
        if not (_nat(d["m"]) and d["m"] < len(meshes) and isinstance(d["p"], list)
                and len(d["p"]) == len(meshes[d["m"]]["shape"]) and all(_placement_ok(p) for p in d["p"])
                and isinstance(d["g"], list) and all(_nat(x) for x in d["g"]) and isinstance(d["st"], list)
                and len(d["st"]) == len(d["g"]) and all(_nat(x) for x in d["st"])):
            raise ValueError("malformed DTensor entry in a memory-tier layout")
        specs[i] = {"mesh": meshes[d["m"]], "placements": d["p"], "shape": d["g"], "stride": d["st"]}
    return specs


def load_meta(meta: bytes) -> dict[str, Any]:
    """Parse a layout skeleton written by :func:`capture` (JSON: reading it runs no code; the
    tiers authenticate it before they get here).

    Returns:
        ``{format, kinds, tree, layout: [(offset, dtype name, local shape), ...], nbytes,
        dtensors: {tensor index: placement spec}, meshes}``.

    Raises:
        ValueError: not JSON, not a layout of this :data:`FORMAT`, or malformed (a bad tag, a
            tensor outside ``nbytes``, an unknown dtype, a malformed DTensor placement or mesh).
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
    out["dtensors"] = _load_dtensors(out, len(checked))
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


def _rebuild(obj: Any, leaf: Callable[[Any, tuple], Any], path: tuple = ()) -> Any:
    """``obj`` with every leaf (:class:`_Ref`, tensor, :class:`LocalShard`) replaced by
    ``leaf(value, path)``; dicts are updated in place, lists and tuples rebuilt."""
    if isinstance(obj, (_Ref, torch.Tensor, LocalShard)):
        return leaf(obj, path)
    if isinstance(obj, dict):
        for k in list(obj):
            obj[k] = _rebuild(obj[k], leaf, path + (k,))
        return obj
    if isinstance(obj, list):
        return [_rebuild(v, leaf, path + (i,)) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        items = [_rebuild(v, leaf, path + (i,)) for i, v in enumerate(obj)]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return obj


def unflatten(meta: dict[str, Any], buf: torch.Tensor) -> dict[str, Any]:
    """Rebuild the state tree from a flat buffer: every tensor a fresh CPU copy (the buffer is
    reused later); a DTensor's local shard as a :class:`LocalShard` (:func:`apply` puts it on the
    live mesh).

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
    specs = meta.get("dtensors", {})
    tensors: list[Any] = []
    for i, (off, dt, shape) in enumerate(meta["layout"]):
        t = tensor_view(buf, off, _dtype(dt), tuple(shape)).clone()
        tensors.append(LocalShard(t, specs[i]) if i in specs else t)
    return {k: _rebuild(v, lambda ref, _p: tensors[ref.i]) for k, v in meta["tree"].items()}


# ---- matching a snapshot's placements with the live state -----------------------------------------
_MISSING = object()


def _lookup(tree: Any, path: tuple) -> Any:
    for k in path:
        if isinstance(tree, dict) and k in tree:
            tree = tree[k]
        elif isinstance(tree, (list, tuple)) and isinstance(k, int) and 0 <= k < len(tree):
            tree = tree[k]
        else:
            return _MISSING
    return tree


def _leaves(obj: Any, path: tuple = ()):
    """``(path, leaf)`` for every :class:`_Ref`, tensor and :class:`LocalShard` in a tree."""
    if isinstance(obj, (_Ref, torch.Tensor, LocalShard)):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))


def _match(state: dict[str, Any], kinds: dict[str, str], saved: dict[str, Any],
           spec_of: Callable[[Any], dict[str, Any] | None]) -> tuple[list[str], dict[tuple, Any]]:
    """Pair each saved tensor with the live tensor at the same place and compare placements.

    An optimizer's per-parameter state that does not exist yet (no step taken since the
    process started) is matched with its parameter, whose placement it will have.

    Returns:
        ``(problems, live)``: a sentence per mismatch (a DTensor shard where the live state has a
        plain tensor or nothing, a plain tensor where it has a DTensor, or another mesh,
        placement or global shape), and ``{(key, *path): live DTensor}`` for every saved shard.
    """
    problems: list[str] = []
    live_refs: dict[tuple, Any] = {}
    dtensor = dtensor_type()
    meshes: dict[int, tuple[Any, dict]] = {}
    for key, value in state.items():
        kind = kinds[key]
        part = saved.get(key)
        leaves = list(_leaves(part))
        if dtensor is None and not any(spec_of(leaf) is not None for _p, leaf in leaves):
            continue  # no DTensor on either side
        live_tree = value if kind == KIND_DICT else value.state_dict()
        params = [p for g in value.param_groups for p in g["params"]] if kind == KIND_OPTIMIZER else None
        for path, leaf in leaves:
            spec = spec_of(leaf)
            where = "/".join(map(str, (key,) + path))
            live = _lookup(live_tree, path)
            if (live is _MISSING and spec is not None and params is not None and len(path) == 3 and path[0] == "state"
                    and isinstance(path[1], int) and 0 <= path[1] < len(params)):
                live = params[path[1]]  # exp_avg & co. take their parameter's placement, shape and stride
            live_is_dt = dtensor is not None and isinstance(live, dtensor)
            if spec is None:
                if live_is_dt:
                    problems.append(f"{where}: the snapshot holds a plain (unsharded) tensor, the live state "
                                    f"{_describe(_dtensor_spec(live, where, meshes))}")
                continue
            if not live_is_dt:
                have = "no value" if live is _MISSING else (
                    "a plain (unsharded) tensor" if isinstance(live, torch.Tensor) else f"a {type(live).__name__}")
                problems.append(f"{where}: the snapshot holds {_describe(spec)}, the live state has {have} there")
                continue
            now = _dtensor_spec(live, where, meshes)
            if now != spec:
                problems.append(f"{where}: the snapshot holds {_describe(spec)}, the live state {_describe(now)}")
                continue
            live_refs[(key,) + path] = live
    return problems, live_refs


def _problems_text(problems: list[str]) -> str:
    more = f" (and {len(problems) - 2} more)" if len(problems) > 2 else ""
    return ("the snapshot's sharding does not match the live state's: " + "; ".join(problems[:2]) + more
            + ". The mesh or the parallelism changed since the snapshot was taken; restore from the "
              "persistent tier (DCP reshards), or rebuild the job with the snapshot's mesh")


def compatible(meta: dict[str, Any], state: dict[str, Any]) -> str | None:
    """None when a layout with ``meta`` can be loaded into ``state``, else the reason: other keys
    or kinds, or a DTensor whose mesh, placements or global shape differ from the live tensor's
    at the same place (or a sharded tensor where the live one is plain, or the reverse).

    Raises:
        TypeError: as :func:`classify`.
    """
    kinds = classify(state)
    if kinds != meta.get("kinds"):
        return f"the snapshot holds {meta.get('kinds')}, the state is {kinds}"
    specs = meta.get("dtensors", {})
    problems, _live = _match(state, kinds, meta["tree"],
                             lambda leaf: specs.get(leaf.i) if isinstance(leaf, _Ref) else None)
    return _problems_text(problems) if problems else None


def apply(state: dict[str, Any], tree: dict[str, Any]) -> None:
    """Load a tree from :func:`unflatten` into the live ``state`` (modules, optimizers, ... in place).

    Each :class:`LocalShard` becomes a DTensor on the mesh of the live DTensor at the same place
    (``DTensor.from_local(shard, live mesh, live placements, shape=, stride=, run_check=False)``,
    on the live tensor's device), which ``load_state_dict`` then copies into the live shard.

    Raises:
        TypeError: as :func:`classify`.
        ValueError: the tree does not have the state's keys, or its sharding does not match the
            live state's (the message names the first mismatches: see :func:`compatible`).
        RuntimeError: ``load_state_dict`` rejected it (e.g. the model changed shape).
    """
    kinds = classify(state)
    if set(tree) != set(kinds):
        raise ValueError(f"the snapshot holds {sorted(tree)}, the state has {sorted(kinds)}")
    problems, live_refs = _match(state, kinds, tree, lambda leaf: leaf.spec if isinstance(leaf, LocalShard) else None)
    if problems:
        raise ValueError(_problems_text(problems))
    if live_refs:
        from torch.distributed.tensor import DTensor

        def to_dtensor(leaf: Any, path: tuple) -> Any:
            if not isinstance(leaf, LocalShard):
                return leaf
            live = live_refs[path]
            local = leaf.local.to(_local_of(live).device)
            return DTensor.from_local(local, live.device_mesh, live.placements, run_check=False,
                                      shape=live.shape, stride=live.stride())

        tree = {k: _rebuild(v, lambda leaf, p, k=k: to_dtensor(leaf, (k,) + p)) for k, v in tree.items()}
    for key, value in state.items():
        if kinds[key] == KIND_DICT:
            copy_into(value, tree[key])
        else:
            value.load_state_dict(tree[key])
