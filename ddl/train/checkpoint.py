"""Atomic checkpoints: model, optimizer, scheduler, loader position, RNG, step, config, signature."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from .. import paths

PATTERN = "step_*.pt"


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
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), None))
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"], 0, 0.0))
    if device.type == "cuda" and isinstance(state.get("cuda"), torch.Tensor):
        torch.cuda.set_rng_state(state["cuda"], device)


def save(run_dir: Path, state: dict, keep: int) -> Path:
    """Write step_<n>.pt via temp file, fsync and rename, then drop all but the newest `keep`: the
    older ones go only once the new one is on disk (a node crash leaves a whole checkpoint)."""
    directory = checkpoint_dir(run_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step_{state['step']:08d}.pt"
    paths.write_atomic(path, lambda f: torch.save(state, f), durable=True)
    for old in sorted(directory.glob(PATTERN))[:-keep]:
        old.unlink()
    return path


def latest(run_dir: Path) -> Path | None:
    found = sorted(checkpoint_dir(run_dir).glob(PATTERN))
    return found[-1] if found else None


def load(path: Path, map_location="cpu") -> dict:
    return torch.load(path, map_location=map_location, weights_only=True)


def load_checkpoint_model(path: Path, map_location="cpu"):
    """(GPT in eval mode, meta) from a checkpoint file or a run directory (its latest checkpoint)."""
    from ..model import GPT
    from .config import RunConfig

    path = Path(path)
    if path.is_dir():
        found = latest(path)
        if found is None:
            raise ValueError(f"checkpoint={str(path)!r}: no {PATTERN} under {checkpoint_dir(path)}")
        path = found
    state = load(path, map_location)
    run = RunConfig.from_dict(state["run"])
    model = GPT(run.model)
    model.load_state_dict(state["model"])
    meta = {"run": run, "step": state["step"], "signature": state["signature"], "dataset": state["dataset"],
            "path": str(path)}
    return model.eval(), meta
