"""normbench's own model as an lm-evaluation-harness ``LM``: every architecture, no export.

lm-eval's ``TemplateLM`` (lm_eval/api/model.py) turns each (context, continuation) request into token ids
with :meth:`NormbenchLM.tok_encode` (an empty context becomes the EOS id, export/tokenizer.eos_id, as the
harness's HF model does with the export's BOS); this module scores those ids. It follows the harness's HF
model (``HFLM._loglikelihood_tokens``, lm_eval/models/huggingface.py) where the numbers depend on it, so
that ``normbench eval`` equals ``lm_eval --model hf`` on ``normbench export`` of the same run: requests
longest first in batches (lm-eval's ``Collator``), each input ``(context + continuation)[-(L + 1):][:-1]``
(truncated from the left to the block size L), right-padded, log-softmax over every logit row (a padded
vocabulary's rows included, as the exported model's logits), the continuation's log-probabilities summed,
and greedy = every continuation token is the argmax. ``loglikelihood_rolling`` uses the harness's rolling
windows (``get_rolling_token_windows``, ``make_disjoint_window``). ``generate_until`` is greedy decoding
one request at a time over the model's KV cache, restricted to the tokenizer's ids (the sampler's rule,
export/sample.py), stopped at the first ``until`` string; sampling (``do_sample``) is refused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM  # lm-eval: the optional `eval` extra (this module loads after the check)
from lm_eval.models.utils import Collator
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from normbench.errors import ConfigError
from normbench.export.tokenizer import eos_id
from normbench.model.attention import KVCache

MAX_GEN_TOKS = 256  # the harness's default for generation tasks that name none


class NormbenchLM(TemplateLM):
    """Scores lm-eval's requests with ``model`` (on its device, under ``autocast``) and ``tokenizer``."""

    def __init__(self, model, tokenizer, autocast, batch_size: int = 32):
        super().__init__()
        self.model, self.tok, self.autocast = model.eval(), tokenizer, autocast
        self.batch_size = int(batch_size)
        self._device = next(model.parameters()).device
        self._eos = eos_id(tokenizer)

    @property
    def eot_token_id(self) -> int:
        return self._eos

    @property
    def max_length(self) -> int:
        return int(self.model.seq_len)

    @property
    def tokenizer_name(self) -> str:
        return self.tok.name

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tok.encode(string)  # no special tokens: the export's tokenizer adds none either

    def tok_decode(self, ids) -> str:
        return self.tok.decode(ids)

    @torch.no_grad()
    def _logits(self, rows: list[list[int]]) -> torch.Tensor:
        """The model's logits on ``rows``, right-padded to the longest: (B, T, V)."""
        width = max(len(r) for r in rows)
        idx = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            idx[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        with self.autocast():
            return self.model(idx.to(self._device))[0]

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        L = self.max_length
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        res = []
        for chunk in order.get_batched(n=self.batch_size):
            if any(not 0 < len(cont) <= L for _, _, cont in chunk):
                raise ConfigError(f"eval: a continuation longer than the block size {L} (or empty) cannot be scored")
            rows = [(ctx + cont)[-(L + 1) :][:-1] for _, ctx, cont in chunk]
            logits = self._logits(rows)
            for (key, _, cont), row, lg in zip(chunk, rows, logits):
                # the continuation's positions only: a (B, T, V) fp32 copy would be GBs at GPT-2's vocabulary
                scores = F.log_softmax(lg[len(row) - len(cont) : len(row)].float(), dim=-1)
                target = torch.tensor(cont, device=scores.device)
                greedy = bool((scores.argmax(-1) == target).all())
                answer = (float(scores.gather(1, target[:, None]).sum()), greedy)
                res.append(answer)
                if key is not None:  # a rolling window's piece is cached per document instead
                    self.cache_hook.add_partial("loglikelihood", key, answer)
        return order.get_original(res)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in (req.args for req in requests):
            windows = get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            pieces = [(None, *make_disjoint_window(w)) for w in windows]
            total = sum(ll for ll, _ in self._loglikelihood_tokens(pieces))
            out.append(total)
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for context, gen_kwargs in (req.args for req in requests):
            kwargs = dict(gen_kwargs or {})
            if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                raise ConfigError("eval: generation tasks are scored greedily here (do_sample/temperature > 0)")
            until = kwargs.get("until") or [self.tok_decode([self.eot_token_id])]
            until = [until] if isinstance(until, str) else list(until)
            text = self._greedy(self.tok_encode(context), int(kwargs.get("max_gen_toks", MAX_GEN_TOKS)), until)
            out.append(text)
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
        return out

    @torch.no_grad()
    def _greedy(self, prompt: list[int], max_new: int, until: list[str]) -> str:
        """Greedy continuation of ``prompt`` (left-truncated to leave room) up to the first ``until`` string."""
        L = self.max_length
        max_new = max(1, min(max_new, L - 1))
        prompt = (prompt or [self.eot_token_id])[-(L - max_new) :]
        cache, new = KVCache(len(self.model.blocks)), []
        step = torch.tensor([prompt], dtype=torch.long, device=self._device)
        for _ in range(max_new):
            with self.autocast():
                logits = self.model(step, cache=cache)[0][0, -1, : self.tok.vocab_size]
            new.append(int(logits.argmax()))
            text = self.tok_decode(new)
            cut = min((text.find(u) for u in until if u and u in text), default=-1)
            if cut >= 0:
                return text[:cut]
            step = torch.tensor([[new[-1]]], dtype=torch.long, device=self._device)
        return self.tok_decode(new)
