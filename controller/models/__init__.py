"""Model specs (Table I of the paper) and GPU specs."""

from controller.models.gpus import GPU_SPECS, GpuSpec, gpu_spec
from controller.models.specs import MODELS, ModelSpec, model_spec

__all__ = ["GPU_SPECS", "GpuSpec", "gpu_spec", "MODELS", "ModelSpec", "model_spec"]
