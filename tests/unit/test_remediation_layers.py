"""sdc_remediation's layers import only those below them (its package docstring, lambdas/README
"Layout"): the data layer never reaches up into the domain. It once did (``dal/ledger.py`` and
``dal/shadow_guard.py`` imported ``logic.admission``: a package-level cycle, issue 33); the
admission rule now reaches the ledger as an argument, and its data lives in
``models.admission``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lambdas" / "sdc_remediation"

# Each lower layer, and the layers above it that it may never import.
FORBIDDEN: dict[str, set[str]] = {
    "dal": {"logic", "targets", "cli"},
    "clients": {"logic", "targets", "cli", "dal"},
    "models": {"logic", "targets", "cli", "dal", "clients"},
}


def _imported_subpackages(source: str, package: tuple[str, ...]) -> set[str]:
    """The sdc_remediation subpackages (first component) that a module of ``package`` (its
    path inside sdc_remediation, e.g. ``("dal",)``) imports in ``source``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - (node.level - 1)])
                if node.module:
                    targets = [base + node.module.split(".")]
                else:
                    targets = [[*base, alias.name] for alias in node.names]
            elif node.module and node.module.startswith("sdc_remediation."):
                targets = [node.module.split(".")[1:]]
            else:
                continue
            found.update(parts[0] for parts in targets if parts)
        elif isinstance(node, ast.Import):
            found.update(
                alias.name.split(".")[1]
                for alias in node.names
                if alias.name.startswith("sdc_remediation.")
            )
    return found


def _imports_of(path: Path) -> set[str]:
    package = path.relative_to(PACKAGE).parent.parts
    return _imported_subpackages(path.read_text(encoding="utf-8"), package)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_lower_layer_never_imports_a_higher_one(layer: str) -> None:
    # Given every module of the layer
    modules = sorted((PACKAGE / layer).rglob("*.py"))
    assert modules
    # Then none imports a layer above it
    upward = {
        str(m.relative_to(PACKAGE)): sorted(_imports_of(m) & FORBIDDEN[layer]) for m in modules
    }
    assert {m: up for m, up in upward.items() if up} == {}


def test_the_reading_of_imports_sees_an_upward_import() -> None:
    # Given the imports that used to make the cycle, as dal/ledger.py held them
    source = (
        "from ..logic.admission import decide\n"
        "from .. import logic\n"
        "from sdc_remediation.targets import target_for\n"
        "from .dynamo import to_item\n"
    )
    # Then each is seen (and dal's own module too)
    assert _imported_subpackages(source, ("dal",)) == {"logic", "targets", "dal"}
