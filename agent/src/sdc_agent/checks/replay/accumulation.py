"""Check 2 under gradient accumulation: one micro-batch's local gradient, isolated exactly.

With N micro-batches per step a parameter's gradient is g_0 + g_1 + ... + g_{N-1}, summed by
autograd as each backward finishes (``grad += g_i``). The audit replays ONE micro-batch, so it
needs that micro-batch's own gradient g_k, bit for bit, without changing what training sums.

:class:`MicroBatchIsolation` stashes the accumulated gradient before micro-batch k's backward
(every ``p.grad`` set aside, ``p.grad = None``), lets the backward compute g_k alone, fingerprints
it, and adds it back into the stash in place (``stash += g_k``, exactly the operation autograd's
accumulation performs, so the bits are those of normal accumulation; fp addition is also
commutative, so the order of the two operands could not matter either). The stash goes back as
the same tensor object, so gradients that are views of DDP's buckets stay views.

The add-back runs in a post-accumulate-grad hook of each parameter, the moment autograd has
stored g_k and before anything else reads ``p.grad``. That matters for the LAST micro-batch, the
one DDP synchronises: DDP's reducer copies ``p.grad`` into its bucket from a hook on the same
autograd node that runs after the parameter's post-accumulate-grad hooks, so the bucket (and
check 1's comm hook, and the all-reduce) see the full accumulated gradient, while the audit's
fingerprint is of g_k alone, the local gradient of the audited micro-batch before any
reduction. For an earlier (``no_sync``) micro-batch the hook does the same and nothing else
reads the gradient. A parameter the micro-batch does not reach gets its stash back when the
micro-batch ends and fingerprints as no gradient, as in a replay.

A replay of micro-batch k starts from no gradient (``p.grad = None``) and back-propagates the
same ``loss / N`` (times the same GradScaler scale): its gradient is g_k, the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ...fingerprint import fingerprints


class MicroBatchIsolation:
    """Isolates and fingerprints one micro-batch's gradient while training accumulates.

    Active only between :meth:`begin` and :meth:`end`: its own hooks are registered by
    :meth:`begin` and removed by :meth:`end`, so the backward of a micro-batch that is not
    audited runs no Python hook of it.
    """

    def __init__(
        self, params: Sequence[nn.Parameter | None], *, register_hooks: bool = True
    ) -> None:
        """Watch ``params`` (the fingerprint order). ``register_hooks``: a post-accumulate-grad
        hook on each while isolating (DDP); False when the caller runs
        :meth:`gradient_accumulated` from its own hook instead, and :meth:`attach`-es tensors
        that do not exist yet (FSDP2's unsharded parameters, created at the first forward)."""
        self.params: list[nn.Parameter | None] = list(params)
        self._active = False
        self._stash: list[torch.Tensor | None] = []
        self._rows: list[torch.Tensor | None] = []
        self._returned: list[bool] = []
        self._handles: list[Any] = []
        self._register_hooks = register_hooks
        if register_hooks:
            for index, param in enumerate(self.params):
                if param is None:
                    raise ValueError(f"MicroBatchIsolation: parameter {index} is None")

    def attach(self, index: int, param: nn.Parameter) -> None:
        """Watch ``param`` as row ``index`` from now on (it had no gradient to set aside)."""
        self.params[index] = param

    def begin(self) -> None:
        """Before the audited micro-batch's forward: set every accumulated gradient aside."""
        if self._active:
            raise RuntimeError("sdc_agent: a micro-batch is being isolated already")
        self._stash = [p.grad if p is not None else None for p in self.params]
        self._rows = [None] * len(self.params)
        self._returned = [False] * len(self.params)
        for p in self.params:
            if p is not None:
                p.grad = None
        if self._register_hooks:
            handles = []
            for index, p in enumerate(self.params):
                if p is None:  # __init__ refuses a None when registering hooks
                    raise RuntimeError(f"MicroBatchIsolation: parameter {index} is None")
                handles.append(p.register_post_accumulate_grad_hook(self._hook_for(index)))
            self._handles = handles
        self._active = True

    def _hook_for(self, index: int) -> Any:
        def hook(param: nn.Parameter) -> None:
            self.gradient_accumulated(index, param)

        return hook

    def gradient_accumulated(self, index: int, param: nn.Parameter) -> None:
        """Autograd has stored row ``index``'s gradient in ``param.grad``: while isolating,
        fingerprint it and add it to the set-aside gradient (a post-accumulate-grad hook's body;
        it must run before anything else reads ``param.grad``)."""
        if not self._active or self._returned[index]:
            return
        own = param.grad
        if own is None:
            return
        self._rows[index] = fingerprints([own])[0]
        stash = self._stash[index]
        if stash is not None:
            stash.add_(own)  # what autograd's accumulation does: grad += g_k
            param.grad = stash
        self._returned[index] = True

    def end(self) -> torch.Tensor:
        """After the audited micro-batch's backward: give back every gradient the backward did
        not reach; returns the [num_params, 2] int64 fingerprints of the micro-batch's own
        gradients (a parameter it did not reach: (0, 0), as in a replay)."""
        if not self._active:
            raise RuntimeError("sdc_agent: no micro-batch is being isolated")
        self._active = False
        self.remove()
        for index, param in enumerate(self.params):
            if param is not None and not self._returned[index]:
                own = param.grad  # set outside autograd's accumulation (unusual): fold it in
                self._rows[index] = fingerprints([own])[0] if own is not None else None
                stash = self._stash[index]
                if stash is not None and own is not None:
                    stash.add_(own)
                param.grad = stash if stash is not None else own
        rows = self._rows
        self._stash, self._rows, self._returned = [], [], []
        present = [r for r in rows if r is not None]
        device = present[0].device if present else torch.device("cpu")
        zero = torch.zeros(2, dtype=torch.int64, device=device)
        return torch.stack([r.to(device) if r is not None else zero for r in rows])

    def remove(self) -> None:
        """Remove the hooks registered by :meth:`begin` (:meth:`end` does; idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
