"""No corrupt file is trusted : a damaged ``checkpoints/last.pt`` is refused by a resume,
``export``, ``sample`` and the layer-skip evaluation with one line naming it (exit 2 for the commands), and
neither it nor the run directory changes; a damaged ``summary.json`` is named by the report and never read.

The damage: bytes flipped inside single records of the zip that ``torch.save`` writes (the ``wte.weight``
data record, the pickle, one bit in every record, a CRC in the central directory), the file truncated
(to half, by one byte), zeroed and emptied.
"""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from normbench import cli, report
from normbench.claims.skip_eval import skip_losses
from normbench.errors import ConfigError
from normbench.run.rundir import RunDir
from normbench.train import checkpoint as ckpt

from conftest import run_cli

RUN = [
    "model=tiny",
    "model.seq_len=32",
    "trainer.batch_size=2",
    "trainer.max_steps=2",
    "trainer.log_every=1",
    "trainer.eval_every=2",
    "trainer.eval_batches=1",
    "trainer.ckpt_every=1",
    "diag=off",
]
CRC = "fails the zip's CRC-32 check"
TORN = "truncated or corrupt"


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A finished 2-step tiny run with its .hydra/ (trained through the CLI, in this process)."""
    run = tmp_path_factory.mktemp("integrity") / "run"
    assert cli.main(["train", *RUN, f"hydra.run.dir={run}"]) == 0
    return run


def _data_offset(path: Path, info: zipfile.ZipInfo) -> int:
    """Where a record's bytes start: after its local header (30 bytes, the name, the extra field)."""
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _records(path: Path) -> dict[str, tuple[int, int]]:
    """Each record of the archive: name -> (offset of its bytes, size)."""
    with zipfile.ZipFile(path) as archive:
        return {i.filename: (_data_offset(path, i), i.file_size) for i in archive.infolist()}


def _wte_record(path: Path) -> str:
    """The name of the record holding ``wte.weight``'s data (found by its bytes)."""
    wte = torch.load(path, weights_only=True)["model"]["wte.weight"].contiguous().numpy().tobytes()
    with zipfile.ZipFile(path) as archive:
        found = [i.filename for i in archive.infolist() if i.file_size == len(wte) and archive.read(i) == wte]
    assert len(found) == 1, found
    return found[0]


def _flip(data: bytearray, start: int, n: int) -> None:
    for i in range(start, start + n):
        data[i] ^= 0xFF


def damage(kind: str, path: Path) -> None:
    data = bytearray(path.read_bytes())
    records = _records(path)
    if kind == "64 bytes of wte.weight":
        offset, size = records[_wte_record(path)]
        _flip(data, offset + size // 2, 64)
    elif kind == "a byte of the pickle":
        offset, size = next(v for k, v in records.items() if k.endswith("/data.pkl"))
        _flip(data, offset + size // 2, 1)
    elif kind == "one bit in every record":
        for offset, size in records.values():
            if size:
                data[offset + size // 2] ^= 0x01
    elif kind == "a CRC in the central directory":
        name, entry = _wte_record(path).encode(), -1
        while (entry := bytes(data).find(b"PK\x01\x02", entry + 1)) >= 0:  # central directory entries
            (name_len,) = struct.unpack("<H", data[entry + 28 : entry + 30])
            if data[entry + 46 : entry + 46 + name_len] == name:
                break
        assert entry >= 0
        _flip(data, entry + 16, 1)  # that entry's crc-32 field
    elif kind == "truncated to half":
        data = data[: len(data) // 2]
    elif kind == "truncated by one byte":
        data = data[:-1]
    elif kind == "zeroed":
        data = bytearray(len(data))
    elif kind == "emptied":
        data = bytearray()
    path.write_bytes(bytes(data))


KINDS = [
    ("64 bytes of wte.weight", CRC),
    ("a byte of the pickle", CRC),
    ("one bit in every record", CRC),
    ("a CRC in the central directory", CRC),
    ("truncated to half", TORN),
    ("truncated by one byte", TORN),
    ("zeroed", TORN),
    ("emptied", TORN),
]


def listing(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*"))


def one_line(err: str, path: Path, needle: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"normbench: error: checkpoint {path} ") and needle in lines[0], lines[0]
    return lines[0]


def cli_run(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    try:
        code = cli.main(list(args))
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def test_a_good_checkpoint_verifies_and_every_kind_of_damage_is_seen(saved_run, tmp_path):
    last = saved_run / "checkpoints" / "last.pt"
    ckpt.verify(last)  # the control: a checkpoint as written passes
    assert len(_records(last)) > 10, "several records to damage"
    for kind, needle in KINDS:
        copy = tmp_path / "last.pt"
        shutil.copyfile(last, copy)
        damage(kind, copy)
        with pytest.raises(ConfigError, match=needle):
            ckpt.load(copy)


@pytest.mark.parametrize("kind,needle", KINDS, ids=[k for k, _ in KINDS])
def test_damaged_checkpoint_is_refused_by_every_reader_and_left_as_it_is(saved_run, tmp_path, capsys, kind, needle):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    last = run / "checkpoints" / "last.pt"
    damage(kind, last)
    damaged, files = last.read_bytes(), listing(run)
    out = tmp_path / "exported"

    code, err = cli_run(capsys, "export", str(run), str(out))
    assert code == 2
    one_line(err, last, needle)
    assert not out.exists()

    code, err = cli_run(capsys, "sample", str(run), "--prompt", "In the beginning", "--max-new-tokens", "4")
    assert code == 2
    one_line(err, last, needle)

    code, err = cli_run(capsys, "train", *RUN, "trainer.resume=true", f"hydra.run.dir={run}")
    assert code == 2
    one_line(err, last, needle)

    with pytest.raises(ConfigError) as refused:
        skip_losses(run)
    assert len(str(refused.value).splitlines()) == 1 and str(refused.value).startswith(f"checkpoint {last} ")
    assert needle in str(refused.value)

    assert last.read_bytes() == damaged, "the damaged checkpoint is never overwritten"
    assert listing(run) == files, "nothing is added to or removed from the run directory"
    assert not RunDir(run).layer_skip_path.exists()


def test_the_console_command_refuses_a_bit_flipped_checkpoint_in_one_line(saved_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(saved_run, run)
    last = run / "checkpoints" / "last.pt"
    damage("64 bytes of wte.weight", last)
    proc = run_cli(["export", str(run), str(tmp_path / "out")], cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    one_line(proc.stderr, last, CRC)
    assert "logits match" not in proc.stdout and not (tmp_path / "out").exists()


def test_checkpoints_are_saved_with_crcs_even_when_torch_is_told_otherwise(tmp_path, saved_run):
    state = ckpt.load(saved_run / "checkpoints" / "last.pt")
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        ckpt.save_atomic(state, tmp_path / "ours.pt")
        torch.save(state, tmp_path / "foreign.pt")
    finally:
        torch.serialization.set_crc32_options(crc)
    assert torch.serialization.get_crc32_options() == crc
    assert ckpt.load(tmp_path / "ours.pt")["step"] == 2
    with pytest.raises(ConfigError, match="carries no CRC-32s"):
        ckpt.load(tmp_path / "foreign.pt")


@pytest.mark.parametrize(
    "text,why",
    [
        ('{"status": "completed", "final_lo', "is not valid JSON"),
        ("\0" * 64, "is not valid JSON"),
        ("[1, 2]", "is not a JSON object"),
    ],
    ids=["truncated", "zeroed", "not an object"],
)
def test_report_names_a_corrupt_summary_and_does_not_trust_it(saved_run, tmp_path, capsys, text, why):
    run = tmp_path / "runs" / "run"
    shutil.copytree(saved_run, run)
    summary = run / "summary.json"
    summary.write_text(text)
    capsys.readouterr()
    assert report.main([str(tmp_path / "runs"), "--out", str(tmp_path / "rep"), "--no-figures"]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"normbench: warning: {summary} {why}"), lines
    assert lines[0].endswith("; the run is listed as unreadable")
    assert summary.read_text() == text, "the report never rewrites a summary"
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "unreadable" in md and json.loads((saved_run / "summary.json").read_text())["status"] == "completed"
