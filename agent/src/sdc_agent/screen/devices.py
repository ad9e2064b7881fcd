"""The devices a screen compares, and the environment key its golden digests are filed under.

On a GPU node every visible GPU is one device, ``torch.device("cuda", i)``, named by its index
and its UUID (``GPU-<uuid>`` from ``torch.cuda.get_device_properties(i).uuid``; ``cuda:<i>``
where torch does not expose it: nvidia-smi is not assumed to be in the image).

On the CPU (the tests, the local demo) a screen takes a number of *simulated* devices: all of
them are ``cpu``, named ``cpu-0``, ``cpu-1``, ... They compute bit for bit alike (one process,
one thread count), so a fault injected into one of them (:mod:`sdc_agent.screen.faults`) is the
only thing that can tell them apart, as it would be on a real node.

The environment key (:class:`EnvironmentKey`) is what a golden digest is valid for: the device
model (GPU name and compute capability; on the CPU the machine and torch's thread count, which
change CPU results), the driver (``/proc/driver/nvidia/version``, which the NVIDIA container
runtime mounts; ``unknown`` where it is absent), the CUDA version torch was built with, torch's
version, and the digest of the list of ops the screen runs. A golden digest is used only when
every field is equal.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from sdc_contract.screen import ENVIRONMENT_KEYS

_DRIVER_FILE = Path("/proc/driver/nvidia/version")
_DRIVER = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]*)")


@dataclass(frozen=True)
class ScreenDevice:
    """One device the screen runs on."""

    index: int
    """Its index on the node (``CUDA_VISIBLE_DEVICES`` order), or the simulated device's."""
    uuid: str
    """``GPU-<uuid>``, ``cuda:<index>`` or ``cpu-<index>``."""
    device: torch.device
    """Where its tensors live."""
    model: str
    """What kind of device it is (the golden key's ``device_model``)."""


@dataclass(frozen=True)
class EnvironmentKey:
    """What golden digests are keyed by: equal keys compute equal digests."""

    device_model: str
    driver: str
    cuda: str
    torch: str
    workload: str
    """:func:`sdc_contract.screen.shape_list_digest` of the ops run."""

    def as_dict(self) -> dict[str, str]:
        """The key as the result's ``environment`` and the golden store carry it."""
        return {name: getattr(self, name) for name in ENVIRONMENT_KEYS}


def cuda_devices() -> list[ScreenDevice]:
    """Every visible GPU, by index (empty without CUDA)."""
    if not torch.cuda.is_available():
        return []
    found = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        uuid = getattr(props, "uuid", None)
        found.append(
            ScreenDevice(
                index=i,
                uuid=f"GPU-{uuid}" if uuid is not None else f"cuda:{i}",
                device=torch.device("cuda", i),
                model=f"{props.name} (sm_{props.major}{props.minor}, "
                f"{props.multi_processor_count} SMs)",
            )
        )
    return found


def simulated_devices(count: int) -> list[ScreenDevice]:
    """``count`` CPU devices named ``cpu-0`` .. ``cpu-<count-1>``; ValueError for count < 1."""
    if count < 1:
        raise ValueError(f"simulated devices must be at least 1, got {count}")
    model = f"cpu ({platform.machine() or 'unknown'}, {torch.get_num_threads()} threads)"
    return [
        ScreenDevice(index=i, uuid=f"cpu-{i}", device=torch.device("cpu"), model=model)
        for i in range(count)
    ]


def driver_version() -> str:
    """The NVIDIA kernel driver's version, or ``unknown`` (no GPU, or the file is absent)."""
    try:
        text = _DRIVER_FILE.read_text()
    except OSError:
        return "unknown"
    match = _DRIVER.search(text)
    return match.group(1) if match else "unknown"


def environment_key(devices: list[ScreenDevice], workload_digest: str) -> EnvironmentKey:
    """The key of a screen on ``devices`` (all of one model: the caller checks) of the list of
    ops whose digest is ``workload_digest``."""
    on_gpu = any(d.device.type == "cuda" for d in devices)
    return EnvironmentKey(
        device_model=devices[0].model if devices else "none",
        driver=driver_version() if on_gpu else "none",
        cuda=str(torch.version.cuda) if on_gpu else "none",
        torch=torch.__version__,
        workload=workload_digest,
    )


__all__ = [
    "EnvironmentKey",
    "ScreenDevice",
    "cuda_devices",
    "driver_version",
    "environment_key",
    "simulated_devices",
]
