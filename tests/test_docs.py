"""The documentation's code runs: every Python and bash code block of README.md and docs/*.md.

Sybil (https://sybil.readthedocs.io) reads the Markdown: fenced ```python and ```bash blocks,
hidden set-up blocks (`<!-- invisible-code-block: python ... -->`: the tiny model and sample a
snippet assumes, or a check of what it promised) and skips with their reason
(`<!-- skip: next "why" -->`: commands that install from the package registry, benchmarks
that run for minutes, GPU-only ones). Python blocks run in one namespace per document, in
order, as a reader runs them; bash blocks run in `bash -e -o pipefail` with this Python's
environment first on PATH, so `infertune` and `python` are the ones under test.

Each test is one visible snippet, with the hidden blocks and skips just before it. Every
document runs in a temporary directory of its own, which is also HOME (so `~/...` paths land
there) and is removed at the end. A snippet selected alone (`-k`) first runs the snippets
before it in its document, which it may depend on.

Two kinds of snippet are in the `slow` tier (tests/conftest.py): those of a section that
starts a local Ray (a hidden `_docs.start_ray(...)` through `_docs.stop_ray()`, 5-20 s a
snippet) and the blocks of SLOW_BLOCKS. Nothing after either depends on it, so a snippet
that has one before it passes over it (and a Ray section's hidden checks at its end) when
that one did not run.

Blocks of another language would not run, so any other fence fails
`test_every_code_block_is_run_or_plain_text`: a command is ```bash, output a plain ```.
What the skipped blocks name is still checked where it can be without the network or
minutes: the extras of `pip install` commands exist, no command installs infertune from a
package index, each benchmark command's script and options exist; and every relative link
of the docs resolves.

Two more kinds of check keep the docs honest about numbers and words:

- One source for each number. A benchmark run writes a result folder,
  `docs/benchmarks/<benchmark>/<date>/` (`results.json`, `results.md`: the tables as the docs
  quote them, `README.md`). A doc quotes a table between `<!-- results: PATH -->` and
  `<!-- end results -->`, and the quoted block must equal the file at PATH (trailing
  whitespace aside); every number README.md states in a paragraph that links a result
  folder must appear in that folder's results.json, results.md or README.md.
- The repository speaks of the software, not of how the work on it was organized: no file
  git tracks (or would track) names work periods, numbered rounds of checks, issue
  numbers or where the hardware came from (`test_no_file_speaks_of_how_the_work_was_organized`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import unittest
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sybil import Document, Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Ray reads its authentication settings when it is imported, and keeps its token in ~/.ray,
# which is each document's own HOME here: the token goes in the environment instead, before
# any snippet imports Ray, as tests/deploy/test_ray.py does (whose values win where it sets them).
_RAY_AUTH = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
_RAY_AUTH_SET = {key: value for key, value in _RAY_AUTH.items() if key not in os.environ}
os.environ.update(_RAY_AUTH_SET)
# A bash block runs the CLI on tiny models: a minute is plenty; ten mean it hangs.
BASH_TIMEOUT_S = 600
# What the hidden blocks that open and close a local-Ray section call (DocsHelpers).
RAY_START, RAY_STOP = "_docs.start_ray(", "_docs.stop_ray()"
# Visible blocks of over ~20 s that start no Ray, by their document and a line of theirs,
# and why: the `slow` tier. Each is self-contained: nothing after it reads what it made.
SLOW_BLOCKS = {
    ("getting-started.md", "infertune env --check"): "the command line: seven processes, each "
    "importing TensorFlow, 25-40 s on 2 cores (the unit tier runs demo, env, env --check, "
    "optimize and report in tests/test_cli.py and test_gpu.py)",
}


def _run_bash(example: Example) -> str | None:
    """Run a ```bash block as a script; its output is the failure message if it fails."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # A session of its own: where the block runs past its time, every process it started
    # (the commands under bash, their children) is killed with it, none left running.
    script = subprocess.Popen(
        ["bash", "-e", "-o", "pipefail", "-c", str(example.parsed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = script.communicate(timeout=BASH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(script.pid, signal.SIGKILL)
        stdout, stderr = script.communicate()
        return (
            f"ran past {BASH_TIMEOUT_S} s\n--- stdout (end) ---\n{stdout[-4000:]}"
            f"\n--- stderr (end) ---\n{stderr[-4000:]}"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)  # what the block left in the background
    if script.returncode == 0:
        return None
    return (
        f"exit status {script.returncode}\n--- stdout (end) ---\n{stdout[-4000:]}"
        f"\n--- stderr (end) ---\n{stderr[-4000:]}"
    )


SYBIL = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="bash", evaluator=_run_bash),
        SkipParser(),
    ]
)


class DocsHelpers:
    """What the hidden blocks may call as `_docs`: machinery a reader's machine has already
    (a free port, a local Ray), kept out of the visible snippets."""

    def __init__(self):
        self._ray_dir: str | None = None

    @staticmethod
    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    @staticmethod
    def port_in_use(port: int) -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    def start_ray(self, num_cpus: int) -> None:
        """A local Ray bound to 127.0.0.1, its files in a short temporary directory (unix
        socket paths must stay under 108 bytes)."""
        import logging

        import ray

        self._ray_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
        ray.init(num_cpus=num_cpus, _temp_dir=self._ray_dir, include_dashboard=False,
                 _node_ip_address="127.0.0.1", logging_level=logging.WARNING)  # fmt: skip

    def stop_ray(self) -> None:
        if self._ray_dir is None:
            return
        import ray
        from ray import serve

        if ray.is_initialized():
            serve.shutdown()
            ray.shutdown()
        shutil.rmtree(self._ray_dir, ignore_errors=True)
        self._ray_dir = None


@dataclass
class Snippet:
    """One visible block and the hidden blocks and skips just before it (or, for the last
    snippet of a document, the hidden blocks after it too)."""

    document: DocumentRun
    index: int
    shown: Example
    examples: list[Example]
    ray_section: int | None = None  # the local-Ray section its visible block is in, if any

    @property
    def slow(self) -> bool:
        document, shown = self.document.path.name, str(self.shown.parsed)
        blocks = [line for name, line in SLOW_BLOCKS if name == document]
        return self.ray_section is not None or any(line in shown for line in blocks)

    def evaluate(self) -> None:
        run = self.document
        for example in self.examples:
            section = run.ray_sections.get(id(example))
            if section is not None:
                if RAY_START in str(example.parsed):
                    run.ray_started.add(section)
                elif section not in run.ray_started:
                    continue  # a block of a local-Ray section that was not run
            example.evaluate()


@dataclass
class DocumentRun:
    """A document's snippets, its workspace, and how far its run has got."""

    path: Path
    document: Document
    snippets: list[Snippet] = field(default_factory=list)
    workspace: Path | None = None
    helpers: DocsHelpers | None = None
    next: int = 0
    ray_sections: dict[int, int] = field(default_factory=dict)  # id(example) -> section
    ray_started: set[int] = field(default_factory=set)

    def open(self) -> Path:
        if self.workspace is None:
            self.workspace = Path(tempfile.mkdtemp(prefix=f"docs-{self.path.stem}-"))
            self.helpers = DocsHelpers()
            self.document.namespace["_docs"] = self.helpers
        return self.workspace

    def close(self) -> None:
        if self.workspace is None:
            return
        try:
            self.helpers.stop_ray()
        finally:
            self.document.namespace.clear()  # the models and results it held
            shutil.rmtree(self.workspace, ignore_errors=True)
            self.workspace = None


def _parse(path: Path) -> DocumentRun:
    run = DocumentRun(path, SYBIL.parse(path))
    pending: list[Example] = []
    section, sections = None, 0
    for example in run.document.examples():
        source = str(example.parsed)
        if RAY_START in source:
            section, sections = sections, sections + 1
        if section is not None:
            run.ray_sections[id(example)] = section
        if RAY_STOP in source:
            section = None
        pending.append(example)
        lexemes = example.region.lexemes or {}
        shown = "source" in lexemes and "directive" not in lexemes
        if shown:
            in_section = run.ray_sections.get(id(example))
            run.snippets.append(Snippet(run, len(run.snippets), example, pending, in_section))
            pending = []
    if pending and run.snippets:  # hidden checks after the last snippet belong to it
        run.snippets[-1].examples.extend(pending)
    return run


RUNS = [_parse(path) for path in DOCUMENTS]
SNIPPETS = [
    pytest.param(
        snippet,
        id=f"{run.path.relative_to(ROOT)}:{snippet.shown.line}",
        marks=pytest.mark.slow if snippet.slow else (),
    )
    for run in RUNS
    for snippet in run.snippets
]


@pytest.fixture(scope="module", autouse=True)
def _close_documents():
    yield
    for run in RUNS:
        run.close()
    if "ray" in sys.modules:  # it keeps token mode: a later Ray of this process needs the token
        return
    for key, value in _RAY_AUTH_SET.items():
        if os.environ.get(key) == value:
            del os.environ[key]


@pytest.mark.slow
@pytest.mark.parametrize("snippet", SNIPPETS)
def test_snippet(snippet: Snippet, monkeypatch):
    run = snippet.document
    workspace = run.open()
    monkeypatch.chdir(workspace)
    monkeypatch.setenv("HOME", str(workspace))
    # Run alone: the snippets before it first, as a reader would have.
    while run.next < snippet.index:
        earlier = run.snippets[run.next]
        run.next += 1
        same_section = (
            earlier.ray_section is not None and earlier.ray_section == snippet.ray_section
        )
        if earlier.slow and not same_section:
            continue  # a slow block this snippet does not depend on (see the module's docstring)
        with contextlib.suppress(unittest.SkipTest):
            earlier.evaluate()
    run.next = snippet.index + 1
    try:
        snippet.evaluate()
    except unittest.SkipTest as skip:
        pytest.skip(str(skip))


def test_every_code_block_is_run_or_plain_text():
    """A ```sh or ```console block would be left out silently: commands are ```bash, Python
    is ```python, output and layouts are plain ```."""
    lexer = FencedCodeBlockLexer(language=r"[^\n]*")
    found = []
    for path in DOCUMENTS:
        document = Document(path.read_text(encoding="utf-8"), str(path))
        for region in lexer(document):
            language = region.lexemes["language"].strip()
            if language not in ("python", "bash", ""):
                found.append(f"{path.relative_to(ROOT)}, {document.line_column(region.start)}: "
                             f"```{language}")  # fmt: skip
    assert not found, "code blocks that no test runs:\n" + "\n".join(found)


def test_snippets_were_found_in_every_document_that_has_code():
    """Sybil found the blocks: a change of its Markdown syntax must not pass as 'no snippets'."""
    counts = {run.path.name: len(run.snippets) for run in RUNS}
    for name in ("README.md", "getting-started.md", "api.md", "deploy.md"):
        assert counts[name] >= 3, counts


def test_every_slow_block_is_one_snippet():
    """A SLOW_BLOCKS line the docs no longer hold would leave its block in the unit tier."""
    for name, line in SLOW_BLOCKS:
        found = [snippet for run in RUNS if run.path.name == name for snippet in run.snippets
                 if line in str(snippet.shown.parsed)]  # fmt: skip
        assert len(found) == 1, f"{name}: {len(found)} blocks hold {line!r}"


def _pip_install_arguments(text: str) -> list[str]:
    """The arguments of every `pip install` command in `text`, quotes removed."""
    found = []
    for command in re.findall(r"pip install ([^\n`#&|]*)", text):
        found += shlex.split(command.rstrip().removesuffix("\\"))  # a line continued
    return found


def test_every_extra_the_docs_install_exists():
    """The install commands are checked by hand in a fresh venv (they need the registry);
    what can be checked here: every extra they name is one pyproject.toml defines."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    extras = set(pyproject["project"]["optional-dependencies"])
    named = set()
    for path in DOCUMENTS:
        for argument in _pip_install_arguments(path.read_text(encoding="utf-8")):
            match = re.fullmatch(r"(?:\.|[\w./-]*infertune[\w.-]*)\[([\w,-]+)\]", argument)
            if match:
                named.update(match.group(1).split(","))
    assert named, "no pip install command with an extra was found"
    assert named <= extras, f"extras the docs name that pyproject.toml lacks: {named - extras}"


def test_no_doc_installs_infertune_from_a_package_index():
    """infertune is not on a package index: `pip install infertune` or "infertune[cpu]" fails;
    the docs install the checkout (".[cpu]") or a wheel built from it."""
    wrong = []
    for path in DOCUMENTS:
        for argument in _pip_install_arguments(path.read_text(encoding="utf-8")):
            if re.fullmatch(r"infertune(\[[\w,-]+\])?", argument):
                wrong.append(f"{path.relative_to(ROOT)}: pip install {argument}")
    assert not wrong, "\n".join(wrong)


def _benchmark_commands() -> list[tuple[str, list[str]]]:
    """Each benchmark command of the docs and the changelog: the suite's scripts
    (`python benchmarks/NAME.py`) and the studies (`python -m benchmarks.studies.NAME`), with
    the options on the same line."""
    commands = []
    for path in [*DOCUMENTS, ROOT / "CHANGELOG.md"]:
        text = path.read_text(encoding="utf-8")
        for script, options in re.findall(r"python3? (benchmarks/[a-z_]+\.py)([^\n`#]*)", text):
            commands.append((script, re.findall(r"(--[a-z][a-z0-9-]*)", options)))
        for study, options in re.findall(
            r"python3? -m benchmarks\.studies\.([a-z_]+)([^\n`#]*)", text
        ):
            options = re.findall(r"(--[a-z][a-z0-9-]*)", options)
            commands.append((f"benchmarks/studies/{study}.py", options))
    return commands


def test_benchmark_commands_name_scripts_and_options_that_exist():
    """The benchmarks run for minutes, so their blocks are skipped; each command the docs
    give still names a script that exists and options that script defines."""
    commands = _benchmark_commands()
    assert commands
    for script, options in commands:
        source = ROOT / script
        assert source.is_file(), f"{script} does not exist"
        text = source.read_text(encoding="utf-8")
        for option in options:
            assert f'"{option}"' in text, f"{script} defines no {option}"


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file: lower case, punctuation dropped,
    spaces as hyphens."""
    prose = re.sub(r"^```.*?^```|<!--.*?-->", "", markdown, flags=re.MULTILINE | re.DOTALL)
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", prose, re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


def test_every_relative_link_resolves():
    """Links between the docs, and to the result files under docs/benchmarks/, point at
    something that exists: a file, a directory, or a heading of a Markdown file."""
    broken = []
    for path in [*DOCUMENTS, ROOT / "CHANGELOG.md", *RESULTS.glob("*/*/README.md")]:
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such file)")
            elif (
                anchor
                and resolved.suffix == ".md"
                and anchor not in _anchors(resolved.read_text(encoding="utf-8"))
            ):
                broken.append(f"{path.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


# -- one source for each number -------------------------------------------------------------
RESULTS = ROOT / "docs" / "benchmarks"
QUOTE = re.compile(r"<!-- results: (\S+) -->\n(.*?)<!-- end results -->", re.DOTALL)
# README's links to a result folder (or a file in one): docs/benchmarks/<benchmark>/<date>/
FOLDER_LINK = re.compile(r"\]\((docs/benchmarks/[a-z0-9-]+/\d{4}-\d{2}-\d{2}[a-z0-9-]*)/?[^)]*\)")
RESULT_KEYS = {"benchmark", "command", "date", "commit", "machine", "rows", "targets"}


def _result_folders() -> list[Path]:
    return sorted(path.parent for path in RESULTS.glob("*/*/results.json"))


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def test_every_quoted_result_equals_its_results_file():
    """A table quoted from a run is that run's results.md, byte for byte (trailing whitespace
    aside): a number changes in the result folder, never in the doc alone."""
    quoted, wrong = 0, []
    for path in [*DOCUMENTS, ROOT / "CHANGELOG.md"]:
        for source, block in QUOTE.findall(path.read_text(encoding="utf-8")):
            quoted += 1
            where = f"{path.relative_to(ROOT)} quotes {source}"
            file = ROOT / source
            if not re.fullmatch(r"docs/benchmarks/[a-z0-9-]+/[0-9][0-9a-z-]+/results\.md", source):
                wrong.append(f"{where}: not a result folder's results.md")
            elif not file.is_file():
                wrong.append(f"{where}: no such file")
            elif _lines(block) != _lines(file.read_text(encoding="utf-8")):
                wrong.append(f"{where}: the block differs from the file")
    assert quoted, "no quoted result block found"
    assert not wrong, "\n".join(wrong)


def test_every_result_folder_holds_a_run_described():
    """docs/benchmarks/<benchmark>/<date>/ holds results.json (what ran, how, where, when:
    the keys below), results.md and README.md; nothing lies beside the folders; the index of
    docs/benchmarks.md lists every folder."""
    folders = _result_folders()
    assert folders, "no result folder"
    index = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    wrong = []
    for entry in RESULTS.iterdir():
        if not entry.is_dir():
            wrong.append(f"{entry.relative_to(ROOT)}: a file beside the benchmarks' folders")
        for inner in entry.iterdir() if entry.is_dir() else ():
            if not (inner / "results.json").is_file():
                wrong.append(f"{inner.relative_to(ROOT)}: not a result folder (no results.json)")
    for folder in folders:
        name = folder.relative_to(ROOT)
        for required in ("results.md", "README.md"):
            if not (folder / required).is_file():
                wrong.append(f"{name}: no {required}")
        data = json.loads((folder / "results.json").read_text(encoding="utf-8"))
        missing = RESULT_KEYS - set(data)
        if missing:
            wrong.append(f"{name}/results.json lacks {sorted(missing)}")
            continue
        if data["benchmark"] != folder.parent.name:
            wrong.append(f"{name}: benchmark {data['benchmark']!r} in a folder of another")
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", data["date"]) or not folder.name.startswith(
            data["date"]
        ):
            wrong.append(f"{name}: date {data['date']!r} is not the folder's")
        if not {"cpu", "flags", "cores", "gpu"} <= set(data["machine"]):
            wrong.append(f"{name}/results.json: machine lacks cpu, flags, cores or gpu")
        for target in data["targets"]:
            if not {"name", "target", "value", "met"} <= set(target):
                wrong.append(f"{name}/results.json: a target without name, target, value, met")
        if f"(benchmarks/{folder.parent.name}/{folder.name}/)" not in index:
            wrong.append(f"{name}: not in docs/benchmarks.md's index of result folders")
    assert not wrong, "\n".join(wrong)


def _numbers(text: str) -> list[str]:
    """The numbers a sentence states: not those inside a word (ResNet50, fp32), inline code or
    a link's target."""
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.findall(r"(?<![\w.])\d+(?:\.\d+)?", text)


def _paragraphs(markdown: str) -> list[str]:
    """The prose of a Markdown text, a paragraph or a list item each: code blocks, comments
    and quoted result blocks taken out."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    prose = re.sub(r"<!--.*?-->", "", QUOTE.sub("", prose), flags=re.DOTALL)
    found = []
    for block in re.split(r"\n\s*\n", prose):
        items = re.split(r"\n(?=- |\* |\d+\. )", block.strip())
        found += [item for item in items if item and not item.startswith(("|", "#"))]
    return found


def test_readme_states_only_numbers_its_result_folders_hold():
    """README's headline numbers come from the runs it links: each number of a paragraph that
    links a result folder appears in that folder's results.json, results.md or README.md."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    checked, wrong = 0, []
    for paragraph in _paragraphs(readme):
        folders = {(ROOT / link).resolve() for link in FOLDER_LINK.findall(paragraph)}
        if not folders:
            continue
        checked += 1
        held = ""
        for folder in folders:
            for name in ("results.json", "results.md", "README.md"):
                if (folder / name).is_file():
                    held += (folder / name).read_text(encoding="utf-8") + "\n"
        for number in _numbers(paragraph):
            if not re.search(rf"(?<![\d.]){re.escape(number)}(?!\d)", held):
                first_line = paragraph.strip().split("\n")[0][:70]
                wrong.append(f"{number} (in: {first_line}...)")
    assert checked >= 3, "README's headline links no result folder"
    assert not wrong, "README numbers no linked result file holds:\n" + "\n".join(wrong)


def test_no_readme_paragraph_runs_over_eight_lines():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    long = [p.split("\n")[0][:70] for p in _paragraphs(readme) if p.count("\n") >= 8]
    assert not long, f"paragraphs over 8 lines: {long}"


# -- words about how the work was organized ---------------------------------------------------
_ORDINAL = (
    r"(?:second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth"
    r"|later|earlier|previous|last|\d+(?:st|nd|rd|th))"
)
_NUMBER_WORD = r"(?:two|three|four|five|six|seven|eight|nine|ten|several)"
_UPSTREAM = r"(?:tf2onnx|tensorflow|keras|onnxruntime|onnx|openvino|nncf|litert|ray|triton)"
DIARY = {
    # a period of the work, named by its place in a sequence or relative to another
    "a work session": re.compile(
        rf"\b(?:{_ORDINAL}|next|this)\s+(?:precision\s+|GPU\s+)?sessions?\b"
        rf"|\bin\s+{_NUMBER_WORD}\s+sessions\b|\b\w+\s+sessions'\s+(?:code|runs?)\b"
        r"|\bsessions?\s+(?:before|above|ago)\b|\bthe\s+session\s+(?:after|before)\s+that\b"
        r"|\b(?:of|in)\s+(?:that|one)\s+session(?=\s*[,;.)])",
        re.IGNORECASE,
    ),
    # a round of checks named by its number or its place in a sequence
    "a numbered pass": re.compile(
        rf"\b{_ORDINAL}\s+(?:GPU\s+)?pass(?:es)?\b|\b(?:in|of|from|since)\s+pass\s+\d+\b"
        r"|\bpass\s+\d+'s\b|\bpasses\s+(?:before|above)\b|\bper\s+pass\b"
        r"|\b(?:a|one\s+more)\s+pass\s+(?:before|ran|after)\b",
        re.IGNORECASE,
    ),
    "an issue number": re.compile(
        r"\bissues?\s+#?\d+\b|\b(?:the|this)\s+issue's\b|\b(?:of|in)\s+the\s+issue\b"
        r"|\bthe\s+issue\s+asks\b",
        re.IGNORECASE,
    ),
    "a #number": re.compile(r"(?<![\w&/#])#\d{2,}\b(?![0-9a-fA-F])"),
    "borrowed hardware": re.compile(
        r"\b(?:was|were|been)\s+lent\b|\bworkplace\b|\bdevice\s+tool\b"
        r"|\bminutes\s+of\s+(?:the\s+)?device(?:'s)?\s+time\b|\bof\s+device\s+time\b",
        re.IGNORECASE,
    ),
}


def _repository_text_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"],
            capture_output=True, check=True, timeout=60,
        ).stdout.decode()  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"git cannot list the repository's files here: {exc}")
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def test_no_file_speaks_of_how_the_work_was_organized():
    """Dates, versions and commits are what a reader can look up; the periods, rounds and
    tickets the work was organized in are not. Every text file git tracks or would track (the
    docs, the changelog, the code, the tests, the benchmarks, the result folders) is free of
    them. ONNX Runtime's sessions, tf2onnx's optimizer passes, a candidate that passes the
    gate and an upstream project's issue (`tf2onnx #2448`) are not what these patterns mean."""
    found = []
    for path in _repository_text_files():
        raw = path.read_bytes()
        if b"\0" in raw[:8192]:
            continue  # binary
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        flat = re.sub(r"\n[ \t#*>/-]*", lambda m: " " * len(m.group(0)), text)  # a phrase may wrap
        for what, pattern in DIARY.items():
            for match in pattern.finditer(flat):
                before = flat[max(0, match.start() - 20) : match.start()]
                if re.search(rf"\b{_UPSTREAM} $", before, re.IGNORECASE):
                    continue  # an upstream project's issue: "tf2onnx #2448"
                if re.fullmatch(r"#(\d{3}|\d{6})", match.group(0)) and re.search(
                    r"colou?r|fill|stroke|background", flat[match.start() - 40 : match.start()]
                ):
                    continue  # a colour
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}: {what}: {match.group(0)!r}")
    assert not found, "words about how the work was organized:\n" + "\n".join(found)
