"""The documentation: the site builds strictly, and every code block of the README and docs/ runs.

Each page runs in a fresh folder, its blocks in order, so the files and baselines that one block
makes are there for the next; `examples/` (with `baselines/`), `tuned/` and `tests/data/` are
copied in when the page's code names them, as a checkout has them.

- ```python: a block that defines ``test_*`` functions runs under ``python -m pytest``, any
  other with ``python``.
- ```bash / ```sh: one command a line, ``oam ...`` or ``python ...`` (``NAME=VALUE`` may stand
  before it).
- ```console: ``$ COMMAND`` lines, each followed by what it printed: those lines are matched in
  order against the real output (``*`` matches anything within a line; other lines may come
  between, and a ``...`` line only says so to the reader).
- ```text: what the block before it printed, matched the same way.
- ```toml / ```ini / ```python marked ``file NAME``: written to NAME for a later block, which
  must name it; a ``[pytest]`` ini block without a file configures a profiled test run that must
  pass. ```yaml: parsed.

Commands and blocks exit 0 unless marked. A marker is an HTML comment on the line before the
block, ``<!-- docs-test: WORDS -->``, several words separated by ``;``: ``skip (REASON)`` (not
run; the reason is required, and the inventory lists every skipped block), ``file NAME``,
``exit N`` (the block's last command exits N) and ``illustrative`` (a text block that no
command printed).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: Folders of the checkout that a page's code may use, copied into its folder when named.
CHECKOUT_FOLDERS = {"examples": ("examples", "baselines"), "tuned": ("tuned",), "tests/data": ("tests/data",)}
#: The project's rule: the README keeps exactly these two set-up commands.
SETUP_COMMANDS = [
    "python -m pip install '.[examples]' && python -m pytest examples --oam-baseline",
    "python -m pip install '.[test]' && python -m pytest",
]
COMMAND_TIMEOUT_S = 180
MARKER = re.compile(r"^\s*<!--\s*docs-test:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
RUN_LANGUAGES = {"python", "bash", "sh", "console"}
KNOWN_LANGUAGES = RUN_LANGUAGES | {"text", "toml", "ini", "yaml"}


@dataclasses.dataclass
class Block:
    """One fenced block of a page, with what its marker says."""

    page: Path
    line: int  # of the opening fence, from 1
    language: str
    code: str
    skip: str | None = None  # the reason
    file: str | None = None
    exit: int = 0
    illustrative: bool = False
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runs(self) -> str:
        """What the block runs or writes (a console block's commands, not its output)."""
        if self.language == "console":
            return "\n".join(line for line in self.code.splitlines() if line.startswith("$ "))
        return "" if self.language == "text" else self.code


def parse_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, each with the marker on the line before it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, language = opening.groups()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: the block is never closed")
        code = "\n".join(line[len(indent):] for line in lines[i + 1:end]) + "\n"
        block = Block(page, i + 1, language, code)
        marker = MARKER.match(lines[i - 1]) if i else None
        if marker:
            _apply_marker(block, marker.group(1))
        blocks.append(block)
        i = end + 1
    return blocks


def _split_marker(text: str) -> list[str]:
    """The words of a marker, split at each ``;`` outside parentheses (a reason may hold one)."""
    words, depth, word = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == ";" and depth == 0:
            words.append(word)
            word = ""
        else:
            word += char
    return [w.strip() for w in [*words, word] if w.strip()]


def _apply_marker(block: Block, text: str) -> None:
    for word in _split_marker(text):
        if word.startswith("skip"):
            reason = re.fullmatch(r"skip\s*\((.+)\)", word, re.DOTALL)
            if reason:
                block.skip = " ".join(reason.group(1).split())
            else:
                block.problems.append("a skipped block needs its reason: <!-- docs-test: skip (REASON) -->")
        elif word.startswith("file "):
            block.file = word.split(None, 1)[1].strip()
        elif re.fullmatch(r"exit \d+", word):
            block.exit = int(word.split()[1])
        elif word == "illustrative":
            block.illustrative = True
        else:
            block.problems.append(f"unknown docs-test marker {word!r}")


def check_page(blocks: list[Block]) -> list[str]:
    """What is wrong with a page's blocks before anything runs, each problem with its line."""
    problems = []
    for n, block in enumerate(blocks):
        problems += [f"{block.where}: {problem}" for problem in block.problems]
        if block.skip:
            continue
        if block.language not in KNOWN_LANGUAGES:
            problems.append(f"{block.where}: give the block a language the docs test knows "
                            f"({', '.join(sorted(KNOWN_LANGUAGES))}), not {block.language!r}, "
                            "or skip it with a reason")
        if block.language == "toml" and not block.file:
            problems.append(f"{block.where}: a toml block is a job file: mark it <!-- docs-test: file NAME -->")
        if block.file:
            later = "\n".join(b.runs for b in blocks[n + 1:] if not b.skip)
            users = ("-m pytest",) if block.file in ("conftest.py", "pytest.ini") else (
                block.file, Path(block.file).stem)
            if not any(user in later for user in users):
                problems.append(f"{block.where}: the block is written to {block.file}, but no later block uses it")
        if block.language == "text" and not block.illustrative and not any(
                b.language in RUN_LANGUAGES and not b.skip for b in blocks[:n]):
            problems.append(f"{block.where}: a text block is what a block before it printed, and there is "
                            "none: mark it <!-- docs-test: illustrative -->")
        if block.language in ("bash", "sh"):
            for command in _commands(block.code):
                try:
                    _argv(command)
                except ValueError as exc:
                    problems.append(f"{block.where}: {exc}")
    return problems


def _commands(code: str) -> list[str]:
    """The commands of a bash block: one a line, backslash continuations joined, comments left out."""
    return [c for c in code.replace("\\\n", " ").splitlines() if c.strip() and not c.lstrip().startswith("#")]


def _argv(command: str) -> tuple[dict[str, str], list[str]]:
    """The environment and the argument list of one documented command.

    Raises:
        ValueError: a command the docs test does not run (skip its block, with the reason).
    """
    words = shlex.split(command, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, value = words.pop(0).split("=", 1)
        env[name] = value
    if any(word in ("&&", "||", "|", ";", ">", ">>", "<") for word in words):
        raise ValueError(f"{command!r}: shell syntax; write one command a line, or skip the block with a reason")
    if words[:3] == ["python", "-m", "pip"]:
        raise ValueError(f"{command!r} installs packages: skip the block with a reason")
    if words[:1] == ["oam"]:
        return env, [sys.executable, "-m", "pytest_oam", *words[1:]]
    if words[:1] == ["python"]:
        return env, [sys.executable, *words[1:]]
    raise ValueError(f"{command!r} is neither `oam ...` nor `python ...`: skip the block with a reason")


def match_lines(expected: str, output: str) -> str | None:
    """``None`` when every expected line matches a whole output line, in order (``*`` matches
    anything within a line; ``...`` lines and blank ones are passed over); else the first line
    that did not."""
    lines = [line.rstrip() for line in output.splitlines()]
    at = 0
    for want in (w.rstrip() for w in expected.splitlines()):
        if not want.strip() or want.strip() == "...":
            continue
        pattern = re.compile(".*".join(map(re.escape, want.split("*"))))
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            return want
        at += 1
    return None


def _environment() -> dict[str, str]:
    """What a user's terminal has: the outer run's environment without its pytest settings and
    without CI's marks (under CI=true pytest prints its summary lines uncut), 80 columns wide."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "COV_CORE_")) and k not in ("CI", "BUILD_NUMBER")}
    env.update(COLUMNS="80", NO_MKDOCS_2_WARNING="1", PYTHONDONTWRITEBYTECODE="1")
    return env


class PageRun:
    """Runs one page's blocks in order, in one folder."""

    def __init__(self, folder: Path, blocks: list[Block]) -> None:
        self.folder = folder
        self.blocks = blocks
        self.output = ""  # what the last block that ran printed
        self.env = _environment()
        named = "\n".join(b.runs for b in blocks if not b.skip)
        for name, folders in CHECKOUT_FOLDERS.items():
            if re.search(rf"(?<![\w/.-]){re.escape(name)}(/|\b)", named):
                for folder_name in folders:
                    shutil.copytree(ROOT / folder_name, folder / folder_name)

    def run_all(self) -> None:
        for n, block in enumerate(self.blocks):
            if not block.skip:
                self.run_block(n, block)

    def run_block(self, n: int, block: Block) -> None:
        if block.file:
            (self.folder / block.file).write_text(block.code, encoding="utf-8")
            if block.language == "toml" and sys.version_info >= (3, 11):
                import tomllib

                tomllib.loads(block.code)
        elif block.language == "python":
            is_test = re.search(r"^\s*(async\s+)?def test_\w*\(", block.code, re.MULTILINE)
            name = f"{'test_' if is_test else ''}docs_block_{n}.py"
            (self.folder / name).write_text(block.code, encoding="utf-8")
            command = f"python -m pytest -p no:cacheprovider {name}" if is_test else f"python {name}"
            self.run(command, block.exit, block)
        elif block.language in ("bash", "sh"):
            commands = _commands(block.code)
            for i, command in enumerate(commands):
                self.run(command, block.exit if i == len(commands) - 1 else 0, block)
        elif block.language == "console":
            self.console(block)
        elif block.language == "text" and not block.illustrative:
            self.check_output(block.code, block, "the block before it")
        elif block.language == "ini":
            self.ini(n, block)
        elif block.language == "yaml":
            _require("yaml")
            import yaml

            yaml.safe_load(block.code)

    def run(self, command: str, expected_exit: int, block: Block) -> None:
        env, argv = _argv(command)
        result = subprocess.run(argv, check=False, cwd=self.folder, env={**self.env, **env}, capture_output=True,
                                text=True, timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
        self.output = result.stdout + result.stderr
        crashed = expected_exit and "Traceback (most recent call last)" in result.stderr
        if result.returncode != expected_exit or crashed:
            pytest.fail(f"{block.where}: `{command}` exited {result.returncode}, the docs say {expected_exit}:\n"
                        f"{self.output}", pytrace=False)

    def console(self, block: Block) -> None:
        sessions: list[tuple[str, list[str]]] = []
        for line in block.code.splitlines():
            if line.startswith("$ "):
                sessions.append((line[2:], []))
            elif sessions:
                sessions[-1][1].append(line)
            elif line.strip():
                pytest.fail(f"{block.where}: a console block starts with a `$ COMMAND` line", pytrace=False)
        for i, (command, expected) in enumerate(sessions):
            self.run(command, block.exit if i == len(sessions) - 1 else 0, block)
            self.check_output("\n".join(expected), block, f"`{command}`")

    def check_output(self, expected: str, block: Block, what: str) -> None:
        missing = match_lines(expected, self.output)
        if missing is not None:
            pytest.fail(f"{block.where}: {what} did not print this line (or not in this order):\n  {missing}\n"
                        f"what it printed:\n{self.output}", pytrace=False)

    def ini(self, n: int, block: Block) -> None:
        """A ``[pytest]`` configuration: a profiled test must run under it."""
        folder = self.folder / f"ini_block_{n}"
        folder.mkdir()
        (folder / "pytest.ini").write_text(block.code, encoding="utf-8")
        (folder / "test_ini.py").write_text(
            "def matmul(npu):\n    npu.matmul(npu.tensor((256, 256)), npu.tensor((256, 256)))\n\n\n"
            "def test_ini(oam_profile):\n    oam_profile.run(matmul)\n", encoding="utf-8")
        result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider"], check=False, cwd=folder,
                                env=self.env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        assert result.returncode == 0, (f"{block.where}: a profiled test does not run under this configuration:\n"
                                        f"{result.stdout}{result.stderr}")


def test_every_block_is_run_or_skipped_with_a_reason() -> None:
    """The inventory: every block has a language the test runs and every skip its reason; the
    counts and the skipped blocks are printed (``pytest -s`` or ``-rP`` shows them)."""
    blocks = [b for page in PAGES for b in parse_blocks(page)]
    problems = [problem for page in PAGES for problem in check_page(parse_blocks(page))]
    assert not problems, "\n".join(problems)
    counts: dict[str, int] = {}
    for block in blocks:
        if not block.skip:
            counts[block.language] = counts.get(block.language, 0) + 1
    skipped = [b for b in blocks if b.skip]
    print(f"{len(blocks)} code blocks in {len(PAGES)} pages: {len(blocks) - len(skipped)} checked "
          f"({', '.join(f'{n} {language}' for language, n in sorted(counts.items()))}), {len(skipped)} skipped:")
    for block in skipped:
        print(f"  {block.where}: {block.skip}")


@pytest.mark.parametrize(
    "page", [p for p in PAGES if any(not b.skip and b.language != "text" for b in parse_blocks(p))],
    ids=lambda page: str(page.relative_to(ROOT)))
def test_code_blocks_run(page: Path, tmp_path: Path) -> None:
    blocks = parse_blocks(page)
    problems = check_page(blocks)
    assert not problems, "\n".join(problems)
    PageRun(tmp_path, blocks).run_all()


def test_readme_is_a_front_page() -> None:
    """At most 200 lines, exactly the two set-up commands, and links that resolve."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200, "the README is a front page: move the details to docs/"
    installs = [b.code.strip() for b in parse_blocks(ROOT / "README.md") if "pip install" in b.code]
    assert installs == SETUP_COMMANDS
    for target, anchor in re.findall(r"\]\(((?!https?:)[^)#\s]+)(?:#([^)\s]+))?\)", text):
        assert (ROOT / target).exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(ROOT / target), f"README.md links to {target}#{anchor}: no such heading"


def _anchors(page: Path) -> set[str]:
    """The anchors MkDocs makes of a page's headings (the toc extension's slugs)."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", page.read_text(encoding="utf-8"), re.MULTILINE)
    return {re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", h.replace("`", "")).strip().lower()) for h in headings}


def test_match_lines() -> None:
    output = "a [1, 2] b\nskipped\nstep  4.153 ms   pass\n"
    assert match_lines("a [1, 2] b\n...\nstep  *ms   pass", output) is None
    assert match_lines("step*\na [1, 2] b", output) == "a [1, 2] b"  # in order
    assert match_lines("a [1, 2]", output) == "a [1, 2]"  # a whole line, not a part of one


def test_markers() -> None:
    block = Block(ROOT / "README.md", 1, "bash", "")
    _apply_marker(block, " skip (slow; over a minute) ; exit 1 ")
    assert (block.skip, block.exit, block.problems) == ("slow; over a minute", 1, [])
    for text, problem in [("skip", "a skipped block needs its reason"), ("skip()", "a skipped block needs its reason"),
                          ("run fast", "unknown docs-test marker")]:
        block = Block(ROOT / "README.md", 1, "bash", "")
        _apply_marker(block, text)
        assert block.skip is None and block.problems and block.problems[0].startswith(problem)


def test_mkdocs_builds_strictly(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, anchor, page or docstring fails it. In CI
    (CI=true) a missing MkDocs fails instead of skipping: `pip install '.[test]'` installs it."""
    _require("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                            check=False, cwd=ROOT, env=_environment(), capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    assert (tmp_path / "site" / "index.html").exists()


def _require(*modules: str) -> None:
    """Skip without the docs extra, except in CI (CI=true), where `pip install '.[test]'` has
    installed it and a missing module fails the test."""
    missing = [name for name in modules if not _importable(name)]
    if missing:
        message = f"{', '.join(missing)} not installed: python -m pip install '.[docs]'"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False
