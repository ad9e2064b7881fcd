"""Every file, module, make target, script flag and CLI command the docs name exists.

A reader follows the docs to a file or runs the command they show; a name the code no longer
has sends them nowhere. This reads the project's Markdown (README, docs/ with its folders such as
docs/usage/, the packages' READMEs), takes what sits in backticks and in link targets, and checks
each kind of name it recognises against the tree:

- paths (``agent/src/sdc_agent/guard.py``, ``benchmarks/``, a bare ``guard.py``, a glob such as
  ``tests/unit/test_fingerprint*.py``): a tracked file or folder, found from the repository root,
  from the document's folder, or (for a bare name) anywhere in the tree;
- Python names (``sdc_agent.sensors.protect``, ``sdc.Guard``, ``sdc_remediation.cli``): an
  importable module, or an attribute of one;
- ``make TARGET``: a target of the Makefile;
- a script or module with flags (``python benchmarks/overhead.py --against``,
  ``python -m sdc_agent.drill --parallel``): each flag is in the script's source;
- ``sdc-remediation COMMAND --option``: the command and its options are in the CLI's source.

And no doc tells the user to install the agent by its bare name from an index
(``pip install "sdc-agent[aws]"``): it is not on PyPI, so that fails, and whoever registered the
name would be installed into training images. Installs name a path or URL of this repository.

A name kept on purpose as history is marked on its line with the word "history"
(e.g. "(history: ...)"); such lines are not checked.
"""

from __future__ import annotations

import functools
import importlib
import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    "README.md",
    "agent/README.md",
    "lambdas/README.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")),  # usage/ too
]
EXTENSIONS = (".py", ".md", ".sh", ".yaml", ".yml", ".json", ".toml", ".txt", ".cfg", ".ini")
BARE_EXTENSIONS = (".py", ".md", ".sh", ".yaml", ".yml", ".toml")
PY_ROOTS = {"sdc_agent": "sdc_agent", "sdc": "sdc_agent", "sdc_remediation": "sdc_remediation"}
# Where the Python packages live, for modules named by a path below their package.
PACKAGE_DIRS = ["agent/src/sdc_agent", "lambdas/sdc_remediation", "infra", "tests", "benchmarks"]

SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


@functools.cache
def tracked() -> tuple[str, ...]:
    """Every file git tracks or would track (untracked but not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return tuple(line for line in out.splitlines() if (REPO / line).exists())


@functools.cache
def tracked_dirs() -> frozenset[str]:
    dirs = set()
    for path in tracked():
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return frozenset(dirs)


def path_exists(token: str, doc: str) -> bool:
    """Whether ``token`` names a tracked file or folder (see the module docstring)."""
    token = token.rstrip("/")
    bases = ["", str(Path(doc).parent), *PACKAGE_DIRS, "agent/src"]
    files = tracked()
    for base in bases:
        candidate = str(Path(base) / token) if base not in ("", ".") else token
        candidate = str(Path(candidate))
        if any(ch in candidate for ch in "*?["):
            if any(Path(f).match(candidate) for f in files):
                return True
        elif candidate in files or candidate in tracked_dirs():
            return True
    if "/" not in token:  # a bare file name: anywhere in the tree
        return any(f.rsplit("/", 1)[-1] == token for f in files) or any(
            d.rsplit("/", 1)[-1] == token for d in tracked_dirs()
        )
    return any(f.endswith("/" + token) for f in files) or any(
        d.endswith("/" + token) for d in tracked_dirs()
    )


def looks_like_path(token: str) -> bool:
    """A repository path: a known extension, or a folder whose first segment is in the tree."""
    if not re.fullmatch(r"[\w./*\-]+", token) or token.startswith(("/", "..", "~")):
        return False
    if "/" not in token:
        # A bare name is looked up anywhere in the tree: only source-like names, not the
        # run-time files a doc shows as examples (``alarm-step...-rank0.json``).
        return token.endswith(BARE_EXTENSIONS) and "." in token[1:]
    if token.endswith(EXTENSIONS):
        return "." in token.rsplit("/", 1)[-1][1:]
    if token.endswith("/"):
        first = token.split("/", 1)[0]
        return first in tracked_dirs() or any(d.rsplit("/", 1)[-1] == first for d in tracked_dirs())
    return False


@functools.cache
def python_name_exists(name: str) -> bool:
    """Whether ``name`` (dotted, rooted at one of :data:`PY_ROOTS`) is a module or attribute."""
    parts = name.split(".")
    parts[0] = PY_ROOTS[parts[0]]
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


@functools.cache
def make_targets() -> frozenset[str]:
    """The Makefile's targets, with ``$(VAR)`` in target names expanded (``$(STAMP)``)."""
    text = (REPO / "Makefile").read_text()
    variables = dict(re.findall(r"^(\w+)\s*:?=\s*(\S*)", text, flags=re.M))

    def expand(name: str) -> str:
        for _ in range(5):
            name = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), ""), name)
        return name

    targets = re.findall(r"^([$()\w./-]+)\s*:(?!=)", text, flags=re.M)
    return frozenset(expand(t) for t in targets)


def script_source(token: str) -> tuple[str, str] | None:
    """The source of the script or module a command runs, and its name; None when the command
    names none (a flag on its own)."""
    words = token.split()
    if len(words) < 2:
        return None  # a path on its own, not a command
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words):
            module = words[i + 1]
            root = module.split(".", 1)[0]
            if root not in PY_ROOTS:
                return None
            spec = importlib.util.find_spec(module.replace(root, PY_ROOTS[root], 1))
            if spec is None or spec.origin is None:
                return ("", module)
            return (Path(spec.origin).read_text(), module)
        if word.endswith(".py") and "/" in word:
            path = REPO / word
            return (path.read_text() if path.exists() else "", word)
    return None


def cli_sources() -> str:
    return "\n".join(
        (REPO / f).read_text() for f in tracked() if f.startswith("lambdas/") and f.endswith(".py")
    )


def names_in(doc: str) -> list[tuple[int, str]]:
    """(line number, name) for every backticked span and link target of ``doc``, outside
    lines marked as history."""
    found = []
    in_fence = False
    for number, line in enumerate((REPO / doc).read_text().splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            continue
        if "history" in line.lower():
            continue
        if in_fence:
            # Commands shown in code blocks: check what they run.
            stripped = line.split("#", 1)[0].strip()
            if stripped.startswith(("make ", "python ", "sdc-remediation ")):
                found.append((number, stripped))
            continue
        found.extend((number, span.strip()) for span in SPAN.findall(line))
        found.extend((number, target) for target in LINK.findall(line))
    return found


def problem(token: str, doc: str) -> str | None:
    """What is wrong with ``token`` (a name in ``doc``), or None when it exists or is not a
    name this test recognises."""
    token = token.strip()
    if token.startswith(("http://", "https://", "mailto:")):
        return None
    if token.startswith("make "):
        try:
            words = shlex.split(token)[1:]
        except ValueError:
            words = token.split()[1:]
        targets = [w for w in words if "=" not in w and not w.startswith("-")]
        missing = [t for t in targets if t not in make_targets()]
        return f"no Makefile target(s) {missing}" if missing else None
    if token.startswith("sdc-remediation "):
        source = cli_sources()
        words = [w for w in token.split()[1:] if re.fullmatch(r"[a-z][\w-]*|--[\w-]+", w)]
        missing = [
            w
            for w in words
            if f'"{w}"' not in source
            and f"'{w}'" not in source
            and f"def {w.replace('-', '_')}(" not in source
        ]
        command = [w for w in missing if not w.startswith("--")][:1]
        flags = [w for w in missing if w.startswith("--")]
        if command and command[0] == words[0]:
            return f"the CLI has no command {command[0]!r}"
        return f"the CLI has no option(s) {flags}" if flags else None
    flags = re.findall(r"(?<![\w-])--[a-z][\w-]*", token)
    source = script_source(token)
    if source is not None:
        text, script = source
        if not text:
            return f"no script or module {script!r}"
        missing = [f for f in flags if f not in text]
        return f"{script} has no flag(s) {missing}" if missing else None
    first = token.split()[0].rstrip(",;:")
    first = re.sub(r"\(.*$", "", first)
    if first.split(".", 1)[0] in PY_ROOTS and "." in first and "/" not in first:
        if re.fullmatch(r"[\w.]+", first) and not python_name_exists(first):
            return f"no module or attribute {first!r}"
        return None
    if looks_like_path(first) and not ignored(first) and not path_exists(first, doc):
        return f"no file or folder {first!r}"
    return None


def ignored(path: str) -> bool:
    """Whether git ignores ``path`` (a file a command writes, such as ``.deploy-local/...``)."""
    result = subprocess.run(
        ["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, check=False
    )
    return result.returncode == 0


@pytest.mark.parametrize("doc", DOCS)
def test_every_name_the_docs_give_exists(doc):
    # Given the names a document gives in backticks, links and code blocks
    # When each is looked up in the tree, the Makefile, the modules and the scripts' flags
    problems = [
        f"{doc}:{line}: `{name}`: {why}"
        for line, name in names_in(doc)
        if (why := problem(name, doc)) is not None
    ]
    # Then every one exists (or is marked as history on its line)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "name",
    [
        "agent/src/sdc_agent/gradflags.py",
        "gradflags.py",
        "sdc_agent.no_such_module",
        "sdc.Guard.no_such_method",
        "make no-such-target",
        "python benchmarks/overhead.py --no-such-flag",
        "python -m sdc_agent.drill --no-such-flag",
        "sdc-remediation no-such-command",
        "benchmarks/no_such_script.py",
    ],
)
def test_a_name_the_tree_does_not_have_is_reported(name):
    # Given a name nothing in the tree has; When it is looked up; Then it is a problem
    assert problem(name, "docs/performance.md") is not None


@pytest.mark.parametrize(
    "name",
    [
        "agent/src/sdc_agent/guard.py",
        "guard.py",
        "sdc_agent.sensors.protect",
        "sdc.Guard",
        "make test",
        "make demo ARGS=--canary",
        "python -m sdc_agent.drill --parallel fsdp",
        "sdc-remediation pending",
        "benchmarks/",
        "tests/unit/test_fingerprint*.py",
        "sdc.alarm/v1",
        "training.kubeflow.org/job-name",
    ],
)
def test_a_name_the_tree_has_or_that_is_no_path_passes(name):
    assert problem(name, "docs/performance.md") is None


# ---------------------------------------------------------------- installs name this repository
PIP_INSTALL = re.compile(r"\bpip3?\s+install\b(?P<rest>[^`#;|&\n]*)")
# The agent's distribution name with optional extras and version: what an index would resolve.
BARE_AGENT = re.compile(r"sdc[-_.]agent(\[[^\]]*\])?\s*([=<>!~].*)?", re.IGNORECASE)


def bare_agent_installs(line: str) -> list[str]:
    """Each requirement in ``line``'s ``pip install`` commands that an index would resolve as
    ``sdc-agent``: the bare name, with or without extras or a version, not a path (``./agent``)
    nor a direct reference (``sdc-agent[aws] @ git+https://...``)."""
    found = []
    for command in PIP_INSTALL.finditer(line):
        try:
            words = shlex.split(command.group("rest"))
        except ValueError:
            words = command.group("rest").split()
        for i, word in enumerate(words):
            direct = " @ " in word or (i + 1 < len(words) and words[i + 1] == "@")
            if BARE_AGENT.fullmatch(word.strip()) and not direct:
                found.append(word)
    # A backticked ``sdc-agent[aws]`` on its own reads as the thing to install, too.
    found.extend(
        s for s in SPAN.findall(line) if BARE_AGENT.fullmatch(s.strip("\"' ")) and "[" in s
    )
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_no_doc_installs_the_agent_by_its_bare_name_from_an_index(doc):
    # Given every line of a document, code blocks included
    lines = (REPO / doc).read_text().splitlines()
    # When its pip install commands are read
    bare = [
        f"{doc}:{number}: {name!r}"
        for number, line in enumerate(lines, start=1)
        for name in bare_agent_installs(line)
    ]
    # Then none asks an index for sdc-agent: every install is a path or URL of this repository
    assert not bare, "the agent is not on PyPI; install ./agent (docs/agent-install.md):\n" + (
        "\n".join(bare)
    )


@pytest.mark.parametrize(
    "line",
    [
        'pip install "sdc-agent[aws]"',
        "RUN pip install --no-cache-dir sdc-agent",
        "`pip install 'sdc_agent[lightning]'`",
        "pip install -U sdc-agent==0.1.0 boto3",
        "python -m pip install torch sdc-agent[aws,accelerate]",
        "an ImportError that says to install `sdc-agent[aws]`.",
    ],
)
def test_a_bare_name_install_is_found(line):
    assert bare_agent_installs(line)


@pytest.mark.parametrize(
    "line",
    [
        'pip install "./agent[aws]"',
        'RUN pip install --no-cache-dir "/opt/sdc-agent[aws]"',
        'pip install "sdc-agent[aws] @ git+https://example.com/sdc-guard.git@abc#subdirectory=agent"',
        "pip install sdc-agent[aws] @ file:///src/sdc-guard/agent",
        "pip install -e ./agent/contract ./lambdas",
        "Never install its bare name `sdc-agent` from an index",
    ],
)
def test_a_path_or_url_install_passes(line):
    assert not bare_agent_installs(line)
