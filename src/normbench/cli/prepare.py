"""``python -m normbench prepare <data overrides>``: a corpus' token shards, made before any training.

The overrides are ``train``'s (``data=files data.paths=[...] data.tokenizer=gpt2``, ...); the config is
composed and its data section checked as ``train`` would, then data/pipeline/prepare.py makes (or finishes) the
shards that ``train`` with the same data config will use. It prints where they are and what they hold.
"""

from __future__ import annotations

import sys

from normbench.config.files import compose_config
from normbench.errors import ConfigError, error

USAGE = """usage: python -m normbench prepare data=NAME [data.KEY=VALUE ...]

  data=files data.paths=[a.jsonl,dir/,'web/*.parquet'] [data.hf_text_field=text] [data.val_paths=[...]]
  data=hf data.hf_path=HubName/or/local/path [data.hf_config=...] [data.hf_streaming=true]
  data.tokenizer=gpt2|byte|bpe|tiktoken:NAME|hf:NAME_OR_PATH   data.workers=N (default: usable cores)
  data.shard_tokens=N (default 100M)   data.cache_dir=DIR (default $NORMBENCH_CACHE or ~/.cache/normbench)
"""


def prepare_cli(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    from normbench.data.checks import check_data  # deferred (start-up time): hydra, omegaconf, numpy
    from normbench.data.pipeline.prepare import prepare  # deferred (start-up time): hydra, omegaconf, numpy

    bad = [a for a in argv if "=" not in a or not a.split("=", 1)[0].lstrip("+").startswith("data")]
    if bad:
        return error(f"prepare: {bad[0]!r} is not a data override (data=NAME or data.KEY=VALUE; see prepare --help)")
    try:
        cfg = compose_config(argv).data
        check_data(cfg)
        if cfg.name not in ("files", "hf"):
            raise ConfigError(f"prepare: data={cfg.name} needs no preparing; prepare takes data=files or data=hf")
        entry, manifest = prepare(cfg, log=lambda msg: print(f"normbench: {msg}", file=sys.stderr))
    except ConfigError as exc:
        return error(str(exc))
    except Exception as exc:  # Hydra's own composition errors: one line
        if type(exc).__module__.startswith(("hydra", "omegaconf")):
            return error(f"prepare: {str(exc).strip().splitlines()[0]}")
        raise
    docs, tokens, shards = manifest["documents"], manifest["tokens"], manifest["shards"]
    print(
        f"{entry}\n  documents: {docs['train']:,} train, {docs['val']:,} val\n"
        f"  tokens:    {tokens['train']:,} train, {tokens['val']:,} val ({manifest['tokenizer']}, "
        f"vocab {manifest['vocab_size']:,}, end of text {manifest['eot_id']})\n"
        f"  shards:    {len(shards['train'])} train, {len(shards['val'])} val ({manifest['dtype']})"
    )
    return 0
