"""The DDL models: PyTorch modules whose Delta ops run as hand-fused kernels (C++ on CPU).
Imports nothing else from ddl but ddl.validation: `from ddl.model import GPT`.

The config half imports no torch, so CLIs can validate and plan without loading it.
"""

from .config import CONVS, MAPPINGS, RESIDUALS, SIZES, ModelConfig, ddl_extra_params, model_config, param_count

__all__ = ["CONVS", "MAPPINGS", "RESIDUALS", "SIZES", "ModelConfig", "model_config", "param_count",
           "ddl_extra_params", "DeltaResidual", "delta_update", "GPT"]


def __getattr__(name):
    if name in ("DeltaResidual", "delta_update"):
        from . import delta
        return getattr(delta, name)
    if name == "GPT":
        from . import gpt
        return getattr(gpt, name)
    raise AttributeError(name)
