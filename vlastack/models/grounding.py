"""Grounding head: where are the objects the instruction names? (``model.grounding``, flow head only)

The VLM prefix is [image tokens | text tokens]. The head pools the text tokens into one query per
point, scores every image token against it, and returns the softmax-weighted sum of a per-token
3-D position estimate, one per point. The score is a bilinear match between what the instruction
says and what each patch shows (for example a color word and a patch's color), and the value is
a linear function of the patch token, which carries its position embedding.

Why it exists: the tiny demo VLA learned to move to *an* object but picked the named one at chance
(binding), while the same model given the named object's position as input scored 90%. The
flow loss alone gives the binding only a weak, indirect signal. This head gets a direct one
(the recorded positions), and its output reaches the action expert the way the state does,
through the state token's input (see ``FlowHead``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn

from vlastack.nn.norms import RMSNorm


def _linear32(layer: nn.Linear, x: Tensor) -> Tensor:
    """``layer(x)`` in fp32, whatever the stored dtype (without converting the module in place)."""
    return F.linear(x, layer.weight.float(), layer.bias.float())


class GroundingHead(nn.Module):
    """VLM hidden states -> ``points`` positions, each ``point_dim`` values (normalized units)."""

    def __init__(
        self,
        width: int,
        num_image_tokens: int,
        points: int,
        key_dim: int,
        point_dim: int = 3,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.num_image_tokens, self.points, self.point_dim = num_image_tokens, points, point_dim
        self.key_dim = key_dim
        self.norm = RMSNorm(width, eps)
        self.query = nn.Linear(width, points * key_dim)
        self.key = nn.Linear(width, key_dim)
        self.value = nn.Linear(width, points * point_dim)

    def forward(self, hidden: Tensor, pad: Tensor) -> Tensor:
        """hidden [B, P, W] (image tokens first), pad bool [B, P] -> fp32 [B, points * point_dim].

        Runs in fp32: it is a small regression read-out, and its softmax is over ~100s of tokens.
        """
        n = self.num_image_tokens
        assert hidden.shape[:2] == pad.shape and hidden.shape[1] > n, (hidden.shape, pad.shape, n)
        with torch.autocast(hidden.device.type, enabled=False):
            h = self.norm(hidden.float())
            img, txt = h[:, :n], h[:, n:]
            img_pad, txt_pad = pad[:, :n], pad[:, n:, None].float()
            text = (txt * txt_pad).sum(1) / txt_pad.sum(1).clamp(min=1.0)  # [B, W], mean of real tokens
            q = rearrange(_linear32(self.query, text), "b (k e) -> b k e", k=self.points)
            scores = einsum(q, _linear32(self.key, img), "b k e, b p e -> b k p") * self.key_dim**-0.5
            weights = scores.masked_fill(~img_pad[:, None], float("-inf")).softmax(-1)  # [B, K, P]
            values = rearrange(_linear32(self.value, img), "b p (k d) -> b k p d", k=self.points)
            out = einsum(weights, values, "b k p, b k p d -> b k d")
        return rearrange(out, "b k d -> b (k d)")
