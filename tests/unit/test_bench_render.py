"""docs/performance.md's tables are what the committed raw results render, and those results
came from the commands `make bench` runs.

The figures in the docs are the output of ``benchmarks/render.py`` over ``benchmarks/results/``
(written by ``benchmarks/bench.py``); this keeps the two from drifting apart: a hand edit of a
rendered table, or a results file rerun without re-rendering, fails here.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench  # noqa: E402
import render  # noqa: E402
import results  # noqa: E402


def test_docs_are_what_the_committed_results_render(capsys: pytest.CaptureFixture[str]) -> None:
    code = render.main(["--check"])
    out = capsys.readouterr()
    assert code == 0, f"run `python benchmarks/render.py`:\n{out.out}{out.err}"


def test_every_results_file_comes_from_its_make_bench_command() -> None:
    files = sorted(results.RESULTS_DIR.glob("*.json"))
    assert files, "no results committed under benchmarks/results/"
    for path in files:
        job = bench.BY_NAME.get(path.stem)
        assert job is not None, f"{path.name}: no job of benchmarks/bench.py writes it"
        meta = results.load(path)["provenance"]
        assert meta["command"] == ["python", *job.command("")[1:]], path.name
        for key in ("started_utc", "finished_utc", "machine", "load", "torch", "git_commit"):
            assert meta.get(key) is not None, f"{path.name}: no {key}"


def test_every_marker_in_the_docs_has_a_renderer_and_every_job_a_script() -> None:
    for doc in render.DOCS:
        text = (REPO / doc).read_text()
        for name in render.MARKER.findall(text):
            assert name[1] in render.TABLES, f"{doc}: unknown marker {name[1]}"
    for job in bench.JOBS:
        assert (REPO / "benchmarks" / job.script).is_file()


def test_every_job_feeds_a_table_and_every_renderer_has_a_marker() -> None:
    # A job whose results no table shows, or a renderer no document places, is a figure that
    # `make bench` measures but the docs still carry by hand (or not at all).
    placed = set()
    for doc in render.DOCS:
        placed |= {match[1] for match in render.MARKER.findall((REPO / doc).read_text())}
    assert set(render.TABLES) - placed == set(), "renderers without a marker in any document"
    read = render.Results()
    for name in placed - {"bench-runs"}:  # bench-runs reads every job's provenance
        render.TABLES[name](read)
    assert {job.name for job in bench.JOBS} - set(read._cache) == set(), "jobs no table shows"


def test_a_three_d_scenario_that_missed_its_expectation_is_shown_as_such(tmp_path: Path) -> None:
    scenario = {
        "scenario": "wgrad",
        "faults": [
            {
                "kind": "ScaleWeightGradElement",
                "param": "blocks.1.up.weight",
                "factor": 1000.0,
                "rank": 3,
                "step": 6,
            }
        ],
        "ok": False,
        "expected": "rank 3 alone",
        "steps": 20,
        "every": 5,
        "fault_step": 6,
        "bf16": False,
        "updates_applied": 20,
        "last_audit_pass": 19,
        "last_weight_check_pass": 19,
        "wall_s": 12.0,
        "alarm": None,
    }
    for job in render.THREE_D_JOBS:
        recorder = results.Recorder("benchmarks/three_d.py", [], interval=0.05)
        recorder.write(tmp_path / f"{job}.json", {"layout": {"faulty": 3}, "scenarios": [scenario]})
    lines = render.three_d(render.Results(tmp_path))
    row = lines[2]
    assert (
        "x1000 in one element of rank 3's local `blocks.1.up.weight` gradient slice from step 6"
        in row
    )
    assert "no alarm, 20 updates applied" in row
    assert "rank 3 alone (**NOT as expected**)" in row


def _fake_results(directory: Path) -> None:
    recorder = results.Recorder("benchmarks/publish.py", ["--steps", "3"], interval=0.05)
    case = {
        "median_ms": 0.5,
        "p99_ms": 1.25,
        "slowest_publish_ms": 2.0,
        "flush_s": 0.1,
        "delivered": 1.0,
    }
    recorder.write(directory / "publish.json", {"args": {"steps": 3}, "cases": {"null": case}})


def test_render_rewrites_only_between_markers_and_keeps_indentation(tmp_path: Path) -> None:
    _fake_results(tmp_path)
    text = (
        "prose before\n"
        "<!-- bench:publish -->\nstale | table\n<!-- /bench:publish -->\n"
        "- a list item:\n\n"
        "  <!-- bench:publish -->\n  <!-- /bench:publish -->\n"
        "prose after\n"
    )
    out = render.render_text(text, render.Results(tmp_path))
    assert out.startswith("prose before\n<!-- bench:publish -->\n| endpoint |")
    assert out.endswith("<!-- /bench:publish -->\nprose after\n")
    assert "stale" not in out
    assert "| null | 0.500 | 1.250 | 2.0 | 0.10 | yes |" in out
    indented = out.split("- a list item:\n\n")[1]
    body = indented.split("  <!-- /bench:publish -->")[0]
    assert all(line.startswith("  ") for line in body.splitlines() if line)
    assert "`python benchmarks/publish.py --steps 3`" in out
    assert render.render_text(out, render.Results(tmp_path)) == out  # stable


def test_check_fails_on_a_hand_edited_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_results(tmp_path)
    doc = tmp_path / "doc.md"
    doc.write_text("<!-- bench:publish -->\n<!-- /bench:publish -->\n")
    monkeypatch.setattr(render, "REPO", tmp_path)
    assert render.main(["--results", str(tmp_path), "doc.md"]) == 0
    assert render.main(["--check", "--results", str(tmp_path), "doc.md"]) == 0
    doc.write_text(doc.read_text().replace("0.500", "0.400"))
    assert render.main(["--check", "--results", str(tmp_path), "doc.md"]) == 1


def test_missing_results_unknown_and_unbalanced_markers_are_named(tmp_path: Path) -> None:
    empty = render.Results(tmp_path)
    with pytest.raises(render.MissingResults, match="make bench BENCH=publish"):
        render.render_text("<!-- bench:publish -->\n<!-- /bench:publish -->\n", empty)
    with pytest.raises(ValueError, match="unknown table marker 'nope'"):
        render.render_text("<!-- bench:nope -->\n<!-- /bench:nope -->\n", empty)
    with pytest.raises(ValueError, match="unbalanced"):
        render.render_text("<!-- bench:publish -->\nno end\n", empty)


def test_recorder_writes_the_command_machine_load_and_versions(tmp_path: Path) -> None:
    recorder = results.Recorder(
        str(REPO / "benchmarks" / "overhead.py"), ["--rounds", "1"], interval=0.01
    )
    path = recorder.write(tmp_path / "x.json", {"figure": 1.5})
    document = json.loads(path.read_text())
    meta = document["provenance"]
    assert document["figure"] == 1.5
    assert meta["command"] == ["python", "benchmarks/overhead.py", "--rounds", "1"]
    assert meta["started_utc"] <= meta["finished_utc"]
    assert meta["machine"]["cpu_count"] >= 1 and meta["machine"]["memory_gib"] > 0
    assert len(meta["load"]["before"]) == 3 and meta["load"]["samples"] >= 2
    assert meta["python"] and meta["torch"] and len(meta["git_commit"]) == 40
    import socket

    assert socket.gethostname() not in path.read_text()  # nothing that names the host
    with pytest.raises(ValueError, match="provenance"):
        results.Recorder(__file__).write(tmp_path / "y.json", {"provenance": 1})
    with pytest.raises(ValueError, match=r"not written by benchmarks/results\.py"):
        (tmp_path / "z.json").write_text("{}")
        results.load(tmp_path / "z.json")


# ------------------------------------------------------------------ the coverage matrix
COVERAGE_DOC = "docs/usage/coverage.md"


def test_the_coverage_matrix_is_generated_into_one_document_only() -> None:
    # Given every document the renderer reads, and the project's other Markdown
    markdown = [REPO / doc for doc in render.DOCS]
    markdown += [REPO / "README.md", REPO / "agent" / "README.md", REPO / "lambdas" / "README.md"]
    markdown += sorted((REPO / "docs").rglob("*.md"))
    # When the coverage markers are looked for
    holding = sorted(
        {
            str(path.relative_to(REPO))
            for path in markdown
            if "<!-- bench:coverage -->" in path.read_text()
        }
    )
    # Then one page holds the matrix, and the renderer keeps it
    assert holding == [COVERAGE_DOC]
    assert COVERAGE_DOC in render.DOCS


def test_a_hand_edit_of_the_coverage_matrix_is_rendered_back() -> None:
    # Given the committed page with one generated cell changed by hand
    text = (REPO / COVERAGE_DOC).read_text()
    cell = "a rank is named when its copy differs from a strict majority"
    assert cell in text
    edited = text.replace(cell, "a rank is named when its copy differs from any other", 1)
    # When it is rendered from the code
    rendered = render.render_text(edited, render.Results(), COVERAGE_DOC)
    # Then the page is what the code says again (so `render.py --check` fails on the edit)
    assert rendered == text != edited


def test_the_matrix_says_what_describe_says_for_each_layout() -> None:
    import coverage_matrix

    # Given the example jobs, one per layout
    jobs = {job.name: job for job in coverage_matrix.jobs()}
    lines = coverage_matrix.render()
    # When describe() is asked about each
    parallelism = {name: job.coverage()["parallelism"] for name, job in jobs.items()}
    weights = {
        name: job.coverage()["checks"]["weight_fingerprints"]["on"] for name, job in jobs.items()
    }
    # Then every layout is in the matrix under the name describe() gives it
    assert parallelism == {
        "DDP": "ddp",
        "FSDP2 full sharding": "fsdp",
        "HSDP": "hsdp",
        "FSDP2 x TP": "fsdp+tp",
        "HSDP x TP": "hsdp+tp",
        "PP x FSDP2": "pp+fsdp",
        "PP x HSDP": "pp+hsdp",
        "TP x PP x HSDP": "pp+hsdp+tp",
    }
    assert all(any(f"`{kind}`" in line for line in lines) for kind in parallelism.values())
    # And check 3 is off exactly where one copy of each slice is kept, which the matrix says
    assert {name for name, on in weights.items() if not on} == {
        "FSDP2 full sharding",
        "FSDP2 x TP",
        "PP x FSDP2",
    }
    off = [line for line in lines if "| **off**: " in line]
    assert {line.split(" | ")[0].lstrip("| ") for line in off} == {
        "FSDP2 full sharding",
        "FSDP2 x TP",
        "PP x FSDP2",
    }
