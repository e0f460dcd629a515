"""lm-eval on our checkpoints: the offline task, agreement with a direct computation, offline errors."""

import json
import time

import pytest
import torch
import torch.nn.functional as F

from ddl.data import DataConfig
from ddl.eval import OFFLINE_TASK, TaskUnavailable, evaluate
from ddl.eval.harness import task_manager
from ddl.eval.offline_task import build_items, ensure_task_dir
from ddl.model import model_config
from ddl.train import RunConfig, TrainConfig, load_checkpoint_model, train

LIMIT = 40


class Quiet:
    def log_metrics(self, metrics, step):
        pass

    def flush(self):
        pass

    def close(self):
        pass


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    data = DataConfig()
    run = RunConfig(model_config("micro", vocab_size=data.model_vocab_size(), residual="ddl", dv=4), data,
                    TrainConfig(steps=30, batch_tokens=512, micro_batch=8, seq_len=64, warmup_steps=5, eval_every=30,
                                eval_tokens=1024, ckpt_every=30, log_every=10), seed=0)
    result = train(run, home / "run", Quiet(), "sig", data_root=home / "data")
    return result.checkpoint


def direct_accuracy(model, tokenizer, items):
    """argmax_choice sum log p(choice | context), computed without lm-eval."""
    correct = 0
    with torch.no_grad():
        for item in items:
            scores = []
            for choice in item["choices"]:
                ctx, cont = tokenizer.encode(item["context"]), tokenizer.encode(choice)
                window = (ctx + cont)[-(model.cfg.max_seq_len + 1):]
                logits, _ = model(torch.tensor([window[:-1]]))
                log_probs = F.log_softmax(logits[0], -1)[-len(cont):]
                scores.append(log_probs.gather(-1, torch.tensor(cont)[:, None]).sum().item())
            correct += int(max(range(len(scores)), key=scores.__getitem__) == item["label"])
    return correct / len(items)


@pytest.mark.slow
def test_lm_eval_accuracy_equals_the_direct_computation(checkpoint, monkeypatch, tmp_path):
    monkeypatch.setenv("DDL_HOME", str(tmp_path))
    result = evaluate(checkpoint, [OFFLINE_TASK], [0], limit=LIMIT)
    model, meta = load_checkpoint_model(checkpoint)
    from ddl.eval.adapter import load_tokenizer_for
    expected = direct_accuracy(model, load_tokenizer_for(meta), build_items()[:LIMIT])
    assert result.scores[f"eval/0shot/{OFFLINE_TASK}/acc"] == pytest.approx(expected)
    assert result.scores[f"eval/0shot/{OFFLINE_TASK}/reported"] == result.scores[f"eval/0shot/{OFFLINE_TASK}/acc"]
    # bootstrap_iters=0 leaves lm-eval's stderr "N/A": the binomial one of its closed form, over LIMIT items
    assert result.scores[f"eval/0shot/{OFFLINE_TASK}/n"] == LIMIT
    binomial = (expected * (1 - expected) / (LIMIT - 1)) ** 0.5
    assert result.scores[f"eval/0shot/{OFFLINE_TASK}/stderr"] == pytest.approx(binomial)
    assert json.loads(result.results_json)["0shot"]["results"][OFFLINE_TASK]["alias"] == OFFLINE_TASK


def test_rolling_loglikelihood_is_the_models_own_loss(checkpoint):
    from lm_eval.api.instance import Instance
    from ddl.eval.adapter import DDLLM
    lm = DDLLM(checkpoint=checkpoint)
    text = build_items()[0]["context"][:200]
    [total] = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    tokens = [lm.eot_token_id] + lm.tok_encode(text)
    _, loss = lm.model(torch.tensor([tokens[:-1]]), torch.tensor([tokens[1:]]))
    assert total == pytest.approx(-loss.item() * (len(tokens) - 1), rel=1e-4)


@pytest.mark.slow
def test_a_hub_task_offline_is_one_clear_line_and_fast(checkpoint, monkeypatch, tmp_path):
    monkeypatch.setenv("DDL_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    task_manager(hub=True)     # indexing lm-eval's tasks takes seconds of CPU: the clock times the refusal
    started = time.time()
    with pytest.raises(TaskUnavailable) as err:
        evaluate(checkpoint, ["arc_easy"], [0])
    assert time.time() - started < 30
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("eval.tasks='arc_easy': its dataset is not in the Hugging Face cache")


def test_offline_task_is_deterministic_and_held_out(monkeypatch, tmp_path):
    from ddl.data.sources import embedded_documents, is_val
    monkeypatch.setenv("DDL_HOME", str(tmp_path))
    first = (ensure_task_dir() / f"{OFFLINE_TASK}.jsonl").read_bytes()
    (ensure_task_dir() / f"{OFFLINE_TASK}.jsonl").unlink()
    assert (ensure_task_dir() / f"{OFFLINE_TASK}.jsonl").read_bytes() == first
    train_text = "\n".join(d for d in embedded_documents() if not is_val(d, 0.1))
    items = build_items()
    assert len(items) > 50 and all(item["context"] not in train_text for item in items)
    assert all(len(item["choices"]) == 4 and 0 <= item["label"] < 4 for item in items)
