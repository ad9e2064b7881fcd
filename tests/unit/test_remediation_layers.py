"""sdc_remediation's layers import only those below them (its package docstring, lambdas/README
"Layout"): the data layer never reaches up into the domain. It once did (``dal/ledger.py`` and
``dal/shadow_guard.py`` imported ``logic.admission``: a package-level cycle, issue 33); the
admission rule now reaches the ledger as an argument, and its data lives in
``models.admission``.

And one module owns the tables' keys (``dal/keys.py``): no other module of the package, and no
test that seeds or reads a table by hand, spells a key (``"STATE"``, ``f"GUARD#{cluster}"``, a
``{"pk": ..., "sk": ...}`` literal). Keys once lived in four modules and a dozen tests (issue
33, round two)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from sdc_remediation.dal import keys

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lambdas" / "sdc_remediation"

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


def _offenders(modules: Iterable[Path], find: Callable[[Path], Iterable[str]]) -> dict[str, list]:
    """What ``find`` reports of each module, for the modules where it reports anything."""
    found = {str(m.relative_to(ROOT)): sorted(find(m)) for m in modules}
    return {m: what for m, what in found.items() if what}


def _imports_of(path: Path) -> set[str]:
    package = path.relative_to(PACKAGE).parent.parts
    return _imported_subpackages(path.read_text(encoding="utf-8"), package)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_lower_layer_never_imports_a_higher_one(layer: str) -> None:
    # Given every module of the layer
    modules = sorted((PACKAGE / layer).rglob("*.py"))
    assert modules
    # Then none imports a layer above it
    assert _offenders(modules, lambda m: _imports_of(m) & FORBIDDEN[layer]) == {}


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


# What only dal/keys.py may spell: a key's prefix (the canary's partition is the contract's,
# sdc_contract.canary.canary_runs_key), or a whole sort key.
KEY_PREFIXES = (
    keys.GUARD_PREFIX,
    keys.CLUSTER_PREFIX,
    keys.EVENT_PREFIX,
    keys.REPORT_PREFIX,
    keys.NOTICE_PREFIX,
    keys.DUE_PREFIX,
    keys.RUN_PREFIX,
    keys.run_pk(""),
)
SORT_KEYS = {keys.STATE_SK, keys.GUARD_SK, keys.SHADOW_SK}
KEY_OWNER = PACKAGE / "dal" / "keys.py"
# The package, every handler, and the tests that touch the tables (tests/infra reads the
# synthesized template's grants, whose LeadingKeys it states on purpose as a literal).
KEY_USERS = (
    PACKAGE,
    ROOT / "lambdas",
    ROOT / "tests" / "lambdas",
    ROOT / "tests" / "e2e",
    ROOT / "tests" / "unit",
)


def _hand_built_keys(source: str) -> list[str]:
    """Where ``source`` spells a key of the tables itself: ``line: what``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(KEY_PREFIXES) or node.value in SORT_KEYS:
                found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.Dict):
            names = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if {"pk", "sk"} <= names:
                found.append(f"{node.lineno}: a {{'pk', 'sk'}} literal")
    return sorted(found)


def test_only_dal_keys_builds_a_key_of_the_tables() -> None:
    # Given every module of the package but dal/keys.py, the handlers, and the table tests
    modules = {
        path
        for folder in KEY_USERS
        for path in folder.rglob("*.py")
        if path != KEY_OWNER and ".egg-info" not in str(path)
    }
    assert len(modules) > 100
    # Then none spells a key itself
    assert _offenders(modules, lambda m: _hand_built_keys(m.read_text(encoding="utf-8"))) == {}


def test_the_reading_of_keys_sees_a_hand_built_key() -> None:
    # Given the keys as dal/ledger.py and the tests once spelled them
    source = (
        'def guard_pk(cluster): return f"GUARD#{cluster}"\n'
        'key = {"pk": node, "sk": "STATE"}\n'
        'run = f"RUN#{run_id}"\n'
    )
    # Then each is seen
    assert _hand_built_keys(source) == [
        "1: 'GUARD#'",
        "2: 'STATE'",
        "2: a {'pk', 'sk'} literal",
        "3: 'RUN#'",
    ]


# The DynamoDB idioms dal/dynamo.py writes once (``Table``): a condition that failed, a lost
# transaction, paging; and the client itself, which no other module of the package builds.
DYNAMO_IDIOMS = (
    "ConditionalCheckFailed",
    "transact_write_items",
    "get_paginator",
    "LastEvaluatedKey",
)
DYNAMO_CLIENT = 'client("dynamodb")'


def test_only_dal_dynamo_talks_to_dynamodb() -> None:
    # Given every module of the package but dal/dynamo.py
    dynamo = PACKAGE / "dal" / "dynamo.py"
    modules = [m for m in sorted(PACKAGE.rglob("*.py")) if m != dynamo]

    # Then none builds a DynamoDB client, and no other dal module spells one of its idioms
    def spelled(module: Path) -> list[str]:
        idioms = (
            (*DYNAMO_IDIOMS, DYNAMO_CLIENT) if module.parent.name == "dal" else (DYNAMO_CLIENT,)
        )
        return [idiom for idiom in idioms if idiom in module.read_text("utf-8")]

    assert _offenders(modules, spelled) == {}
    assert all(
        idiom in dynamo.read_text("utf-8") for idiom in ("ConditionalCheckFailed", DYNAMO_CLIENT)
    )
