"""The package's shape, read from its source with ``ast`` (README's "Layout" section describes it).

- No module over 400 lines and no function over 60 (a reader takes either in at once).
- No import circle between the modules of ``src/normbench``, function-local imports included.
- No import that runs up or sideways between the packages: each imports only the layers below it
  (``LAYERS``, the order README's layout section lists them in).
- No package (a folder's own modules, ``__init__`` included; a sub-package counts as a package of its
  own) over 12 modules or 16% of ``src/normbench``'s lines: a package is one concern a newcomer can
  name, and the loop, the optimizers, the diagnostics and the runtime each have their own.
- Code as ``ruff format`` writes it (``# fmt: skip`` only on a literal table of numbers) and no import of
  another module's ``_private`` name; an import inside a function says why it is not at the top.

Each check is a function of a source tree, so the tests below also run it on a small made-up tree
that breaks every rule and assert that it is caught.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_PACKAGE_MODULES = 12
MAX_PACKAGE_SHARE = 0.16
# The packages by concern (README's layout section): each must stand, so that a move back into
# train/ (or a package folded into another) fails here rather than in a newcomer's search.
PACKAGES = [
    "analysis",
    "claims",
    "cli",
    "config",
    "data",
    "data/pipeline",
    "diag",
    "downstream",
    "export",
    "hf_template",
    "model",
    "norm",
    "optim",
    "report",
    "report/figures",
    "reproduce",
    "reproduce/ladders",
    "run",
    "runtime",
    "train",
]

# (module, function) pairs allowed over MAX_FUNCTION_LINES, each with its reason; none today.
ALLOWED_LONG: set[tuple[str, str]] = set()

# The layers from the bottom up: a package imports only packages of lower layers (and itself);
# packages that share a layer import neither each other. "normbench" is the root package's
# __init__, which every import of a submodule runs first, so it may import nothing of its own.
LAYERS = [
    {"normbench", "errors", "hf_template"},
    {"config"},
    {"data", "norm"},
    {"model"},
    {"run", "runtime"},
    {"optim"},
    {"validation"},
    {"diag"},
    {"analysis"},
    {"train"},
    {"report", "export"},
    {"claims", "downstream"},
    {"reproduce"},
    {"cli"},
    {"__main__"},
]
LAYER = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the ``normbench`` package below ``src``."""
    out = {}
    for path in sorted((src / "normbench").rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(src: Path) -> dict[str, set[str]]:
    """Each module's imports of other ``normbench`` modules, anywhere in it (function-local ones
    too): ``from a.b import c`` counts as ``a.b.c`` when that is a module, else as ``a.b``."""
    mods = modules(src)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in mods:  # `import a.b.c` of a name inside a module
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    graph[mod].add(name)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def package_of(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b`` for each import of a package that is not in a lower layer than the importer's."""
    bad = []
    for mod, targets in sorted(graph.items()):
        for target in sorted(targets):
            a, b = package_of(mod), package_of(target)
            if a != b and LAYER.get(b, len(LAYERS)) >= LAYER.get(a, -1):
                bad.append(f"{mod} -> {target} ({a} may import only layers below it)")
    return bad


def long_modules(src: Path) -> list[str]:
    return [
        f"{path.relative_to(src)}: {n} lines"
        for path in modules(src).values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]


def long_functions(src: Path) -> dict[tuple[str, str], int]:
    """(module path below ``src``, function name) -> lines from ``def`` to its end, for every
    function (methods and nested ones too) over MAX_FUNCTION_LINES."""
    out = {}
    for path in modules(src).values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                    out[(path.relative_to(src).as_posix(), node.name)] = n
    return out


def package_sizes(src: Path) -> dict[str, tuple[int, int]]:
    """Each package folder below ``src/normbench`` (as a path from it) -> (its own modules, their
    lines); the modules of a sub-package count for the sub-package alone."""
    out: dict[str, tuple[int, int]] = {}
    for init in sorted((src / "normbench").rglob("__init__.py")):
        files = sorted(init.parent.glob("*.py"))
        lines = sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files)
        out[init.parent.relative_to(src / "normbench").as_posix() or "."] = (len(files), lines)
    return out


def big_packages(src: Path) -> list[str]:
    """The packages over MAX_PACKAGE_MODULES modules or MAX_PACKAGE_SHARE of all the lines."""
    total = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in modules(src).values())
    return [
        f"{pkg}: {n} modules, {lines} lines ({lines / total:.0%} of {total})"
        for pkg, (n, lines) in package_sizes(src).items()
        if pkg != "." and (n > MAX_PACKAGE_MODULES or lines > MAX_PACKAGE_SHARE * total)
    ]


# ----------------------------------------------------------------------------- the package


def test_the_packages_by_concern_stand():
    assert sorted(p for p in package_sizes(SRC) if p != ".") == sorted(PACKAGES)


def test_no_package_is_over_12_modules_or_16_percent_of_the_lines():
    assert big_packages(SRC) == []


def test_the_loop_keeps_only_the_loop():
    """train/ holds the loop and its state (and the state's checkpoints: the single file, sharded DCP, which
    one is the run's, how they are written); the optimizers, diagnostics and runtime moved out."""
    names = {p.stem for p in (SRC / "normbench" / "train").glob("*.py")}
    loop = {"__init__", "build", "callbacks", "loop_parts", "signals", "state", "trainer"}
    assert names == loop | {"checkpoint", "sharded", "ckpt_store", "ckpt_writer"}


def test_no_module_is_over_400_lines():
    assert long_modules(SRC) == []


def test_no_function_is_over_60_lines_but_those_being_split():
    too_long = {k: n for k, n in long_functions(SRC).items() if k not in ALLOWED_LONG}
    assert too_long == {}, f"split these (lines): {too_long}"


def test_every_allowed_long_function_is_still_long():
    """An allow-list entry whose function was split (or renamed) is removed, so that the list only
    ever shrinks to nothing."""
    long = long_functions(SRC)
    assert sorted(k for k in ALLOWED_LONG if k not in long) == [], "remove these from ALLOWED_LONG"


def test_no_import_circle():
    assert circles(imports(SRC)) == []


def test_no_import_runs_up_a_layer():
    graph = imports(SRC)
    assert {package_of(m) for m in graph} <= set(LAYER), "a new package: give it a place in LAYERS"
    assert upward_imports(graph) == []


def test_the_graph_sees_function_local_and_relative_imports():
    """The checks are only as good as the graph: spot-check edges of each kind in the real tree."""
    graph = imports(SRC)
    assert "normbench.cli" in graph["normbench.__main__"]  # module level
    assert "normbench.data.checks" in graph["normbench.data.corpus"]  # inside load_data
    modeling = "normbench.hf_template.modeling_normbench"
    assert "normbench.hf_template.configuration_normbench" in graph[modeling]  # `from .x import`


# ----------------------------------------------------------------------------- the checks catch what they claim


def write_tree(src: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = src / "normbench" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_catch_a_circle_an_upward_import_and_long_code(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    write_tree(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "def fail():\n    from normbench.model import gpt\n",  # function-local, upward
            "model/__init__.py": "",
            "model/gpt.py": "from . import attention\n",
            "model/attention.py": "from normbench.model.gpt import Block\n",  # gpt <-> attention
            "report/__init__.py": "from normbench.export import card\n",  # sideways
            "export/__init__.py": "",
            "export/card.py": f"def model_card():\n{body}\n" + "\n" * MAX_MODULE_LINES,
        },
    )
    graph = imports(tmp_path)
    assert circles(graph) == [["normbench.model.attention", "normbench.model.gpt"]]
    assert [line.split(" (")[0] for line in upward_imports(graph)] == [
        "normbench.errors -> normbench.model.gpt",
        "normbench.report -> normbench.export.card",
    ]
    assert long_functions(tmp_path) == {("normbench/export/card.py", "model_card"): MAX_FUNCTION_LINES + 1}
    assert long_modules(tmp_path) == [f"normbench/export/card.py: {MAX_FUNCTION_LINES + 1 + MAX_MODULE_LINES} lines"]


def test_the_size_check_catches_a_package_of_too_many_modules_or_lines(tmp_path):
    """13 one-line modules in model/ (over 12), and report/ holding 20 of the 35 lines (57%, over 16%);
    model/norm/'s one module counts for model/norm/, not for model/."""
    files = {"__init__.py": "", "model/__init__.py": "", "model/norm/__init__.py": "", "model/norm/a.py": "x = 1\n"}
    files |= {f"model/m{i}.py": "x = 1\n" for i in range(12)}
    files |= {"report/__init__.py": "", "report/big.py": "x = 1\n" * 20}
    write_tree(tmp_path, files)
    assert package_sizes(tmp_path)["model"] == (13, 12)
    assert package_sizes(tmp_path)["model/norm"] == (2, 1)
    assert big_packages(tmp_path) == [
        "model: 13 modules, 12 lines (36% of 33)",
        "report: 2 modules, 20 lines (61% of 33)",
    ]


def test_no_noqa_silences_a_rule_the_project_does_not_check():
    """A ``# noqa`` for a rule pyproject.toml does not select is dead: it tells the reader a check runs that
    does not (ruff's RUF100, against the project's own rule set). The reason beside it belongs in a comment."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    args = ["check", "--extend-select", "RUF100", "--output-format", "concise", "src", "tests", "scripts"]
    proc = subprocess.run([ruff, *args], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout


def private_imports(roots: list[Path]) -> list[str]:
    """``from normbench.x import _name`` anywhere below ``roots``: a name another module keeps to itself."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("normbench"):
                    found += [
                        f"{path.name}:{node.lineno}: {node.module}.{a.name}"
                        for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")
                    ]
    return found


def format_skips(roots: list[Path]) -> list[str]:
    """The ``# fmt: skip`` lines that do not close a literal table (``}``, ``]`` or ``)`` alone)."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#")[0].strip()
                if line.rstrip().endswith("# fmt: skip") and code not in ("}", "]", ")"):
                    found.append(f"{path.name}:{n}: {line.strip()}")
    return found


def test_no_module_imports_another_modules_private_names():
    assert private_imports([SRC, REPO / "tests", REPO / "scripts"]) == []


def test_code_is_as_ruff_formats_it_but_tables_of_numbers():
    """``ruff format`` lays out every statement but a literal table kept in its columns (``}  # fmt: skip``)."""
    assert format_skips([SRC, REPO / "tests", REPO / "scripts"]) == []
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    proc = subprocess.run(
        [ruff, "format", "--check", "src", "tests", "scripts"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout


def test_the_style_checks_catch_a_private_import_and_a_skipped_statement(tmp_path):
    (tmp_path / "a.py").write_text("from normbench.data.texts import _hidden\nx = {1: 2}  # fmt: skip\n")
    (tmp_path / "b.py").write_text("TABLE = {\n    1: 2, 3: 4,\n}  # fmt: skip\n")
    assert private_imports([tmp_path]) == ["a.py:1: normbench.data.texts._hidden"]
    assert format_skips([tmp_path]) == ["a.py:2: x = {1: 2}  # fmt: skip"]


def unexplained_local_imports(root: Path) -> list[str]:
    """Imports inside a function without a comment saying why they are not at the top (an optional
    dependency, start-up time, a failure handled there)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for fn in ast.walk(ast.parse(text)):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                said = isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                    "#" in line for line in lines[node.lineno - 1 : node.end_lineno]
                )
                if isinstance(node, (ast.Import, ast.ImportFrom)) and not said:
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


def test_an_import_inside_a_function_says_why_it_is_not_at_the_top():
    assert unexplained_local_imports(SRC) == []


def test_the_import_check_catches_an_unexplained_local_import(tmp_path):
    (tmp_path / "a.py").write_text(
        "def f():\n    import json\n    import torch  # deferred (start-up time): torch\n    return json, torch\n"
    )
    assert unexplained_local_imports(tmp_path) == ["a.py:2: import json"]
