"""VLA models: SigLIP encoder, Gemma decoder with action expert, flow-matching and token heads."""

from vlastack.models.vla import VLA, build_model

__all__ = ["VLA", "build_model"]
