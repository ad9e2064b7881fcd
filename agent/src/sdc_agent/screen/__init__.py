"""The node screen: a known-answer silent-data-corruption screen of every GPU of a node.

``python -m sdc_agent.screen`` (:mod:`sdc_agent.screen.__main__`) runs, from the training
image, a fixed suite of ops (GEMMs in bf16, fp16, TF32 and fp32, attention forward and backward,
norms, softmax, reductions) plus the job's own workload (``sdc.workload/v1``) on every GPU, on
seeded inputs, repeated with new seeds within a time budget, and a device-to-device all-sum.
Each result is fingerprinted bit for bit and compared: each GPU against the node's other GPUs
by strict majority, and with golden digests learned under the same environment key. A GPU is
named only by comparison, never by a tolerance. The result is one ``sdc.screen/v1`` document
(:mod:`sdc_contract.screen`), the pod's termination message; docs/usage/screen.md is the guide.

The command line (:func:`sdc_agent.screen.__main__.build_parser`): ``--workload``,
``--repetitions``, ``--budget-s``, ``--seed``, ``--size``, ``--golden``, ``--no-learn``,
``--simulate`` (CPU devices), ``--fault`` and ``--fault-seed`` (with ``--simulate`` only),
``--termination-log`` / ``--no-termination-log``. (Listed here too because tools that look a
``python -m`` package's flags up read this file, not ``__main__.py``.)

Modules: :mod:`~sdc_agent.screen.runner` (the screen), :mod:`~sdc_agent.screen.ops` (the ops,
their inputs and digests), :mod:`~sdc_agent.screen.compare` (how one observation is judged),
:mod:`~sdc_agent.screen.devices` (the devices and the environment key),
:mod:`~sdc_agent.screen.golden` (the golden store), :mod:`~sdc_agent.screen.report` (the JSON
document within 4096 bytes) and :mod:`~sdc_agent.screen.faults` (fault injection for tests and
demos only; not imported here).
"""

from __future__ import annotations

from .devices import EnvironmentKey, ScreenDevice, cuda_devices, simulated_devices
from .golden import GoldenStore
from .report import document
from .runner import (
    DEFAULT_BUDGET_S,
    DEFAULT_REPETITIONS,
    DeviceResult,
    ScreenConfig,
    ScreenResult,
    run_screen,
)

__all__ = [
    "DEFAULT_BUDGET_S",
    "DEFAULT_REPETITIONS",
    "DeviceResult",
    "EnvironmentKey",
    "GoldenStore",
    "ScreenConfig",
    "ScreenDevice",
    "ScreenResult",
    "cuda_devices",
    "document",
    "run_screen",
    "simulated_devices",
]
