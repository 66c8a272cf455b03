"""Grounding add-on of the flow head: where are the objects the instruction names? (``model.grounding``)

The VLM prefix is [image tokens | text tokens]. The head pools the text tokens into one query per
point, scores every image token against it, and returns the softmax-weighted sum of a per-token
3-D position estimate, one per point. The score is a bilinear match between what the instruction
says and what each patch shows (for example a color word and a patch's color), and the value is
a linear function of the patch token, which carries its position embedding.

Why it exists: the tiny demo VLA learned to move to *an* object but picked the named one at chance
(binding), while the same model given the named object's position as input scored 90%. The
flow loss alone gives the binding only a weak, indirect signal. This head gets a direct one
(the recorded positions), and its output reaches the action expert the way the state does,
through the state token's input: ``GroundedFlowHead`` is the flow head with that input added.

The regression alone binds late: until the per-patch estimates are informative, it says nothing
about where to look, and the demo's binding formed anywhere from step ~1800 to past its last
step depending on the training seed (31% to 73% success). ``attention_loss`` (``grounding.attend_weight``) supervises the
attention directly with where the first camera images each point, recorded by the simulator; the
demo then binds by step ~1000-1250 on every seed tried.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from einops import einsum, rearrange
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.models.backbone import Backbone
from vlastack.models.heads.flow import FlowHead
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


class GroundedFlowHead(FlowHead):
    """The flow head with a ``GroundingHead``: the state token reads [state | grounding], where
    grounding is the head's prediction from the prefix (sampling) or the recorded positions plus
    noise (training, with probability ``teacher_forcing``). Training adds the head's regression
    loss (``weight``) and, with ``attend_weight``, a loss on where it looks (``attention_loss``).

    Weights: ``head.grounding.*`` beside the flow head's, and ``head.state_proj`` takes S + 3K
    inputs; the same names and order as before the add-on was split out of ``FlowHead``.
    """

    def loss_draws(
        self, batch_size: int, actions_shape: tuple[int, ...], generator: torch.Generator
    ) -> dict | None:
        return None  # its loss also draws teacher-forcing noise: each rank draws its own

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        g = cfg.grounding
        self.grounding = GroundingHead(
            cfg.vlm.width, cfg.num_cameras * cfg.vision.num_patches, g.points, g.key_dim, eps=cfg.vlm.norm_eps
        )
        # Register the grounding head first, as checkpoints and the seeded init (which visits
        # modules in order) had it when it lived inside FlowHead.
        self._modules = {"grounding": self._modules.pop("grounding"), **self._modules}

    @property
    def state_extra_dim(self) -> int:
        return self.cfg.grounding.dim

    def frozen_backbone_params(self, backbone: Backbone) -> list[str]:
        if self.cfg.grounding_layer == self.cfg.vlm.depth - 1:
            return ["decoder.norm.weight"]  # the grounding head reads the last layer's (pre-norm) output
        return super().frozen_backbone_params(backbone)

    def prefill_kw(self) -> dict[str, Any]:
        layer = self.cfg.grounding_layer
        return {"vlm_output": layer == self.cfg.vlm.depth - 1, "vlm_hidden_at": layer}

    def condition_state(self, state: Tensor, hidden: Tensor | None, prefix_pad: Tensor) -> Tensor:
        """state [B, S] -> [B, S + G]: the grounding prediction appended."""
        return torch.cat([state, self.grounding(hidden, prefix_pad).to(state.dtype)], dim=-1)

    def uncached_state(self, backbone: Backbone, prefix: Tensor, prefix_pad: Tensor, state: Tensor) -> Tensor:
        return self.condition_state(state, self.prefill_prefix(backbone, prefix, prefix_pad)[3], prefix_pad)

    def predict_grounding(self, backbone: Backbone, batch: Batch) -> Tensor:
        """The grounding head's prediction, normalized units. -> fp32 [B, G]."""
        prefix, pad = backbone.embed_prefix(batch)
        return self.grounding(self.prefill_prefix(backbone, prefix, pad)[3], pad)

    def train_velocity(
        self, backbone: Backbone, batch: Batch, prefix: Tensor, prefix_pad: Tensor, x_t: Tensor, t: Tensor
    ) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        """Teacher forcing: the recorded positions plus N(0, noise^2) ->
        (v fp32 [B, H, A], (prediction [B, G], attention [B, K, image tokens], target [B, G]))."""
        target = batch["env_state"].float()
        forced = target + self.cfg.grounding.noise * torch.randn_like(target)
        v, pred, look = self.velocity_grounded(backbone, prefix, prefix_pad, batch["state"], forced, x_t, t)
        return v, (pred, look, target)

    def velocity_grounded(
        self,
        backbone: Backbone,
        prefix: Tensor,
        prefix_pad: Tensor,
        state: Tensor,
        forced: Tensor,
        x_t: Tensor,
        t: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Training with grounding: the prefix runs first, into a cache (with gradients), then the
        suffix against it, as in sampling. The same math as the joint pass, and 8% faster on the
        demo model, since prefix queries skip the suffix keys. The state token gets ``forced``
        [B, G], or per sample with probability 1 - ``teacher_forcing`` the head's own prediction.
        -> (v fp32 [B, H, A], prediction fp32 [B, G], the head's attention fp32 [B, K, image tokens])."""
        cache, positions, mask, hidden = self.prefill_prefix(backbone, prefix, prefix_pad)
        pred, look = self.grounding.attend(hidden, prefix_pad)
        fed, tf = forced, self.cfg.grounding.teacher_forcing
        if tf < 1:
            fed = torch.where(torch.rand(pred.shape[0], 1, device=pred.device) < tf, forced, pred)
        state = torch.cat([state, fed.to(state.dtype)], dim=-1)
        return self.denoise_step(backbone, cache, state, x_t, t, positions, mask), pred, look

    def extra_losses(self, out: dict[str, Tensor], aux: Any, batch: Batch) -> dict[str, Tensor]:
        g = self.cfg.grounding
        pred, look, target = aux
        loss = out["loss"]
        ground = (pred - target).pow(2).mean()
        out.update(flow_loss=loss, grounding_loss=ground, loss=loss + g.weight * ground)
        if g.attend_weight:
            grid = self.cfg.vision.image_size // self.cfg.vision.patch_size
            attend = attention_loss(look, batch["env_uv"], grid)
            out.update(attend_loss=attend, loss=out["loss"] + g.attend_weight * attend)
        return out


def predict_grounding(model: Backbone, batch: Batch) -> Tensor:
    """``model``'s grounding prediction (normalized units, fp32 [B, G]); ValueError without one."""
    if not model.cfg.grounding.points:
        raise ValueError("this model has no grounding head (model.grounding.points is 0)")
    return model.head.predict_grounding(model, batch)
