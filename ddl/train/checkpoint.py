"""Atomic, checksummed checkpoints: model, optimizer, scheduler, loader position, RNG, step, config,
signature, and the sha256 of all of it (verified on load: a damaged file is never trained on)."""

from __future__ import annotations

import hashlib
import random
import sys
from pathlib import Path

import numpy as np
import torch

from .. import paths

PATTERN = "step_*.pt"
CHECKSUM = "sha256"
QUARANTINE_SUFFIX = ".corrupt"


class CorruptCheckpoint(ValueError):
    """A checkpoint that cannot be read or whose content does not match its checksum."""


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def rng_state(device: torch.device) -> dict:
    """The generators' states; on CUDA only the training device's (touching every visible GPU
    would open a context on each, from every rank)."""
    _, keys, pos, _, _ = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]),
             "numpy": torch.from_numpy(keys.astype(np.int64)), "numpy_pos": int(pos)}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict, device: torch.device) -> None:
    """The generators' states back; each a CPU tensor again (a checkpoint loaded onto the training device
    maps them there, and torch's setters take only CPU bytes)."""
    torch.set_rng_state(state["torch"].cpu())
    random.setstate((3, tuple(state["python"]), None))
    np.random.set_state(("MT19937", state["numpy"].cpu().numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))
    if device.type == "cuda" and isinstance(state.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)


def digest(state, h=None) -> str:
    """sha256 over a state's content: every tensor's dtype, shape and bytes, every other value's repr,
    dict keys in a fixed order. The same on the loaded copy as on the saved one."""
    h = h or hashlib.sha256()
    if isinstance(state, dict):
        for key in sorted(state, key=repr):
            h.update(repr(key).encode())
            digest(state[key], h)
    elif isinstance(state, (list, tuple)):
        h.update(f"{type(state).__name__}{len(state)}".encode())
        for item in state:
            digest(item, h)
    elif isinstance(state, torch.Tensor):
        tensor = state.detach().cpu().contiguous()
        h.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    else:
        h.update(repr(state).encode())
    return h.hexdigest()


class _WriteErrors:
    """A file that keeps the OSError of a failed write (a full disk): torch.save reports it only as its
    zip writer's RuntimeError ("unexpected pos")."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self.file.flush()


def _torch_save(state: dict, file) -> None:
    out = _WriteErrors(file)
    try:
        torch.save(state, out)
    except RuntimeError:
        if out.error is None:
            raise
        raise OSError(out.error.errno, out.error.strerror, getattr(file, "name", None)) from None


def save(run_dir: Path, state: dict, keep: int) -> Path:
    """Write step_<n>.pt (with its checksum) via temp file, fsync and rename, then drop all but the
    newest `keep`: the older ones go only once the new one is on disk (a node crash leaves a whole
    checkpoint)."""
    path = path_for(run_dir, state["step"])
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True)
    signed = {**state, CHECKSUM: digest(state)}
    paths.write_atomic(path, lambda f: _torch_save(signed, f), durable=True)
    for old in sorted(directory.glob(PATTERN))[:-keep]:
        old.unlink()
    return path


def path_for(run_dir: Path, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:08d}.pt"


def latest(run_dir: Path) -> Path | None:
    found = sorted(checkpoint_dir(run_dir).glob(PATTERN))
    return found[-1] if found else None


def load(path: Path, map_location="cpu") -> dict:
    """The checkpoint's state, verified against its checksum; CorruptCheckpoint (one line) if the file
    is unreadable, truncated or altered. A checkpoint written before checksums loads unverified."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise CorruptCheckpoint(f"checkpoint {path}: unreadable ({type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else 'no detail'})") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CorruptCheckpoint(f"checkpoint {path}: not a ddl checkpoint")
    expected = state.pop(CHECKSUM, None)
    if expected is not None and digest(state) != expected:
        raise CorruptCheckpoint(f"checkpoint {path}: content does not match its sha256 (damaged on disk)")
    return state


def newest_intact(run_dir: Path, map_location="cpu") -> tuple[Path, dict] | None:
    """(path, state) of the newest checkpoint that verifies. Each damaged one on the way is reported in
    one line and renamed to step_<n>.pt.corrupt, so nothing picks it again."""
    for path in sorted(checkpoint_dir(run_dir).glob(PATTERN), reverse=True):
        try:
            return path, load(path, map_location)
        except CorruptCheckpoint as err:
            path.rename(path.with_name(path.name + QUARANTINE_SUFFIX))
            print(f"{err}; moved aside as {path.name}{QUARANTINE_SUFFIX}, using the previous checkpoint",
                  file=sys.stderr, flush=True)
    return None


# The parameterizations a checkpoint records (model.param, model.depth_param), each with what a checkpoint written
# before it existed was trained under.
PARAMETERIZATIONS = {"param": "sp", "depth_param": "none"}


def check_parameterization(path: Path, state: dict, model) -> None:
    """A checkpoint loads only under the parameterizations it was trained with (model.param, model.depth_param;
    one written before a key existed has its earlier value): under another, the same weights compute another
    function or train another way."""
    for key, earlier in PARAMETERIZATIONS.items():
        saved, wanted = state["run"]["model"].get(key, earlier), getattr(model, key)
        if saved != wanted:
            raise ValueError(f"model.{key}={wanted!r}: checkpoint {str(path)!r} was trained under "
                             f"model.{key}={saved!r}; it loads only under that one")


def load_checkpoint_model(path: Path, map_location="cpu"):
    """(GPT in eval mode, meta) from a checkpoint file or a run directory (its latest checkpoint)."""
    from ..model import GPT
    from .config import RunConfig

    path = Path(path)
    if path.is_dir():
        found = newest_intact(path, map_location)
        if found is None:
            raise ValueError(f"checkpoint={str(path)!r}: no intact {PATTERN} under {checkpoint_dir(path)}")
        path, state = found
    else:
        state = load(path, map_location)
    run = RunConfig.from_dict(state["run"])
    model = GPT(run.model)
    model.load_state_dict(state["model"])
    meta = {"run": run, "step": state["step"], "signature": state["signature"], "dataset": state["dataset"],
            "path": str(path)}
    return model.eval(), meta
