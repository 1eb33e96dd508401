"""Export's errors and manners : any OSError while writing OUT_DIR is one line (exit 2) and
leaves nothing; a new OUT_DIR gets what a plain ``mkdir`` gives (umask, setgid parent) and its files what a
plain ``open()`` gives; an existing empty OUT_DIR keeps its mode and group; a run still training is exported
with a warning; the loading lines of docs/export.md run on a terminal without a prompt.
"""

from __future__ import annotations

import errno
import os
import pty
import re
import select
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors import SafetensorError

from normbench import cli
from normbench.errors import ConfigError
from normbench.export import target
from normbench.export.target import STAGE_PREFIX, staged
from normbench.train import trainer

from conftest import REPO, TINY, compose, run_cli

ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A finished 2-step tiny peri_ln run (the custom class) with the byte tokenizer."""
    path = tmp_path_factory.mktemp("exp") / "run"
    trainer.run(compose([*TINY, "arch=peri_ln", "trainer.max_steps=2", "trainer.eval_batches=1", "diag=off"]), path)
    return path


@pytest.fixture
def umask():
    """Set the process umask for one test (restored after)."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def export(capsys, *args: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = cli.main(["export", *map(str, args)])
    return code, capsys.readouterr().err.strip().splitlines()


def other_group() -> int | None:
    """A group this process may give a directory other than its own (root: any)."""
    groups = [g for g in os.getgroups() if g != os.getegid()]
    return groups[0] if groups else (os.getegid() + 4242 if ROOT else None)


def what_mkdir_gives(parent: Path) -> tuple[int, int, int]:
    """(mode of a plain mkdir's directory, its gid, mode of a plain open()'s file) in ``parent``."""
    probe = parent / "probe"
    probe.mkdir()
    (probe / "f").write_text("")
    got = (probe.stat().st_mode, probe.stat().st_gid, stat.S_IMODE((probe / "f").stat().st_mode))
    (probe / "f").unlink()
    probe.rmdir()
    return got


# ---------------------------------------------------------------------------------------------- errors
def test_a_target_that_is_a_file_is_refused_in_one_line(run, tmp_path, capsys):
    out = tmp_path / "model"
    out.write_text("keep me")
    code, lines = export(capsys, run, out)
    assert code == 2 and lines == [f"normbench: error: OUT_DIR {out} is a file, not a directory; choose a new one"]
    assert out.read_text() == "keep me" and listing(tmp_path) == ["model"]


@pytest.mark.skipif(ROOT, reason="root writes into read-only directories")
def test_a_read_only_parent_is_one_line_and_exit_2(run, tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        code, lines = export(capsys, run, parent / "out")
        assert code == 2 and len(lines) == 1, lines
        want = f"export: cannot write {parent} (Permission denied); nothing was written to {parent / 'out'}"
        assert lines[0] == f"normbench: error: {want}"
        assert listing(parent) == []
        code, lines = export(capsys, run, parent / "sub" / "out")  # a parent that cannot be made
        assert code == 2 and len(lines) == 1 and f"cannot write {parent / 'sub'} (Permission denied)" in lines[0]
    finally:
        parent.chmod(0o755)


def test_a_parent_that_refuses_mkdir_is_one_line_even_as_root(run, tmp_path, capsys, monkeypatch):
    """The read-only parent of the test above, for every user: mkdir there fails with EACCES."""
    parent = tmp_path / "ro"
    parent.mkdir()
    mkdir = os.mkdir

    def refuse(path, *args, **kwargs):
        if Path(path).parent == parent:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refuse)
    code, lines = export(capsys, run, parent / "out")
    want = f"export: cannot write {parent} (Permission denied); nothing was written to {parent / 'out'}"
    assert code == 2 and lines == [f"normbench: error: {want}"]
    assert listing(parent) == []


@pytest.mark.slow
def test_the_console_command_gives_one_line_for_an_unwritable_target(run, tmp_path):
    (tmp_path / "file").write_text("")
    proc = run_cli(["export", str(run), str(tmp_path / "file" / "out")], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"normbench: error: export: cannot write {tmp_path / 'file'} (Not a directory); "
        f"nothing was written to {tmp_path / 'file' / 'out'}"
    ]


@pytest.mark.parametrize("where", ["new, under parents that do not exist", "an existing empty directory"])
def test_a_full_disk_leaves_nothing_half_written(run, tmp_path, capsys, monkeypatch, where):
    """safetensors' own I/O error (what a full disk gives: a SafetensorError ending in "(os error 28)")."""
    import transformers.modeling_utils

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    out = tmp_path / "a" / "b" / "out" if where.startswith("new") else tmp_path / "out"
    if not where.startswith("new"):
        out.mkdir(mode=0o2770)
    before = (listing(tmp_path), out.stat().st_mode if out.exists() else None)
    code, lines = export(capsys, run, out)
    assert code == 2
    assert lines == [f"normbench: error: export: cannot write {out} (No space left on device); nothing was written"]
    assert (listing(tmp_path), out.stat().st_mode if out.exists() else None) == before


def test_an_oserror_names_the_file_as_it_would_have_been_in_out_dir(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(ConfigError) as refused:
        with staged(out) as stage:
            (stage / "config.json").write_text("{}")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(stage / "model.safetensors"))
    assert str(refused.value) == (
        f"export: cannot write {out / 'model.safetensors'} (No space left on device); nothing was written to {out}"
    )
    assert listing(tmp_path) == []


def test_a_failed_move_into_an_existing_directory_backs_out(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    renames = []
    rename = os.rename

    def rename_twice(src, dst):
        renames.append(dst)
        if len(renames) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
        rename(src, dst)

    monkeypatch.setattr(target.os, "rename", rename_twice)
    with pytest.raises(ConfigError, match=f"cannot write {out / 'b'} "):
        with staged(out) as stage:
            for name in "abc":
                (stage / name).write_text(name)
    assert listing(tmp_path) == ["out"], "OUT_DIR is left empty, as it was found"


def test_a_leftover_staging_directory_is_named(tmp_path):
    out = tmp_path / "out"
    (out / f"{STAGE_PREFIX}0a1b2c3d").mkdir(parents=True)
    with pytest.raises(ConfigError, match=f"it holds {STAGE_PREFIX}0a1b2c3d, left by an export that was killed"):
        with staged(out):
            pass


# ---------------------------------------------------------------------------------------------- manners
@pytest.mark.parametrize("mask", [0o002, 0o022, 0o077])
@pytest.mark.parametrize("setgid_parent", [False, True], ids=["plain parent", "setgid parent"])
def test_a_new_out_dir_gets_what_mkdir_gives(tmp_path, umask, mask, setgid_parent):
    parent = tmp_path / "parent"
    parent.mkdir()
    if setgid_parent:
        if (gid := other_group()) is not None:
            os.chown(parent, -1, gid)
        parent.chmod(0o2775)
    umask(mask)
    with staged(parent / "out") as stage:
        (stage / "model.safetensors").write_text("w")
        (stage / "model.safetensors").chmod(0o600)  # as safetensors writes it
    want_mode, want_gid, file_mode = what_mkdir_gives(parent)
    got = (parent / "out").stat()
    assert (oct(got.st_mode), got.st_gid) == (oct(want_mode), want_gid)
    assert stat.S_IMODE((parent / "out" / "model.safetensors").stat().st_mode) == file_mode == 0o666 & ~mask
    assert listing(parent) == ["out", "out/model.safetensors"]


def test_an_existing_empty_out_dir_keeps_its_mode_and_group(run, tmp_path, capsys, umask):
    umask(0o002)
    out = tmp_path / "shared"
    out.mkdir()
    if (gid := other_group()) is not None:
        os.chown(out, -1, gid)
    out.chmod(0o2775)
    before = out.stat()
    code, lines = export(capsys, run, out)
    assert code == 0 and lines == []
    after = out.stat()
    assert (oct(after.st_mode), after.st_gid, after.st_ino) == (oct(before.st_mode), before.st_gid, before.st_ino)
    files = sorted(out.iterdir())
    assert {p.name for p in files} >= {"config.json", "model.safetensors", "tokenizer.json", "README.md"}
    assert not any(p.name.startswith(".") for p in files), "no staging directory left"
    for p in files:
        assert p.stat().st_gid == before.st_gid, p  # the setgid directory's group
        assert stat.S_IMODE(p.stat().st_mode) == 0o664, p  # model.safetensors too (safetensors writes 0600)


def test_a_run_still_training_is_exported_with_a_warning(run, tmp_path, capsys):
    lock = run / ".lock"
    lock.write_text(f"{socket.gethostname()}:{os.getpid()}")  # a live owner: this very process
    try:
        code, lines = export(capsys, run, tmp_path / "out")
        assert code == 0 and len(lines) == 1, lines
        assert lines[0].startswith(f"normbench: warning: {run} is still being trained by process {os.getpid()}")
        assert "this uses its last checkpoint, from step 2, not the finished model" in lines[0]
        capsys.readouterr()
        assert cli.main(["sample", str(run), "--prompt", "And", "--max-new-tokens", "2", "--hf"]) == 0
        assert len(capsys.readouterr().err.strip().splitlines()) == 1, "sample warns too, once"
        ended = subprocess.Popen(["true"])  # a process that has ended: its lock is stale, no warning
        ended.wait()
        lock.write_text(f"{socket.gethostname()}:{ended.pid}")
        code, lines = export(capsys, run, tmp_path / "out2")
        assert code == 0 and lines == []
    finally:
        lock.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- the docs
def _on_a_terminal(code: str, timeout: float = 240) -> tuple[str, bool]:
    """Run ``python -c code`` on a pseudo-terminal; (what it printed, whether it asked [y/N]).
    A prompt is answered "n" once; the child is then stopped."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a fresh interpreter on the terminal
        os.execve(sys.executable, [sys.executable, "-c", code], os.environ)
    out, asked, end = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if not select.select([fd], [], [], 0.5)[0]:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if b"[y/N]" in out and not asked:
                asked = True
                os.kill(pid, 9)
    finally:
        os.waitpid(pid, 0)
        os.close(fd)
    return out.decode(errors="replace"), asked


@pytest.mark.slow
def test_the_docs_loading_lines_run_on_a_terminal_without_a_prompt(run, tmp_path, capsys):
    code, _ = export(capsys, run, tmp_path / "my_model")
    assert code == 0 and (tmp_path / "my_model" / "modeling_normbench.py").is_file(), "the custom class"
    doc = (REPO / "docs" / "export.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    assert 'AutoTokenizer.from_pretrained("my_model", trust_remote_code=True)' in snippet
    snippet = snippet.replace('"my_model"', repr(str(tmp_path / "my_model")))
    out, asked = _on_a_terminal(snippet + "print('DONE')\n")
    assert not asked and "DONE" in out, out[-2000:]
    assert "And God said" in out
    # the control: without the flag the tokenizer asks (so the terminal above would have shown a prompt)
    path = repr(str(tmp_path / "my_model"))
    tokenizer_line = f"AutoTokenizer.from_pretrained({path}, trust_remote_code=True)"
    assert tokenizer_line in snippet
    _, asked = _on_a_terminal(snippet.replace(tokenizer_line, f"AutoTokenizer.from_pretrained({path})"))
    assert asked
