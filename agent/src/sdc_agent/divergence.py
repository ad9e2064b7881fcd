"""Check 3's public comparison, under the path it had before the checks became packages.

:func:`find_divergent_ranks` and :class:`DivergenceReport` live in
:mod:`sdc_agent.checks.weights` (and are exported by ``sdc_agent``).
"""

from .checks.weights.divergence import find_divergent_ranks
from .checks.weights.report import DivergenceReport

__all__ = ["DivergenceReport", "find_divergent_ranks"]
