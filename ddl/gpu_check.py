"""`make gpu-check`: what a CPU cannot show, measured on a CUDA GPU in minutes.

Parts (--parts, comma-separated; default `train,step,resume`):
- train: each arm (--arms) as a training run (`python -m ddl.train`, embedded corpus, 16 x 1024 tokens a step,
  compiled per block with CUDA graphs: train.compile_mode=reduce-overhead; on the CPU, eager), one after another:
  tokens/s as the run logs it, the median over its logged intervals after the first two (compiling, recording the
  graphs); each arm's step over the baseline's, MFU and the peak GPU memory the run logged (train/gpu_peak_gib).
- step: the paper's small size in bf16, the arms (--arms; default baseline, DDL d_v=1 and d_v=4), each compiled
  per block (GPT.compile_blocks; --compile-mode reduce-overhead: with CUDA graphs; --compile-backend aot_eager:
  dynamo and AOTAutograd without inductor's code, to tell their failures apart): seconds to the first step, the
  compiled gradients against eager's, then 5 warm-up and 20 timed steps each (CUDA events), the arms alternating
  in rounds of 5; step time, the host's time to launch a step (as long as the step: host-bound), ratio to the
  baseline, MFU, step memory.
- resume: a 200-step run of DDL d_v=4 at the small shape (embedded corpus) killed with SIGKILL after a
  checkpoint and resumed, against the same run uninterrupted: the steps continue from the checkpoint, no
  loss is NaN, and the curves agree within bf16 noise.
- tests (opt-in): the device-aware tests on CUDA (tests/test_triton_kernels.py, tests/test_model_bf16_compile.py).
- profile (opt-in): the CUDA kernels of three compiled steps of each arm, by time (profile-<arm>.txt).
- kernels (opt-in): each Delta op's Triton kernel alone (d_v=4, bf16 state): microseconds at 2-16 warps (a tiled
  op's also at 64 and 128 features a tile) and as chosen, bytes, the rate; and a sublayer's norm and gates, the
  fused op against the plain ops compiled.

summary.json is rewritten after every part (and every arm), so a check cut short still leaves its figures.
Without a CUDA GPU it says so in one line and exits 0; `--device cpu` runs the parts on the CPU at
`--size micro` (how the suite tests this harness).

    python -m ddl.gpu_check [--parts step,resume] [--arms baseline,ddl_dv1,ddl_dv4] [--compile-mode default]
                            [--compile-backend inductor] [--out DIR] [--size small] [--device cuda|cpu]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import paths
from .validation import OneLineParser, printable_path, unknown_names

CHECKOUT = Path(__file__).resolve().parents[1]
DEVICE_TESTS = ["tests/test_triton_kernels.py", "tests/test_model_bf16_compile.py"]
ARMS = ("baseline", "ddl_dv1", "ddl_dv4")                # the step and profile parts' default arms (--arms)
PARTS = ("train", "step", "resume", "tests", "profile", "kernels")
DEFAULT_PARTS = ("train", "step", "resume")
TARGETS = {"ddl_dv1": 1.05, "ddl_dv4": 1.10}          # compiled step ratio to the baseline, small, bf16
TRAIN_TARGETS, TRAIN_MFU_TARGET = {"ddl_dv1": 1.05, "ddl_dv4": 1.25}, 0.35   # a training run's, under CUDA graphs
TRAIN_STEPS, TRAIN_LOG_EVERY = 60, 5                  # the train part's runs; tokens/s is logged every 5 steps
MFU_TARGET, WALL_TARGET_S = 0.40, 480
BATCH, SEQ = 16, 1024                                 # 16 x 1024 tokens a step, as the bench
WARMUP, TIMED, ROUND = 5, 20, 5                       # steps per arm: warm-up, timed, timed per round
RESUME_STEPS, RESUME_CKPT, RESUME_KILL_AFTER = 200, 100, 120
KERNEL_WARPS = (2, 4, 8, 16)                          # the kernels part times each op at each,
KERNEL_TILE_FEATURES = (64, 128)                      # a tiled op at each warps and each of these features a tile
# |loss difference| at a logged step: bf16 noise. Two identical d_v=4 runs on one H100 (2026-11-26) drifted up to 0.045
# nats apart by step 60 (reductions whose order varies: the embedding's backward, attention's): a broken resume (the
# schedule or the data restarted) is off by nats.
RESUME_TOLERANCE = 0.1


class Check:
    """The summary, rewritten (atomically) to out/summary.{json,md} each time a part adds to it."""

    def __init__(self, out: Path, machine: dict, parts: list[str]):
        self.out, self.started = out, time.perf_counter()
        self.summary = {"machine": machine, "parts": parts}

    def record(self, part: str, value) -> None:
        self.summary[part] = value
        self.summary["seconds"] = time.perf_counter() - self.started
        paths.write_atomic(self.out / "summary.json", json.dumps(self.summary, indent=1))
        paths.write_atomic(self.out / "summary.md", markdown(self.summary))


def step_part(check: Check, device, size: str, arms: list[str], compile_mode: str, compile_backend: str) -> dict:
    """The arms at `size` (the baseline first), compiled per block in `compile_mode` by `compile_backend`, timed
    alternating (ddl.bench.model_costs)."""
    import torch

    from .bench import model_costs
    from .model import SIZES, ModelConfig
    shape = {**SIZES[size], "vocab_size": ModelConfig.vocab_size}
    batch, seq = (BATCH, SEQ) if device.type == "cuda" else (2, 64)
    torch.backends.cuda.matmul.allow_tf32 = True
    set_up: dict = {}

    def on_arm(name: str, row: dict) -> None:
        set_up[name] = row
        check.record("step", {"set_up": set_up})

    rows = model_costs(device, shape, batch, seq, TIMED // ROUND, ROUND, True, arms, warmup=WARMUP,
                       on_arm=on_arm, compile_mode=compile_mode, compile_backend=compile_backend)
    return {"shape": {**shape, "batch": batch, "seq_len": seq}, "compile_mode": compile_mode,
            "compile_backend": compile_backend,
            "rows": rows, "targets": targets(rows)}


def speed_targets(rows: dict, bounds: dict, mfu_target: float) -> dict:
    """Each arm's step over the baseline's against its bound, and the baseline's MFU (rows without a ratio, a run that
    failed, are not judged)."""
    judged = {}
    for arm, bound in bounds.items():
        if "time_ratio" in rows.get(arm, {}):
            ratio = rows[arm]["time_ratio"]
            judged[f"{arm} step / baseline"] = {"value": ratio, "target": f"<= {bound:.2f}", "met": ratio <= bound}
    mfu = rows.get("baseline", {}).get("mfu")
    judged["baseline MFU"] = {"value": mfu, "target": f">= {mfu_target:.0%}",
                              "met": mfu is not None and mfu >= mfu_target}
    return judged


def targets(rows: dict) -> dict:
    """The issue's targets from the step part's rows."""
    judged = speed_targets(rows, TARGETS, MFU_TARGET)
    for arm, row in rows.items():
        error = row["gradient_error"]
        judged[f"{arm} compiled gradients"] = {"value": error, "target": "<= 0.05 (relative L2 to eager)",
                                               "met": error is not None and error <= 0.05}
        if row.get("loops_error") is not None:
            judged[f"{arm} Triton kernels' gradients"] = {"value": row["loops_error"],
                                                          "target": "<= 0.05 (relative L2 to the PyTorch-op loops)",
                                                          "met": row["loops_error"] <= 0.05}
    return judged


def train_command(home: Path, size: str, device: str, arm: str = "ddl_dv4", steps: int = RESUME_STEPS,
                  log_every: int = 10, compile_mode: str = "default") -> tuple[list[str], dict]:
    """`python -m ddl.train` for an arm of ddl.bench at `size` (the resume part's: DDL d_v=4), `steps` steps, a
    checkpoint every RESUME_CKPT, compiled per block in `compile_mode` on CUDA; and its environment (DDL_HOME=home)."""
    from .bench import ARMS
    tokens = (BATCH, SEQ) if device == "cuda" else (2, 64)
    on_cuda = device == "cuda"
    cmd = [sys.executable, "-m", "ddl.train", f"model.size={size}",
           *(f"model.{key}={value}" for key, value in ARMS[arm].items()),
           "data.source=embedded", f"train.steps={steps}", f"train.micro_batch={tokens[0]}",
           f"train.seq_len={tokens[1]}", f"train.batch_tokens={tokens[0] * tokens[1]}", "train.warmup_steps=20",
           f"train.log_every={log_every}", f"train.eval_every={steps}",
           f"train.eval_tokens={4 * tokens[0] * tokens[1]}",
           f"train.ckpt_every={RESUME_CKPT}", f"train.device={device}", "train.lr=1e-3",
           f"train.compile={str(on_cuda).lower()}", f"train.compile_mode={compile_mode if on_cuda else 'default'}"]
    return cmd, {**os.environ, "DDL_HOME": str(home), "PYTHONUNBUFFERED": "1"}


def trained_model(size: str, arm: str):
    """The model train_command's run of `arm` trains: ddl.bench's arm at `size`, the embedded corpus's vocabulary."""
    from .bench import ARMS
    from .data import DataConfig
    from .model import model_config
    return model_config(size, vocab_size=DataConfig(source="embedded").model_vocab_size(), **ARMS[arm])


def logged(home: Path, key: str) -> list[tuple[int, float]]:
    """(step, value of `key`) of every line of the run's metrics.jsonl that has it, in the order logged."""
    [metrics] = home.glob("runs/*/metrics.jsonl")
    rows = (json.loads(line) for line in metrics.read_text().splitlines())
    return [(row["step"], row[key]) for row in rows if key in row]


def train_part(check: Check, out: Path, size: str, device: str, arms: list[str]) -> dict:
    """Each arm as a training run under CUDA graphs (the module docstring says what is read), the baseline first;
    the rows are recorded after each run, so a check cut short keeps the runs it finished."""
    import torch

    from .bench import peak_flops
    from .costs import training_flops
    from .model import param_count
    peak = peak_flops(torch.device(device))
    rows: dict = {}
    for arm in arms:
        with tempfile.TemporaryDirectory() as scratch:
            cmd, env = train_command(Path(scratch), size, device, arm, TRAIN_STEPS, TRAIN_LOG_EVERY, "reduce-overhead")
            with open(out / f"train-{arm}.log", "w") as log:
                code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            if code:
                rows[arm] = {"error": f"the run exited {code} (train-{arm}.log)"}
                check.record("train", {"rows": rows})
                continue
            rates = [rate for _, rate in logged(Path(scratch), "train/tokens_per_s")[2:]]
            memory = [gib for _, gib in logged(Path(scratch), "train/gpu_peak_gib")]
        tokens_per_s = statistics.median(rates)
        params = param_count(trained_model(size, arm))
        rows[arm] = {"tokens_per_s": tokens_per_s, "intervals": len(rates), "params": params,
                     "mfu": training_flops(params, tokens_per_s) / peak if peak else None,
                     "peak_gib": max(memory) if memory else None}
        if "tokens_per_s" in rows.get(arms[0], {}):
            rows[arm]["time_ratio"] = rows[arms[0]]["tokens_per_s"] / tokens_per_s
        check.record("train", {"rows": rows})
    return {"compile_mode": "reduce-overhead" if device == "cuda" else "eager", "rows": rows,
            "targets": train_targets(rows)}


def train_targets(rows: dict) -> dict:
    """The issue's targets for a training run under CUDA graphs, from the train part's rows."""
    return speed_targets(rows, TRAIN_TARGETS, TRAIN_MFU_TARGET)


def logged_losses(home: Path) -> list[tuple[int, float]]:
    """(step, train/loss) of every line of the run's metrics.jsonl, in the order logged."""
    return logged(home, "train/loss")


def resume_part(out: Path, size: str, device: str) -> dict:
    """One run uninterrupted; the same run killed (SIGKILL) once it has logged RESUME_KILL_AFTER steps, then resumed.
    Judged: the resumed run continues from its last checkpoint to the end (every logged step present), no loss NaN,
    each logged loss within RESUME_TOLERANCE of the uninterrupted run's. (One at a time: kernels are timed at a
    first launch.)"""
    with tempfile.TemporaryDirectory() as scratch:
        whole, broken = Path(scratch, "whole"), Path(scratch, "broken")
        start = time.perf_counter()
        cmd, env = train_command(whole, size, device)
        with open(out / "resume-whole.log", "w") as log:
            code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        if code:
            return {"ok": False, "error": f"the uninterrupted run exited {code} (resume-whole.log)"}
        cmd, env = train_command(broken, size, device)
        with open(out / "resume-killed.log", "w") as log:
            process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                killed_at = wait_for_step(broken, process, RESUME_KILL_AFTER)
            except RuntimeError as error:
                return {"ok": False, "error": f"{error} (resume-killed.log)"}
            finally:
                process.send_signal(signal.SIGKILL)
                process.wait()
        with open(out / "resume-resumed.log", "w") as log:
            code = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
        if code:
            return {"ok": False, "error": f"the resumed run exited {code} (resume-resumed.log)"}
        return compare_curves(logged_losses(whole), logged_losses(broken), killed_at, time.perf_counter() - start)


def wait_for_step(home: Path, process: subprocess.Popen, step: int, timeout_s: float = 600) -> int:
    """Polls the run's metrics until it has logged `step` (or more): the last logged step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        points = logged_losses(home) if list(home.glob("runs/*/metrics.jsonl")) else []
        if points and points[-1][0] >= step:
            return points[-1][0]
        time.sleep(0.2)
    raise RuntimeError(f"the run to kill never logged step {step} (exit {process.poll()})")


def compare_curves(whole: list[tuple[int, float]], broken: list[tuple[int, float]], killed_at: int,
                   seconds: float) -> dict:
    """The killed-and-resumed curve against the uninterrupted one. A resumed run logs again the steps between
    its checkpoint and the kill: its curve is each step's last value."""
    resumed = dict(broken)
    expected = [step for step, _ in whole]
    differences = {step: abs(resumed[step] - loss) for step, loss in whole if step in resumed}
    continuous = sorted(resumed) == expected
    finite = all(math.isfinite(loss) for _, loss in broken)
    largest = max(differences.values()) if differences else math.inf
    return {"ok": continuous and finite and largest <= RESUME_TOLERANCE, "killed_after_step": killed_at,
            "resumed_from": (killed_at // RESUME_CKPT) * RESUME_CKPT, "steps_logged": len(resumed),
            "continuous": continuous, "finite": finite, "largest_loss_difference": largest,
            "final_loss": {"uninterrupted": whole[-1][1], "resumed": resumed.get(whole[-1][0])},
            "tolerance": RESUME_TOLERANCE, "seconds": seconds}


def tests_part(out: Path) -> dict:
    if not (CHECKOUT / "tests").is_dir():
        return {"skipped": "no tests/ beside the package: run from a checkout"}
    start = time.perf_counter()
    with open(out / "tests.log", "w") as log:
        code = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DEVICE_TESTS],
                              cwd=CHECKOUT, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "DDL_TEST_DEVICE": "cuda"}).returncode
    lines = (out / "tests.log").read_text().strip().splitlines()
    return {"exit_code": code, "seconds": time.perf_counter() - start, "summary": lines[-1] if lines else ""}


def profile_part(out: Path, device, size: str, arms: list[str]) -> dict:
    """Three compiled steps of each arm under torch.profiler: its kernels by total device time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .bench import Arm
    from .model import SIZES, ModelConfig
    shape = {**SIZES[size], "vocab_size": ModelConfig.vocab_size}
    batch, seq = (BATCH, SEQ) if device.type == "cuda" else (2, 64)
    files = {}
    for name in arms:
        arm = Arm(name, shape, batch, seq, device, True)
        arm.step(), arm.step()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=activities) as prof:
            for _ in range(3):
                arm.step()
        sort = "device_time_total" if device.type == "cuda" else "cpu_time_total"
        path = out / f"profile-{name}.txt"
        path.write_text(prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=70))
        files[name] = path.name
        del arm
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"files": files}


def kernels_part(device, size: str, compile_backend: str) -> dict:
    """Each Delta op's Triton kernel alone at `size` (d_v=4, bf16 state, 16 x 1024 tokens): median microseconds of 20
    calls (CUDA events), its bytes (inputs + outputs, as ddl.traffic counts them) and the rate, beside a copy's; and
    the fused norm beside the plain ops compiled by `compile_backend`."""
    import functools

    import torch

    from .model.fused import triton_loops
    shape, calls, norm_inputs = _kernel_calls(device, size)
    on_gpu = device.type == "cuda"
    timed = functools.partial(_timed, on_gpu=on_gpu)
    big = torch.empty(2 ** 28 if on_gpu else 2 ** 20, device=device, dtype=torch.bfloat16)   # 512 MiB on a GPU
    copy_rate = 2 * big.numel() * 2 / timed(torch.Tensor.clone, big) * 1e6
    rows = {}
    chosen = (triton_loops.ROW_WARPS, triton_loops.NORM_WARPS, triton_loops.TILE_WARPS, triton_loops.TILE_FEATURES)
    for name, args in calls.items():
        op_name = name.split()[0].replace("key_backward", "update_backward")
        op = getattr(torch.ops.ddl_triton, op_name)
        moved = _nbytes(args) + _nbytes(op(*args))
        by_launch = {}
        for warps, features in launch_settings(op_name in triton_loops.TILED_OPS, on_gpu):   # then as chosen
            triton_loops.ROW_WARPS = triton_loops.NORM_WARPS = triton_loops.TILE_WARPS = warps
            triton_loops.TILE_FEATURES = features or chosen[-1]
            by_launch[f"{warps}" if features is None else f"{warps}x{features}"] = timed(op, *args)
        triton_loops.ROW_WARPS, triton_loops.NORM_WARPS, triton_loops.TILE_WARPS, triton_loops.TILE_FEATURES = chosen
        us = timed(op, *args)
        by_launch["chosen"] = us
        rows[name] = {"us": us, "bytes": moved, "GB_per_s": moved / us / 1e3, "of_copy": moved / us * 1e6 / copy_rate,
                      "us_by_launch": by_launch}
    return {"shape": shape, "copy_GB_per_s": copy_rate / 1e9, "ops": rows,
            "norm_step_us": norm_step(device, *norm_inputs, timed, compile_backend),
            "compile_backend": compile_backend}


def launch_settings(tiled: bool, on_gpu: bool) -> list[tuple[int, int | None]]:
    """(warps, features a tile, None where the op has no tiled kernel) the kernels part times an op at: on a GPU each
    of KERNEL_WARPS, a tiled op's at each of KERNEL_TILE_FEATURES too; under the interpreter, which ignores warps, a
    tiled op's features at the chosen warps (the harness runs every tile size), an other op's none."""
    from .model.fused import triton_loops
    features = KERNEL_TILE_FEATURES if tiled else (None,)
    if not on_gpu:
        return [(triton_loops.TILE_WARPS, f) for f in features if f is not None]
    return [(warps, f) for warps in KERNEL_WARPS for f in features]


def _kernel_calls(device, size: str) -> tuple[dict, dict, tuple]:
    """(the shape, op name -> its arguments, the norm's (x, gain, W_c, W_x)) of kernels_part: random inputs of the
    Delta ops at `size` (a tiny shape on the CPU, where triton's interpreter runs them)."""
    import torch

    from .model import SIZES
    from .model.fused import triton_loops  # noqa: F401  (registers torch.ops.ddl_triton)
    d = SIZES[size]["d_model"]
    B, T, dv, L = (BATCH, SEQ, 4, 4) if device.type == "cuda" else (2, 8, 4, 4)
    ops = torch.ops.ddl_triton
    bf16, fp32 = torch.bfloat16, torch.float32

    def randn(*shape, dtype=fp32):
        return torch.randn(*shape, device=device, dtype=dtype)

    X, G = randn(B, T, dv, d, dtype=bf16), randn(B, T, dv, d, dtype=bf16)
    h, h_a, beta, v, w = randn(B, T, d, dtype=bf16), randn(B, T, d, dtype=bf16), randn(B, T, 1).sigmoid(), \
        randn(B, T, dv), randn(B, T, dv)
    A, x, g = randn(dv, d, L), randn(B, T, d), randn(B, T, d)
    gain, W_c, W_x, b_c, b_x = randn(d), randn(1, d), randn(dv, d), randn(1), randn(dv)
    w_k, rho, q = ops.key_forward(X, h, beta, v, 1e-10)
    _, w_m, rho_m, q_m, _ = ops.write_forward(X, h_a, w_k, h, beta, v, A, 1e-10, True)
    gates = (b_c, b_x, 2.0, 4.0)                                  # beta = 2 sigmoid(.), v = 4 sigmoid(.)
    _, y_c, y_x, rho_n = ops.norm_forward(x, gain, W_c, W_x, *gates, 1e-5, bf16)
    calls = {"key_forward": (X, h, beta, v, 1e-10), "key_backward (update_backward)": (G, w, X, h, beta, v, rho, q),
             "write_forward": (X, h_a, w_k, h, beta, v, A, 1e-10, True),
             "write_backward": (G, w, g, X, h_a, w_k, h, beta, v, rho_m, q_m, A),
             "update_forward (d_v=1)": (X[:, :, :1].contiguous(), h, beta, v[..., :1], 1e-10),
             "norm_forward": (x, gain, W_c, W_x, *gates, 1e-5, bf16),
             "norm_backward": (h, g[..., :1], g[..., :dv], x, gain, W_c, W_x, *gates, rho_n, y_c, y_x),
             "rank_one_forward": (w, h, A), "rank_one_backward": (g, w, h, A)}
    return {"B": B, "T": T, "dv": dv, "d": d, "L": L}, calls, (x, gain, W_c, W_x, *gates)


def _timed(fn, *args, on_gpu: bool) -> float:
    """Median microseconds of fn(*args): CUDA events on a GPU; on the CPU (the interpreter, where the figure only
    shows the harness works) the host clock, one call after one untimed."""
    import torch
    for _ in range(3 if on_gpu else 1):
        fn(*args)
    times = []
    for _ in range(20 if on_gpu else 1):
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        else:
            begin = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - begin) * 1e6)
    return sorted(times)[len(times) // 2]


def _nbytes(tree) -> int:
    """The bytes of the tensors of a nested tuple of arguments or results."""
    import torch

    from .model.torch_private import tree_leaves
    return sum(t.numel() * t.element_size() for t in tree_leaves(tree) if isinstance(t, torch.Tensor))


def norm_step(device, x, gain, W_c, W_x, b_c, b_x, s_c, s_x, timed, compile_backend: str) -> dict:
    """A sublayer's norm and gates forward and backward (bf16 autocast): the fused op against the plain ops compiled
    by `compile_backend` (inductor, unless told), microseconds."""
    import torch

    from .model.fused import eager, norm_projections

    def step(fn):
        x_, gain_, W_c_, W_x_, b_c_, b_x_ = (t.detach().requires_grad_() for t in (x, gain, W_c, W_x, b_c, b_x))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            c, y_c, y_x = fn(x_, gain_, W_c_, W_x_, 1e-5, b_c_, b_x_, s_c, s_x)
        (c.float().sum() + y_c.sum() + y_x.sum()).backward()

    compiled = torch.compile(eager.norm_projections, fullgraph=True, backend=compile_backend)
    return {"fused": timed(step, norm_projections), "plain_compiled": timed(step, compiled)}


def markdown(summary: dict) -> str:
    machine = summary["machine"]
    lines = [f"# gpu-check ({machine['device']}, torch {machine['torch']}, triton {machine['triton']})", "",
             f"Parts: {', '.join(summary['parts'])}; {summary.get('seconds', 0):.0f} s so far.", ""]
    lines += _train_lines(summary.get("train", {}), machine.get("size", "small"))
    step = summary.get("step", {})
    if "rows" in step:
        graphs = ", CUDA graphs (reduce-overhead)" if step.get("compile_mode") == "reduce-overhead" else ""
        if step.get("compile_backend", "inductor") != "inductor":
            graphs += f", by {step['compile_backend']} (not inductor: no MFU to compare)"
        lines += [f"## Step: {machine.get('size', 'small')}, bf16 on CUDA, compiled per block{graphs}", "",
                  "| arm | step (ms) | host launches (ms) | x baseline | tokens/s | MFU | memory (MiB) "
                  "| first step (s) | grad error |", "|---|---|---|---|---|---|---|---|---|"]
        for arm, row in step["rows"].items():
            mfu = "-" if row["mfu"] is None else f"{row['mfu']:.1%}"
            lines.append(f"| {arm} | {row['step_ms']:.1f} | {row['host_ms']:.1f} | {row['time_ratio']:.3f} "
                         f"| {row['tokens_per_s']:,.0f} "
                         f"| {mfu} | {row['memory_mib']:,.0f} | {row['first_step_s']:.1f} "
                         f"| {row['gradient_error']:.2e} |")
        lines += _target_lines(step["targets"], "{:.3g}") + [""]
    elif step:
        lines += [f"## Step: set up so far: {json.dumps(step.get('set_up', step))}", ""]
    if "resume" in summary:
        lines += ["## Resume after SIGKILL (DDL d_v=4)", "", "```", json.dumps(summary["resume"], indent=1), "```", ""]
    if "kernels" in summary:
        kernels = summary["kernels"]
        lines += [f"## Kernels alone ({kernels['shape']}, bf16 state; a copy moves "
                  f"{kernels['copy_GB_per_s']:.0f} GB/s)", "", "| op | us | MB moved | GB/s | of a copy |",
                  "|---|---|---|---|---|"]
        lines += [f"| {name} | {row['us']:.1f} | {row['bytes'] / 1e6:.0f} | {row['GB_per_s']:.0f} "
                  f"| {row['of_copy']:.0%} |" for name, row in kernels["ops"].items()]
        lines += ["", "Microseconds by warps (a tiled op's: warps x features a tile): " + "; ".join(
            f"{name} " + ", ".join(f"{launch}: {us:.0f}" for launch, us in row["us_by_launch"].items())
            for name, row in kernels["ops"].items()),
            "", f"A sublayer's norm and gates, forward and backward: {kernels['norm_step_us']['fused']:.0f} us fused, "
                f"{kernels['norm_step_us']['plain_compiled']:.0f} us as plain ops compiled by "
                f"{kernels.get('compile_backend', 'inductor')}."]
        lines.append("")
    for part in ("tests", "profile"):
        if part in summary:
            lines += [f"## {part}", "", "```", json.dumps(summary[part], indent=1), "```", ""]
    if "seconds" in summary and summary.get("done"):
        verdict = "met" if summary["seconds"] <= WALL_TARGET_S else "MISSED"
        lines.append(f"The check took {summary['seconds']:.0f} s (target <= {WALL_TARGET_S} s, install apart: "
                     f"{verdict}).")
    return "\n".join(lines) + "\n"


def _train_lines(train: dict, size: str) -> list[str]:
    """The train part's table (and its targets, once every run is in)."""
    if "rows" not in train:
        return []
    graphs = "compiled per block, CUDA graphs" if train.get("compile_mode", "reduce-overhead") != "eager" else "eager"
    lines = [f"## Training runs: {size}, {graphs}, {TRAIN_STEPS} steps each", "",
             "| arm | tokens/s | x baseline | MFU | peak GiB |", "|---|---|---|---|---|"]
    for arm, row in train["rows"].items():
        if "error" in row:
            lines.append(f"| {arm} | {row['error']} | | | |")
            continue
        cells = [f"{row['tokens_per_s']:,.0f}", _figure(row.get("time_ratio"), "{:.3f}"),
                 _figure(row["mfu"], "{:.1%}"), _figure(row["peak_gib"], "{:.1f}")]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    if "targets" in train:
        lines += _target_lines(train["targets"], "{:.3f}")
    return lines + [""]


def _target_lines(judged: dict, form: str) -> list[str]:
    """A part's targets as a table: each value in `form` (MFU as a percentage), its bound, met or MISSED."""
    lines = ["", "| target | value | bound | |", "|---|---|---|---|"]
    for name, t in judged.items():
        value = _figure(t["value"], "{:.1%}" if "MFU" in name else form)
        lines.append(f"| {name} | {value} | {t['target']} | {'met' if t['met'] else 'MISSED'} |")
    return lines


def _figure(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)


def _parser() -> argparse.ArgumentParser:
    from .model import SIZES
    parser = OneLineParser(prog="python -m ddl.gpu_check", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(DEFAULT_PARTS), help=f"of {', '.join(PARTS)}")
    parser.add_argument("--out", type=printable_path, default=None,
                        help="where the reports go (default reports/gpu-check)")
    parser.add_argument("--size", choices=tuple(SIZES), default=None,
                        help="model size (default: small on CUDA, micro on CPU)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--arms", default=",".join(ARMS),
                        help="the step and profile parts' arms, the baseline first (ddl.bench's arms)")
    parser.add_argument("--compile-mode", choices=("default", "reduce-overhead"), default="default",
                        help="the step part's torch.compile mode (reduce-overhead: CUDA graphs)")
    parser.add_argument("--compile-backend", choices=("inductor", "aot_eager", "eager"), default="inductor",
                        help="the step part's and the kernels part's torch.compile backend (aot_eager: dynamo and "
                             "AOTAutograd without inductor's code generation, to tell a failure of one from the other)")
    parser.add_argument("--record", action="store_true", help="the step part's MFU and step ratios (and the kernels "
                        "part's copy rate) become the figures the dry run prices GPU jobs from "
                        "(ddl/recorded_costs.json)")
    return parser


def _checked_arguments(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """The arguments, each bad one argparse's one error: an unknown part, an unknown arm, arms not baseline first."""
    args = parser.parse_args(argv)
    parts, arms = args.parts.split(","), args.arms.split(",")
    if error := unknown_names("--parts", parts, PARTS):
        parser.error(error)
    from .bench import arms_error
    if error := arms_error(arms):
        parser.error(error)
    if arms[0] != "baseline":
        parser.error(f"--arms: {args.arms!r} starts with {arms[0]!r}; allowed: baseline first (the ratios' reference)")
    return args


def graphs_peak_over_saved(rows: dict, size: str) -> float:
    """The train part's peak memory under CUDA graphs over the activations a step saves (its parameters' state
    apart), the largest over the arms: the ratio the dry run's GiB/GPU takes for jobs under graphs."""
    from .costs import BYTES_PER_PARAM, saved_bytes_per_token
    return max((row["peak_gib"] * 2 ** 30 - BYTES_PER_PARAM * row["params"])
               / (saved_bytes_per_token(trained_model(size, arm)) * BATCH * SEQ) for arm, row in rows.items())


def _record(summary: dict, card: str) -> None:
    """The measured figures the dry run prices from (ddl.costs.record): the baseline MFU and arms' step ratios of the
    train part where every run finished, else the step part's; the kernels part's copy rate."""
    from .bench import record_step_ratios
    from .costs import record
    from .model import SIZES, ModelConfig
    if "step" in summary:
        step = summary["step"]
        record_step_ratios("gpu", {"card": card, "baseline_mfu": step["rows"]["baseline"]["mfu"]}, step["rows"],
                           {k: v for k, v in step["shape"].items() if k not in ("batch", "seq_len")})
    train = summary.get("train", {}).get("rows", {})
    if train and all("time_ratio" in row for row in train.values()):   # a training run's figures over the harness's
        size = summary["machine"]["size"]
        record_step_ratios("gpu", {"card": card, "baseline_mfu": train["baseline"]["mfu"],
                                   "graphs_peak_over_saved": graphs_peak_over_saved(train, size)}, train,
                           {**SIZES[size], "vocab_size": ModelConfig.vocab_size})
    if "kernels" in summary:
        record("gpu", {"copy_bytes_per_s": summary["kernels"]["copy_GB_per_s"] * 1e9})


def main(argv: list[str] | None = None) -> int:
    args = _checked_arguments(_parser(), argv)
    parts, arms = args.parts.split(","), args.arms.split(",")
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu-check: no CUDA GPU on this machine (torch {torch.__version__}); nothing to check.")
        return 0
    try:
        import triton
        triton_version = triton.__version__
    except ImportError as error:
        triton_version = f"not importable ({error})"
    device = torch.device(args.device)
    size = args.size or ("small" if args.device == "cuda" else "micro")
    out = args.out or paths.reports_dir() / "gpu-check"
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or platform.machine()
    check = Check(out, {"device": name, "torch": torch.__version__, "triton": triton_version,
                        "python": platform.python_version(), "size": size}, parts)
    run_part = {"train": lambda: train_part(check, out, size, args.device, arms),
                "step": lambda: step_part(check, device, size, arms, args.compile_mode, args.compile_backend),
                "resume": lambda: resume_part(out, size, args.device), "tests": lambda: tests_part(out),
                "kernels": lambda: kernels_part(device, size, args.compile_backend),
                "profile": lambda: profile_part(out, device, size, arms)}
    for part in parts:
        check.record(part, run_part[part]())
    if args.record and args.device == "cuda":
        _record(check.summary, name)
    check.summary["done"] = True
    check.record("done", True)
    print((out / "summary.md").read_text())
    judged = [t["met"] for part in ("train", "step") for t in check.summary.get(part, {}).get("targets", {}).values()]
    failed = (not all(judged) or any("error" in row for row in check.summary.get("train", {}).get("rows", {}).values())
              or not check.summary.get("resume", {"ok": True})["ok"] or check.summary.get("tests", {}).get("exit_code"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
