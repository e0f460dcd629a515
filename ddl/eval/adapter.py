"""The lm-eval model adapter for ddl checkpoints: log-likelihoods, batched, context-length aware.

Registered as `ddl`, so lm-eval's own API can use it:
    lm_eval.simple_evaluate(model="ddl", model_args="checkpoint=DDL_HOME/runs/<sig>", tasks=[...])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window


def load_tokenizer_for(meta: dict):
    from ..data.dataset import open_dataset
    from ..data.tokenizers import load_tokenizer
    try:
        return open_dataset(meta["dataset"]).tokenizer()
    except ValueError:  # the shards moved: byte and gpt2 need nothing from them
        return load_tokenizer(meta["run"].data.tokenizer)


@register_model("ddl")
class DDLLM(TemplateLM):
    backend = "causal"

    def __init__(self, checkpoint: str | None = None, model=None, tokenizer=None, batch_size: int | str = 16,
                 device: str = "cpu", **kwargs):
        super().__init__()
        if checkpoint is not None:
            from ..train.checkpoint import load_checkpoint_model
            model, meta = load_checkpoint_model(checkpoint)
            tokenizer = load_tokenizer_for(meta)
        if model is None or tokenizer is None:
            raise ValueError("ddl lm-eval model: pass checkpoint=<path>, or model= and tokenizer=")
        self._device = torch.device(device)
        self.model = model.to(self._device).eval()
        self.tokenizer = tokenizer
        self.batch_size = int(batch_size) if str(batch_size).isdigit() else 16
        self.max_length = model.cfg.max_seq_len

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eot

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string)

    def tok_decode(self, tokens: list[int], **kwargs) -> str:
        return self.tokenizer.decode(tokens)

    @torch.no_grad()
    def _score(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """Sum of log p(continuation | context) and whether it is the greedy continuation.

        The window is the last max_length+1 tokens of context+continuation (context left-truncated).
        """
        results = []
        for first in range(0, len(pairs), self.batch_size):
            batch = pairs[first:first + self.batch_size]
            windows = [(ctx + cont)[-(self.max_length + 1):] for ctx, cont in batch]
            width = max(len(w) - 1 for w in windows)
            inputs = torch.zeros(len(batch), width, dtype=torch.long)
            for row, window in enumerate(windows):
                inputs[row, : len(window) - 1] = torch.tensor(window[:-1])
            logits, _ = self.model(inputs.to(self._device))
            log_probs = F.log_softmax(logits.float(), dim=-1).cpu()
            for row, ((_, cont), window) in enumerate(zip(batch, windows, strict=True)):
                n_in = len(window) - 1
                positions = torch.arange(n_in - len(cont), n_in)               # predicting the continuation
                targets = torch.tensor(cont)
                scores = log_probs[row, positions]                            # (len(cont), V)
                results.append((scores.gather(-1, targets[:, None]).sum().item(),
                                bool((scores.argmax(-1) == targets).all())))
        return results

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        return self._score([(ctx, cont) for _, ctx, cont in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        totals = []
        for request in requests:
            tokens = self.tok_encode(request.args[0])
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                tokens, prefix_token=self.eot_token_id, max_seq_len=self.max_length, context_len=1)]
            totals.append(sum(score for score, _ in self._score(windows)))
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError("ddl models are evaluated by log-likelihood; generation tasks are not supported")
