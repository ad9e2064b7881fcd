"""What the guard refuses at construction: a model compiled with ``torch.compile`` and compiled
autograd.

Neither is supported yet, and neither would fail loudly on its own:

* ``torch.compile``: the protected layers are Python autograd Functions that keep state on
  ``ctx`` and write to the sensor board, the function sites enter a ``TorchFunctionMode`` in
  module hooks, and a deterministic audit step toggles the deterministic-kernel flags: each
  breaks the graph or recompiles, and the checks the guard arms per step would be traced once
  and then run (or not) as traced.
* compiled autograd: FSDP2 then skips the post-accumulate-grad hooks check 1's gradient taps
  are, so the taps never see a gradient (and ``require_reduction`` fails every step).

Both are detected without importing ``torch._dynamo`` when nothing has (then nothing was compiled
and compiled autograd cannot be on). Compiled autograd enabled only later, around a backward
(``torch._dynamo.compiled_autograd._enable``), is not seen here.
"""

from __future__ import annotations

import sys

from torch import nn

_ADVICE = "build the Guard on the eager model and train it without torch.compile"


def compiled_parts(model: nn.Module) -> list[str]:
    """The names of ``model``'s modules (``model`` itself is ``""``) compiled with
    ``torch.compile``: wrapped (``torch._dynamo.eval_frame.OptimizedModule``, which keeps the
    original as ``_orig_mod``) or in place (``nn.Module.compile()``)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    optimized = getattr(eval_frame, "OptimizedModule", None)
    found = []
    for name, module in model.named_modules(remove_duplicate=False):
        wrapped = (optimized is not None and isinstance(module, optimized)) or isinstance(
            getattr(module, "_orig_mod", None), nn.Module
        )
        in_place = getattr(module, "_compiled_call_impl", None) is not None
        if wrapped or in_place:
            found.append(name)
    return found


def compiled_autograd_enabled() -> bool:
    """Whether compiled autograd is on: ``torch._dynamo.config.compiled_autograd`` (applied by
    ``torch.compile``) or the compiled-autograd context entered now
    (``torch._dynamo.compiled_autograd.compiled_autograd_enabled``)."""
    config = sys.modules.get("torch._dynamo.config")
    if config is not None and getattr(config, "compiled_autograd", False):
        return True
    module = sys.modules.get("torch._dynamo.compiled_autograd")
    return bool(getattr(module, "compiled_autograd_enabled", False))


def refuse_compiled(model: nn.Module) -> None:
    """Raise ValueError when ``model`` (or a submodule) is compiled with ``torch.compile`` or
    compiled autograd is enabled, naming what is unsupported and why (module docstring). Every
    rank raises alike, before any collective."""
    parts = compiled_parts(model)
    if parts:
        named = ", ".join(repr(p) if p else "the model itself" for p in parts[:5])
        more = f" and {len(parts) - 5} more" if len(parts) > 5 else ""
        raise ValueError(
            f"sdc_agent.Guard: torch.compile is not supported ({named}{more} compiled): the "
            "guard's checks run in Python hooks, autograd Functions and a TorchFunctionMode "
            "that break or freeze compiled graphs, and deterministic audit steps recompile; "
            + _ADVICE
        )
    if compiled_autograd_enabled():
        raise ValueError(
            "sdc_agent.Guard: compiled autograd is not supported (torch._dynamo.config."
            "compiled_autograd is set, or the compiled-autograd context is entered): under it "
            "FSDP2 skips the post-accumulate-grad hooks that check 1's gradient taps are, so "
            "no gradient would be checked; turn compiled autograd off and " + _ADVICE
        )
