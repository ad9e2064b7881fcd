"""The operator CLI, ``sdc-remediation`` (console script ``sdc_remediation.cli:main``): the
commands (``commands``) over the library layer (``dal``, ``logic``, ``clients.approval_url``),
and the tables it prints (``tables``, the only user of ``tabulate``)."""

from __future__ import annotations

from .commands import main

__all__ = ["main"]
