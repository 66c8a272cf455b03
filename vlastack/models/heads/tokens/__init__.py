"""Discrete action tokens from the VLM's LM head (RT-2/OpenVLA bins, FAST, parallel decoding):

- ``head.py``: ``TokenHead`` (teacher-forced cross-entropy, autoregressive or parallel decoding);
- ``grounded.py``: ``GroundedTokenHead``, the head with the grounding add-on (``../grounding.py``);
- ``serving.py``: ``TokenServing`` (decoding options at serving time, invalid-chunk policy).

Its options: ``model.head_options`` = ``config.TokenHeadConfig``; the action tokenizers:
``models/action_tokens/``.
"""

from vlastack.models.heads.tokens.grounded import GroundedTokenHead
from vlastack.models.heads.tokens.head import TokenHead

__all__ = ["GroundedTokenHead", "TokenHead"]
