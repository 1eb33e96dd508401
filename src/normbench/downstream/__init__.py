"""Downstream evaluation through lm-evaluation-harness (EleutherAI, github.com/EleutherAI/lm-evaluation-harness).

``python -m normbench eval RUN_DIR ... --tasks T1,T2`` scores runs on the harness's tasks with normbench's own
model (lm.py, an lm-eval ``LM``), and writes ``eval.json`` into each run (run/eval_file.py). harness.py drives the
harness (its ``TaskManager`` and ``simple_evaluate``); callback.py is the optional in-training evaluation. The
harness is the optional ``eval`` extra: :func:`require_harness` says how to install it, in one line.
Anchors: litgpt's ``litgpt evaluate`` (lm-eval over its own model wrapper), OLMo-core's in-loop downstream
evaluators, Peri-LN (arXiv:2502.02732) reporting the average of ARC, HellaSwag, PIQA, SIQA and Winogrande.
"""

from __future__ import annotations

from normbench.errors import ConfigError

INSTALL_HINT = "pip install 'normbench[eval]' (in a checkout: pip install -e '.[eval]')"


def require_harness() -> str:
    """lm-evaluation-harness's version; ConfigError (one line, the install command) when it is missing."""
    try:
        import lm_eval  # the optional `eval` extra
    except ImportError as exc:
        raise ConfigError(
            f"eval needs lm-evaluation-harness ({exc.name or 'lm_eval'} is missing): {INSTALL_HINT}"
        ) from None
    return str(lm_eval.__version__)
