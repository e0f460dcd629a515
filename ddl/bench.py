"""`make bench`: what the Delta residual costs next to the baseline, and what the orchestrator costs.

Every figure is a ratio to the baseline measured in the same process, the arms alternating
round by round to cancel drift (thermal, other load). Writes reports/bench/bench.{json,md}.

    python -m ddl.bench [--rounds 7] [--steps 3] [--quick] [--arms baseline,ddl_dv4,...] [--orchestrator] [--out DIR]
    python -m ddl.bench --traffic [--arms ...] [--size small] [--out DIR]
    python -m ddl.bench --dispatch [--rounds 25] [--steps 3] [--out DIR]

Memory on CPU is the activation memory autograd holds for backward (unique storages saved,
parameters excluded: what grows with d_v); on CUDA, torch.cuda.max_memory_allocated over a step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from . import paths
from .model import GPT, SIZES, ModelConfig
from .costs import BF16_PEAK_FLOPS, RECORDED_COSTS, training_flops
from .model.fused import loops_name, native
from .train.distributed import keep_freed_memory
from .validation import OneLineParser, at_least_one, printable_path, unknown_names

DDL_ARMS = {"ddl_dv1": dict(residual="ddl", dv=1), "ddl_dv4": dict(residual="ddl", dv=4),
            "ddl_dv4_cc": dict(residual="ddl", dv=4, conv="cc"), "ddl_dv4_ec": dict(residual="ddl", dv=4, conv="ec")}
# Each DDL arm twice: the hand-fused autograd kernels (default) and the same ops through torch.compile;
# DeltaProduct (n_h = 2 Delta updates a sublayer) with the fused kernels.
ARMS = {"baseline": dict(residual="baseline"), **DDL_ARMS,
        **{f"{name}_compiled": dict(arm, kernels="compiled") for name, arm in DDL_ARMS.items()},
        "ddl_dv1_nh2": dict(residual="ddl", dv=1, n_h=2), "ddl_dv4_nh2": dict(residual="ddl", dv=4, n_h=2)}
CPU_SHAPE = dict(n_layer=4, n_head=4, d_model=256, max_seq_len=256, vocab_size=256)
MODEL_ROUNDS = 7                                      # the model arms' rounds (--rounds)
TARGETS = {"ddl_dv1": 1.05, "ddl_dv4": 1.25, "ddl_dv4_nh2": 1.25}
MEMORY_TARGET = 1.5
# Start-up, in seconds on a quiet 2-core machine: `ddl-run --help`, the dry run of the paper's small sweep, and
# the plan of a 1,000-job seed study (its dry run).
HELP_GOAL_S, DRY_RUN_GOAL_S, PLAN_GOAL_S = 0.5, 1.5, 15
DRY_RUN = ["-m", "+sweep=paper_small", "hydra/launcher=slurm", "--dry-run"]
PLAN_1000 = ["-m", "+variant=baseline,ddl_dv1,ddl_dv4,ddl_dv4_ec", "seed=range(0,250)", "model=micro", "--dry-run"]


def arms_error(names: list[str]) -> str | None:
    """The one-line refusal of an --arms list that names an arm not in ARMS, or None."""
    return unknown_names("--arms", names, ARMS)


def relative_distance(grads: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """|grads - reference| / |reference| over all of them (L2)."""
    diff = sum(float((a - b).square().sum()) for a, b in zip(grads, reference, strict=True))
    return (diff / sum(float(b.square().sum()) for b in reference)) ** 0.5


HOST_PHASES = ("forward", "backward", "optimizer")   # a step's host time, in Arm.step's order


class Arm:
    """One model of the bench: built from ARMS[name] at `shape`, with AdamW, on one fixed batch; `compile_` compiles
    it per block (GPT.compile_blocks, in torch.compile's `compile_mode`, by `compile_backend`). On CUDA it runs
    under bf16 autocast and its steps are timed with CUDA events, beside the host's time to launch them
    (host_times: a step whose launches take as long as the GPU's work is host-bound)."""

    def __init__(self, name: str, shape: dict, batch: int, seq: int, device: torch.device, compile_: bool,
                 compile_mode: str = "default", compile_backend: str = "inductor"):
        torch.manual_seed(0)
        self.name = name
        self.model = GPT(ModelConfig(**shape, **ARMS[name])).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.x = torch.randint(0, shape["vocab_size"], (batch, seq), device=device)
        self.device = device
        self.autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
        self.compiled, self.compile_mode, self.compile_backend = compile_, compile_mode, compile_backend
        self.gradient_error: float | None = None
        self.loops_error: float | None = None
        if compile_:
            self.gradient_error = self.compile()
        self.times: list[float] = []
        self.host_times: list[float] = []
        self.host_phases: list[tuple[float, float, float]] = []
        self.memory = 0

    def gradients(self) -> list[torch.Tensor]:
        with self.autocast:
            _, loss = self.model(self.x, self.x)
        loss.backward()
        grads = [p.grad.float().clone() for p in self.model.parameters()]
        self.model.zero_grad(set_to_none=True)
        return grads

    def compile(self) -> float:
        """Compiles the model per block: the relative L2 distance of its gradients on the bench's batch to the
        eager model's (bf16 rounding: ~1e-3-1e-2; wrong gradients: ~1). Before that, on CUDA, loops_error: the eager
        model's with its Triton kernels against the same with the PyTorch-op loops (DDL_NATIVE_KERNELS=0)."""
        eager = self.gradients()
        if self.device.type == "cuda" and self.model.cfg.residual == "ddl":
            with native.eager_loops():
                self.loops_error = relative_distance(self.gradients(), eager)
        self.model.compile_blocks(self.compile_backend, mode=self.compile_mode)
        return relative_distance(self.gradients(), eager)

    def step(self) -> float:
        """One training step's seconds: CUDA events around it on a GPU (no host sync inside), the host clock on CPU;
        the host's seconds to launch it go to host_times, split into forward, backward and optimizer in host_phases."""
        cuda = self.device.type == "cuda"
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        begin = time.perf_counter()
        torch.compiler.cudagraph_mark_step_begin()     # CUDA graphs: the last step's outputs are consumed
        with self.autocast:
            _, loss = self.model(self.x, self.x)
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        end_host = time.perf_counter()
        self.host_times.append(end_host - begin)
        self.host_phases.append((forward - begin, backward - forward, end_host - backward))
        if not cuda:
            return self.host_times[-1]
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def measure_memory(self) -> int:
        if self.device.type == "cuda":                # what a step adds on top of weights and optimizer state
            torch.cuda.reset_peak_memory_stats()
            resident = torch.cuda.memory_allocated()
            self.step()
            return torch.cuda.max_memory_allocated() - resident
        storages: dict[int, int] = {}                 # a tensor saved by two ops is held once

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        parameters = {p.untyped_storage().data_ptr() for p in self.model.parameters()}
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _, loss = self.model(self.x, self.x)
        loss.backward()
        self.model.zero_grad(set_to_none=True)
        return sum(n for ptr, n in storages.items() if ptr not in parameters)


# The host's cost of a step: the paper small's depth with tensors too small for arithmetic to matter, one thread, so a
# step's time is its dispatch (Python, autograd, the op calls); the ratios to the baseline's, eager and compiled.
DISPATCH_SHAPE = dict(n_layer=12, n_head=2, d_model=32, max_seq_len=16, vocab_size=256)
DISPATCH_BATCH, DISPATCH_SEQ = 1, 16
DISPATCH_ROUNDS = 25
DISPATCH_TARGETS = {"eager": {"ddl_dv1": 1.3, "ddl_dv4": 1.5}, "compiled": {"ddl_dv1": 1.2, "ddl_dv4": 1.3}}


def dispatch_costs(rounds: int, steps: int, forms: tuple[str, ...] = ("eager", "compiled")) -> dict:
    """model_costs of the baseline, d_v=1 and d_v=4 at DISPATCH_SHAPE on one thread, eager and compiled per block."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return {form: model_costs(torch.device("cpu"), DISPATCH_SHAPE, DISPATCH_BATCH, DISPATCH_SEQ, rounds, steps,
                                  form == "compiled", ["baseline", *DISPATCH_TARGETS[form]])
                for form in forms}
    finally:
        torch.set_num_threads(threads)


def dispatch_markdown(result: dict) -> str:
    lines = [f"# ddl bench: a step's dispatch ({result['machine']}, torch {torch.__version__}, 1 thread)", "",
             f"{DISPATCH_SHAPE['n_layer']} layers, d={DISPATCH_SHAPE['d_model']}, {DISPATCH_BATCH} x {DISPATCH_SEQ} "
             "tokens: arithmetic is negligible, a step's time is its op calls.", "",
             "| form | arm | step (ms) | x baseline | target | forward | backward | optimizer (ms, x baseline's) |",
             "|---|---|---|---|---|---|---|---|"]
    for form, rows in result["dispatch"].items():
        base = rows["baseline"]["host_phases_ms"]
        for name, row in rows.items():
            target = DISPATCH_TARGETS[form].get(name)
            verdict = "" if target is None else f"<= {target} {'ok' if row['time_ratio'] <= target else 'MISSED'}"
            phases = " | ".join(f"{ms:.2f} ({ms / base[phase]:.2f})" for phase, ms in row["host_phases_ms"].items())
            lines.append(f"| {form} | {name} | {row['step_ms']:.2f} | {row['time_ratio']:.3f} | {verdict} | {phases} |")
    return "\n".join(lines + [""])


def model_costs(device: torch.device, shape: dict, batch: int, seq: int, rounds: int, steps: int,
                compile_: bool, names: list[str], warmup: int = 2, on_arm=None,
                compile_mode: str = "default", compile_backend: str = "inductor") -> dict:
    """The arms `names` (the baseline first) alternating round by round: step time, the host's time to launch a
    step, memory, MFU; compiled (in `compile_mode`, by `compile_backend`), also the seconds to the first step and
    the gradients' distance to eager. on_arm(name, row) after each arm's set-up."""
    arms, first_step_s = [], {}
    for name in names:
        start = time.perf_counter()
        arm = Arm(name, shape, batch, seq, device, compile_, compile_mode, compile_backend)
        arm.step()                                     # compiled: the compile happens here
        first_step_s[name] = time.perf_counter() - start
        for _ in range(warmup - 1):
            arm.step()
        arm.memory = arm.measure_memory()
        arms.append(arm)
        if on_arm:
            on_arm(name, {"first_step_s": first_step_s[name], "gradient_error": arm.gradient_error,
                          "loops_error": arm.loops_error})
    for r in range(rounds):                            # alternate, reversing the order every round
        for arm in (arms if r % 2 == 0 else arms[::-1]):
            arm.times += [arm.step() for _ in range(steps)]
    base = arms[0]
    base_time = statistics.median(base.times)
    tokens, peak = batch * seq, peak_flops(device)
    rows = {}
    for arm in arms:
        median = statistics.median(arm.times)
        params = arm.model.num_params()
        host = statistics.median(arm.host_times[-len(arm.times):])
        phases = [1e3 * statistics.median(p) for p in zip(*arm.host_phases[-len(arm.times):], strict=True)]
        rows[arm.name] = {"step_ms": 1e3 * median, "host_ms": 1e3 * host, "time_ratio": median / base_time,
                          "host_phases_ms": dict(zip(HOST_PHASES, phases, strict=True)),
                          "tokens_per_s": tokens / median,
                          "memory_mib": arm.memory / 2 ** 20, "memory_ratio": arm.memory / base.memory,
                          "params": params, "mfu": training_flops(params, tokens) / median / peak if peak else None,
                          "first_step_s": first_step_s[arm.name], "gradient_error": arm.gradient_error,
                          "loops_error": arm.loops_error}
    return rows


TRAFFIC_BATCH, TRAFFIC_SEQ = 16, 1024
# The GPU step's targets: extra non-matmul bytes over the baseline's (GB), and saved activations (x the baseline's).
TRAFFIC_TARGETS = {"ddl_dv1": 2.0, "ddl_dv4": 8.0}
SAVED_TARGET = 1.3


def traffic_costs(names: list[str], size: str) -> dict:
    """ddl.traffic.step_traffic of each arm at `size`, TRAFFIC_BATCH x TRAFFIC_SEQ tokens, beside the baseline's."""
    from .traffic import step_traffic

    shape = {**SIZES[size], "vocab_size": ModelConfig.vocab_size}
    arms = {name: step_traffic(ModelConfig(**shape, **ARMS[name]), TRAFFIC_BATCH, TRAFFIC_SEQ) for name in names}
    base = arms["baseline"]
    for row in arms.values():
        row["extra_non_matmul_bytes"] = row["non_matmul_bytes"] - base["non_matmul_bytes"]
        row["saved_ratio"] = row["saved_bytes"] / base["saved_bytes"]
    return {"size": size, "batch": TRAFFIC_BATCH, "seq_len": TRAFFIC_SEQ, "torch": torch.__version__,
            "path": "CUDA (Triton kernels, bf16 autocast, model.state_dtype=auto: bf16), counted on fake tensors",
            "arms": arms}


def traffic_markdown(result: dict) -> str:
    lines = [f"# ddl bench: one training step's memory traffic ({result['size']}, {result['batch']} x "
             f"{result['seq_len']} tokens, {result['path']})", "",
             "| arm | non-matmul GB | over the baseline (target) | saved GB | x baseline (target) | kernel calls |",
             "|---|---|---|---|---|---|"]
    for name, row in result["arms"].items():
        extra = row["extra_non_matmul_bytes"] / 1e9
        bound = TRAFFIC_TARGETS.get(name)
        judged = f"{extra:+.2f}" + ("" if bound is None else f" (<= {bound:g}: {'ok' if extra <= bound else 'MISSED'})")
        saved = f"{row['saved_ratio']:.2f}"
        if name == "ddl_dv4":
            saved += f" (<= {SAVED_TARGET}: {'ok' if row['saved_ratio'] <= SAVED_TARGET else 'MISSED'})"
        lines.append(f"| {name} | {row['non_matmul_bytes'] / 1e9:.2f} | {judged} | {row['saved_bytes'] / 1e9:.2f} "
                     f"| {saved} | {row['kernel_calls']:,} |")
    return "\n".join(lines) + "\n"


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak, for MFU, if known."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in BF16_PEAK_FLOPS.items() if key in name), None)


def cpu_name() -> str:
    """The CPU model as Linux reports it (with its family, which tells generations apart), else platform's word."""
    with contextlib.suppress(OSError):
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
        info = {key.strip(): value.strip() for key, value in info.items()}
        if "model name" in info:
            return f"{info['model name']} (family {info.get('cpu family', '?')}, {os.cpu_count()} CPUs)"
    return platform.processor() or platform.machine()


def _timed(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall, CPU: user + sys) seconds of the command."""
    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime

    start, cpu_start = time.perf_counter(), cpu()
    subprocess.run(cmd, env=env, capture_output=True, check=True)
    return time.perf_counter() - start, cpu() - cpu_start


def start_up_costs(ddl_run: str, env: dict, runs: int) -> dict:
    """`ddl-run --help`, the dry run of paper_small with the SLURM launcher and the 1,000-job plan (PLAN_1000),
    alternating, `runs` times each: the median and every time of each (the plan's CPU times too), and the
    1-minute load average before and after (the machine may be shared). One dry run first, untimed: the
    first on a machine indexes lm-eval's task names into the user's cache. The dry runs ask the store the
    environment names (MLFLOW_TRACKING_URI, else DDL_HOME's SQLite)."""
    _timed([ddl_run, *DRY_RUN], env)
    load = [os.getloadavg()[0]]
    commands = {"help": ["--help"], "dry_run": DRY_RUN, "plan_1000": PLAN_1000}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, args in commands.items():
            times[name].append(_timed([ddl_run, *args], env))
    load.append(os.getloadavg()[0])
    walls = {f"{name}_runs_s": [wall for wall, _ in done] for name, done in times.items()}
    return {"help_s": statistics.median(walls["help_runs_s"]),
            "dry_run_paper_small_s": statistics.median(walls["dry_run_runs_s"]),
            "plan_1000_s": statistics.median(walls["plan_1000_runs_s"]), **walls,
            "plan_1000_cpu_runs_s": [cpu for _, cpu in times["plan_1000"]], "load_average": load,
            "store": env.get("MLFLOW_TRACKING_URI") or "DDL_HOME's SQLite"}


def warm_start_costs(ddl_run: str, env: dict, jobs: int, plan_runs: int) -> dict:
    """A local sweep of `jobs` micro jobs of 10 steps, 2 at a time, with its jobs forked from a warm server and
    started cold (hydra.launcher.warm_start), each in a fresh DDL_HOME: (wall, CPU) seconds of each. Then the
    1,000-job plan, `plan_runs` times, in the warm sweep's home, whose store holds its runs: the plan asks the
    store about every job (start_up_costs times it in an empty home)."""
    out = {"sweep_jobs": jobs}
    for warm in ("true", "false"):
        with tempfile.TemporaryDirectory() as home:
            home_env = {**env, "DDL_HOME": home, "DDL_WARM_SOCKET": ""}
            out[f"sweep_warm_{warm}_s"] = _timed(
                [ddl_run, "-m", "model=micro", "train=smoke", "train.steps=10", f"seed=range(0,{jobs})",
                 "hydra.launcher.max_parallel=2", f"hydra.launcher.warm_start={warm}"], home_env)
            if warm == "true":
                out["plan_1000_stored_runs_s"] = [_timed([ddl_run, *PLAN_1000], home_env)[0] for _ in range(plan_runs)]
    return out


def orchestrator_costs(runs: int, sweep_jobs: int) -> dict:
    """Start-up (`start_up_costs`), a sweep's jobs warm and cold (`warm_start_costs`) and launching the smoke
    sweep to its first training step."""
    ddl_run = str(Path(sys.executable).parent / "ddl-run")
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "DDL_HOME": home}
        out = start_up_costs(ddl_run, env, runs)
        out.update(warm_start_costs(ddl_run, env, sweep_jobs, runs))
        start = time.perf_counter()
        process = subprocess.Popen([ddl_run, "-m", "+sweep=smoke", "train.log_every=1", "train.steps=200"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            while time.perf_counter() - start < 300:
                steps = [json.loads(p.read_text()).get("step", 0) for p in Path(home).glob("runs/*/status.json")
                         if p.stat().st_size]
                if any(s >= 1 for s in steps):
                    out["smoke_sweep_to_first_step_s"] = time.perf_counter() - start
                    break
                time.sleep(0.05)
        finally:
            _stop_group(process)
    return out


def _stop_group(process: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM a session leader's whole group and wait until none of it is left (SIGKILL after
    timeout_s): the sweep's jobs checkpoint on SIGTERM, and must be done writing before their
    DDL_HOME is removed."""
    os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(ProcessLookupError):
        while time.monotonic() < deadline:
            process.poll()                             # reap the leader: a zombie still counts in its group
            os.killpg(process.pid, 0)                  # raises once the group is empty
            time.sleep(0.05)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def logging_cost(step_s: float, calls: int) -> dict:
    """MLflowLogger.log_metrics with a DDL step's metrics every step, `calls` steps, against a step's time.

    Two figures: how long the training loop waits in the call (it hands batches to MLflow's
    logging thread), with 20 ms of other work between calls, far less than a step, so the thread
    has less slack than in training; and all the work per call, the writes included, measured
    back to back: what logging costs a machine with no core to spare.
    """
    with tempfile.TemporaryDirectory() as home, _environ(DDL_HOME=home, MLFLOW_TRACKING_URI=None):
        metrics = {f"beta/L{i:02d}.{p}/{s}": 1.0 for i in range(4) for p in ("attn", "mlp")
                   for s in ("mean", "std", "frac_gt1")} | {"train/loss": 1.0, "train/lr": 1.0}
        waited, _ = _log_steps("bench-wait", metrics, calls, pause_s=0.02)
        in_calls, in_close = _log_steps("bench-work", metrics, calls, pause_s=0.0)
        work = (in_calls + in_close) / calls
    return {"loop_wait_ms": 1e3 * waited / calls, "work_ms": 1e3 * work, "metrics_per_call": len(metrics),
            "fraction_of_step": waited / calls / step_s, "work_fraction_of_step": work / step_s}


@contextlib.contextmanager
def _environ(**values: str | None):
    """Set (a value) or unset (None) environment variables for the block, then restore them."""
    def apply(settings: dict) -> None:
        for key, value in settings.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    before = {key: os.environ.get(key) for key in values}
    apply(values)
    try:
        yield
    finally:
        apply(before)


def _log_steps(signature: str, metrics: dict, calls: int, pause_s: float) -> tuple[float, float]:
    """Seconds spent in MLflowLogger.log_metrics over `calls` steps `pause_s` apart, and in close(), into a
    run of its own (a second run of one signature would replace the first, its curves copied)."""
    from . import paths
    from .track import logger as track_logger
    from .track import runs
    logger = track_logger.MLflowLogger(runs.open_run("bench", signature, signature, {}, {},
                                                     paths.runs_dir() / signature))
    in_calls = 0.0
    for step in range(calls):
        if pause_s:
            time.sleep(pause_s)
        start = time.perf_counter()
        logger.log_metrics(metrics, step)
        in_calls += time.perf_counter() - start
    start = time.perf_counter()
    logger.close()
    return in_calls, time.perf_counter() - start


def time_target(name: str, rows: dict) -> float | None:
    """The step-time bound for an arm: d_v=1 <= 1.05x, d_v=4 <= 1.25x, CC/EC within 1.05x of d_v=4,
    DeltaProduct (n_h = 2) at d_v=4 <= 1.25x; none for n_h = 2 at d_v=1, which is measured, not bounded."""
    arm, compiled = name.removesuffix("_compiled"), name.endswith("_compiled")
    if arm in TARGETS:
        return TARGETS[arm]
    dv4 = rows.get("ddl_dv4" + ("_compiled" if compiled else ""))
    if arm in ("ddl_dv4_cc", "ddl_dv4_ec") and dv4:
        return 1.05 * dv4["time_ratio"]
    return None


def model_table(rows: dict) -> list[str]:
    lines = ["| arm | step (ms) | x baseline | target | tokens/s | memory (MiB) | x baseline |",
             "|---|---|---|---|---|---|---|"]
    for name, row in rows.items():
        target = time_target(name, rows)
        verdict = "" if target is None else f"<= {target:.2f} {'ok' if row['time_ratio'] <= target else 'MISSED'}"
        memory_verdict = 'ok' if row['memory_ratio'] <= MEMORY_TARGET else 'MISSED'
        memory = f"{row['memory_ratio']:.2f}" + (f" (<= {MEMORY_TARGET} {memory_verdict})"
                                                  if name.removesuffix("_compiled") == "ddl_dv4" else "")
        mfu = f" (MFU {100 * row['mfu']:.0f}%)" if row.get("mfu") else ""
        lines.append(f"| {name} | {row['step_ms']:.1f} | {row['time_ratio']:.3f} | {verdict} "
                     f"| {row['tokens_per_s']:,.0f}{mfu} | {row['memory_mib']:.1f} | {memory} |")
    return lines


def start_up_row(name: str, times: list[float], goal_s: float) -> str:
    median = statistics.median(times)
    return (f"| {name} | {median:.2f} ({min(times):.2f}-{max(times):.2f}) | < {goal_s} "
            f"{'ok' if median < goal_s else 'MISSED'} |")


def orchestrator_table(o: dict) -> list[str]:
    """The orchestrator's figures against their goals, and how they were taken."""
    return ["| orchestrator | seconds | target |", "|---|---|---|",
            start_up_row("ddl-run --help", o["help_runs_s"], HELP_GOAL_S),
            start_up_row("dry run of paper_small, hydra/launcher=slurm", o["dry_run_runs_s"], DRY_RUN_GOAL_S),
            start_up_row("plan of 1,000 jobs (dry run: 4 rows x 250 seeds, micro)", o["plan_1000_runs_s"], PLAN_GOAL_S),
            f"| smoke sweep to its first training step | {o.get('smoke_sweep_to_first_step_s', float('nan')):.2f} | |",
            *_warm_start_rows(o),
            "", f"Start-up: the median of {len(o['help_runs_s'])} runs each (min-max), the dry runs asking "
                f"{o['store']}; the plan's CPU time (user + sys) {statistics.median(o['plan_1000_cpu_runs_s']):.2f} s; "
                f"1-minute load average {o['load_average'][0]:.2f} before, {o['load_average'][1]:.2f} after (the "
                "targets are for a quiet machine)."]


def _warm_start_rows(o: dict) -> list[str]:
    """The warm-start sweep's wall and CPU, warm and cold, and their ratios (absent from older results)."""
    if "sweep_jobs" not in o:
        return []
    (wall, cpu), (cold_wall, cold_cpu) = o["sweep_warm_true_s"], o["sweep_warm_false_s"]
    stored = o.get("plan_1000_stored_runs_s")
    return [f"| local sweep of {o['sweep_jobs']} micro jobs, 10 steps, 2 at a time: wall, warm / cold | {wall:.2f} / "
            f"{cold_wall:.2f} = {wall / cold_wall:.2f}x | |",
            f"| the same sweep's CPU (user + sys, its jobs' included), warm / cold | {cpu:.2f} / {cold_cpu:.2f} "
            f"= {cpu / cold_cpu:.2f}x | |",
            *([start_up_row(f"plan of 1,000 jobs in that sweep's home (its store: {o['sweep_jobs']} finished runs)",
                            stored, PLAN_GOAL_S)] if stored else [])]


def markdown(result: dict) -> str:
    lines = [f"# ddl bench ({result['machine']['device']}, torch {result['machine']['torch']}, "
             f"{result['machine']['threads']} threads)", "",
             f"Model config: {result['config']}; the fused arms' loops ran as {result['machine']['fused_loops']}; "
             "`_compiled` arms run the Delta ops with kernels=compiled.", ""]
    lines += model_table(result["model"])
    for key in ("model_small_bf16", "model_small_bf16_compiled"):
        if key in result:
            compiled = ", compiled per block" if "compiled" in key else ""
            lines += ["", f"## {key}: the paper's small size, bf16{compiled}", ""] + model_table(result[key])
    log = result["logging"]
    if "orchestrator" in result:
        lines += ["", *orchestrator_table(result["orchestrator"])]
    lines += ["", f"MLflow logging, {log['metrics_per_call']} metrics every step: the loop waits "
                  f"{log['loop_wait_ms']:.3f} ms "
                  f"a step = {100 * log['fraction_of_step']:.2f}% of a baseline step at the config above (target < 1%: "
                  f"{'ok' if log['fraction_of_step'] < 0.01 else 'MISSED'}); all the work, writes on MLflow's logging "
                  f"thread included: {log['work_ms']:.3f} ms = {100 * log['work_fraction_of_step']:.2f}%.", ""]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m ddl.bench", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=at_least_one, default=None,
                        help=f"rounds of the arms in turn (default {MODEL_ROUNDS}; --dispatch {DISPATCH_ROUNDS}: its "
                             f"steps take milliseconds, and a VM's noise swings fewer rounds' ratios by a tenth)")
    parser.add_argument("--steps", type=at_least_one, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds on fewer tokens, fewer logging calls: a smoke check of the bench")
    parser.add_argument("--out", type=printable_path, default=None,
                        help="where bench.{json,md} go (default reports/bench)")
    parser.add_argument("--arms", default=",".join(ARMS), help="the model arms, comma-separated (default: all; "
                        "the baseline always runs: every figure is a ratio to it)")
    parser.add_argument("--orchestrator", action="store_true",
                        help="only the orchestrator's figures (start-up, the 1,000-job plan): orchestrator.{json,md}")
    parser.add_argument("--model", action="store_true",
                        help="only the model arms and the logging cost (no orchestrator figures): bench.{json,md}")
    parser.add_argument("--traffic", action="store_true",
                        help="only the memory traffic and saved activations of one GPU training step per arm, counted "
                             "on fake tensors (no GPU needed): traffic.{json,md}")
    parser.add_argument("--dispatch", action="store_true",
                        help="only a step's dispatch cost: DISPATCH_SHAPE on one thread, eager and compiled per block, "
                             "as ratios to the baseline: dispatch.{json,md}")
    parser.add_argument("--size", default="small", choices=list(SIZES), help="--traffic's model size (default small)")
    parser.add_argument("--record", nargs="?", type=printable_path, const=RECORDED_COSTS, default=None,
                        metavar="PATH",
                        help="the arms' step ratios become the CPU figures the report's equal-compute verdicts read "
                             "(default PATH: ddl/recorded_costs.json)")
    return parser


def _rounds(args: argparse.Namespace, default: int) -> int:
    return default if args.rounds is None else args.rounds


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    names = ["baseline", *(name for name in args.arms.split(",") if name != "baseline")]
    if error := arms_error(names):                     # refused whichever figures run, before any of them
        parser.error(error)
    out, runs, sweep_jobs = args.out or paths.reports_dir() / "bench", *((1, 2) if args.quick else (5, 4))
    if args.orchestrator:
        result = {"machine": {"device": cpu_name()}, "orchestrator": orchestrator_costs(runs, sweep_jobs)}
        return _write(out, "orchestrator", result, "\n".join(
            [f"# ddl bench: the orchestrator ({cpu_name()})", "", *orchestrator_table(result["orchestrator"]), ""]))
    if args.dispatch:
        rounds = (2, 2) if args.quick else (_rounds(args, DISPATCH_ROUNDS), args.steps)
        result = {"machine": cpu_name(), "dispatch": dispatch_costs(*rounds)}
        return _write(out, "dispatch", result, dispatch_markdown(result))
    if args.traffic:
        result = traffic_costs(names, args.size)
        return _write(out, "traffic", result, traffic_markdown(result))
    result = _model_figures(args, names)
    if args.record:
        record_step_ratios("cpu", {"machine": cpu_name()}, result["model"], CPU_SHAPE, args.record)
    if not args.model:
        result["orchestrator"] = orchestrator_costs(runs, sweep_jobs)
    return _write(out, "bench", result, markdown(result))


def record_step_ratios(kind: str, machine: dict, rows: dict, shape: dict, path: Path = RECORDED_COSTS) -> None:
    """Each fused arm's step over the baseline's (a compiled arm is the same arm's other form), dated, into
    ddl/recorded_costs.json under `kind` (ddl.costs.record)."""
    import datetime

    from .costs import arm_key, record
    ratios = {arm_key(ModelConfig(**shape, **ARMS[name])): row["time_ratio"] for name, row in rows.items()
              if name != "baseline" and not name.endswith("_compiled")}
    record(kind, {**machine, "date": datetime.date.today().isoformat(), "step_ratios": ratios}, path)
    print(f"recorded: the {kind} step ratios of {', '.join(ratios)}")


def _model_figures(args, names: list[str]) -> dict:
    """The machine, and each arm's step against the baseline's (on CUDA also the paper's small size, bf16, compiled
    and not), and the logging cost."""
    # --quick, a smoke check of the bench itself: 2 rounds of 1 step on a quarter of the tokens, 60 logging calls
    rounds, steps, batch, seq, logging_calls = \
        (2, 1, 4, 128, 60) if args.quick else (_rounds(args, MODEL_ROUNDS), args.steps, 8, 256, 300)
    reuses_memory = keep_freed_memory()               # as train() does: no page faults for reused activations
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    result = {"machine": {"device": torch.cuda.get_device_name() if cuda else cpu_name(),
                          "torch": torch.__version__, "threads": torch.get_num_threads(),
                          "python": platform.python_version(),
                          "keep_freed_memory": reuses_memory,
                          "fused_loops": loops_name(torch.empty(0, device=device))},
              "config": {**CPU_SHAPE, "batch": batch, "seq_len": seq}}
    result["model"] = model_costs(device, CPU_SHAPE, batch, seq, rounds, steps, False, names)
    if cuda:
        small = {**SIZES["small"], "vocab_size": ModelConfig.vocab_size}  # GPT-2's, padded
        for compile_ in (False, True):
            result[f"model_small_bf16{'_compiled' if compile_ else ''}"] = model_costs(device, small, 16, 1024, rounds,
                                                                                         steps, compile_, names)
    result["logging"] = logging_cost(result["model"]["baseline"]["step_ms"] / 1e3, logging_calls)
    return result


def _write(out: Path, name: str, result: dict, text: str) -> int:
    """out/<name>.json and out/<name>.md, the markdown printed too."""
    out.mkdir(parents=True, exist_ok=True)
    paths.write_atomic(out / f"{name}.json", json.dumps(result, indent=1))
    paths.write_atomic(out / f"{name}.md", text)
    print(text)
    print(f"written: {out / f'{name}.json'}, {out / f'{name}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
