"""Per-invocation settings: several functions in one process, none writing os.environ."""

from __future__ import annotations

import os
import threading

import pytest

from sdc_remediation import config
from sdc_remediation.config import settings
from sdc_remediation.errors import ConfigurationError


def test_an_invocation_reads_its_own_variables_first_and_leaves_os_environ_alone(monkeypatch):
    # Given a process environment that names one cluster
    monkeypatch.setenv("HYPERPOD_CLUSTER_NAME", "process-cluster")
    monkeypatch.setenv("LEDGER_TABLE", "process-ledger")
    before = dict(os.environ)
    # When an invocation runs with its own variables
    with config.environment({"HYPERPOD_CLUSTER_NAME": "function-cluster", "DRY_RUN": "true"}):
        inside = settings()
        # Then its settings read them before os.environ, and the rest from os.environ
        assert inside.hyperpod_cluster_name == "function-cluster"
        assert inside.dry_run is True
        assert inside.ledger_table == "process-ledger"
        # And the process environment never changed
        assert dict(os.environ) == before
    # And after the block the process environment is what settings read again
    assert settings().hyperpod_cluster_name == "process-cluster"
    assert settings().dry_run is False


def test_a_settings_object_keeps_the_variables_of_the_block_it_was_made_in():
    with config.environment({"MAX_NODES_PER_HOUR": "7"}):
        made_inside = settings()
    assert made_inside.max_nodes_per_hour == 7


def test_nested_blocks_layer_over_the_outer_one():
    with config.environment({"REPLACE_MODE": "label", "MAX_NODES_PER_HOUR": "3"}):
        with config.environment({"MAX_NODES_PER_HOUR": "4"}):
            inner = settings()
        outer = settings()
    assert (inner.replace_mode, inner.max_nodes_per_hour) == ("label", 4)
    assert (outer.replace_mode, outer.max_nodes_per_hour) == ("label", 3)


def test_an_explicit_mapping_still_replaces_the_environment():
    with config.environment({"HYPERPOD_CLUSTER_NAME": "function-cluster"}):
        explicit = config.Settings({"HYPERPOD_CLUSTER_NAME": "given"})
    assert explicit.hyperpod_cluster_name == "given"


def test_concurrent_invocations_never_see_each_others_variables():
    # Given two invocations in two threads whose blocks are open at the same time (the
    # barrier holds each inside its block until both are in, whatever the scheduling)
    both_inside = threading.Barrier(2, timeout=60)
    seen: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def invoke(cluster: str) -> None:
        try:
            with config.environment({"HYPERPOD_CLUSTER_NAME": cluster}):
                both_inside.wait()
                first = settings().hyperpod_cluster_name
                both_inside.wait()  # the other one has read too, still inside its block
                seen[cluster] = [first, settings().hyperpod_cluster_name]
        except BaseException as exc:  # surfaced below: a thread's failure must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=invoke, args=(name,)) for name in ("a", "b")]
    # When both run
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    # Then each read only its own cluster
    assert not errors, errors
    assert seen == {"a": ["a", "a"], "b": ["b", "b"]}


@pytest.mark.parametrize("name", ["HYPERPOD_CLUSTER_NAME", "LEDGER_TABLE"])
def test_a_variable_missing_from_both_still_names_itself(monkeypatch, name):
    monkeypatch.delenv(name, raising=False)
    with config.environment({}), pytest.raises(ConfigurationError, match=name):
        getattr(settings(), name.lower())
