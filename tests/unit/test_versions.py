"""The supported torch, enforced: ``import sdc_agent`` refuses a torch older than the floor
(naming the version found, the floor and why), a torch without the private placement the
sharding code needs, and ``sdc_agent.Guard`` refuses a model compiled with ``torch.compile``
and compiled autograd."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from torch import nn

import sdc_agent as sdc
from sdc_agent import _compile, _versions

AGENT = Path(__file__).resolve().parents[2] / "agent"


def import_agent_after(setup: str) -> subprocess.CompletedProcess[str]:
    """``import sdc_agent`` in a fresh interpreter after running ``setup``."""
    code = f"import torch\n{setup}\nimport sdc_agent\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


@pytest.mark.parametrize("version", ["2.7.1", "2.4.0+cu121", "1.13.1"])
def test_an_older_torch_is_refused_naming_the_version_the_floor_and_why(monkeypatch, version):
    # Given an installed torch older than the floor
    monkeypatch.setattr(torch, "__version__", version)
    # When the agent checks it
    with pytest.raises(ImportError) as raised:
        _versions.check_torch()
    # Then the error names the version found, the floor and what needs it
    message = str(raised.value)
    assert f"found torch {version}" in message and "torch >= 2.8" in message
    assert "out_dtype" in message and "FSDPModule" in message


@pytest.mark.parametrize(
    "version", ["2.8.0", "2.8.0a0+gitabc123", "2.13.0+cpu", "2.10.0.dev20250901", "3.0.0"]
)
def test_the_floor_and_newer_torch_are_accepted(monkeypatch, version):
    # Given a torch at or above the floor (pre-releases of the floor included)
    monkeypatch.setattr(torch, "__version__", version)
    # Then the check passes
    _versions.check_torch()


def test_an_unreadable_version_is_refused_clearly():
    # Given a version string that does not start with MAJOR.MINOR
    with pytest.raises(ImportError, match=r"cannot read a torch release .*'nightly'"):
        # When the agent checks it, then it says so
        _versions.check_torch("nightly")


@pytest.mark.slow
def test_import_sdc_agent_refuses_an_older_torch_before_anything_else():
    # Given a fresh interpreter whose torch reports 2.7.1
    out = import_agent_after("torch.__version__ = '2.7.1'")
    # Then `import sdc_agent` fails with the agent's own message
    assert out.returncode != 0
    assert "ImportError: sdc_agent needs torch >= 2.8, found torch 2.7.1" in out.stderr


@pytest.mark.slow
def test_import_sdc_agent_names_a_missing_private_placement():
    # Given a torch whose placement_types lacks the private _StridedShard
    # (torch's own FSDP2, which imports it too, loaded first)
    out = import_agent_after(
        "import torch.distributed.fsdp\n"
        "import torch.distributed.tensor.placement_types as p\n"
        "del p._StridedShard"
    )
    # Then `import sdc_agent` fails naming it, the torch found and where versions are stated
    assert out.returncode != 0
    assert "sdc_agent needs torch.distributed.tensor.placement_types._StridedShard" in out.stderr
    assert f"torch {torch.__version__} does not have" in out.stderr


def test_the_package_floor_is_the_enforced_floor():
    # Given agent/pyproject.toml
    meta = tomllib.loads((AGENT / "pyproject.toml").read_text())
    # Then its torch requirement is the floor import sdc_agent enforces
    floor = ".".join(map(str, _versions.TORCH_FLOOR))
    assert f"torch>={floor}" in meta["project"]["dependencies"]


def guard_for(model: nn.Module) -> sdc.Guard:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return sdc.Guard(
        model, optimizer, compute_loss=lambda m, b: m(b).sum(), rebuild_batch=lambda s, r: None
    )


def test_a_model_compiled_with_torch_compile_is_refused_at_guard_construction():
    # Given a model wrapped by torch.compile (an OptimizedModule keeping the original as
    # _orig_mod)
    model = torch.compile(nn.Linear(4, 4))
    # When a Guard is built on it, then it refuses, saying what and why
    with pytest.raises(ValueError, match=r"torch.compile is not supported \(the model itself"):
        guard_for(model)


def test_a_block_compiled_in_place_is_refused_naming_it():
    # Given a model one of whose blocks was compiled in place (nn.Module.compile)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    model[2].compile()
    # When a Guard is built on it, then it refuses naming the block
    with pytest.raises(ValueError, match=r"torch.compile is not supported \('2' compiled\)"):
        guard_for(model)


def test_compiled_autograd_configured_is_refused_at_guard_construction():
    # Given compiled autograd turned on in torch._dynamo's config
    import torch._dynamo

    refused = pytest.raises(ValueError, match=r"compiled autograd is not supported.*FSDP2 skips")
    # When a Guard is built on an eager model, then it refuses, saying why
    with torch._dynamo.config.patch(compiled_autograd=True), refused:
        guard_for(nn.Linear(4, 4))


def test_compiled_autograd_entered_is_refused(monkeypatch):
    # Given the compiled-autograd context entered (its module-level switch on)
    from torch._dynamo import compiled_autograd

    monkeypatch.setattr(compiled_autograd, "compiled_autograd_enabled", True)
    # Then the guard's check refuses
    with pytest.raises(ValueError, match="compiled autograd is not supported"):
        _compile.refuse_compiled(nn.Linear(4, 4))


def test_an_eager_model_is_not_refused_once_dynamo_is_loaded():
    # Given torch._dynamo imported (something else compiled) and an eager model
    import torch._dynamo  # noqa: F401

    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    # Then nothing is refused
    assert _compile.compiled_parts(model) == [] and not _compile.compiled_autograd_enabled()
    _compile.refuse_compiled(model)
