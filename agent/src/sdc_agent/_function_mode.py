"""One torch function mode that routes chosen functions to handlers (private).

The online sensors route the functions they check to their sites (:mod:`sdc_agent.sensors.ops.sites`)
and the workload recorder sees attention calls (:mod:`sdc_agent.workload`), each with a
:class:`RoutingMode` of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch.overrides import TorchFunctionMode

Handler = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]
"""``handler(func, args, kwargs)``: computes the call of ``func`` (or has it computed)."""


class RoutingMode(TorchFunctionMode):
    """Routes each function in ``handlers`` to its handler; everything else runs untouched
    (inside ``__torch_function__`` the mode is off, so the calls a handler makes are plain).
    ``handlers`` is read at each call: a mapping changed later routes as it then says."""

    def __init__(self, handlers: Mapping[Callable[..., Any], Handler]) -> None:
        super().__init__()
        self.handlers = handlers

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        handler = self.handlers.get(func)
        if handler is not None:
            return handler(func, args, kwargs)
        return func(*args, **kwargs)
