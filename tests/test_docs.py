"""Every command in the docs is accepted. Each `ddl-run`, `ddl-report`, `ddl-data` and `ddl-track` line of the fenced
code blocks of README.md and docs/*.md runs: a `ddl-run` line as a dry run, the others with `--help`. A line marked
`# refused: ...` must be refused in one line, exit 2. So a removed sweep, a renamed key or a plan the tool now refuses
cannot stay in the docs. (Indented blocks are diagrams, not commands.)"""

from __future__ import annotations

import re
import shlex

import pytest

from tests.conftest import ROOT, run_cli

FENCE = re.compile(r"^( *)```[^\n]*\n(.*?)^\1```", re.M | re.S)
TOOLS = ("ddl-run", "ddl-report", "ddl-data", "ddl-track")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands(text: str) -> list[tuple[tuple[str, ...], bool]]:
    """(the command's words, whether it is marked refused) for each tool line of the text's fenced blocks; a line
    continued with a backslash is one command."""
    found = []
    for block in FENCE.finditer(text):
        for line in block.group(2).replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix(".venv/bin/")
            words = shlex.split(line, comments=True)
            if words and words[0] in TOOLS:
                found.append((tuple(words), "# refused" in line))
    return found


def documented() -> list:
    seen = {}
    for page in PAGES:
        for words, refused in commands(page.read_text()):
            seen.setdefault((words, refused), page.relative_to(ROOT))
    return [pytest.param(words, refused, id=f"{page}: {' '.join(words)}"[:150]) for (words, refused), page in
            seen.items()]


def problem(words: tuple[str, ...], refused: bool) -> str | None:
    """What is wrong with a documented command, run as the docs' test runs it; None when it is as the docs say."""
    tool, *args = words
    if tool == "ddl-run":
        out = run_cli(tool, *args, *([] if "--dry-run" in args else ["--dry-run"]))
    else:
        out = run_cli(tool, *args, "--help")
    said = (out.stdout + out.stderr).strip()
    if "Traceback" in said:
        return f"a traceback: {said[-1500:]}"
    if refused:
        errors = [line for line in out.stderr.strip().splitlines() if line]
        if out.returncode != 2 or len(errors) != 1 or not errors[0].startswith(f"{tool}: error: "):
            return f"marked refused, but exit {out.returncode}: {said[-1500:]}"
        return None
    return None if out.returncode == 0 else f"exit {out.returncode}: {said[-1500:]}"


@pytest.mark.parametrize("words, refused", documented())
def test_a_documented_command_is_accepted_or_refused_as_marked(ddl_home, words, refused):
    assert problem(words, refused) is None
    assert not ddl_home.exists() or not any(ddl_home.iterdir()), "a dry run or --help wrote into DDL_HOME"


def test_a_removed_sweep_in_the_readme_fails_the_docs_test(ddl_home):
    """The README with a block naming a sweep that does not exist: its command is found, and the check above fails
    on it; the README as it is has no such command."""
    readme = (ROOT / "README.md").read_text()
    bad = readme + "\n```sh\nddl-run -m +sweep=no_such_sweep --dry-run\n```\n"
    [(words, refused)] = [c for c in commands(bad) if c not in commands(readme)]
    assert words == ("ddl-run", "-m", "+sweep=no_such_sweep", "--dry-run") and not refused
    assert "no_such_sweep" in problem(words, refused)
    assert sum(len(commands(page.read_text())) for page in PAGES) >= 20
