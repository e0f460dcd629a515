"""One run for real: exact resume, DDP equivalence, NaN stop, signals, checkpoints, schedule."""

import functools
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from ddl.data import DataConfig
from ddl.model import model_config
from ddl.train import Interrupted, NonFiniteLoss, RunConfig, TrainConfig, train
from ddl.train import checkpoint
from ddl.model.mup import optimizer_groups
from ddl.train.loop import lr_at


class Recorder:
    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step):
        self.rows.append((step, dict(metrics)))

    def flush(self):
        pass

    def close(self):
        pass

    def losses(self):
        return [(s, m["train/loss"]) for s, m in self.rows if "train/loss" in m]


def micro_run(residual="ddl", dv=4, param="sp", depth_param="none", **train_kw):
    """Under mup at base width 32: micro's width 64 is m = 2, where µP differs from sp."""
    kw = dict(steps=8, batch_tokens=4 * 32, micro_batch=4, seq_len=32, warmup_steps=2, eval_every=4,
              eval_tokens=512, ckpt_every=4, log_every=1)
    kw.update(train_kw)
    data = DataConfig()
    model = model_config("micro", vocab_size=data.model_vocab_size(), residual=residual, dv=dv, param=param,
                         mup_base_width=32, depth_param=depth_param)
    return RunConfig(model, data, TrainConfig(**kw), seed=1)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


class SignalAt(Recorder):
    """Sends this process `signum` once the trainer has logged `step`."""

    def __init__(self, step, signum=signal.SIGTERM):
        super().__init__()
        self.step, self.signum = step, signum

    def log_metrics(self, metrics, step):
        super().log_metrics(metrics, step)
        if step == self.step:
            os.kill(os.getpid(), self.signum)


@pytest.fixture
def sigterm_default():
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("param", ["sp", "mup"])
def test_stopped_and_resumed_run_continues_the_same_curve(tmp_path, data_root, sigterm_default, param):
    full = Recorder()
    train(micro_run(param=param), tmp_path / "full", full, "sig", data_root=data_root)
    first, second = SignalAt(3), Recorder()
    with pytest.raises(Interrupted):                                          # stopped at N = 3 of 8
        train(micro_run(param=param), tmp_path / "split", first, "sig", data_root=data_root)
    result = train(micro_run(param=param), tmp_path / "split", second, "sig", data_root=data_root)
    assert result.resumed_from == 3
    assert first.losses() + second.losses() == full.losses()  # identical, not merely close


def test_checkpoints_are_atomic_pruned_and_signed(tmp_path, data_root):
    train(micro_run(steps=12, keep_checkpoints=2), tmp_path, Recorder(), "sig", data_root=data_root)
    files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert files == ["step_00000008.pt", "step_00000012.pt"]                     # no .tmp, last 2 kept
    state = checkpoint.load(tmp_path / "checkpoints" / files[-1])                # weights_only=True
    assert state["step"] == 12 and state["signature"] == "sig" and "loader" in state and "rng" in state
    with pytest.raises(ValueError, match="holds checkpoints of run sig, not other"):
        train(micro_run(steps=12), tmp_path, Recorder(), "other", data_root=data_root)
    with pytest.raises(ValueError, match=r"^model.param='mup': checkpoint .* was trained under model.param='sp'; "):
        train(micro_run(steps=12, param="mup"), tmp_path, Recorder(), "sig", data_root=data_root)
    with pytest.raises(ValueError, match=r"^model.depth_param='completep': checkpoint .* was trained under "
                                         r"model.depth_param='none'; it loads only under that one$"):
        train(micro_run(steps=12, depth_param="completep"), tmp_path, Recorder(), "sig", data_root=data_root)
    model, meta = checkpoint.load_checkpoint_model(tmp_path)
    assert meta["step"] == 12 and not model.training


def test_non_finite_loss_stops_with_the_last_good_state(tmp_path, data_root):
    run = micro_run()
    huge_init = RunConfig(run.model.__class__(**{**run.model.__dict__, "init": "gpt2", "init_std": 1e15}), run.data,
                          run.train, 1)
    with pytest.raises(NonFiniteLoss, match=r"^train loss is nan at step 1; last good state \(step 0\) saved at"):
        train(huge_init, tmp_path, Recorder(), "sig", data_root=data_root)
    state = checkpoint.load(checkpoint.latest(tmp_path))
    assert state["step"] == 0 and all(torch.isfinite(v).all() for v in state["model"].values())


def test_a_signal_writes_a_checkpoint_then_stops(tmp_path, data_root, sigterm_default):
    with pytest.raises(Interrupted, match="stopped by SIGTERM at step 3"):
        train(micro_run(ckpt_every=1000), tmp_path, SignalAt(3), "sig", data_root=data_root)
    assert checkpoint.load(checkpoint.latest(tmp_path))["step"] == 3
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL                      # handlers restored


def test_a_signal_the_process_ignores_stays_ignored(tmp_path, data_root):
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        recorder = SignalAt(3, signal.SIGUSR1)
        train(micro_run(ckpt_every=1000), tmp_path, recorder, "sig", data_root=data_root)
        assert [s for s, _ in recorder.losses()] == list(range(1, 9))
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_lr_schedule_and_weight_decay_groups():
    cfg = TrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(1e-4) and lr_at(9, cfg) == pytest.approx(1e-3)
    assert lr_at(100, cfg) == pytest.approx(1e-4)
    assert lr_at(55, cfg) == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    from ddl.model import GPT
    cfg = model_config("micro", vocab_size=256, residual="ddl", dv=4)
    decayed, plain = optimizer_groups(model := GPT(cfg), cfg, 1e-3, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all("norm" in names[id(p)] or names[id(p)].endswith(("bias", "read")) for p in plain["params"])
    assert plain["weight_decay"] == 0 and decayed["weight_decay"] == 0.1
    assert plain["lr"] == decayed["lr"] == 1e-3


DDP_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from tests.test_train import Recorder, micro_run
    from ddl.train import train
    out, data_root = Path(sys.argv[1]), Path(sys.argv[2])
    rec = Recorder()
    train(micro_run(micro_batch=2, batch_tokens=4 * 32), out, rec, "sig", data_root=data_root)
    import os
    if os.environ["RANK"] == "0":
        (out / "losses.json").write_text(json.dumps(rec.losses()))
""")


def run_two_ranks(script: str, out, data_root) -> list[int]:
    """`script out data_root` as ranks 0 and 1 of a gloo group on this host; their exit codes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", script, str(out), str(data_root)],
                              env={**os.environ, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "DDL_CPUS": "1",
                                   "PYTHONPATH": os.getcwd()})
             for r in range(2)]
    return [p.wait(timeout=180) for p in procs]


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path, data_root):
    single = Recorder()
    train(micro_run(), tmp_path / "single", single, "sig", data_root=data_root)
    assert run_two_ranks(DDP_SCRIPT, tmp_path / "ddp", data_root) == [0, 0]
    import json
    ddp = json.loads((tmp_path / "ddp" / "losses.json").read_text())
    assert [s for s, _ in ddp] == [s for s, _ in single.losses()]
    for (_, a), (_, b) in zip(ddp, single.losses(), strict=True):
        assert math.isclose(a, b, rel_tol=1e-4)


DDP_SIGNAL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from tests.test_train import Recorder, micro_run
    import ddl.train.loop as loop
    out, data_root = Path(sys.argv[1]), Path(sys.argv[2])
    if os.environ["RANK"] == "1":            # only rank 1 is signalled, while it draws step 3's batch
        draw, calls = loop.BatchLoader.next_batch, []
        def next_batch(self):
            calls.append(1)
            if len(calls) == 3:
                os.kill(os.getpid(), signal.SIGUSR1)
            return draw(self)
        loop.BatchLoader.next_batch = next_batch
    try:
        loop.train(micro_run(micro_batch=2, batch_tokens=4 * 32, ckpt_every=1000), out, Recorder(), "sig",
                   data_root=data_root)
    except loop.Interrupted as err:
        (out / f"rank{os.environ['RANK']}.txt").write_text(str(err))
""")


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path, data_root):
    assert run_two_ranks(DDP_SIGNAL_SCRIPT, tmp_path, data_root) == [0, 0]
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text().startswith("stopped by SIGUSR1 at step 3;")
    assert checkpoint.load(checkpoint.latest(tmp_path))["step"] == 3


@pytest.mark.parametrize("kwargs, key", [(dict(steps=-5), "train.steps"),
                                         (dict(batch_tokens=1000), "train.batch_tokens"),
                                         (dict(lr=5.0), "train.lr"), (dict(lr=0.0), "train.lr"),
                                         (dict(grad_clip=0.0), "train.grad_clip"),
                                         (dict(eval_tokens=64, seq_len=128), "train.eval_tokens"),
                                         (dict(device="tpu"), "train.device")])
def test_invalid_train_configs(kwargs, key):
    with pytest.raises(ValueError, match=rf"^{key}="):
        TrainConfig(**kwargs)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_freed_activations_are_reused_without_page_faults():
    """train() calls keep_freed_memory(): a step that allocates and frees the same tensors again
    must not fault their pages in afresh, as it does under glibc's defaults."""
    script = textwrap.dedent("""
        import resource, sys, torch
        from ddl.train.distributed import keep_freed_memory
        if sys.argv[1] == "keep":
            assert keep_freed_memory()
        faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step = lambda: [torch.ones(2 << 20) for _ in range(8)]     # 8 tensors of 8 MiB, then freed
        step(), step()
        before = faults()
        step()
        print(faults() - before)
    """)
    faults = {mode: int(subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True,
                                       check=True).stdout) for mode in ("default", "keep")}
    assert faults["keep"] <= 0.01 * faults["default"], faults


@pytest.mark.slow
def test_a_compiled_run_validates_and_reads_its_state_ranks(tmp_path, data_root, monkeypatch):
    """train.compile=true compiles each block (fullgraph): training, evaluation (another mode, no grad, a last block
    that keeps its state for the ranks) and the final validation each get their graphs without hitting dynamo's
    recompile limit (a hard failure under fullgraph). Dynamo's graphs and guards are the claim, so the graphs go to
    AOTAutograd without inductor's C++ (its ~40 kernels, ~45 s of g++ on a cold cache): inductor's numbers are
    test_model_bf16_compile's and gpu-check's (ddl.gpu_check, whose CPU test compiles a run's blocks)."""
    from ddl.model import GPT
    monkeypatch.setattr(GPT, "compile_blocks", functools.partialmethod(GPT.compile_blocks, "aot_eager"))
    run = micro_run(compile=True, steps=4, eval_every=2, ckpt_every=4)
    recorder = Recorder()
    result = train(run, tmp_path / "run", recorder, run.signature(), data_root=data_root)
    assert result.steps == 4 and math.isfinite(result.final["val/loss"])
    assert any("erank/L01" in metrics for _, metrics in recorder.rows)


def test_activation_checkpointing_trains_the_same_numbers(tmp_path, data_root):
    """train.activation_checkpointing recomputes each block in backward: the same losses, and the same signature."""
    curves = []
    for checkpointing in (False, True):
        run = micro_run(steps=4, activation_checkpointing=checkpointing)
        recorder = Recorder()
        train(run, tmp_path / str(checkpointing), recorder, run.signature(), data_root=data_root)
        curves.append((run.signature(), recorder.losses()))
    assert curves[0][0] == curves[1][0]
    assert curves[0][1] == pytest.approx(curves[1][1], rel=1e-6)
