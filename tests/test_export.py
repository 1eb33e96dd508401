"""Export to Hugging Face transformers and sampling: logits, greedy tokens, KV cache, tokenizers, CLI.

Every placement with the four original norms, and every norm with Pre-LN, is exported (tiny, random
parameters so norm gains and DyT/Derf scalars are not at their init) and loaded back with
``AutoModelForCausalLM``; its logits must equal normbench's to 1e-5 (fp32), and transformers' greedy
``generate`` must produce the tokens normbench's own KV-cache sampler produces. Every registered
combination and option, trained and loaded in a process without normbench: tests/test_export_every.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from normbench.errors import ConfigError
from normbench.export import build_hf_model, export_run, load_exported, max_logit_diff
from normbench.export.custom import write_code
from normbench.export.sample import generate, generate_hf
from normbench.model import build_model
from normbench.model.attention import KVCache
from normbench.validation import ARCHS, NORMS

from conftest import TINY, compose, run_cli

VOCAB = 64
SMALL = ["model=tiny", "model.d_model=32", "model.n_head=4", "model.n_layer=4", "model.seq_len=24"]
GPT2_SHAPE = ["norm=layernorm", "model.pos=learned", "model.mlp=gelu", "model.bias=true"]

FIRST_NORMS = ("layernorm", "rmsnorm", "dyt", "derf")
# their own blocks: SimpleGPT (rmsnorm/layernorm only), the norm-free archs and nGPT (they ignore norm=: one entry)
OWN_BLOCKS = ("simplenorm", "rezero", "fixup", "tfixup", "ngpt")
COMBOS = (
    [("pre_ln", n) for n in NORMS]
    + [(a, n) for a in ARCHS if a not in (*OWN_BLOCKS, "pre_ln") for n in FIRST_NORMS]
    + [("simplenorm", "rmsnorm"), ("simplenorm", "layernorm")]
    + [(a, "none") for a in OWN_BLOCKS if a != "simplenorm"]
)
# which stock class each exact shape exports to; the rest of COMBOS export the custom class
STOCK = [
    ("gpt2", ["arch=pre_ln", *GPT2_SHAPE]),
    ("gpt2", ["arch=pre_ln", *GPT2_SHAPE, "model.tie_embeddings=false"]),
    ("llama", ["arch=pre_ln", "norm=rmsnorm"]),
    ("llama", ["arch=pre_ln", "norm=rmsnorm", "model.bias=true", "model.tie_embeddings=false", "model.rope_theta=500"]),
    ("qwen3", ["arch=pre_ln", "norm=rmsnorm", "arch.qk_norm=true"]),
    ("custom", ["arch=pre_ln", *GPT2_SHAPE, "norm.bias=false"]),  # GPT-2's LayerNorm always has a bias
    ("custom", ["arch=pre_ln", "norm=rmsnorm", "norm.affine=false"]),  # Llama's RMSNorm always has a gain
    ("custom", ["arch=pre_ln", "norm=rmsnorm", "model.mlp=gelu"]),
    ("custom", ["arch=peri_ln", "norm=layernorm", "arch.embed_norm=true", "model.pos=learned", "arch.qk_norm=true"]),
]


def make(overrides: list[str], seed: int = 0):
    torch.manual_seed(seed)
    cfg = compose([*SMALL, *overrides])
    model = build_model(cfg, VOCAB).eval()
    if cfg.arch.name != "ngpt":  # nGPT's unit-norm weights keep their init
        g = torch.Generator().manual_seed(seed)
        std = 0.2 if cfg.norm.name != "none" else 0.1  # without norms, activations grow layer by layer
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, std, generator=g)
                elif "alpha" in name or "scale" in name:  # DyT/Derf scalars, the embedding scalar
                    p.uniform_(0.3, 1.2, generator=g)
                else:  # gains around 1, biases and shifts around 0
                    p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.3 * torch.randn(p.shape, generator=g))
    return cfg, model


def roundtrip(tmp_path, model, cfg, custom: bool = False):
    kind, hf = build_hf_model(model, cfg, VOCAB, custom=custom)
    hf.save_pretrained(tmp_path)
    if kind == "custom":
        write_code(tmp_path)
    return kind, load_exported(tmp_path)


def tokens(n: int = 2, T: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, T), generator=torch.Generator().manual_seed(seed))


def check_equivalent(model, hf, seq_len: int = 24) -> None:
    diff, scale = max_logit_diff(model, hf, tokens())
    assert diff <= 1e-5, (diff, scale)
    assert scale > 0.1  # the comparison saw real logits
    prompt = tokens(1, 5, seed=2)[0].tolist()
    ours = generate(model, prompt, 10, temperature=0, n_tokens=VOCAB)
    assert ours == generate_hf(hf, prompt, 10, 0.0, None, 0, seq_len)


@pytest.mark.parametrize(("arch", "norm"), COMBOS)
def test_every_arch_and_norm_exports_with_equal_logits_and_greedy_tokens(tmp_path, arch, norm):
    cfg, model = make([f"arch={arch}", f"norm={norm}"])
    kind, hf = roundtrip(tmp_path, model, cfg, custom=arch != "pre_ln")
    expected = "llama" if (arch, norm) == ("pre_ln", "rmsnorm") else "custom"
    assert kind == expected and type(hf).__name__ == {"llama": "LlamaForCausalLM"}.get(kind, "NormbenchForCausalLM")
    check_equivalent(model, hf)


def test_a_norm_the_exporter_does_not_know_is_refused_in_one_line_naming_it():
    """A plugin's ``register_norm``: its module class is not one the template computes."""
    import torch.nn as nn

    from normbench.norm.norms import NORMS as registry
    from normbench.norm.norms import register_norm

    class HalfNorm(nn.Module):
        def forward(self, x):
            return x / 2

    cfg = compose([*SMALL, "arch=pre_ln", "norm=rmsnorm"])
    cfg.norm.name = "halfnorm"
    register_norm("halfnorm")(lambda cfg, dim, alpha: HalfNorm())
    try:
        model = build_model(cfg, VOCAB)
    finally:
        del registry["halfnorm"]
    for custom in (False, True):
        with pytest.raises(ConfigError) as exc:
            build_hf_model(model, cfg, VOCAB, custom=custom)
        assert str(exc.value).startswith("export: norm=halfnorm (HalfNorm) is not supported: the exported class ")
        assert "\n" not in str(exc.value)


@pytest.mark.parametrize("tied", ["true", "false"])
def test_fixnorm_exports_with_unit_norm_rows(tmp_path, tied):
    cfg, model = make(["arch=pre_ln", "norm=rmsnorm", "model.fixnorm=true", f"model.tie_embeddings={tied}"])
    kind, hf = roundtrip(tmp_path, model, cfg)
    assert kind == "custom" and json.loads((tmp_path / "config.json").read_text())["fixnorm"] is True
    check_equivalent(model, hf)


@pytest.mark.parametrize(("kind", "overrides"), STOCK, ids=[f"{k}-{i}" for i, (k, _) in enumerate(STOCK)])
def test_exact_shapes_export_to_stock_classes_without_remote_code(tmp_path, kind, overrides):
    from transformers import AutoModelForCausalLM

    cfg, model = make(overrides)
    got, hf = roundtrip(tmp_path, model, cfg)
    assert got == kind
    check_equivalent(model, hf)
    config = json.loads((tmp_path / "config.json").read_text())
    if kind == "custom":
        assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_normbench.NormbenchForCausalLM"
        with pytest.raises(ValueError, match="trust_remote_code"):
            AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=False)
        return
    assert "auto_map" not in config and not list(tmp_path.glob("*.py"))
    plain = AutoModelForCausalLM.from_pretrained(tmp_path)  # no trust_remote_code
    assert type(plain).__name__ == {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}.get(
        kind, "Qwen3ForCausalLM"
    )
    assert config["tie_word_embeddings"] == cfg.model.tie_embeddings
    if kind == "gpt2":
        assert config["activation_function"] == "gelu" and config["layer_norm_epsilon"] == cfg.norm.eps
    else:
        assert config["rms_norm_eps"] == cfg.norm.eps
        assert config["rope_parameters"]["rope_theta"] == cfg.model.rope_theta
        assert config.get("attention_bias") == cfg.model.bias


def test_the_custom_class_is_self_contained(tmp_path):
    """Loads and runs in a process where normbench cannot be imported; imports only torch/transformers."""
    import ast
    import subprocess
    import sys

    cfg, model = make(["arch=hybridnorm_star", "norm=derf", "model.pos=learned"])
    roundtrip(tmp_path, model, cfg, custom=True)
    from normbench.export.custom import FILES

    assert set(FILES) == {f"{n}_normbench.py" for n in ("configuration", "modeling", "layers", "norms")}
    for name in FILES:
        tree = ast.parse((tmp_path / name).read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
        assert roots <= {"__future__", "math", "torch", "transformers"}, roots
    expected = model(torch.tensor([[1, 2, 3]]))[0][0, -1, :4].tolist()
    code = (
        "import sys; sys.modules['normbench'] = None\n"
        "import torch; from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}, trust_remote_code=True)\n"
        "print(m(torch.tensor([[1, 2, 3]])).logits[0, -1, :4].tolist())"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert max(abs(a - b) for a, b in zip(got, expected)) <= 1e-5
    assert len(json.loads((tmp_path / "config.json").read_text())["blocks"]) == 4


@pytest.mark.parametrize(
    ("arch", "norm", "extra"), [(a, n, []) for a, n in COMBOS] + [("pre_ln", "rmsnorm", GPT2_SHAPE[1:])]
)
def test_kv_cache_logits_equal_full_forward(arch, norm, extra):
    cfg, model = make([f"arch={arch}", f"norm={norm}", *extra])
    idx = tokens(2, 20)
    with torch.no_grad():
        full = model(idx)[0]
        cache = KVCache(len(model.blocks))
        parts = [model(idx[:, :6], cache=cache)[0]]  # a prompt, one token at a time, then a chunk
        parts += [model(idx[:, t : t + 1], cache=cache)[0] for t in range(6, 12)]
        parts.append(model(idx[:, 12:], cache=cache)[0])
    assert cache.length == 20
    # float32 rounding, relative to the logits' scale (a wrong cache is off by O(1))
    assert (torch.cat(parts, dim=1) - full).abs().max() <= 1e-5 * full.abs().max().clamp(min=1)


def test_kv_cache_leaves_training_untouched():
    """The training call (no cache) computes what it did: same logits and gradients as a fresh model."""
    cfg, model = make(["arch=pre_ln", "norm=rmsnorm"])
    idx = tokens(2, 24)
    loss = model(idx, idx)[1]
    loss.backward()
    with torch.no_grad():
        cache = KVCache(len(model.blocks))
        model(idx[:, :8], cache=cache)
    assert model(idx, idx)[1].item() == loss.item()


@pytest.mark.parametrize("name", ["byte", "gpt2", "bpe"])
def test_tokenizer_round_trip(tmp_path, name):
    from transformers import AutoTokenizer

    from normbench.data.tokenizer import build_tokenizer
    from normbench.export.tokenizer import hf_tokenizer

    text = "In the beginning God created the heaven and the earth.\n  Ünïcödé: naïve café — 1234 ✓ 🎉\tend"
    train = (text + "\n") * 50 + "the quick brown fox jumps over the lazy dog. " * 200
    tok = build_tokenizer(name, 300 if name == "bpe" else None, train, tmp_path / "cache")
    hf_tokenizer(tok, 128).save_pretrained(tmp_path / "tok")
    hf = AutoTokenizer.from_pretrained(tmp_path / "tok")
    for s in (text, "plain ascii", " leading space", "x"):
        ids = tok.encode(s)
        assert hf(s)["input_ids"] == ids
        assert hf.decode(ids) == tok.decode(ids) == s
    assert len(hf) == getattr(tok, "learned_size", tok.vocab_size)
    assert hf.model_max_length == 128
    # an EOS (and BOS) for lm-evaluation-harness: GPT-2's end of text; "\n" where a tokenizer has none
    eos = 50256 if name == "gpt2" else tok.encode("\n")[0]
    assert hf.eos_token_id == hf.bos_token_id == eos and (name != "byte" or eos == 10)


def test_a_reserved_end_of_text_id_is_the_exported_eos(tmp_path):
    """A tokenizer with ``eot_id`` (the corpus's multi-document form: byte id 256 of 257) exports that id as EOS,
    as ``<|endoftext|>``; text encodes as before."""
    from transformers import AutoTokenizer

    from normbench.data.tokenizer import ByteTokenizer
    from normbench.export.tokenizer import eos_id, hf_tokenizer

    with_eot = ByteTokenizer(eot=True)
    hf_tokenizer(with_eot, 64).save_pretrained(tmp_path / "tok")
    hf = AutoTokenizer.from_pretrained(tmp_path / "tok")
    assert eos_id(with_eot) == hf.eos_token_id == hf.bos_token_id == 256 and hf.eos_token == "<|endoftext|>"
    assert len(hf) == 257 and hf("a\nb")["input_ids"] == [97, 10, 98] and hf.decode([97, 10, 98]) == "a\nb"


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory):
    """A tiny GPT-2-shaped run on the GPT-2 tokenizer (padded vocabulary), trained through the CLI."""
    root = tmp_path_factory.mktemp("gpt2run")
    overrides = ["arch=pre_ln", *GPT2_SHAPE, "data=synthetic", "data.tokenizer=gpt2", "data.synthetic_tokens=40000"]
    run_cli(["train", *TINY, *overrides, "trainer.max_steps=6", "diag=off", "hydra.run.dir=run"], cwd=root, check=True)
    return root


@pytest.mark.slow
def test_cli_export_and_sample_agree_on_a_trained_gpt2_run(gpt2_run, capsys):
    from normbench import cli

    root = gpt2_run
    proc = run_cli(["export", "run", "out"], cwd=root, check=True)  # the console command, end to end
    assert "GPT2LMHeadModel" in proc.stdout and proc.stderr == ""
    out = root / "out"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json", "README.md"):
        assert (out / name).is_file(), name
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["suppress_tokens"] == list(range(50257, 50304))  # the padded rows of a 50257-token vocabulary
    card = (out / "README.md").read_text()
    summary = json.loads((root / "run" / "summary.json").read_text())
    assert "GPT2LMHeadModel" in card and "arch=pre_ln" in card and "data=synthetic" in card
    assert f"{summary['best_val_loss']:.4f}" in card and "| status | completed |" in card

    def sample(*args: str) -> str:
        assert cli.main(["sample", str(root / "run"), *args]) == 0
        return capsys.readouterr().out

    greedy = ["--prompt", "the king said", "--temperature", "0", "--max-new-tokens", "12", "--ids"]
    ours = sample(*greedy).split()
    assert len(ours) == 12 and ours == sample(*greedy, "--hf").split()
    drawn = sample("--prompt", "the king", "--max-new-tokens", "8", "--seed", "3", "--top-k", "20")
    assert drawn.startswith("the king") and drawn == sample(
        "--prompt", "the king", "--max-new-tokens", "8", "--seed", "3", "--top-k", "20"
    )


def test_export_of_a_trained_custom_run_in_process(tmp_path):
    """peri_ln + derf with a trained BPE (config read back from the checkpoint: no .hydra/ here)."""
    from normbench.train import trainer

    overrides = ["arch=peri_ln", "norm=derf", "data=synthetic", "data.tokenizer=bpe", "data.vocab_size=300"]
    cfg = compose([*TINY, *overrides, "data.synthetic_tokens=40000", "trainer.max_steps=4", "diag=off"])
    trainer.run(cfg, tmp_path / "run")
    info = export_run(tmp_path / "run", tmp_path / "out", log=lambda *_: None)
    assert info["kind"] == "custom" and info["max_abs_diff"] <= 1e-5
    from transformers import AutoTokenizer

    hf = load_exported(tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(tmp_path / "out")
    ids = tok("the river and the", return_tensors="pt").input_ids
    greedy = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    from normbench.export.run import load_run

    run = load_run(tmp_path / "run")
    assert (
        generate(run.model, ids[0].tolist(), 6, temperature=0, n_tokens=len(tok)) == greedy[0, ids.shape[1] :].tolist()
    )


def test_one_line_errors(tmp_path, gpt2_run, capsys, monkeypatch):
    from normbench import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    run = str(gpt2_run / "run")
    cases = [
        (["export", "nowhere", "out"], "run directory nowhere does not exist"),
        (["export", "empty", "out"], "has no checkpoint"),
        (["sample", "empty", "--prompt", "a"], "has no checkpoint"),
        (["export", run, run], "exists and is not empty"),
        (["sample", run, "--prompt", "a", "--max-new-tokens", "500"], "exceeds the model's context"),
        (["sample", run, "--prompt", ""], "--prompt is empty"),
        (["sample", run, "--prompt", "a", "--temperature", "-1"], "--temperature=-1.0 must be >= 0"),
        (["export", run], "the following arguments are required: out_dir"),
        (["sample", run, "--top-k", "x", "--prompt", "a"], "--top-k: invalid int value"),
    ]
    for args, needle in cases:
        assert cli.main(args) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], (args, lines)
    assert not (tmp_path / "out").exists()
    proc = run_cli(["export", "empty", "out"], cwd=tmp_path)  # the console command: one line, no traceback
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"normbench: error: empty has no checkpoint (expected {'empty/checkpoints/last.pt'}); "
        "a run writes one every trainer.ckpt_every steps and at its end"
    ]


def test_bad_sampling_values_are_config_errors():
    cfg, model = make(["arch=pre_ln", "norm=rmsnorm"])
    with pytest.raises(ConfigError, match="--temperature"):
        generate(model, [1, 2], 3, temperature=-1)
    with pytest.raises(ConfigError, match="--top-k"):
        generate(model, [1, 2], 3, top_k=0)


@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_custom_class_left_padding_and_labels(tmp_path, pos):
    """A left-padded batch generates what each prompt generates alone; labels give normbench's loss."""
    cfg, model = make(["arch=peri_ln", "norm=dyt", f"model.pos={pos}"])
    _, hf = roundtrip(tmp_path, model, cfg, custom=True)
    short, long = tokens(1, 4, seed=3)[0].tolist(), tokens(1, 7, seed=4)[0].tolist()
    batch = torch.tensor([[0] * 3 + short, long])
    mask = torch.tensor([[0] * 3 + [1] * 4, [1] * 7])
    out = hf.generate(batch, attention_mask=mask, max_new_tokens=6, do_sample=False)[:, 7:].tolist()
    assert out == [generate(model, short, 6, temperature=0), generate(model, long, 6, temperature=0)]
    idx = tokens(2, 24)
    with torch.no_grad():
        ours = model(idx[:, :-1], idx[:, 1:])[1]
        theirs = hf(input_ids=idx, labels=idx).loss
    assert abs(ours.item() - theirs.item()) <= 1e-6


@pytest.mark.parametrize(("norm", "leak"), [("batchnorm", True), ("powernorm", False), ("rmsnorm", False)])
def test_model_card_says_what_the_batch_statistic_norms_compute(norm, leak):
    """BatchNorm's card says its training forward leaked the future; every custom card's loading lines pass
    trust_remote_code to the tokenizer too (it reads config.json's auto_map)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from normbench.export.card import model_card

    cfg, model = make(["arch=pre_ln", f"norm={norm}"])
    run = SimpleNamespace(cfg=OmegaConf.structured(cfg), summary={}, model=model, vocab_size=VOCAB, tokens=0, step=0)
    card = model_card(run, "custom", "NormbenchForCausalLM", VOCAB, 0.0, "out")
    assert ("BatchNorm leaked the future in training" in card) == leak
    assert ("running quadratic mean" in card) == (norm == "powernorm")
    assert "AutoTokenizer.from_pretrained('out', trust_remote_code=True)" in card
    stock = model_card(run, "llama", "LlamaForCausalLM", VOCAB, 0.0, "out")
    assert "AutoTokenizer.from_pretrained('out')\n" in stock and "trust_remote_code" not in stock
