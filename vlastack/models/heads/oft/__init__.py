"""The OpenVLA-OFT-style head: parallel decoding of a whole chunk, L1 regression.

- ``head.py``: ``OFTHead`` (one learned query per action step, an MLP to each action);
- ``grounded.py``: ``GroundedOFTHead``, the head with the grounding add-on (``../grounding.py``).

Its options: ``model.head_options`` = ``config.OFTOptions``."""

from vlastack.models.heads.oft.grounded import GroundedOFTHead
from vlastack.models.heads.oft.head import OFTHead

__all__ = ["GroundedOFTHead", "OFTHead"]
