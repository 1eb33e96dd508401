"""``python -m normbench list [GROUP]``: the options of each config group, with their papers.

An option's line is the first sentence of its ``conf/<group>/<option>.yaml`` header comment, plus
the sentence that cites its source (a paper, a year, a repository) when that is another one.
Names registered in code without a conf file (a ``NORMBENCH_PLUGINS`` module) are listed too.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from normbench.config.files import GROUPS, config_dir, options
from normbench.errors import error

_CITES = re.compile(r"arXiv|et al\.|\b(19|20)\d\d\b|\b[A-Za-z][A-Za-z0-9-]{2,}/[A-Za-z][\w.-]{2,}")
_SENTENCE_END = re.compile(r"(?<!al\.)(?<!e\.g\.)(?<!i\.e\.)(?<!vs\.)(?<=[.?!])\s+(?=[A-Za-z(`])")
_LIST_WIDTH = 150  # characters of description per option in `normbench list`


def describe(path: Path) -> str:
    """A config file's first sentence, plus the sentence that cites its source if that is another one."""
    header = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("#"):
            break
        if not line.startswith("# @package"):
            header.append(line.lstrip("# ").strip())
    sentences = _SENTENCE_END.split(" ".join(header))
    if not sentences or not sentences[0]:
        return ""
    first = sentences[0]
    if _CITES.search(first):
        return textwrap.shorten(first, _LIST_WIDTH, placeholder=" ...")
    ref = next((s for s in sentences[1:] if _CITES.search(s)), "")
    if not ref:
        return textwrap.shorten(first, _LIST_WIDTH, placeholder=" ...")
    ref = textwrap.shorten(ref.rstrip("."), 70, placeholder=" ...")
    return f"{textwrap.shorten(first, max(90, _LIST_WIDTH - len(ref) - 4), placeholder=' ...')}  [{ref}]"


def list_cli(argv: list[str]) -> int:
    groups = argv or list(GROUPS)
    for group in groups:
        if group not in GROUPS:
            return error(f"unknown group {group!r}; choose one of: {', '.join(GROUPS)}")
    from normbench import validation  # deferred (start-up time): torch, hydra, omegaconf

    registries = {"arch": validation.archs, "norm": validation.norms, "optim": validation.optims}
    for group in groups:
        print(f"{group}:")
        for opt in options(group):
            print(f"  {opt:<16} {describe(config_dir() / group / f'{opt}.yaml')}")
        # registered without a conf file (a NORMBENCH_PLUGINS module): chosen with <group>.name=...
        for name in registries[group]() if group in registries else ():
            if name not in options(group):
                print(f"  {name:<16} registered in code, no conf/{group}/{name}.yaml: choose with {group}.name={name}")
    return 0
