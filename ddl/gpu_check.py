"""`make gpu-check`: what a CPU cannot prove, run on a machine with a CUDA GPU.

1. The device-aware tests on CUDA (DDL_TEST_DEVICE=cuda): the Triton kernels against the plain forms,
   compiled for the GPU (no interpreter); every variant under bf16 autocast and torch.compile.
2. A short ddl-run per arm (baseline, d_v=1, d_v=4) at the paper's small size with its training
   config (train=paper: bf16 autocast, torch.compile), on the embedded corpus (byte tokens, offline).
3. `python -m ddl.bench`, whose CUDA half adds the paper's small size in bf16, compile off and on:
   step time, tokens/s, MFU and memory of every arm against the baseline.

Writes reports/gpu-check/summary.{md,json}, each step's log and the bench's report beside them, and
judges the targets: DDL d_v=4 step <= 1.10x the baseline's (small, bf16, compiled), MFU >= 40%.
Without a CUDA GPU it says so in one line and exits 0.

    python -m ddl.gpu_check [--steps 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import paths

CHECKOUT = Path(__file__).resolve().parents[1]
DEVICE_TESTS = ["tests/test_triton_kernels.py", "tests/test_model_bf16_compile.py"]
RUN_ARMS = {"baseline": ["residual=baseline"], "ddl_dv1": ["residual=ddl", "dv=1"], "ddl_dv4": ["residual=ddl", "dv=4"]}
STEP_RATIO_TARGET, MFU_TARGET = 1.10, 0.40          # d_v=4 against the baseline, small bf16 compiled


def run_command(arm: str, steps: int) -> list[str]:
    """ddl-run for one arm: the paper's small model and training config, shrunk to `steps` steps of
    16 x 1024 tokens, validated once at the end, on the embedded corpus."""
    return [str(Path(sys.executable).parent / "ddl-run"), "model=small", "train=paper", "data=embedded", *RUN_ARMS[arm],
            f"train.steps={steps}", "train.batch_tokens=16384", "train.micro_batch=16", "train.warmup_steps=10",
            f"train.eval_every={steps}", "train.eval_tokens=65536", f"train.ckpt_every={steps}", "train.log_every=10",
            "experiment=gpu-check"]


def logged(name: str, cmd: list[str], out: Path, **env: str) -> tuple[int, float]:
    """Runs cmd with its output in out/<name>.log: (exit code, seconds)."""
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        code = subprocess.run(cmd, cwd=CHECKOUT, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, **env}).returncode
    return code, time.perf_counter() - start


def device_tests(out: Path) -> dict:
    if not (CHECKOUT / "tests").is_dir():
        return {"skipped": "no tests/ beside the package: run from a checkout"}
    code, seconds = logged("tests", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *DEVICE_TESTS],
                           out, DDL_TEST_DEVICE="cuda")
    lines = (out / "tests.log").read_text().strip().splitlines()
    return {"exit_code": code, "seconds": seconds, "summary": lines[-1] if lines else ""}


def training_runs(out: Path, steps: int) -> dict:
    runs = {}
    for arm in RUN_ARMS:
        with tempfile.TemporaryDirectory() as home:            # a fresh DDL_HOME: nothing skipped as done
            code, seconds = logged(f"run-{arm}", run_command(arm, steps), out, DDL_HOME=home)
            status = [json.loads(p.read_text()) for p in Path(home).glob("runs/*/status.json")]
        finished = status and status[0].get("state") == "finished"
        runs[arm] = {"exit_code": code, "seconds": seconds,
                     "final": {"train/loss": status[0]["train_loss"], "val/loss": status[0]["val_loss"]}
                     if finished else None,
                     "tokens_per_s": status[0].get("tokens_per_s") if status else None}
    return runs


def bench(out: Path) -> dict:
    code, seconds = logged("bench", [sys.executable, "-m", "ddl.bench", "--out", str(out / "bench")], out)
    report = out / "bench" / "bench.json"
    result = json.loads(report.read_text()) if code == 0 and report.exists() else None
    return {"exit_code": code, "seconds": seconds, "targets": targets(result) if result else None}


def targets(result: dict) -> dict:
    """The issue's targets from the bench's small-size bf16 compiled table."""
    rows = result.get("model_small_bf16_compiled", {})
    if not rows:
        return {}
    ratio = rows["ddl_dv4"]["time_ratio"]
    judged = {"ddl_dv4 step / baseline": {"value": ratio, "target": f"<= {STEP_RATIO_TARGET:.2f}",
                                          "met": ratio <= STEP_RATIO_TARGET}}
    for arm in ("baseline", "ddl_dv4"):
        mfu = rows[arm]["mfu"]
        judged[f"{arm} MFU"] = {"value": mfu, "target": f">= {MFU_TARGET:.0%}",
                                "met": mfu is not None and mfu >= MFU_TARGET}
    return judged


def markdown(summary: dict) -> str:
    machine = summary["machine"]
    lines = [f"# gpu-check ({machine['device']}, torch {machine['torch']}, triton {machine['triton']})", ""]
    tests = summary["tests"]
    ran = f"`{' '.join(DEVICE_TESTS)}`: {tests.get('summary')} (exit {tests.get('exit_code')}, tests.log)"
    lines += ["## Tests on CUDA", "", tests.get("skipped", ran), ""]
    lines += [f"## {summary['steps']}-step ddl-run per arm (model=small train=paper, embedded corpus)", "",
              "| arm | exit | train/loss | val/loss | tokens/s | seconds |", "|---|---|---|---|---|---|"]
    for arm, run in summary["runs"].items():
        final = run["final"] or {}
        cells = [f"{final[key]:.4f}" if key in final else "-" for key in ("train/loss", "val/loss")]
        tokens = f"{run['tokens_per_s']:,.0f}" if run["tokens_per_s"] else "-"
        lines.append(f"| {arm} | {run['exit_code']} | {' | '.join(cells)} | {tokens} | {run['seconds']:.0f} |")
    bench_part = summary["bench"]
    lines += ["", "## Targets (bench: paper small, bf16, whole-model torch.compile)", ""]
    if bench_part["targets"]:
        lines += ["| measure | value | target | |", "|---|---|---|---|"]
        for name, t in bench_part["targets"].items():
            value = "-" if t["value"] is None else f"{t['value']:.1%}" if "MFU" in name else f"{t['value']:.3f}"
            lines.append(f"| {name} | {value} | {t['target']} | {'met' if t['met'] else 'MISSED'} |")
        lines += ["", "Every arm, compile off and on: bench/bench.md."]
    else:
        lines.append(f"The bench did not finish (exit {bench_part['exit_code']}): bench.log.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddl.gpu_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50, help="training steps per arm (default 50)")
    parser.add_argument("--out", type=Path, default=None, help="where the reports go (default reports/gpu-check)")
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print(f"gpu-check: no CUDA GPU on this machine (torch {torch.__version__}); nothing to check.")
        return 0
    try:
        import triton
    except ImportError as error:
        triton = argparse.Namespace(__version__=f"not importable ({error})")
    out = args.out or paths.reports_dir() / "gpu-check"
    out.mkdir(parents=True, exist_ok=True)
    summary = {"machine": {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "triton": triton.__version__, "python": platform.python_version()},
               "steps": args.steps, "tests": device_tests(out), "runs": training_runs(out, args.steps),
               "bench": bench(out)}
    paths.write_atomic(out / "summary.json", json.dumps(summary, indent=1))
    paths.write_atomic(out / "summary.md", markdown(summary))
    print(markdown(summary))
    print(f"written: {out / 'summary.md'}, {out / 'summary.json'}")
    failed = summary["tests"].get("exit_code") or summary["bench"]["exit_code"] or any(
        run["exit_code"] for run in summary["runs"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
