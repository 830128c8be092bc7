"""The README tells the truth: its kata table is the manifest's, its quick start is two commands."""
from __future__ import annotations

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
