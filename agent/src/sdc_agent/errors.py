"""The one base of every error the agent raises on purpose: ``except sdc_agent.SdcAgentError``
catches them all, whatever they are about.

Each error keeps the built-in base it had before there was a common one (a ``ValueError`` for
a bad argument or layout, a ``RuntimeError`` for a state the job is in), so ``except ValueError``
in a user's code still catches what it caught. The class itself is ``sdc_contract.errors``'s:
the contract's ``AlarmLogError`` derives from it too, and the modules that load without torch
(``sdc_contract.resume``, ``recovery.py`` read as a file) need it there.
"""

from __future__ import annotations

from sdc_contract.errors import SdcAgentError

__all__ = ["SdcAgentError"]
