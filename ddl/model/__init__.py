"""Pure-PyTorch DDL models. Imports nothing else from ddl: `from ddl.model import GPT`."""

from .config import CONVS, MAPPINGS, RESIDUALS, SIZES, ModelConfig, model_config
from .delta import DeltaResidual, delta_update
from .gpt import GPT, ddl_extra_params

__all__ = ["CONVS", "MAPPINGS", "RESIDUALS", "SIZES", "ModelConfig", "model_config", "DeltaResidual",
           "delta_update", "GPT", "ddl_extra_params"]
