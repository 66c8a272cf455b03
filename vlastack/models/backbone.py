"""The backbone every action head reads: SigLIP encoder -> linear projector -> Gemma decoder.

    prefix, pad = backbone.embed_prefix(batch)            # [B, P, Wv], bool [B, P]
    out = backbone.decoder([prefix, suffix], positions, mask, cond=[None, c])   # DecoderOutput

Heads (``models/heads/``) take a ``Backbone`` and import only this module; ``VLA`` is a backbone
plus a head. The decoder carries an action expert (Pi0's "mixture of transformers") when the head
asks for one, and with ``model.head_options.variant='pi05'`` the expert's norms are adaptive (``AdaRMSNorm``).
"""

from __future__ import annotations

import torch
from einops import rearrange, repeat
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.models.gemma import JointDecoder
from vlastack.models.siglip import SiglipEncoder, preprocess_images
from vlastack.nn.attention import block_causal_mask


def prefix_layout(prefix_pad: Tensor, starts: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Mask and positions of the prefix followed by T extra tokens (never padding), the one recipe
    every head uses to put its own tokens through the decoder after [images | text].

    ``prefix_pad`` bool [B, P]: the prefix is one bidirectional block; ``starts`` bool [T] (None:
    T = 0): True where an extra token opens a new block (a block sees itself and every block
    before it). -> (pad bool [B, P+T], block-causal mask bool [B, 1, P+T, P+T], positions long
    [B, P+T], counting real tokens only so a padded prompt's extra tokens sit right after its text).
    """
    b, p = prefix_pad.shape
    starts = prefix_pad.new_zeros(0) if starts is None else starts
    pad = torch.cat([prefix_pad, prefix_pad.new_ones(b, starts.shape[0])], dim=1)
    mask = block_causal_mask(pad, torch.cat([prefix_pad.new_zeros(p), starts.to(torch.bool)]))
    return pad, mask, pad.long().cumsum(-1) - 1


class Backbone(nn.Module):
    """Vision encoder, projector and joint decoder. ``expert``: build the action expert."""

    def __init__(self, cfg: ModelConfig, expert: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        v = cfg.vision
        self.vision = SiglipEncoder(
            v.image_size, v.patch_size, v.width, v.depth, v.heads, v.mlp_dim, v.norm_eps
        )
        self.projector = nn.Linear(v.width, cfg.vlm.width)
        cond_dim = cfg.expert.width if (expert and cfg.adarms) else None
        self.decoder = JointDecoder(cfg.vlm, cfg.expert if expert else None, expert_cond_dim=cond_dim)

    def embed_prefix(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """-> prefix tokens [B, P, Wv] (P = N*patches + L) and their pad mask bool [B, P].

        Image tokens are the projected SigLIP features (not scaled); text tokens are embeddings
        scaled by sqrt(Wv). A missing camera's tokens are masked out rather than dropped, so the
        prefix length is fixed.
        """
        images = preprocess_images(batch["images"])
        b = images.shape[0]
        feats = self.vision(rearrange(images, "b n c h w -> (b n) c h w"))
        img = rearrange(self.projector(feats), "(b n) p w -> b (n p) w", b=b)
        img_pad = repeat(batch["image_mask"], "b n -> b (n p)", p=self.vision.num_patches)
        txt = self.decoder.embed(batch["tokens"])
        prefix = torch.cat([img, txt.to(img.dtype)], dim=1)
        pad = torch.cat([img_pad, batch["token_mask"]], dim=1)
        assert prefix.shape[1] == self.cfg.prefix_len, (prefix.shape, self.cfg.prefix_len)
        return prefix, pad
