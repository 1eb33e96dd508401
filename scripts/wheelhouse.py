#!/usr/bin/env python3
"""A wheelhouse for air-gapped nodes: build it where a package index is reachable, install from it where none is.

    python3 scripts/wheelhouse.py build DIR [--python-version 3.12] [--platform manylinux_2_28_x86_64]
                                            [--have FREEZE] [--extras sweeps]
    python3 scripts/wheelhouse.py install DIR [--python python3] [--venv .venv] [--extras sweeps]

``build`` resolves everything normbench needs except torch (and torch's CUDA/triton wheels), for the
target's Python and platform, and downloads those wheels into DIR with a ``wheelhouse.json`` that
says what it holds. ``--have`` takes ``pip freeze`` of the target: its pins constrain the
resolution (the wheels fit what is there) and the packages it already has are left out. Packages
published only as source archives (omegaconf's antlr4 runtime, ``future``, ...) are built into
pure-Python wheels here, since the target cannot build them without an index.

``install`` makes ``VENV`` with ``--system-site-packages`` from the node's Python, so the node's
own torch (and whatever else it has) stays in use, and pip-installs normbench (editable) from DIR
alone: ``--no-index``, no configuration files, no ``PIP_*`` variables. When pip finds a
requirement neither in DIR nor installed it prints one line naming it and exits 2. A wheelhouse
for another Python or platform (wheelhouse.json) is refused; ``VENV/normbench-offline.json``
records which Python and wheelhouse made VENV: another Python's VENV is rebuilt, one without the
record refused. ``stale`` is the Makefile's one line when such a VENV is older than pyproject.toml.

Written with the standard library and pip only (pip's documented command line and its
``--report`` JSON, https://pip.pypa.io/en/stable/reference/installation-report/): it has to run
on the node before anything is installed there, and pip is the tool that knows the resolution.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAMP = "normbench-offline.json"  # in the venv: which Python and which wheelhouse made it
# never in the wheelhouse: the node brings its own torch build, and these come with it
NODE_OWN = re.compile(r"^(torch|triton|pytorch-triton.*|nvidia-.*|cuda-.*)$")
_NO_DIST = re.compile(r"No matching distribution found for (\S+)")
_VERSIONS = re.compile(r"Could not find a version that satisfies the requirement (\S+).*\(from versions: ([^)]*)\)")
# the resolver's form of the same (a dependency of a dependency): a list of names after this line
_NO_DISTS = re.compile(r"no matching distributions available for your environment:\s*\n\s*(\S+)")


def fail(msg: str) -> None:
    print(f"normbench: error: {msg}", file=sys.stderr)
    sys.exit(2)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def req_name(spec: str) -> str:
    return canonical(re.split(r"[\s<>=!~;\[(]", spec.strip(), maxsplit=1)[0])


def requirements(extras: list[str]) -> tuple[list[str], list[str]]:
    """normbench's dependencies (and the named extras') without torch, and what building it takes."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pip vendors the same parser
        from pip._vendor import tomli as tomllib
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = meta["project"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        fail(f"--extras {','.join(unknown)}: not an extra of normbench (allowed: {', '.join(sorted(optional))})")
    specs = [*project["dependencies"], *(d for e in extras for d in optional[e])]
    # the build backend, and what hatchling asks for to build an editable install (`pip install -e`)
    backend = [*meta["build-system"]["requires"], "editables~=0.3"]
    return [s for s in specs if not NODE_OWN.match(req_name(s))], backend


def read_freeze(path: Path) -> dict[str, str]:
    """``pip freeze`` / ``pip list --format=freeze`` lines ``name==version`` (others, e.g. ``-e`` or
    ``name @ url``, are skipped: pip cannot be told to keep those)."""
    have = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line.strip())
        if m:
            have[canonical(m.group(1))] = m.group(2)
    return have


def target_flags(python_version: str | None, platform: str | None) -> list[str]:
    """pip's flags for another interpreter/platform; binary wheels only (pip's rule for them). A
    ``manylinux_2_N`` platform also accepts the older manylinux tags, as pip does for its own machine."""
    if not python_version and not platform:
        return []
    flags = ["--only-binary=:all:", "--implementation", "cp"]
    if python_version:
        flags += ["--python-version", python_version]
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform or "")
    plats = [platform] if platform else []
    if m:
        glibc, arch = int(m.group(1)), m.group(2)
        plats = [f"manylinux_2_{n}_{arch}" for n in range(glibc, 4, -1)]
        plats += [alias for n, alias in ((17, "manylinux2014"), (12, "manylinux2010"), (5, "manylinux1")) if n <= glibc]
        plats = [p if p.startswith("manylinux_") else f"{p}_{arch}" for p in plats]
    for p in plats:
        flags += ["--platform", p]
    return flags


def pip(python: str, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True, env=env)


def missing(output: str) -> tuple[str, str] | None:
    """The requirement pip found nowhere and the versions it saw of it, from pip's error text: "No
    matching distribution found for X", or the resolver's conflict over a dependency X of a
    dependency ("A depends on X==4.9.*", with newer pips' "no matching distributions" note). The
    second is also how a real conflict reads: callers check that X is indeed absent."""
    m = _NO_DIST.search(output)
    if m:
        return m.group(1), next((v for r, v in _VERSIONS.findall(output) if r == m.group(1)), "none")
    if "ResolutionImpossible" not in output:
        return None
    deps = re.findall(r"depends on ([A-Za-z0-9][A-Za-z0-9._-]*)(\S*)", output)
    m = _NO_DISTS.search(output)
    names = [canonical(m.group(1))] if m else [canonical(n) for n, _ in deps]
    if not names or len(set(names)) != 1:
        return None
    spec = next((n + v.rstrip(",") for n, v in deps if canonical(n) == names[0]), names[0])
    return spec, "none"


def present(python: str, wheels: Path, name: str) -> bool:
    """Whether ``name`` has a wheel in ``wheels`` or is installed for ``python``."""
    if any(canonical(w.name.split("-")[0]) == canonical(name) for w in wheels.glob("*.whl")):
        return True
    code = "import importlib.metadata as m, sys; m.distribution(sys.argv[1])"
    return subprocess.run([python, "-c", code, name], capture_output=True).returncode == 0


def resolve(reqs: list[str], flags: list[str], out: Path, constraints: Path | None) -> list[dict]:
    """pip's resolution for the target (``install --dry-run --report``); a requirement with no wheel
    for the target is built here into a pure-Python wheel in ``out`` and the resolution repeated."""
    req_file = out / ".requirements.in"
    req_file.write_text("\n".join(reqs) + "\n")
    built: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        report, target = Path(tmp) / "report.json", Path(tmp) / "target"
        while True:
            args = [
                "install",
                "--dry-run",
                "--ignore-installed",
                "--report",
                str(report),
                "--target",
                str(target),
                "--find-links",
                str(out),
                "--only-binary=:all:",
                *flags,
                "-r",
                str(req_file),
            ]
            if constraints:
                args += ["-c", str(constraints)]
            proc = pip(sys.executable, args)
            if proc.returncode == 0:
                return json.loads(report.read_text())["install"]
            gone = missing(proc.stdout + proc.stderr)
            if gone is None or req_name(gone[0]) in built:
                fail(f"pip cannot resolve normbench's requirements for the target: {last_error(proc)}")
            built.add(req_name(gone[0]))
            build_pure_wheel(gone[0], out)


def build_pure_wheel(spec: str, out: Path) -> None:
    """A source-only requirement as a wheel, here; only a pure-Python one fits another machine."""
    print(f"wheelhouse: {spec} has no wheel for the target: building one from its source archive")
    with tempfile.TemporaryDirectory() as tmp:
        proc = pip(sys.executable, ["wheel", "--no-deps", "--quiet", "-w", tmp, spec])
        if proc.returncode != 0:
            fail(f"cannot build a wheel of {spec}: {last_error(proc)}")
        for whl in Path(tmp).glob("*.whl"):
            if not whl.name.endswith("-none-any.whl"):
                fail(
                    f"{spec} has no wheel for the target and is not pure Python ({whl.name}): build it on a machine "
                    "like the target and put it in the wheelhouse"
                )
            shutil.copy(whl, out / whl.name)


def last_error(proc: subprocess.CompletedProcess) -> str:
    """pip's failure in one line: the causes of a resolver conflict, else its last ERROR line."""
    text = proc.stderr + proc.stdout
    cause = re.search(r"The conflict is caused by:\n((?:[ \t]+\S.*\n?)+)", text)
    if cause:
        return "conflicting requirements: " + "; ".join(ln.strip() for ln in cause.group(1).splitlines()[:6])
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    return (errors or lines or ["no output"])[-1]


def build(args: argparse.Namespace) -> None:
    out = Path(args.dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    extras = [e for e in args.extras.split(",") if e]
    (reqs, backend), flags = requirements(extras), target_flags(args.python_version, args.platform)
    have = read_freeze(Path(args.have)) if args.have else {}
    constraints = None
    if have:
        constraints = out / ".have-constraints.txt"
        # a local version (2.11.0+cu128) is on no index: such pins are left to the node
        pins = [f"{n}=={v}\n" for n, v in have.items() if not NODE_OWN.match(n) and "+" not in v]
        constraints.write_text("".join(pins))
    keep, left_out = [], []
    for item in resolve(reqs, flags, out, constraints):
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        (left_out if NODE_OWN.match(name) or name in have else keep).append(f"{name}=={version}")
    # pip builds normbench in an isolated environment that sees no installed package: the backend's whole
    # closure goes in, whatever the node has
    for item in resolve(backend, flags, out, None):
        pin = f"{canonical(item['metadata']['name'])}=={item['metadata']['version']}"
        keep += [pin] if pin not in keep else []
    left_out = [pin for pin in left_out if pin not in keep]
    proc = pip(
        sys.executable,
        [
            "download",
            "--no-deps",
            "--quiet",
            "-d",
            str(out),
            "--find-links",
            str(out),
            "--only-binary=:all:",
            *flags,
            *keep,
        ],
    )
    if proc.returncode != 0:
        fail(f"pip download failed: {last_error(proc)}")
    wanted = {canonical(k.split("==")[0]) for k in keep}
    wheels = sorted(p for p in out.glob("*.whl") if canonical(p.name.split("-")[0]) in wanted)
    size = sum(p.stat().st_size for p in wheels)
    meta = {
        "python_version": args.python_version or f"{sys.version_info[0]}.{sys.version_info[1]}",
        "platform": args.platform or node_facts(sys.executable)["platform"],
        "extras": extras,
        "packages": sorted(keep),
        "left_out": sorted(left_out),
        "have": args.have,
        "bytes": size,
    }
    (out / "wheelhouse.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "requirements.txt").write_text("".join(f"{k}\n" for k in sorted(keep)))
    for tmp in (out / ".requirements.in", constraints):
        if tmp:
            tmp.unlink(missing_ok=True)
    also = ", and what --have lists" if have else ""
    print(
        f"wheelhouse: {len(wheels)} wheels, {size / 1e6:.1f} MB in {out} (Python {meta['python_version']}, "
        f"platform {meta['platform']}; left out: torch and its CUDA wheels{also})"
    )


def offline_env() -> dict:
    """No pip configuration at all: no config files (PIP_CONFIG_FILE=os.devnull, pip's documented
    switch), no PIP_* variables (find-links, extra indexes or constraints of this machine)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


# Run by the node's Python (stdlib and pip's vendored packaging only). "site": when it is itself a venv, every
# directory on its sys.path outside the standard library: its site-packages and what .pth files there add (a venv
# made from it with --system-site-packages would reach its base interpreter's instead, and a .pth in a directory a
# .pth adds is not read, so the chain has to be flattened here). -E: PYTHONPATH is the environment's, not the node's.
_FACTS = """
import json, os, platform, sys, sysconfig
std = [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")]
def own(p):
    return "-packages" in p or not any(p == s or p.startswith(s + os.sep) for s in std)
site = [p for p in sys.path[1:] if os.path.isdir(p) and own(p)] if sys.prefix != sys.base_prefix else None
try:
    from pip._vendor.packaging.tags import sys_tags
    plats = list(dict.fromkeys(t.platform for t in sys_tags() if t.platform != "any"))
except Exception:
    plats = []
print(json.dumps({"executable": os.path.realpath(sys.executable) if site is None else sys.executable,
                  "version": platform.python_version(), "site": site, "platforms": plats,
                  "platform": plats[0] if plats else sysconfig.get_platform()}))
"""


def node_facts(python: str) -> dict:
    """What the node's Python is: its executable, version, platform tags and (a venv's) site directories."""
    proc = subprocess.run([python, "-E", "-c", _FACTS], capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"--python {python}: cannot run it ({last_error(proc)})")
    return json.loads(proc.stdout)


def minor(version: str) -> str:
    """'3.12.1' or pip's '312' as '3.12'."""
    parts = version.split(".") if "." in version else [version[0], version[1:]]
    return ".".join(parts[:2])


def check_target(wheels: Path, python: str, node: dict) -> dict | None:
    """The wheelhouse's target (wheelhouse.json) against the node's Python and platform; None without the file."""
    path = wheels / "wheelhouse.json"
    if not path.exists():
        return None
    meta = json.loads(path.read_text())
    want_py, want_plat = meta.get("python_version"), meta.get("platform")
    py_ok = not want_py or minor(want_py) == minor(node["version"])
    # a wheelhouse.json of before the platform was recorded says "this machine's": nothing to compare
    plat_ok = not want_plat or "_" not in want_plat or not node["platforms"] or want_plat in node["platforms"]
    if not (py_ok and plat_ok):
        fail(
            f"wheelhouse {wheels} was built for Python {want_py} on {want_plat}, but {python} is Python "
            f"{node['version']} on {node['platform']}: build one for this node where an index is reachable "
            f"(make wheelhouse WHEEL_PYTHON={minor(node['version'])} WHEEL_PLATFORM={node['platform']})"
        )
    return {"python_version": want_py, "platform": want_plat}


def make_venv(python: str, venv: Path, node: dict) -> None:
    """A venv that sees the node's packages after its own (so what the wheelhouse installs wins)."""
    extra = node["site"]
    flags = [] if extra else ["--system-site-packages"]
    proc = subprocess.run([python, "-m", "venv", *flags, str(venv)], capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)  # half a venv would be taken for one by the next try
        fail(f"cannot create {venv} with {python} -m venv: {last_error(proc)}")
    vpy = str(venv / "bin" / "python")
    if extra:
        code = "import site, json; print(json.dumps(site.getsitepackages()))"
        own = json.loads(subprocess.run([vpy, "-c", code], capture_output=True, text=True, check=True).stdout)[0]
        # named to be read last (site reads .pth files sorted): the venv's own packages, normbench's editable path
        # among them, come before the node's
        (Path(own) / "~node_site_packages.pth").write_text("".join(f"{d}\n" for d in extra))
    # Python <= 3.11's venv brings its own setuptools, which would hide the node's (torch asks for a recent one)
    subprocess.run([vpy, "-m", "pip", "uninstall", "-y", "-q", "setuptools"], capture_output=True, env=offline_env())


def venv_for(python: str, venv: Path, node: dict) -> None:
    """``venv`` made by ``python``: made when absent, rebuilt (said so) when ``STAMP`` says another Python made it,
    refused in one line when it was not made by this install at all (nothing records its Python)."""
    stamp = venv / STAMP
    if venv.exists() and not stamp.exists():
        fail(
            f"{venv} exists but was not made by the offline install (it has no {STAMP} saying which Python made "
            f"it): remove it (rm -rf {venv}) and re-run, or give another VENV="
        )
    if stamp.exists():
        made = json.loads(stamp.read_text())
        same = (made.get("executable"), made.get("version")) == (node["executable"], node["version"])
        if same and (venv / "bin" / "python").exists():
            return
        if same:
            print(f"wheelhouse: {venv} has no bin/python (a try cut short): rebuilding it")
        else:
            print(
                f"wheelhouse: {venv} was made by {made.get('python')} ({made.get('executable')}, Python "
                f"{made.get('version')}), not by {python} ({node['executable']}, Python {node['version']}): "
                "rebuilding it"
            )
        shutil.rmtree(venv)
    make_venv(python, venv, node)


def write_stamp(venv: Path, python: str, node: dict, wheels: Path, target: dict | None, extras, done: bool) -> None:
    made = {
        "python": python,
        "executable": node["executable"],
        "version": node["version"],
        "wheelhouse": str(wheels),
        "wheelhouse_target": target,
        "extras": extras,
        "complete": done,
    }
    (venv / STAMP).write_text(json.dumps(made, indent=1) + "\n")


def install(args: argparse.Namespace) -> None:
    wheels, venv = Path(args.dir).resolve(), Path(args.venv).resolve()
    if not wheels.is_dir():
        fail(f"wheelhouse {wheels}: no such directory (build it with `make wheelhouse` where an index is reachable)")
    extras = [e for e in args.extras.split(",") if e]
    requirements(extras)  # an unknown extra is refused before anything is made
    node = node_facts(args.python)
    target = check_target(wheels, args.python, node)
    venv_for(args.python, venv, node)
    write_stamp(venv, args.python, node, wheels, target, extras, False)
    py = venv / "bin" / "python"
    target_dir = f"{REPO}[{','.join(extras)}]" if extras else str(REPO)
    cmd = [
        "install",
        "--isolated",
        "--no-index",
        "--find-links",
        str(wheels),
        "--disable-pip-version-check",
        "--progress-bar",
        "off",
        "--no-input",
        "-e",
        target_dir,
    ]
    proc = pip(str(py), cmd, env=offline_env())
    if proc.returncode != 0:
        gone = missing(proc.stdout + proc.stderr)
        if gone and (gone[1] != "none" or not present(str(py), wheels, req_name(gone[0]))):
            spec, seen = gone
            has = f"; it holds {seen}" if seen != "none" else ""
            fail(f"needs {spec}, which is neither in the wheelhouse ({wheels}{has}) nor installed ({args.python})")
        fail(f"offline install into {venv} failed: {last_error(proc)}")
    check = "import normbench, torch; print(torch.__version__, torch.__file__)"
    proc = subprocess.run([str(py), "-c", check], capture_output=True, text=True, env=offline_env())
    if proc.returncode != 0:
        fail(f"installed, but {py} cannot import normbench and torch: {last_error(proc)}")
    version, where = proc.stdout.split()
    write_stamp(venv, args.python, node, wheels, target, extras, True)
    (venv / "bin" / "normbench").touch()  # newer than pyproject.toml: the Makefile's targets take the install as done
    print(f"wheelhouse: normbench installed into {venv} from {wheels} with no index; torch {version} from {where}")


def stale(args: argparse.Namespace) -> None:
    """The Makefile's answer when an offline .venv looks out of date: how to re-run the offline install."""
    venv = Path(args.venv)
    made = json.loads((venv / STAMP).read_text())
    extras = ",".join(made.get("extras") or [])
    fail(
        f"{venv} was installed offline and pyproject.toml has changed since; `make install` would reach for a "
        f"package index: re-run the offline install instead: make install-offline WHEELS={made['wheelhouse']} "
        f"PY={made['python']} VENV={args.venv} WHEEL_EXTRAS={extras}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="wheelhouse.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download the wheels (needs an index)")
    b.add_argument("dir")
    b.add_argument("--python-version", help="the target's Python, e.g. 3.12 (default: this one)")
    b.add_argument("--platform", help="the target's platform tag, e.g. manylinux_2_28_x86_64 (default: this one)")
    b.add_argument("--have", help="`pip freeze` of the target: keep its versions, leave its packages out")
    b.add_argument("--extras", default="sweeps", help="normbench extras to include, comma-separated (default sweeps)")
    i = sub.add_parser("install", help="install normbench from the wheels (no network)")
    i.add_argument("dir")
    i.add_argument("--python", default="python3", help="the node's Python, the one with torch (default python3)")
    i.add_argument("--venv", default=str(REPO / ".venv"))
    i.add_argument("--extras", default="sweeps")
    st = sub.add_parser("stale", help="(the Makefile's) how to bring an offline .venv up to date")
    st.add_argument("--venv", default=".venv")
    args = parser.parse_args(argv)
    {"build": build, "install": install, "stale": stale}[args.cmd](args)


if __name__ == "__main__":
    main()
