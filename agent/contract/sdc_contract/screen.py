"""The node screen (``python -m sdc_agent.screen``): its workload's JSON form and its result.

The screen runs on one node, from the training image, as a Kubernetes Job (a Screen step of the
workflow on a cordoned node; on a schedule on idle and standby nodes). It runs a list of ops (a
*workload*: the job's own GEMM, attention, norm and reduction shapes, bounded in size, plus a
fixed suite) on every GPU of the node on seeded inputs and compares the results' fingerprints
across the GPUs and with golden digests. Its result is one JSON document, the pod's termination
message. The agent writes both forms; the pipeline reads them; both take the names from here.
docs/usage/screen.md says what each key means; docs/CONTRACT.md names the schemas.

Workload (schema ``sdc.workload/v1``)::

    {"schema": "sdc.workload/v1",
     "ops": [{"kind": "gemm", "shape": [4096, 14336, 4096], "dtype": "bf16", "name": "mlp.up"},
             {"kind": "sdpa", "shape": [1, 32, 4096, 128], "dtype": "bf16", "causal": true},
             {"kind": "rmsnorm", "shape": [4096, 4096], "dtype": "bf16"},
             {"kind": "reduction", "shape": [4096, 4096], "dtype": "fp32", "reduce": "sum"}]}

Shapes by kind: ``gemm`` [m, n, k] (an [m, k] by [k, n] product); ``sdpa`` [batch, heads, seq,
head_dim] (forward and backward; ``causal`` optional); ``norm`` (layer norm), ``rmsnorm``,
``softmax``: [..., features], over the last dimension; ``reduction``: [..., n] reduced over the
last dimension (a 1-D shape reduces to a scalar) by ``reduce`` (``sum``, ``mean``, ``amax``,
``norm``: the L2 norm). ``dtype``: ``fp32``, ``tf32`` (fp32 tensors, TF32 matmul math: GEMM and
SDPA only), ``fp16``, ``bf16``. ``name`` (optional, at most :data:`MAX_NAME_CHARS`) labels the op
(the layer it came from) and changes nothing computed. A workload has at most
:data:`MAX_WORKLOAD_OPS` ops, each moving at most :data:`MAX_OP_ELEMENTS` elements (inputs and
outputs together, :meth:`OpSpec.elements`); :func:`parse_workload` refuses anything else with a
ValueError that names the field (``ops[3].shape``).

Result (schema ``sdc.screen/v1``, at most :data:`TERMINATION_MESSAGE_BYTES` bytes of UTF-8 JSON):
:data:`SCREEN_KEYS`; ``verdict`` is one of :data:`SCREEN_VERDICTS` and sets the process's exit
code (:data:`SCREEN_EXIT_CODES`); ``devices`` lists :data:`DEVICE_KEYS` per GPU, whose
``status`` is one of :data:`DEVICE_STATUSES`. A ``clean`` screen is not an exoneration: the
document says what was exercised and what was not. :func:`check_screen_result` validates a
document as the pipeline reads it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ._json import json_object

WORKLOAD_SCHEMA = "sdc.workload/v1"
"""A workload: the ops a screen runs besides its fixed suite."""
SCREEN_SCHEMA = "sdc.screen/v1"
"""One screen's result: the screen pod's termination message."""
GOLDEN_SCHEMA = "sdc.screen-golden/v1"
"""A local store of golden digests (``--golden PATH``), learned from screens that agreed."""

OpKind = Literal["gemm", "sdpa", "norm", "rmsnorm", "softmax", "reduction", "collective"]
"""What an op computes; ``collective`` is the screen's own (never in a workload)."""
OP_KINDS: tuple[OpKind, ...] = get_args(OpKind)
WORKLOAD_KINDS: tuple[OpKind, ...] = tuple(k for k in OP_KINDS if k != "collective")
"""The kinds a workload may list."""
OpDtype = Literal["fp32", "tf32", "fp16", "bf16"]
"""An op's dtype; ``tf32`` is fp32 tensors with TF32 matmul math."""
OP_DTYPES: tuple[OpDtype, ...] = get_args(OpDtype)
TF32_KINDS: tuple[OpKind, ...] = ("gemm", "sdpa")
"""The kinds where ``tf32`` means something (matmul math)."""
Reduce = Literal["sum", "mean", "amax", "norm"]
"""How a ``reduction`` reduces its last dimension."""
REDUCES: tuple[Reduce, ...] = get_args(Reduce)

MAX_WORKLOAD_OPS = 64
"""The most ops one workload may list (the alarm report carries it; the screen runs it)."""
MAX_OP_ELEMENTS = 2**28
"""The most elements one op may move, inputs and outputs together (1 GiB of fp32)."""
MAX_DIMS = 4
"""The most dimensions of a norm, softmax or reduction shape."""
MAX_NAME_CHARS = 64
"""The longest ``name`` of an op."""

_OP_KEYS = ("kind", "shape", "dtype", "name", "causal", "reduce")
_RANKS: dict[str, tuple[int, int]] = {
    "gemm": (3, 3),
    "sdpa": (4, 4),
    "norm": (1, MAX_DIMS),
    "rmsnorm": (1, MAX_DIMS),
    "softmax": (1, MAX_DIMS),
    "reduction": (1, MAX_DIMS),
    "collective": (1, 1),
}


@dataclass(frozen=True)
class OpSpec:
    """One op of a workload (or of the screen's fixed suite)."""

    kind: OpKind
    """What it computes (:data:`OP_KINDS`)."""
    shape: tuple[int, ...]
    """Its shape, read by kind (module docstring)."""
    dtype: OpDtype
    """Its dtype (:data:`OP_DTYPES`)."""
    name: str = ""
    """A label (the layer it came from); changes nothing computed."""
    causal: bool = False
    """``sdpa`` only: a causal mask."""
    reduce: Reduce = "sum"
    """``reduction`` only: how the last dimension is reduced."""

    def elements(self) -> int:
        """How many elements the op moves, inputs and outputs together."""
        s = self.shape
        if self.kind == "gemm":
            m, n, k = s
            return m * k + k * n + m * n
        total = 1
        for d in s:
            total *= d
        if self.kind == "sdpa":
            return 8 * total  # q, k, v, out, the output gradient, dq, dk, dv
        if self.kind == "reduction":
            return total + total // s[-1]
        if self.kind == "collective":
            return 2 * total
        return 2 * total

    def label(self) -> str:
        """A short stable name of what is computed, e.g. ``gemm:bf16:4096x14336x4096``."""
        extra = ""
        if self.kind == "sdpa" and self.causal:
            extra = ":causal"
        if self.kind == "reduction":
            extra = f":{self.reduce}"
        return f"{self.kind}:{self.dtype}:{'x'.join(str(d) for d in self.shape)}{extra}"

    def as_dict(self) -> dict[str, Any]:
        """The op in its JSON form (defaults left out)."""
        out: dict[str, Any] = {"kind": self.kind, "shape": list(self.shape), "dtype": self.dtype}
        if self.name:
            out["name"] = self.name
        if self.kind == "sdpa":
            out["causal"] = self.causal
        if self.kind == "reduction":
            out["reduce"] = self.reduce
        return out


def _op(value: Any, where: str, allow_collective: bool) -> OpSpec:
    """One op from its JSON form; ValueError names the field (``where``.key)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object like {{'kind': 'gemm', ...}}, got {value!r}")
    unknown = sorted(set(value) - set(_OP_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; expected some of {list(_OP_KEYS)}")
    kinds = OP_KINDS if allow_collective else WORKLOAD_KINDS
    kind = value.get("kind")
    if kind not in kinds:
        raise ValueError(f"{where}.kind must be one of {list(kinds)}, got {kind!r}")
    dtype = value.get("dtype")
    if dtype not in OP_DTYPES:
        raise ValueError(f"{where}.dtype must be one of {list(OP_DTYPES)}, got {dtype!r}")
    if dtype == "tf32" and kind not in TF32_KINDS:
        raise ValueError(f"{where}.dtype tf32 applies to {list(TF32_KINDS)} only, not {kind}")
    shape = value.get("shape")
    low, high = _RANKS[kind]
    if (
        not isinstance(shape, list)
        or not low <= len(shape) <= high
        or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape)
    ):
        rank = f"{low}" if low == high else f"{low} to {high}"
        raise ValueError(
            f"{where}.shape must be a list of {rank} positive integers for {kind}, got {shape!r}"
        )
    name = value.get("name", "")
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise ValueError(
            f"{where}.name must be printable text of at most {MAX_NAME_CHARS} characters"
        )
    if "causal" in value and kind != "sdpa":
        raise ValueError(f"{where}.causal applies to sdpa only, not {kind}")
    causal = value.get("causal", False)
    if not isinstance(causal, bool):
        raise ValueError(f"{where}.causal must be true or false, got {causal!r}")
    if "reduce" in value and kind != "reduction":
        raise ValueError(f"{where}.reduce applies to reduction only, not {kind}")
    reduce = value.get("reduce", "sum")
    if reduce not in REDUCES:
        raise ValueError(f"{where}.reduce must be one of {list(REDUCES)}, got {reduce!r}")
    spec = OpSpec(
        kind=kind, shape=tuple(shape), dtype=dtype, name=name, causal=causal, reduce=reduce
    )
    if spec.elements() > MAX_OP_ELEMENTS:
        raise ValueError(
            f"{where}.shape {shape} moves {spec.elements()} elements, more than "
            f"{MAX_OP_ELEMENTS} (MAX_OP_ELEMENTS)"
        )
    return spec


def parse_op(value: Any, where: str = "op") -> OpSpec:
    """One op (any kind, ``collective`` included) from its JSON form; ValueError names the field."""
    return _op(value, where, allow_collective=True)


def parse_workload(value: Any) -> tuple[OpSpec, ...]:
    """A workload (``{"schema": "sdc.workload/v1", "ops": [...]}``, or its JSON text) as op
    specs, in order; ValueError names the field that is wrong (``ops[2].dtype``)."""
    value = json_object(value, '{"schema": "sdc.workload/v1", "ops": [{"kind": "gemm", ...}]}')
    if value is None:
        raise ValueError("the workload is empty: expected an object with schema and ops")
    unknown = sorted(set(value) - {"schema", "ops"})
    if unknown:
        raise ValueError(f"unknown field(s) {unknown}; expected schema and ops")
    if value.get("schema") != WORKLOAD_SCHEMA:
        raise ValueError(f"schema must be {WORKLOAD_SCHEMA!r}, got {value.get('schema')!r}")
    ops = value.get("ops")
    if not isinstance(ops, list):
        raise ValueError(f"ops must be a list of ops, got {ops!r}")
    if len(ops) > MAX_WORKLOAD_OPS:
        raise ValueError(f"ops lists {len(ops)} ops, more than {MAX_WORKLOAD_OPS}")
    return tuple(_op(op, f"ops[{i}]", allow_collective=False) for i, op in enumerate(ops))


def workload_document(ops: Sequence[OpSpec]) -> dict[str, Any]:
    """The JSON form of a workload (what :func:`parse_workload` reads back)."""
    return {"schema": WORKLOAD_SCHEMA, "ops": [op.as_dict() for op in ops]}


def shape_list_digest(ops: Sequence[OpSpec]) -> str:
    """A 16-hex digest of the ops a screen computes: every op's label, in order.

    Names are left out (they change nothing computed). Golden digests are keyed by it (each
    digest within a key by op label and seed).
    """
    text = json.dumps([op.label() for op in ops])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


ScreenVerdict = Literal["clean", "reproduced", "inconclusive", "failed"]
"""A screen's verdict: ``clean`` (every op exercised agreed across the GPUs and with golden
digests: not an exoneration), ``reproduced`` (a GPU mismatched in at least
:data:`REPRODUCED_MIN_MISMATCHES` observations: named by index and UUID), ``inconclusive``
(something disagreed but no GPU could be named, or nothing could be compared), ``failed`` (the
screen could not run: the document's ``error`` says why)."""
SCREEN_VERDICTS: tuple[ScreenVerdict, ...] = get_args(ScreenVerdict)
SCREEN_EXIT_CODES: dict[str, int] = {"clean": 0, "reproduced": 3, "inconclusive": 4, "failed": 5}
"""The screen process's exit code by verdict (2 is argparse's, for a bad command line; 1 an
unexpected crash)."""
REPRODUCED_MIN_MISMATCHES = 2
"""How many observations (an op at one seed) a GPU must mismatch to be ``reproduced``."""

DeviceStatus = Literal["agrees", "suspect", "reproduced", "unjudged"]
"""One GPU's status: ``agrees`` (no mismatch), ``suspect`` (one mismatched observation: named,
not reproduced), ``reproduced``, ``unjudged`` (nothing to compare it with)."""
DEVICE_STATUSES: tuple[DeviceStatus, ...] = get_args(DeviceStatus)

TERMINATION_MESSAGE_BYTES = 4096
"""Kubernetes keeps at most this much of a container's termination message: the result's bound."""

SCREEN_KEYS: tuple[str, ...] = (
    "schema",
    "verdict",
    "summary",
    "devices",
    "exercised",
    "not_exercised",
    "inconclusive_ops",
    "golden",
    "environment",
    "durations_s",
    "error",
)
"""The keys of every ``sdc.screen/v1`` document. A list that did not fit is cut, and the key
``<list>_omitted`` (e.g. ``devices_omitted``, ``ops_omitted`` inside a device) counts the rest."""
DEVICE_KEYS: tuple[str, ...] = ("index", "uuid", "status", "mismatches", "ops", "digest")
"""The keys of one ``devices`` entry: the GPU's index on the node, its UUID (``GPU-...``; ``cpu-N``
for a simulated device), its status, how many observations it mismatched, the labels of the ops
it mismatched, and a 16-hex digest of all its digests in order (equal on devices, and on
screens of one environment key, that computed the same bits)."""
ENVIRONMENT_KEYS: tuple[str, ...] = ("device_model", "driver", "cuda", "torch", "workload")
"""The keys of ``environment``: what golden digests are keyed by (``workload`` is
:func:`shape_list_digest`)."""


def check_screen_result(value: Any) -> Mapping[str, Any]:
    """A screen's result (a mapping or its JSON text) after checking its shape; ValueError names
    the field that is wrong. Reading it, a verdict outside :data:`SCREEN_VERDICTS` is refused."""
    if isinstance(value, str) and len(value.encode()) > TERMINATION_MESSAGE_BYTES:
        raise ValueError(f"the result is over {TERMINATION_MESSAGE_BYTES} bytes")
    doc = json_object(value, '{"schema": "sdc.screen/v1", "verdict": "clean", ...}')
    if doc is None:
        raise ValueError("the result is empty")
    if doc.get("schema") != SCREEN_SCHEMA:
        raise ValueError(f"schema must be {SCREEN_SCHEMA!r}, got {doc.get('schema')!r}")
    missing = [k for k in SCREEN_KEYS if k not in doc]
    if missing:
        raise ValueError(f"missing key(s) {missing}")
    if doc["verdict"] not in SCREEN_VERDICTS:
        raise ValueError(f"verdict must be one of {list(SCREEN_VERDICTS)}, got {doc['verdict']!r}")
    devices = doc["devices"]
    if not isinstance(devices, list):
        raise ValueError("devices must be a list")
    for i, device in enumerate(devices):
        if not isinstance(device, Mapping):
            raise ValueError(f"devices[{i}] must be an object")
        lacking = [k for k in DEVICE_KEYS if k not in device]
        if lacking:
            raise ValueError(f"devices[{i}] lacks {lacking}")
        if device["status"] not in DEVICE_STATUSES:
            raise ValueError(
                f"devices[{i}].status must be one of {list(DEVICE_STATUSES)}, "
                f"got {device['status']!r}"
            )
        index = device["index"]
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ValueError(f"devices[{i}].index must be a non-negative integer")
    if doc["verdict"] == "reproduced" and not any(
        isinstance(d, Mapping) and d.get("status") == "reproduced" for d in devices
    ):
        raise ValueError("a reproduced result must name a reproduced device")
    environment = doc["environment"]
    if environment is not None and (
        not isinstance(environment, Mapping) or set(environment) != set(ENVIRONMENT_KEYS)
    ):
        raise ValueError(f"environment must have exactly the keys {list(ENVIRONMENT_KEYS)}")
    return doc


__all__ = [
    "DEVICE_KEYS",
    "DEVICE_STATUSES",
    "ENVIRONMENT_KEYS",
    "GOLDEN_SCHEMA",
    "MAX_DIMS",
    "MAX_NAME_CHARS",
    "MAX_OP_ELEMENTS",
    "MAX_WORKLOAD_OPS",
    "OP_DTYPES",
    "OP_KINDS",
    "REDUCES",
    "REPRODUCED_MIN_MISMATCHES",
    "SCREEN_EXIT_CODES",
    "SCREEN_KEYS",
    "SCREEN_SCHEMA",
    "SCREEN_VERDICTS",
    "TERMINATION_MESSAGE_BYTES",
    "TF32_KINDS",
    "WORKLOAD_KINDS",
    "WORKLOAD_SCHEMA",
    "DeviceStatus",
    "OpDtype",
    "OpKind",
    "OpSpec",
    "Reduce",
    "ScreenVerdict",
    "check_screen_result",
    "parse_op",
    "parse_workload",
    "shape_list_digest",
    "workload_document",
]
