"""Grounding add-on shared by the flow and token heads: where are the objects the instruction names?
(``model.grounding``; the heads that take it: ``flow/grounded.py``, ``tokens/grounded.py``,
``oft/grounded.py``)

The VLM prefix is [image tokens | text tokens]. The head pools the text tokens into one query per
point, scores every image token against it, and returns the softmax-weighted sum of a per-token
3-D position estimate, one per point. The score is a bilinear match between what the instruction
says and what each patch shows (for example a color word and a patch's color), and the value is
a linear function of the patch token, which carries its position embedding.

Why it exists: the tiny demo VLA learned to move to *an* object but picked the named one at chance
(binding), while the same model given the named object's position as input scored 90%. The
flow loss alone gives the binding only a weak, indirect signal. This head gets a direct one
(the recorded positions), and its output reaches the action expert the way the state does,
through the state token's input: ``GroundedFlowHead`` (``flow/grounded.py``) is the flow head with
that input added.

The regression alone binds late: until the per-patch estimates are informative, it says nothing
about where to look, and the demo's binding formed anywhere from step ~1800 to past its last
step depending on the training seed (31% to 73% success). ``attention_loss`` (``grounding.attend_weight``) supervises the
attention directly with where the first camera images each point, recorded by the simulator; the
demo then binds by step ~1000-1250 on every seed tried.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.models.backbone import Backbone, prefix_layout
from vlastack.nn.attention import block_causal_mask
from vlastack.nn.kv_cache import StaticKVCache
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

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> GroundingHead:
        """The head ``cfg.grounding`` asks for, reading the VLM's width and every camera's patches."""
        g = cfg.grounding
        return cls(
            cfg.vlm.width, cfg.num_cameras * cfg.vision.num_patches, g.points, g.key_dim, eps=cfg.vlm.norm_eps
        )

    def forward(self, hidden: Tensor, pad: Tensor) -> Tensor:
        """hidden [B, P, W] (image tokens first), pad bool [B, P] -> fp32 [B, points * point_dim]."""
        return self.attend(hidden, pad)[0]

    def attend(self, hidden: Tensor, pad: Tensor) -> tuple[Tensor, Tensor]:
        """-> (positions fp32 [B, points * point_dim], attention fp32 [B, points, image tokens]).

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
        return rearrange(out, "b k d -> b (k d)"), weights


ATTEND_SIGMA = 0.75  # patches: the target's spread around the point's image location


def attention_loss(weights: Tensor, uv: Tensor, grid: int, sigma: float = ATTEND_SIGMA) -> Tensor:
    """Supervise where the head looks: weights fp32 [B, K, P] (the first camera's ``grid`` x
    ``grid`` patches first, row-major), uv [B, 2K] = each point's (u, v) in that camera as
    fractions of the image -> scalar fp32 -log(sum_p kernel_p * weight_p), mean over the points
    inside the image, where kernel_p = exp(-|centre_p - point|^2 / 2 sigma^2) in patch units.

    Without it the head's scores learn only through the regression, which carries no signal about
    where to look until the per-patch estimates are informative: the binding then forms late, at a
    step that depends on the seed. The loss is the log-likelihood of looking at the point, so it
    does not dictate how the weight spreads over the few patches around it.
    """
    b, k, _ = weights.shape
    assert uv.shape == (b, 2 * k) and weights.shape[2] >= grid * grid, (weights.shape, uv.shape, grid)
    with torch.autocast(weights.device.type, enabled=False):
        uv = rearrange(uv.float(), "b (k two) -> b k two", two=2)
        inside = ((uv >= 0) & (uv <= 1)).all(-1).float()  # [B, K]; e.g. behind a wrist camera
        centres = (torch.arange(grid, device=uv.device, dtype=torch.float32) + 0.5) / grid
        du = (centres[None, None, :] - uv[..., :1]) * grid  # [B, K, grid] along columns
        dv = (centres[None, None, :] - uv[..., 1:]) * grid  # [B, K, grid] along rows
        kernel = torch.exp(-(dv[..., :, None].pow(2) + du[..., None, :].pow(2)) / (2 * sigma**2))
        hit = (weights[..., : grid * grid].float() * kernel.flatten(2)).sum(-1)  # [B, K]
        nll = -(hit + 1e-6).log()
        return (nll * inside).sum() / inside.sum().clamp(min=1.0)


def predict_grounding(model: Backbone, batch: Batch) -> Tensor:
    """``model``'s grounding prediction (normalized units, fp32 [B, G]); ValueError without one."""
    if not model.cfg.grounding.points:
        raise ValueError("this model has no grounding head (model.grounding.points is 0)")
    return model.head.predict_grounding(model, batch)


# ---------------------------------------------------------------------- the two-pass layout
# A head whose state token reads the grounding prediction cannot run prefix and suffix in one
# pass (the suffix's input depends on the prefix's output): the prefix runs first, into a static
# cache (with gradients in training), and the suffix runs against it. The token and OFT heads
# share these two passes; the flow head has its own prefill (it also serves the fast path).


def grounded_prefix_pass(
    cfg: ModelConfig, backbone: Backbone, batch: Batch, suffix_len: int
) -> tuple[StaticKVCache, Tensor, Tensor]:
    """[images | text] into a fresh cache of P + ``suffix_len`` slots. -> (cache, the grounding
    layer's residual stream [B, P, W], prefix pad bool [B, P])."""
    prefix, pad = backbone.embed_prefix(batch)
    b, p = pad.shape
    cache = backbone.decoder.new_cache(b, p + suffix_len, prefix.dtype, prefix.device)
    layer = cfg.grounding_layer
    _, mask, positions = prefix_layout(pad)
    out = backbone.decoder(
        [prefix, None],
        positions,
        mask,
        cache=cache,
        cache_pos=0,
        attend_cache=False,
        vlm_output=layer == cfg.vlm.depth - 1,
        vlm_hidden_at=layer,
    )
    return cache, out.hidden, pad


def cached_suffix_pass(
    backbone: Backbone, cache: StaticKVCache, pad: Tensor, x: Tensor, starts: Tensor
) -> Tensor:
    """x [B, T, W] against the cached prefix (pad [B, P]), in blocks that begin where ``starts``
    bool [T] is True (each block sees the prefix, itself and the blocks before it).
    -> final-normed hidden [B, T, W]."""
    b, p = pad.shape
    t = x.shape[1]
    assert starts.shape == (t,), (starts.shape, t)  # starts[0] must be True (a block begins there)
    own = block_causal_mask(pad.new_ones(b, t), starts)  # [B, 1, T, T]
    unused = pad.new_zeros(b, 1, t, cache.max_len - p - t)
    mask = torch.cat([pad[:, None, None, :].expand(b, 1, t, p), own, unused], dim=-1)
    positions = pad.long().sum(-1, keepdim=True) + torch.arange(t, device=pad.device)[None]
    return backbone.decoder([x, None], positions, mask, cache=cache, cache_pos=p, attend_cache=True).vlm


def teacher_forced(cfg: ModelConfig, pred: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
    """What the state token reads in training: the recorded positions plus N(0, noise^2), or per
    sample with probability 1 - ``teacher_forcing`` the head's own prediction ``pred`` [B, G].
    -> (fed [B, G], target fp32 [B, G])."""
    target = batch["env_state"].float()
    forced = target + cfg.grounding.noise * torch.randn_like(target)
    tf = cfg.grounding.teacher_forcing
    if tf < 1:
        forced = torch.where(torch.rand(pred.shape[0], 1, device=pred.device) < tf, forced, pred)
    return forced, target


def add_grounding_losses(
    cfg: ModelConfig, out: dict[str, Tensor], aux: tuple[Tensor, Tensor, Tensor], batch: Batch, name: str
) -> dict[str, Tensor]:
    """``out["loss"]`` (the head's own, kept as ``out[name]``) plus ``grounding.weight`` x the
    regression MSE and ``grounding.attend_weight`` x ``attention_loss``; aux = (prediction [B, G],
    attention [B, K, image tokens], target [B, G])."""
    g = cfg.grounding
    pred, look, target = aux
    ground = (pred - target).pow(2).mean()
    out.update({name: out["loss"], "grounding_loss": ground, "loss": out["loss"] + g.weight * ground})
    if g.attend_weight:
        grid = cfg.vision.image_size // cfg.vision.patch_size
        attend = attention_loss(look, batch["env_uv"], grid)
        out.update(attend_loss=attend, loss=out["loss"] + g.attend_weight * attend)
    return out
