"""The Pi0 / Pi0.5 flow head and everything that is only about it:

- ``head.py``: ``FlowHead`` (flow-matching loss, Euler sampler over a static KV cache);
- ``grounded.py``: ``GroundedFlowHead``, the head with the grounding add-on (``../grounding.py``);
- ``rtc.py``: real-time chunking's samplers (guided inpainting, training-time prefix);
- ``fastpath.py``: the inference-only model (fused projections, time tables) and static sampler;
- ``serving.py``: ``FlowServing``, what ``Policy`` asks the head for (fast path, RTC, BID).

Its options: ``model.head_options`` = ``config.FlowOptions``; its LeRobot/openpi weight names:
``models/convert/lerobot.py``.
"""

from vlastack.models.heads.flow.grounded import GroundedFlowHead
from vlastack.models.heads.flow.head import FlowHead

__all__ = ["FlowHead", "GroundedFlowHead"]
