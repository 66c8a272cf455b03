"""The OpenVLA-OFT-style head (``head.py``): parallel decoding of a whole chunk, L1 regression.
Its options: ``model.head_options`` = ``config.OFTOptions``."""

from vlastack.models.heads.oft.head import OFTHead

__all__ = ["OFTHead"]
