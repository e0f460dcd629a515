"""The Triton kernels compiled for a GPU on a machine without one: each kernel as the ops launch it at a model's
shape, compiled by triton's own compiler and ptxas for a CUDA architecture, with the registers and the stack
(spilled registers) a thread takes. A construct triton's interpreter runs and the GPU's compiler refuses shows here
(tests/test_triton_kernels.py compiles every kernel so); so does register pressure, which bounds the programs an SM
holds at once.

    python -m ddl.model.fused.triton_compile [--d 768] [--dv 4] [--taps 4] [--arch 90] [--warps 4,8]

Launches are recorded where triton interprets, in a process of their own (TRITON_INTERPRET=1 is read as triton is
imported), and compiled where it does not.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile

import torch

from ...validation import OneLineParser, at_least_one

MODULE = "ddl.model.fused.triton_compile"
POINTEE = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64",
           torch.int64: "i64", torch.int32: "i32"}


def launch_signature(fn, args: tuple, kwargs: dict) -> tuple[dict, dict]:
    """A launch of kernel fn as triton's compiler takes it: each argument's type (a tensor a pointer to its dtype, an
    int i32 or i64, a float fp32) and the constexprs' values."""
    import triton.language as tl
    signature, constexprs = {}, {}
    for name, value in inspect.signature(fn).bind(*args, **kwargs).arguments.items():
        if fn.__annotations__.get(name) in (tl.constexpr, "tl.constexpr") or value is None:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + POINTEE[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -2 ** 31 <= value < 2 ** 31 else "i64"
        else:
            signature[name] = "fp32"
    return signature, constexprs


def record(run) -> list[tuple[str, dict, dict]]:
    """The distinct kernel launches run() makes, [(kernel, signature, constexprs)]; under the interpreter only. Every
    kernel of triton_loops must be among them."""
    from triton.runtime.interpreter import InterpretedFunction

    from . import triton_loops
    kernels = {name: k for name, k in vars(triton_loops).items()
               if isinstance(k, InterpretedFunction) and name.endswith("_kernel")}
    if not kernels:
        raise RuntimeError("triton_loops was imported compiled: record launches where TRITON_INTERPRET=1")
    launches = {}

    def recorder(name: str, kernel):
        def hook(*args, **kwargs):
            signature, constexprs = launch_signature(kernel.fn, args, kwargs)
            launches[name, json.dumps(signature), json.dumps(constexprs)] = signature, constexprs
        return hook

    hooks = {name: recorder(name, kernel) for name, kernel in kernels.items()}
    for name, hook in hooks.items():
        kernels[name].add_pre_run_hook(hook)
    try:
        run()
    finally:
        for name, hook in hooks.items():
            kernels[name].pre_run_hooks.remove(hook)
    missed = set(kernels) - {name for name, _, _ in launches}
    if missed:
        raise RuntimeError(f"kernels never launched: {', '.join(sorted(missed))}")
    return [(name, *launch) for (name, _, _), launch in launches.items()]


def compile_launches(launches: list, arch: int, warps: tuple[int, ...]) -> list[dict]:
    """Each launch compiled for sm_<arch> at each number of warps: its registers and stack bytes a thread (from
    cuobjdump), or the compiler's error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from . import triton_loops
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    rows = []
    for name, signature, constexprs in launches:
        for num_warps in warps:
            row = dict(kernel=name, constexprs=constexprs, warps=num_warps)
            try:
                compiled = triton.compile(ASTSource(getattr(triton_loops, name), signature, constexprs),
                                          target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
            except Exception as error:             # the compiler's own, of any kind: reported, the others go on
                rows.append(row | dict(error=f"{type(error).__name__}: {str(error).strip().splitlines()[-1]}"))
                continue
            rows.append(row | _resources(cuobjdump, compiled.asm["cubin"]))
    return rows


def _resources(cuobjdump: str, cubin: bytes) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        usage = subprocess.run([cuobjdump, "--dump-resource-usage", file.name], capture_output=True, text=True,
                               check=True).stdout
    fields = dict(item.split(":", 1) for line in usage.splitlines() if "REG:" in line for item in line.split())
    return dict(registers=int(fields["REG"]), stack=int(fields["STACK"]))


def op_calls(d: int, dv: int, taps: int, dtype: torch.dtype = torch.float32, state_dtype: torch.dtype | None = None,
             device: str | torch.device = "cpu", tokens: int = 3) -> dict[str, tuple]:
    """Every Triton op, forward and backward, with random arguments: {op (and a variant after a space): args}. The
    state (and c, the norm's output) in state_dtype (default dtype), the rest in dtype, the gates' maps fp32 as the
    model's; the norm with its gates activated and without; two DeltaProduct steps."""
    ops = torch.ops.ddl_triton
    g = torch.Generator().manual_seed(11)
    state_dtype = state_dtype or dtype

    def rand(*shape, dtype=dtype):
        return torch.randn(*shape, generator=g).to(device, dtype)

    X, G = rand(1, tokens, dv, d, dtype=state_dtype), rand(1, tokens, dv, d, dtype=state_dtype)
    h, g_x, A = rand(1, tokens, d), rand(1, tokens, d), rand(dv, d, taps)
    v, w = rand(1, tokens, dv), rand(1, tokens, dv)
    beta = 2 * torch.rand(1, tokens, 1, generator=g).to(device, dtype)
    _, _, rho, q = ops.update_forward(X, h, beta, v, 1e-10)
    steps = ([h, h], [beta, beta], [v, v])
    _, w_by_step, rho_by_step, q_by_step = ops.update_steps_forward(X, *steps, 1e-10)
    calls = {"update_forward": (X, h, beta, v, 1e-10), "update_backward": (G, w, X, h, beta, v, rho, q),
             "update_steps_forward": (X, *steps, 1e-10),
             "update_steps_backward": (G, w_by_step, X, *steps, rho_by_step, q_by_step),
             "read_forward": (X, A), "read_backward": (g_x, X, A), "rank_one_forward": (w, h, A),
             "rank_one_backward": (g_x, w, h, A), "expand_forward": (h, A), "expand_backward": (G, h, A),
             "key_forward": (X, h, beta, v, 1e-10), "write_forward": (X, h, w, h, beta, v, A, 1e-10, True),
             "write_backward": (G, w, g_x, X, h, w, h, beta, v, rho, q, A)}
    W_c, W_x, b_c, b_x = (rand(*shape, dtype=torch.float32) for shape in ((1, d), (dv, d), (1,), (dv,)))
    for variant, gates in (("", (b_c, b_x, 2.0, 4.0)), (" ungated", (None, None, 1.0, 1.0))):
        calls["norm_forward" + variant] = inputs = (h, W_c[0], W_c, W_x, *gates, 1e-6, state_dtype)
        c, y_c, y_x, rho_norm = ops.norm_forward(*inputs)
        calls["norm_backward" + variant] = (rand(*c.shape, dtype=c.dtype), rand(*y_c.shape, dtype=torch.float32),
                                            rand(*y_x.shape, dtype=torch.float32), *inputs[:-2], rho_norm, y_c, y_x)
    return calls


def launch_all(calls: dict[str, tuple]) -> None:
    """Runs every call of op_calls."""
    for name, args in calls.items():
        getattr(torch.ops.ddl_triton, name.split()[0])(*args)


def _warps(value: str) -> tuple[int, ...]:
    counts = value.split(",")
    if not all(c.isdigit() and int(c) in (1, 2, 4, 8, 16, 32) for c in counts):
        raise argparse.ArgumentTypeError(f"{value!r}: must be comma-separated powers of two from 1 to 32")
    return tuple(int(c) for c in counts)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--d", type=at_least_one, default=768, help="d_model (default 768: the paper small's)")
    parser.add_argument("--dv", type=at_least_one, default=4, help="d_v (default 4)")
    parser.add_argument("--taps", type=at_least_one, default=4, help="the state read's taps (default 4)")
    parser.add_argument("--arch", type=at_least_one, default=90,
                        help="CUDA compute capability x10 (default 90: H100, H200)")
    parser.add_argument("--warps", type=_warps, default=(4, 8), help="warps a program, comma-separated (default 4,8)")
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)    # the interpreted child's part
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)   # launches on stdin -> rows
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.record:
        def every_op():                                       # the state in bf16, as on a GPU
            launch_all(op_calls(args.d, args.dv, args.taps, state_dtype=torch.bfloat16, tokens=4))
        print(json.dumps(record(every_op)))
        return 0
    if args.compile:
        print(json.dumps(compile_launches(json.load(sys.stdin), args.arch, args.warps)))
        return 0
    child = subprocess.run([sys.executable, "-m", MODULE, "--record", "--d", str(args.d), "--dv", str(args.dv),
                            "--taps", str(args.taps)], capture_output=True, text=True,
                           env={**os.environ, "TRITON_INTERPRET": "1"})
    if child.returncode:
        print(child.stderr.strip().splitlines()[-1], file=sys.stderr)
        return 1
    rows = compile_launches(json.loads(child.stdout.splitlines()[-1]), args.arch, args.warps)
    print(f"# Triton kernels for sm_{args.arch}: d={args.d}, d_v={args.dv}, {args.taps} taps\n")
    print("| kernel | constexprs | warps | registers | stack (spills), bytes |\n|---|---|---|---|---|")
    for row in rows:
        shown = row.get("error") or f"{row['registers']} | {row['stack']}"
        print(f"| {row['kernel']} | {row['constexprs']} | {row['warps']} | {shown} |")
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
