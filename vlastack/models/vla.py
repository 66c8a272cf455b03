"""The VLA: SigLIP encoder -> linear projector -> Gemma decoder (+ action expert) -> action head.

    model = build_model(cfg.model)
    out = model(batch)                      # {"loss": ...} for training
    actions = model.sample_actions(batch)   # [B, H, A], normalized action space
    model.save_pretrained("ckpt/"); model = VLA.from_pretrained("ckpt/")

The head is chosen by ``cfg.head``: "flow" (Pi0 flow matching with an action expert) or "tokens"
(discrete action tokens from the VLM's own LM head). Both share ``embed_prefix``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from einops import rearrange, repeat
from safetensors.torch import save_file
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig, model_config_from_dict, to_dict
from vlastack.fileio import load_safetensors, read_json
from vlastack.models.gemma import JointDecoder
from vlastack.models.pi0 import FlowHead
from vlastack.models.siglip import SiglipEncoder, preprocess_images
from vlastack.nn.kv_cache import StaticKVCache

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


class VLA(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        v = cfg.vision
        self.vision = SiglipEncoder(
            v.image_size, v.patch_size, v.width, v.depth, v.heads, v.mlp_dim, v.norm_eps
        )
        self.projector = nn.Linear(v.width, cfg.vlm.width)
        self.decoder = JointDecoder(cfg.vlm, cfg.expert if cfg.head == "flow" else None)
        if cfg.head == "flow":
            self.head: nn.Module = FlowHead(cfg)
            # Kept for PaliGemma import/export, but no flow loss can reach them; frozen so DDP does
            # not wait for their gradients and optimizers do not carry state for them.
            unused = self.decoder.unused_by_flow_head()
            if cfg.grounding.points and cfg.grounding_layer == cfg.vlm.depth - 1:
                unused = ["norm.weight"]  # the grounding head reads the last layer's (pre-norm) output
            for name in unused:
                self.decoder.get_parameter(name).requires_grad_(False)
        else:
            from vlastack.models.token_head import TokenHead

            self.head = TokenHead(cfg)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, std: float = 0.02) -> None:
        """LeCun-normal init, N(0, 1/fan_in), for linear and conv weights (the flax default that
        big_vision's SigLIP and openpi train with); N(0, ``std``) for embeddings; zero biases.

        For the 2048-wide pi0 shapes this is close to N(0, 0.02), but narrow presets and small
        inputs (state, actions, patch pixels) need it: with N(0, 0.02) the tiny preset's patch
        content started at a quarter of the position table's scale, and its state and action
        projections 17x below unit gain. On the demo's reach task it trained to a lower loss
        (0.627 vs 0.682 after 1500 steps).
        """
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Conv2d | nn.Embedding) and m.weight.device.type != "meta":
                fan_in = m.weight[0].numel()
                nn.init.normal_(m.weight, std=std if isinstance(m, nn.Embedding) else fan_in**-0.5)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        self.vision.init_position_embedding()

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

    def forward(self, batch: Batch, **kwargs) -> dict[str, Tensor]:
        """Training loss. -> {"loss": scalar fp32, ...}."""
        return self.head.loss(self, batch, **kwargs)

    @torch.no_grad()
    def sample_actions(
        self,
        batch: Batch,
        noise: Tensor | None = None,
        num_steps: int | None = None,
        cache: StaticKVCache | None = None,
    ) -> Tensor:
        """-> normalized action chunk fp32 [B, H, A]. ``cache``: a reusable ``StaticKVCache``
        (flow head only; see ``FlowHead.new_cache``), else a fresh one per call."""
        kw = {} if cache is None else {"cache": cache}
        return self.head.sample(self, batch, noise=noise, num_steps=num_steps, **kw)

    def num_params(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    # ------------------------------------------------------------------ persistence

    def save_pretrained(self, path: str | Path) -> None:
        """Folder of ``model.safetensors`` + ``config.json`` (the model config). No pickle."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        tmp = path / (WEIGHTS_NAME + ".tmp")
        save_file(state, str(tmp), metadata={"format": "pt"})
        tmp.replace(path / WEIGHTS_NAME)
        (path / CONFIG_NAME).write_text(json.dumps({"model": to_dict(self.cfg)}, indent=2))
        if hasattr(self.head, "save_extra"):  # e.g. the token head's action_tokenizer/
            self.head.save_extra(path)

    @classmethod
    def from_pretrained(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
    ) -> VLA:
        path = Path(path)
        if not (path / CONFIG_NAME).exists() or not (path / WEIGHTS_NAME).exists():
            raise ValueError(
                f"{path} is not a vlastack model folder (needs {CONFIG_NAME} and {WEIGHTS_NAME})"
            )
        data = read_json(path / CONFIG_NAME)
        cfg = model_config_from_dict(data.get("model", data))
        with torch.device("meta"):
            model = cls(cfg)
        state = load_safetensors(path / WEIGHTS_NAME, device=str(device))
        if dtype is not None:
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
        if missing or unexpected:
            raise ValueError(
                f"{path}: weights do not match the config: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        model = model.to(device)
        if hasattr(model.head, "load_extra"):
            model.head.load_extra(path)
        return model


def build_model(cfg: ModelConfig, device: str | torch.device = "cpu") -> VLA:
    with torch.device(device):
        return VLA(cfg)
