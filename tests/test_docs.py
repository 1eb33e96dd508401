"""The docs stand on their own and say what the code does (docs/contract.md, docs/architectures.md).

- No tracked file points to material outside the project (the reference notes a user of the
  package does not have).
- Every relative link in README.md and docs/ reaches a file, and every ``#anchor`` a heading.
- Every ``docs/<page>.md §N`` in the code and tests names a section that exists.
- The keys docs/contract.md lists for metrics.jsonl and summary.json are the keys a real run
  writes: none missing from the page, none on the page that the trainer does not write.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from normbench.run.metrics import read_jsonl
from normbench.train import trainer

from conftest import REPO, TINY, compose

THIS = Path(__file__).resolve().relative_to(REPO).as_posix()
# built from parts, so this file does not match its own patterns
FOREIGN = ("shared" + "/", "DESIGN" + ".md", "ARCHITECTURES" + ".md")


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [REPO / p for p in out.decode().split("\0") if p and p != THIS]


def test_no_tracked_file_points_outside_the_project():
    bad = []
    for path in tracked_files():
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # binary (images)
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if any(f in line for f in FOREIGN):
                bad.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]}")
    assert not bad, "files point to material users do not have:\n" + "\n".join(bad)


def _slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(md: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", md.read_text(), flags=re.M)}


def test_slug_matches_github():
    assert _slug("## 3. The run directory".lstrip("# ")) == "3-the-run-directory"
    assert _slug("5. `summary.json`") == "5-summaryjson"
    assert _slug("3.6 HybridNorm\\* (`hybridnorm_star`)") == "36-hybridnorm-hybridnorm_star"


def test_every_doc_link_resolves():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.name}: {target} (no file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no heading #{anchor})")
    assert not broken, "\n".join(broken)


def _sections(md: Path) -> set[str]:
    """Numbered sections of a page: '## 3. Title' -> '3', '### 3.6 Title' -> '3.6'."""
    return set(re.findall(r"^#+\s+(\d+(?:\.\d+)*)\.?\s", md.read_text(), flags=re.M))


def test_section_references_in_code_exist():
    refs = re.compile(r"docs/(\w+)\.md §(\d+(?:\.\d+)*)(?:-(\d+))?")
    missing = []
    files = [p for p in tracked_files() if p.suffix in (".py", ".toml", ".yaml", ".md")]
    assert any(refs.search(p.read_text()) for p in files if p.is_file()), "the code points to the docs"
    for path in files:
        if not path.is_file():
            continue
        for page, first, last in refs.findall(path.read_text()):
            sections = _sections(REPO / "docs" / f"{page}.md")
            wanted = [first] + ([str(n) for n in range(int(first) + 1, int(last) + 1)] if last else [])
            missing += [f"{path.relative_to(REPO)}: docs/{page}.md §{s}" for s in wanted if s not in sections]
    assert not missing, "\n".join(missing)


# --------------------------------------------------------------- contract keys vs a real run
def _contract_section(title_start: str) -> str:
    text = (REPO / "docs" / "contract.md").read_text()
    parts = re.split(r"^## ", text, flags=re.M)
    return next(p for p in parts if p.startswith(title_start))


def _table_keys(section: str) -> set[str]:
    """Backticked names in the first column of the section's tables, ``<a|b>`` expanded."""
    keys = set()
    for row in re.findall(r"^\|((?:\\\||[^|\n])*)\|", section, flags=re.M):
        for name in re.findall(r"`([^`]+)`", row):
            name = name.replace("\\|", "|")
            parts = re.split(r"<([^>]+)>", name)  # alternate literal / alternatives
            expanded = [""]
            for i, part in enumerate(parts):
                options = part.split("|") if i % 2 else [part]
                expanded = [e + o for e in expanded for o in options]
            keys |= set(expanded)
    return keys


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three tiny real runs that between them write every kind of diagnostic key (and QK-Clip's)."""
    out = {}
    for name, overrides in {
        "derf": ["arch=peri_ln", "norm=derf", "arch.embed_norm=true", "arch.qk_norm=true", "norm.embed_scale=true"],
        "ngpt": ["arch=ngpt"],
        "qkclip": ["optim.qk_clip=true"],
    }.items():
        run_dir = tmp_path_factory.mktemp(name)
        short = ["diag=full", "diag.every=2", "trainer.max_steps=4", "trainer.eval_every=4", "trainer.log_every=1"]
        summary = trainer.run(compose([*TINY, *short, *overrides]), run_dir)
        assert summary["status"] == "completed"
        out[name] = (read_jsonl(run_dir / "metrics.jsonl"), json.loads((run_dir / "summary.json").read_text()))
    return out


def test_contract_lists_exactly_the_summary_keys(runs):
    documented = _table_keys(_contract_section("5. `summary.json`"))
    for _, summary in runs.values():
        assert set(summary) == documented, (set(summary) - documented, documented - set(summary))


def test_contract_lists_every_metrics_key(runs):
    section = _contract_section("4. `metrics.jsonl`")
    every_record, _, rest = section.partition("Some records add")
    always = _table_keys(every_record)
    documented = always | _table_keys(rest)
    written = set()
    for records, _ in runs.values():
        # a QK-Clip run writes its two keys on every record
        plain = [r for r in records if set(r) - {"qk_clip_logit_max", "qk_clip_heads"} == always]
        assert plain, "some records carry only the every-record keys"
        written |= {k for r in records for k in r}
    assert written - documented == set(), "keys the trainer writes that docs/contract.md does not list"
    # and each documented key is written by one of the runs (DyT/Derf, Peri-LN + qk-norm, nGPT, full);
    # spikes and Post-LN's split lists need other runs
    not_written = documented - written - {"spike_steps", "norm_alpha_attn_post", "norm_alpha_mlp_post"}
    assert not_written == set(), "keys docs/contract.md lists that no run wrote"
