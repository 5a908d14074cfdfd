"""The YAML, JSON and CSV examples of the docs and the README, each with where it is: the
docs' own test reads every one, the input fuzz test mutates them."""

import re

from support import ROOT

DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
FENCE = re.compile(r"^```(yaml|yml|json|csv)[^\n]*\n(.*?)^```", re.M | re.S)


def examples() -> list[tuple[str, str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            line = text[: m.start()].count("\n") + 1
            out.append((f"{doc.relative_to(ROOT)}:{line}", m.group(1), m.group(2)))
    return out
