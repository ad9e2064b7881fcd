"""The multi-process files' tier and deadlines, decided in one place.

A test file that starts processes (gloo jobs through ``launch``, or a script under ``torchrun``)
declares ``LAUNCH_DEADLINE_S``: how long they may run before the launcher kills them. Every test
of such a file is marked ``slow`` (``make test-fast`` leaves it out) and gets a pytest-timeout of
that deadline plus :data:`MARGIN_S`, so on a busy machine the launcher's own error (which names
the hung ranks) fires before pytest's, never the other way round. ``tests/unit/test_suite_tiers.py``
checks that every file that starts processes declares the deadline and passes it.
"""

from __future__ import annotations

import pytest

# Room for what surrounds the launch in the timed test: module fixtures (a moto server, a
# temporary directory), reading the ranks' results, and the assertions.
MARGIN_S = 300


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of every file that declares LAUNCH_DEADLINE_S slow, with its timeout."""
    for item in items:
        deadline = getattr(getattr(item, "module", None), "LAUNCH_DEADLINE_S", None)
        if deadline is None:
            continue
        item.add_marker(pytest.mark.slow)
        item.add_marker(pytest.mark.timeout(deadline + MARGIN_S))
