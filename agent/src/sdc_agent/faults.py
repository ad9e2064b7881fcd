"""The fault injectors, under the name they had before they moved to :mod:`sdc_agent.drills.faults`.

``sdc_agent.faults`` IS that module (the same object, so its classes are the same classes);
nothing the guard runs imports it: ``import sdc_agent`` loads it only when ``sdc_agent.faults``
is first used.
"""

import sys

from .drills import faults

sys.modules[__name__] = faults
