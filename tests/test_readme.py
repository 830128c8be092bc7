"""The README tells the truth: its kata table is the manifest's, its quick start is two commands."""
from __future__ import annotations

import contextlib
import io
import re

from grader import manifest

README = (manifest.REPO_ROOT / "README.md").read_text(encoding="utf-8")


def test_kata_table_matches_the_manifest():
    block = re.search(r"<!-- kata-table.*?-->\n(.*?)\n<!-- /kata-table -->", README, re.S)
    assert block, "README has no generated kata table"
    assert block.group(1) == manifest.markdown_table()


def test_quick_start_is_exactly_two_commands():
    section = README.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    assert len(commands) == 2
    assert commands[1].startswith('pip install -e ".[dev]" && pytest')


def test_every_environment_variable_the_grader_reads_is_in_the_readme():
    names = set()
    for path in (manifest.PACKAGE_DIR).rglob("*.py"):
        names |= set(re.findall(r"KVKATA_[A-Z_]+", path.read_text(encoding="utf-8")))
    assert names, "the grader reads no KVKATA_ variable: this test looks in the wrong place"
    missing = sorted(n for n in names if f"`{n}" not in README)
    assert not missing, f"README.md does not document {missing}"


def _commands() -> list[str]:
    """Every ``kvkata ...`` command the README shows: in code spans and in bash blocks."""
    spans = re.findall(r"`(kvkata(?: [^`]*)?)`", README)
    blocks = [line.split("  #")[0].strip() for block in re.findall(r"```bash\n(.*?)```", README, re.S)
              for line in block.splitlines() if line.startswith("kvkata")]
    return spans + blocks


def test_every_kvkata_command_in_the_readme_parses():
    import shlex

    from grader import cli

    commands = _commands()
    assert len(commands) > 10
    for command in commands:
        words = [w for w in shlex.split(command.replace("[NN]", "").replace("NN", "03"))[1:]]
        if words and words[0] in cli.DELEGATED:
            continue  # commands with their own parser (bench, notebooks, generate)
        if len(words) == 1:
            words.append("--help")  # a command named in prose: it exists (its arguments may be required)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                cli.parser().parse_args(words)
        except SystemExit as exc:
            assert exc.code == 0, f"README.md shows `{command}`, which kvkata does not accept"
