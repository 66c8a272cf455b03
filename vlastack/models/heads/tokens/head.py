"""Discrete action-token head: RT-2/OpenVLA bins or pi0-FAST tokens from the VLM's own LM head.

Sequence: ``[images | text | state] [a_0 ... a_{L-1}]``. The prompt (images, text, state: one
continuous token or one discrete token per dim) is one bidirectional block; the action tokens are
causal (prefix-LM) and trained with cross-entropy (fp32 logits) on the action targets only. FAST
sequences end with the text tokenizer's EOS; bins have a fixed length and no end token.

Decoding: ``autoregressive`` prefills the prompt into a static KV cache once, then writes one token
per step by index for a fixed number of steps (tokens after the end are masked, no host sync in
the loop). ``parallel`` (OpenVLA-OFT, bins only) fills every action position with a learned query
embedding and predicts all of them in one pass (one bidirectional action block), optionally with
an L1 regression head for continuous output.

The action tokenizer covers the real (leading) action dims; padded dims decode to 0. It is fitted
before training with ``fit_tokenizer`` and saved beside the weights (``action_tokenizer/``).
``sample`` returns validity flags with the actions (an invalid FAST sequence gives a zero chunk
flagged False, never a silent zero action).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vlastack.batch import Batch
from vlastack.config import ModelConfig
from vlastack.models.action_tokens import ActionTokenizer, load_action_tokenizer, make_action_tokenizer
from vlastack.models.backbone import Backbone, prefix_layout
from vlastack.models.heads.base import ActionHead, ActionOutput, HeadBase
from vlastack.models.tokenizer import load_tokenizer
from vlastack.nn.kv_cache import StaticKVCache

TOKENIZER_DIR = "action_tokenizer"
HEAD_FILE = "token_head.json"


def hold_last_step(actions: Tensor, is_pad: Tensor) -> Tensor:
    """actions [B, H, A], is_pad [B, H] -> [B, H, A] where each padded step repeats the latest real
    one, so padded values never reach the tokens and a FAST chunk stays smooth."""
    h = actions.shape[1]
    steps = torch.arange(h, device=actions.device).expand_as(is_pad)
    src = torch.where(is_pad, torch.zeros_like(steps), steps).cummax(dim=1).values
    return actions.gather(1, src[:, :, None].expand_as(actions))


class TokenHead(HeadBase):
    """State/new-row embeddings, OFT queries and regression head, plus loss and decoders."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg, tc, w = cfg, cfg.head_options, cfg.vlm.width
        if tc.sequence == "pi0_fast":
            pass  # the state is written into the prompt text (infer/preprocess.py)
        elif tc.state_input == "continuous":
            self.state_proj = nn.Linear(cfg.state_dim, w)
        else:
            self.state_embed = nn.Embedding(tc.state_bins, w)
        n_ids = tc.num_bins if tc.tokenizer == "bins" else tc.fast_vocab_size
        # 'new_rows' placement: action ids vocab_size.. live here, so the text embedding (and its
        # PaliGemma import/export) keeps its shape; logits concatenate both tables (tied).
        self.new_rows = nn.Embedding(n_ids, w) if tc.placement == "new_rows" else None
        if tc.decoding == "parallel":
            self.action_queries = nn.Embedding(cfg.action_horizon * cfg.action_dim, w)
        self.regression = nn.Linear(w, 1) if tc.regression_head else None
        # pi0-FAST: LeRobot's PaliGemma keeps its LM head apart from the (text) embedding.
        self.lm_head = nn.Linear(w, cfg.vlm.vocab_size, bias=False) if tc.sequence == "pi0_fast" else None
        self._tokenizer: ActionTokenizer | None = None
        self.register_buffer("ordinal", None, persistent=False)  # set with the tokenizer
        self.end_id: int | None = None
        # pi0-FAST layout: the text ids the model writes before the FAST ids ("Action: ") and the
        # id that closes the prompt block (<bos>); set with the tokenizer (save_extra/load_extra).
        self.prefix_ids: list[int] = []
        self.bos_id: int | None = None
        self.require_prefix = True  # a sequence not starting with the prefix is invalid

    # ------------------------------------------------------------------ tokenizer

    @property
    def tokenizer(self) -> ActionTokenizer:
        """The attached action tokenizer; bins are built on first use (over all action dims)."""
        if self._tokenizer is None:
            if self.cfg.head_options.tokenizer != "bins":
                raise ValueError(
                    "the FAST action tokenizer is not fitted: call model.head.fit_tokenizer(chunks) "
                    "(or fit_tokenizer_from_batches(loader)) before training, or load a checkpoint "
                    f"that has {TOKENIZER_DIR}/"
                )
            self.attach_tokenizer(self._new_tokenizer(self.cfg.action_dim))
        return self._tokenizer

    def _new_tokenizer(self, action_dim: int) -> ActionTokenizer:
        text = load_tokenizer(self.cfg.tokenizer)
        specials = [i for i in (text.pad_id, text.bos_id, text.eos_id) if i >= 0]
        self.end_id = text.eos_id if self.cfg.head_options.tokenizer == "fast" else None
        if self.cfg.head_options.tokenizer == "fast" and text.eos_id < 0:
            raise ValueError(f"model.tokenizer={self.cfg.tokenizer!r} has no EOS id to end FAST sequences")
        c = self.cfg
        return make_action_tokenizer(c.head_options, c.vlm.vocab_size, c.action_horizon, action_dim, specials)

    def attach_tokenizer(self, tok: ActionTokenizer) -> None:
        """Use ``tok`` (fitted); registers its id tables as non-persistent buffers on this device."""
        c, tc = self.cfg, self.cfg.head_options
        pl = tok.placement
        if (
            (tok.family or tok.kind) != tc.tokenizer
            or pl.strategy != tc.placement
            or pl.vocab_size != c.vlm.vocab_size
        ):
            raise ValueError(
                f"action tokenizer ({tok.kind}, {pl.strategy}, LM vocab {pl.vocab_size}) does not match "
                f"model.tokens ({tc.tokenizer}, {tc.placement}, LM vocab {c.vlm.vocab_size})"
            )
        if tok.horizon != c.action_horizon or not 0 < tok.action_dim <= c.action_dim:
            raise ValueError(
                f"action tokenizer is for [{tok.horizon}, {tok.action_dim}] chunks, the model predicts "
                f"[{c.action_horizon}, {c.action_dim}]"
            )
        if tc.tokenizer == "fast" and self.end_id is None:
            raise ValueError("FAST needs an end id; set head.end_id before attaching")
        tok._require_fitted()
        n_used = tok.bpe_vocab_size if (tok.family or tok.kind) == "fast" else pl.n
        vocab = c.vlm.vocab_size + (self.new_rows.num_embeddings if self.new_rows is not None else 0)
        assert pl.required_vocab_size <= vocab, (pl.required_vocab_size, vocab)
        allowed = torch.zeros(vocab, dtype=torch.bool)
        allowed[torch.from_numpy(pl.ids[:n_used])] = True
        if self.end_id is not None:
            allowed[self.end_id] = True
        allowed[self.prefix_ids] = True
        inverse = torch.full((vocab,), -1, dtype=torch.long)
        inverse[torch.from_numpy(pl.ids)] = torch.arange(pl.n)
        # Symbols each LM id writes (0 outside the action ids): length-constrained FAST decoding.
        lengths = tok.piece_lengths()
        piece_len = torch.zeros(vocab, dtype=torch.long)
        if lengths is not None:
            piece_len[torch.from_numpy(pl.ids)] = torch.from_numpy(lengths)
        self.chunk_symbols = tok.horizon * tok.action_dim if lengths is not None else 0
        device = next(self.parameters()).device
        self.register_buffer("piece_len", piece_len.to(device), persistent=False)
        is_end = torch.zeros(vocab, dtype=torch.bool)
        if self.end_id is not None:
            is_end[self.end_id] = True
        self.register_buffer("is_end", is_end.to(device), persistent=False)
        self.register_buffer("allowed_ids", allowed.to(device), persistent=False)
        self.register_buffer("lm_to_internal", inverse.to(device), persistent=False)
        self.register_buffer("internal_to_lm", torch.from_numpy(pl.ids).to(device), persistent=False)
        values = tok.ordinal_values()
        ordinal = None if values is None else torch.from_numpy(values).float().to(device)
        self.register_buffer("ordinal", ordinal, persistent=False)  # for bin_sigma
        if tc.bin_sigma > 0 and values is None:
            warnings.warn(
                f"model.head_options.bin_sigma={tc.bin_sigma} has no effect: this {tok.kind} tokenizer's "
                "ids are BPE pieces of several coefficients, which have no order (FAST without merges, "
                "fast_vocab_size = its alphabet, takes it); set bin_sigma=0",
                stacklevel=2,
            )
        self._tokenizer = tok

    def fit_tokenizer(
        self,
        chunks: np.ndarray | Tensor,
        action_is_pad: np.ndarray | Tensor | None = None,
        action_dim_mask: np.ndarray | Tensor | None = None,
    ) -> ActionTokenizer:
        """Fit (FAST) / size (bins) the tokenizer on normalized training chunks [N, H, A], attach it.

        ``action_is_pad`` [N, H] and ``action_dim_mask`` [N, A] or [A] as in the batch; the real
        dims must be the same leading dims for every chunk.
        """
        x = torch.as_tensor(np.asarray(chunks), dtype=torch.float64)
        if x.ndim != 3 or x.shape[1:] != (self.cfg.action_horizon, self.cfg.action_dim):
            raise ValueError(
                f"chunks must be [N, {self.cfg.action_horizon}, {self.cfg.action_dim}], got {tuple(x.shape)}"
            )
        n_real = self.cfg.action_dim
        if action_dim_mask is not None:
            m = torch.as_tensor(np.asarray(action_dim_mask), dtype=torch.bool).reshape(-1, x.shape[2])
            n_real = int(m[0].sum())
            if not (m == (torch.arange(x.shape[2]) < n_real)).all() or n_real == 0:
                raise ValueError("action_dim_mask must mark the same leading dims of every chunk as real")
        if action_is_pad is not None:
            x = hold_last_step(x, torch.as_tensor(np.asarray(action_is_pad), dtype=torch.bool))
        x = x[:, :, :n_real].clamp(-1, 1).numpy()
        tok = self._new_tokenizer(n_real).fit(x)
        if tok.fixed_length is None:
            lengths = np.array([len(t) for t in tok.encode_batch(x)])
            if lengths.max() > self.cfg.head_options.max_action_tokens:
                raise ValueError(
                    f"FAST chunks need up to {lengths.max()} tokens (p99 {np.percentile(lengths, 99):.0f}) "
                    f"but model.head_options.max_action_tokens={self.cfg.head_options.max_action_tokens}; raise it "
                    "or lower model.head_options.fast_scale"
                )
        self.attach_tokenizer(tok)
        return tok

    def fit_tokenizer_from_batches(
        self, batches: Iterable[Batch], max_chunks: int = 10_000
    ) -> ActionTokenizer:
        """``fit_tokenizer`` on the actions of training batches (e.g. a DataLoader), up to max_chunks."""
        acts, pads, dims, n = [], [], [], 0
        for b in batches:
            acts.append(b["actions"].float().cpu()), pads.append(b["action_is_pad"].cpu())
            dims.append(b["action_dim_mask"].cpu())
            n += len(acts[-1])
            if n >= max_chunks:
                break
        if not acts:
            raise ValueError("fit_tokenizer_from_batches got no batches")
        cat = [torch.cat(t)[:max_chunks] for t in (acts, pads, dims)]
        return self.fit_tokenizer(*cat)

    def prepare(self, dataset: Any, max_chunks: int = 10_000) -> None:
        """Fit (FAST) or size (bins) the action tokenizer on the first ``max_chunks`` training
        chunks, in dataset order, so every rank and every resume fits the same tokenizer. A tokenizer
        already attached (fine-tuning from a checkpoint, e.g. an imported pi0-FAST) is kept: its
        token ids are what the weights learned."""
        if self._tokenizer is not None:
            return
        loader = torch.utils.data.DataLoader(dataset, batch_size=256, shuffle=False, num_workers=0)
        self.fit_tokenizer_from_batches(loader, max_chunks=max_chunks)

    def copy_extra_from(self, other: ActionHead) -> None:
        """The fitted action tokenizer is saved with the weights: carry it to an exported copy."""
        assert isinstance(other, TokenHead)
        if other._tokenizer is None:
            return  # nothing fitted or loaded yet (bins build the same one lazily)
        self.end_id, self.bos_id, self.prefix_ids = other.end_id, other.bos_id, list(other.prefix_ids)
        self.require_prefix = other.require_prefix
        self.attach_tokenizer(other.tokenizer)

    def check_exportable(self) -> None:
        if self.cfg.head_options.tokenizer == "fast":
            raise ValueError(
                "a FAST token head cannot be exported: its tokens are decoded by BPE + inverse DCT in "
                "Python. Export the flow head or a bins token head (autoregressive or parallel)."
            )

    def save_extra(self, path: Path) -> None:
        """Called by ``VLA.save_pretrained``: writes ``action_tokenizer/`` (if one is attached/buildable)."""
        if self._tokenizer is None and self.cfg.head_options.tokenizer != "bins":
            return  # an unfitted FAST head has nothing to save
        d = self.tokenizer.save(Path(path) / TOKENIZER_DIR)
        ids = {"end_id": self.end_id, "prefix_ids": self.prefix_ids, "bos_id": self.bos_id,
               "require_prefix": self.require_prefix}  # fmt: skip
        (d / HEAD_FILE).write_text(json.dumps(ids) + "\n")

    def load_extra(self, path: Path) -> None:
        """Called by ``VLA.from_pretrained``: attaches ``action_tokenizer/`` when present."""
        d = Path(path) / TOKENIZER_DIR
        if d.is_dir():
            ids = json.loads((d / HEAD_FILE).read_text())
            self.end_id, self.bos_id = ids["end_id"], ids.get("bos_id")
            self.prefix_ids = list(ids.get("prefix_ids", []))
            self.require_prefix = bool(ids.get("require_prefix", True))
            self.attach_tokenizer(load_action_tokenizer(d))

    # ------------------------------------------------------------------ embeddings

    @property
    def num_steps(self) -> int:
        """Decode length: H*A_real for bins, max_action_tokens + 1 (end) for FAST (+ the pi0-FAST
        prefix), capped at ``model.head_options.max_decode_steps`` when that is set."""
        fixed = self.tokenizer.fixed_length
        need = (
            fixed if fixed is not None else len(self.prefix_ids) + self.cfg.head_options.max_action_tokens + 1
        )
        cap = self.cfg.head_options.max_decode_steps
        return min(need, cap) if cap else need

    def _pi0_fast_prompt(self, backbone: Backbone, batch: Batch) -> tuple[Tensor, Tensor]:
        """pi0-FAST's prompt block: [images | text (state included) | <bos>], one bidirectional block
        (LeRobot's ``sample_actions_fast_kv_cache`` appends <bos> after the padded text)."""
        if self.bos_id is None:
            raise ValueError("the pi0_fast layout needs head.bos_id (set when its tokenizer is attached)")
        prefix, pad = backbone.embed_prefix(batch)
        b = pad.shape[0]
        bos = self.embed_ids(backbone, torch.full((b, 1), self.bos_id, dtype=torch.long, device=pad.device))
        return torch.cat([prefix, bos.to(prefix.dtype)], dim=1), torch.cat([pad, pad.new_ones(b, 1)], dim=1)

    def embed_ids(self, backbone: Backbone, ids: Tensor) -> Tensor:
        """LM ids [B, T] (including new rows) -> [B, T, W], scaled like text embeddings."""
        v = self.cfg.vlm.vocab_size
        base = backbone.decoder.embed(ids.clamp(max=v - 1))
        if self.new_rows is None:
            return base
        extra = self.new_rows((ids - v).clamp(min=0)) * math.sqrt(self.cfg.vlm.width)
        return torch.where((ids >= v)[..., None], extra.to(base.dtype), base)

    def logits(self, backbone: Backbone, h: Tensor) -> Tensor:
        """Final hidden states [..., W] -> fp32 logits [..., vocab (+ new rows)]."""
        if self.lm_head is not None:
            return (h @ self.lm_head.weight.t().to(h.dtype)).float()
        out = backbone.decoder.logits(h)
        if self.new_rows is None:
            return out
        return torch.cat([out, (h @ self.new_rows.weight.t().to(h.dtype)).float()], dim=-1)

    def embed_prompt(self, backbone: Backbone, batch: Batch) -> tuple[Tensor, Tensor]:
        """-> prompt [B, P', W] (images, text, state tokens) and its pad mask bool [B, P']."""
        if self.cfg.head_options.sequence == "pi0_fast":
            return self._pi0_fast_prompt(backbone, batch)
        prefix, pad = backbone.embed_prefix(batch)
        state = batch["state"]
        if self.cfg.head_options.state_input == "continuous":
            st = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None]
        else:
            nb = self.cfg.head_options.state_bins
            bins = ((state.float().clamp(-1, 1) + 1) * (nb / 2)).floor().long().clamp(0, nb - 1)
            st = self.state_embed(bins) * math.sqrt(self.cfg.vlm.width)
        prompt = torch.cat([prefix, st.to(prefix.dtype)], dim=1)
        return prompt, torch.cat([pad, pad.new_ones(st.shape[:2])], dim=1)

    # ------------------------------------------------------------------ training

    def targets(self, batch: Batch) -> tuple[Tensor, Tensor, Tensor]:
        """-> action-token targets int64 [B, L], loss weights fp32 [B, L], real-dim chunk [B, H, A_real]."""
        tok = self.tokenizer
        ad = tok.action_dim
        dim_mask = batch["action_dim_mask"]
        if not torch.compiler.is_compiling() and bool(dim_mask[:, ad:].any()):
            raise ValueError(
                f"the action tokenizer covers {ad} action dims but the batch has more real dims; "
                "fit it on this data (model.head.fit_tokenizer)"
            )
        is_pad = batch["action_is_pad"]
        acts = torch.where(dim_mask[:, None, :], batch["actions"].float(), 0.0)
        acts = hold_last_step(acts, is_pad)[:, :, :ad]
        acts = acts.clamp(-1, 1) if tok.clip_output else acts  # pi0-FAST (MEAN_STD) is not clipped
        if "action_token_ids" in batch:  # FAST's BPE ran before the step (host_inputs)
            return batch["action_token_ids"], batch["action_token_weight"], acts
        b = is_pad.shape[0]
        if tok.fixed_length is not None:  # bins, in torch (same formula as BinTokenizer, fp64)
            nb = tok.num_bins
            q = ((acts.double() + 1.0) * (nb / 2.0)).floor().long().clamp(0, nb - 1)
            ids = self.internal_to_lm[q.reshape(b, -1)]
            weight = (~is_pad)[:, :, None] & dim_mask[:, None, :ad]
            return ids, weight.reshape(b, -1).float(), acts
        seqs = tok.encode_batch(acts.detach().cpu().numpy())
        if self.prefix_ids:  # pi0-FAST writes "Action: " before the FAST ids
            seqs = [np.concatenate([np.asarray(self.prefix_ids, dtype=np.int64), s]) for s in seqs]
        length = self.num_steps
        ids = torch.full((b, length), self.end_id, dtype=torch.long)
        weight = torch.zeros(b, length)
        for i, s in enumerate(seqs):
            n = min(len(s), length - 1)  # an over-long sequence is cut and gets no end token
            ids[i, :n] = torch.from_numpy(s[:n])
            weight[i, : n + 1 if len(s) < length else n] = 1.0
        return ids.to(acts.device), weight.to(acts.device), acts

    def host_inputs(self, batch: Batch) -> dict[str, Tensor]:
        """FAST: the BPE token ids and loss weights of the batch's chunks [B, L] (the tokenizer
        runs in numpy, which a fullgraph-compiled step cannot hold); bins need nothing."""
        if self.tokenizer.fixed_length is not None or "action_token_ids" in batch:
            return {}
        ids, weight, _ = self.targets(batch)
        return {"action_token_ids": ids, "action_token_weight": weight}

    def _run(self, backbone: Backbone, batch: Batch, actions_in: Tensor, causal: bool) -> Tensor:
        """Prompt + action-position inputs [B, T, W] through the LM -> hidden [B, T + 1, W] from
        the last prompt position on."""
        prompt, pad = self.embed_prompt(backbone, batch)
        p = pad.shape[1]
        t = actions_in.shape[1]
        # Causal: every action position starts its own block; parallel: one block for all of them.
        starts = torch.zeros(t, dtype=torch.bool, device=pad.device)
        if causal:
            starts[:] = True
        else:
            starts[0] = True
        _, mask, positions = prefix_layout(pad, starts)
        h = backbone.decoder(
            [torch.cat([prompt, actions_in.to(prompt.dtype)], dim=1), None], positions, mask
        ).vlm
        return h[:, p - 1 :]

    def train_run(
        self, backbone: Backbone, batch: Batch, actions_in: Tensor, causal: bool
    ) -> tuple[Tensor, Any]:
        """Training forward: ``_run`` -> (hidden [B, T + 1, W], whatever ``extra_losses`` needs).
        An add-on (``grounded_tokens.py``) overrides both."""
        return self._run(backbone, batch, actions_in, causal), None

    def extra_losses(self, out: dict[str, Tensor], aux: Any, batch: Batch) -> dict[str, Tensor]:
        """Add an add-on's terms to the token loss ``out`` (``aux`` from ``train_run``)."""
        return out

    def token_ce(self, logits: Tensor, ids: Tensor) -> Tensor:
        """Per-token cross-entropy fp32 [B, L] of logits [B, L, V] against LM ids [B, L].

        ``tokens.bin_sigma`` > 0 with ordinal ids (bins; FAST without BPE merges, one id per
        quantized DCT coefficient): the target is a discretized Gaussian over the ids of
        neighbouring values (std in quantization steps) instead of one id, so a near miss costs
        less than a far one; 256-way one-hot targets treat bin 127 and bin 0 as equally wrong for
        a true bin 128. Targets that are not action ids (FAST's end id) stay one-hot.
        ``tokens.label_smoothing``: the usual uniform smoothing (over the whole vocabulary)."""
        tc = self.cfg.head_options
        logits = logits.float()
        if tc.bin_sigma > 0 and self.ordinal is not None:
            logp_all = logits.log_softmax(-1)
            logp = logp_all[..., self.internal_to_lm]  # [B, L, n]
            internal = self.lm_to_internal[ids]  # -1: not an action id
            q = self.ordinal[internal.clamp(min=0)]
            kernel = torch.exp(-0.5 * ((self.ordinal - q[..., None]) / tc.bin_sigma).pow(2))
            kernel = kernel / kernel.sum(-1, keepdim=True)
            soft = -(kernel * logp).sum(-1)
            if self.tokenizer.fixed_length is not None:
                return soft  # bins: every target is an action id
            hard = -logp_all.gather(-1, ids[..., None]).squeeze(-1)
            return torch.where(internal >= 0, soft, hard)
        b, length = ids.shape
        ce = F.cross_entropy(
            logits.flatten(0, 1), ids.flatten(), reduction="none", label_smoothing=tc.label_smoothing
        )
        return ce.view(b, length)

    def loss(self, backbone: Backbone, batch: Batch) -> dict[str, Tensor]:
        """Cross-entropy on the action tokens only (+ L1 when regression_head). -> {"loss", ...}."""
        ids, weight, acts = self.targets(batch)
        b, length = ids.shape
        if self.cfg.head_options.decoding == "parallel":
            queries = self.action_queries.weight[:length][None].expand(b, -1, -1)
            h, aux = self.train_run(backbone, batch, queries, causal=False)
            h = h[:, 1:]
        else:  # teacher forcing: position i predicts token i from the prompt and tokens < i
            h, aux = self.train_run(backbone, batch, self.embed_ids(backbone, ids[:, :-1]), causal=True)
        logits = self.logits(backbone, h)
        ce = self.token_ce(logits, ids)
        denom = weight.sum().clamp(min=1.0)
        loss_weight, loss_denom = weight, denom
        w0 = self.cfg.head_options.first_step_weight
        if w0 != 1.0:  # bins, step-major: ids [:A] are the first step's dims
            step = torch.ones(length, device=weight.device)
            step[: self.tokenizer.action_dim] = w0
            loss_weight = weight * step
            loss_denom = loss_weight.sum().clamp(min=1e-6)
        out = {"ce": (ce * loss_weight).sum() / loss_denom}
        with torch.no_grad():
            out["token_accuracy"] = ((logits.argmax(-1) == ids).float() * weight).sum() / denom
        out["loss"] = out["ce"]
        if self.regression is not None:
            pred = self.regression(h).squeeze(-1).float()
            l1 = (pred - acts.reshape(b, -1)).abs() * loss_weight
            out["l1"] = l1.sum() / loss_denom
            out["loss"] = out["loss"] + self.cfg.head_options.l1_weight * out["l1"]
        return self.extra_losses(out, aux, batch)

    # ------------------------------------------------------------------ decoding

    @property
    def length_constrained(self) -> bool:
        """FAST decoding keeps every sequence a full chunk (``constrained`` and ``exact_length``)."""
        tc = self.cfg.head_options
        return tc.constrained and tc.exact_length and getattr(self, "chunk_symbols", 0) > 0

    def pick(
        self,
        logits: Tensor,
        temperature: float = 0.0,
        top_p: float = 1.0,
        u: Tensor | None = None,
        written: Tensor | None = None,
    ) -> Tensor:
        """Logits [B, V] -> next ids [B]. Greedy at temperature 0; otherwise a sample at
        ``temperature`` from the top-p nucleus, by Gumbel-max over uniform noise ``u`` [B, V] (the
        caller draws it from its generator, outside any compiled graph; None: the global RNG).
        ``model.head_options.constrained``: only action ids, the end id and the pi0-FAST prefix; with
        ``exact_length`` and ``written`` [B] (symbols written so far), also only ids that keep the
        count <= H*A, and the end id exactly when it is H*A. Every symbol is a one-symbol piece of
        the BPE alphabet, so any remaining count stays reachable."""
        if self.cfg.head_options.constrained:
            allowed = self.allowed_ids[None]
            if written is not None and self.length_constrained:
                room = self.chunk_symbols - written[:, None]  # [B, 1]
                allowed = allowed & (self.piece_len[None] <= room)
                allowed = torch.where(self.is_end[None], room == 0, allowed)
            logits = logits.masked_fill(~allowed, float("-inf"))
        if temperature <= 0:
            return logits.argmax(-1)
        logits = logits.float() / temperature
        if top_p < 1.0:
            ranked, order = logits.sort(dim=-1, descending=True)
            probs = ranked.softmax(-1)
            # drop an id once the ids ranked above it hold top_p of the mass (the top one stays)
            drop = (probs.cumsum(-1) - probs) >= top_p
            logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        u = torch.rand_like(logits) if u is None else u
        return (logits - torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))).argmax(-1)

    def prefill(self, backbone: Backbone, batch: Batch) -> tuple[StaticKVCache, Tensor, Tensor, Tensor]:
        """Prompt into a fresh cache of P' + num_steps slots. -> (cache, logits [B, V] for token 0,
        prompt pad mask [B, P'], number of real prompt tokens [B])."""
        prompt, pad = self.embed_prompt(backbone, batch)
        b, p = pad.shape
        cache = backbone.decoder.new_cache(b, p + self.num_steps, prompt.dtype, prompt.device)
        _, mask, positions = prefix_layout(pad)
        out = backbone.decoder([prompt, None], positions, mask, cache=cache, cache_pos=0, attend_cache=False)
        h = out.vlm
        return cache, self.logits(backbone, h[:, -1]), pad, pad.long().sum(-1)

    def decode_step(
        self,
        backbone: Backbone,
        cache: StaticKVCache,
        prev: Tensor,
        done: Tensor,
        step: Tensor,
        pad: Tensor,
        n_valid: Tensor,
        temperature: float = 0.0,
        top_p: float = 1.0,
        u: Tensor | None = None,
        written: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Feed action token ``step`` (prev [B]) at cache slot P' + step (0-d LongTensor) and pick
        token step + 1 (``pick``; ``u`` [B, V] its sampling noise; ``written`` [B] the symbols
        written before it, for length-constrained FAST). done [B]: sequences past their end token,
        which keep emitting it. -> (next ids [B], done [B], written [B] after it). Fixed shapes, no
        host sync: compiles without graph breaks (tests/models/test_token_decoding.py)."""
        b, p = pad.shape
        x = self.embed_ids(backbone, prev[:, None])
        positions = (n_valid + step)[:, None]
        seen = torch.arange(cache.max_len - p, device=pad.device) <= step
        mask = torch.cat([pad, seen[None].expand(b, -1)], dim=1)[:, None, None, :]
        slot = (step + p).reshape(1)
        h = backbone.decoder([x, None], positions, mask, cache=cache, cache_pos=slot, attend_cache=True).vlm
        nxt = self.pick(self.logits(backbone, h[:, 0]), temperature, top_p, u, written)
        if self.end_id is None:
            return nxt, done, written
        nxt = torch.where(done, torch.full_like(nxt, self.end_id), nxt)
        return nxt, done | (nxt == self.end_id), self._count(written, nxt)

    def _count(self, written: Tensor | None, ids: Tensor) -> Tensor | None:
        """Symbols written after ``ids`` [B] (None when decoding is not length-constrained)."""
        return None if written is None else written + self.piece_len[ids]

    def generate(
        self,
        backbone: Backbone,
        batch: Batch,
        temperature: float | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Autoregressive decoding with the static cache, ``num_steps`` tokens (the hard cap).
        ``temperature`` / ``top_p``: None -> model.tokens'; sampling noise comes from ``generator``
        (seeded: same seed, same tokens) or the global RNG. -> ids int64 [B, num_steps], lengths [B]
        (tokens before the first end token)."""
        tc = self.cfg.head_options
        temp = tc.temperature if temperature is None else float(temperature)
        top_p = tc.top_p if top_p is None else float(top_p)
        if temp < 0 or not 0 < top_p <= 1:
            raise ValueError(f"need temperature >= 0 and top_p in (0, 1], got {temp}, {top_p}")
        cache, logits, pad, n_valid = self.prefill(backbone, batch)

        def noise() -> Tensor | None:
            return None if temp <= 0 else torch.rand(logits.shape, generator=generator, device=logits.device)

        written = torch.zeros_like(n_valid) if self.length_constrained else None
        tok = self.pick(logits, temp, top_p, noise(), written)
        written = self._count(written, tok)
        done = tok == self.end_id if self.end_id is not None else torch.zeros_like(tok, dtype=torch.bool)
        out = [tok]
        steps = torch.arange(self.num_steps, device=pad.device)
        for i in range(self.num_steps - 1):
            tok, done, written = self.decode_step(
                backbone, cache, tok, done, steps[i], pad, n_valid, temp, top_p, noise(), written
            )
            out.append(tok)
        return torch.stack(out, dim=1), self._lengths(torch.stack(out, dim=1))

    def _lengths(self, ids: Tensor) -> Tensor:
        if self.end_id is None:
            return torch.full(ids.shape[:1], ids.shape[1], dtype=torch.long, device=ids.device)
        is_end = ids == self.end_id
        first = is_end.long().argmax(-1)
        return torch.where(is_end.any(-1), first, torch.full_like(first, ids.shape[1]))

    def decode_actions(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """LM ids [B, T] + lengths [B] -> (actions fp32 [B, H, A] with padded dims 0, valid bool [B]).
        pi0-FAST: every "Action: " prefix is removed first (as LeRobot does); a row that does not
        start with it is invalid (LeRobot asserts) unless ``require_prefix`` is off."""
        tok = self.tokenizer
        b, c = ids.shape[0], self.cfg
        out = torch.zeros(b, c.action_horizon, c.action_dim, device=ids.device)
        if tok.fixed_length is not None:  # bins, in torch: no host sync
            internal = self.lm_to_internal[ids]
            valid = (internal >= 0).all(-1) & (lengths == tok.fixed_length)
            centers = -1.0 + (internal.clamp(min=0).float() + 0.5) * (2.0 / tok.num_bins)
            chunk = centers.view(b, c.action_horizon, tok.action_dim) * valid[:, None, None]
        else:
            rows, lens = ids.cpu().numpy(), lengths.cpu().numpy()
            started = np.ones(b, dtype=bool)
            if self.prefix_ids:
                rows, lens, started = strip_prefix(rows, lens, self.prefix_ids)
                started |= not self.require_prefix
            chunk, valid = tok.decode_batch(rows, lens)
            chunk, valid = torch.from_numpy(chunk), torch.from_numpy(valid & started)
            chunk, valid = (chunk * valid[:, None, None]).to(ids.device), valid.to(ids.device)
        out[:, :, : tok.action_dim] = chunk
        return out, valid

    def sample(
        self,
        backbone: Backbone,
        batch: Batch,
        noise: Tensor | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ) -> ActionOutput:
        """-> ActionOutput(normalized actions fp32 [B, H, A], valid bool [B]); an invalid row is
        zeros (Policy applies ``model.head_options.invalid_decode``). ``noise`` is a flow head's input and
        is ignored; decoding options as in ``generate``."""
        if self.cfg.head_options.decoding == "parallel":
            return ActionOutput(*self.sample_parallel(backbone, batch))
        return ActionOutput(
            *self.decode_actions(*self.generate(backbone, batch, temperature, top_p, generator))
        )

    def compile_decoding(self, **kwargs: Any) -> None:
        """torch.compile the hot part (fullgraph): the per-token decode step, or the one parallel
        pass. The Python loop, prefill and FAST's BPE decode stay eager."""
        kwargs = {"fullgraph": True, "dynamic": False, **kwargs}
        _ = self.tokenizer  # build/attach (bins) before tracing
        if self.cfg.head_options.decoding == "parallel":
            self.sample_parallel = torch.compile(self.sample_parallel, **kwargs)
        else:
            self.decode_step = torch.compile(self.decode_step, **kwargs)

    def sample_parallel(self, backbone: Backbone, batch: Batch) -> tuple[Tensor, Tensor]:
        """OFT: every action position in one forward pass. -> (actions [B, H, A], valid [B])."""
        b, length = batch["state"].shape[0], self.num_steps
        queries = self.action_queries.weight[:length][None].expand(b, -1, -1)
        h = self._run(backbone, batch, queries, causal=False)[:, 1:]
        ids = self.pick(self.logits(backbone, h), 0.0)
        actions, valid = self.decode_actions(ids, self._lengths(ids))
        if self.regression is not None:
            ad = self.tokenizer.action_dim
            pred = self.regression(h).float().view(b, self.cfg.action_horizon, ad).clamp(-1, 1)
            actions[:, :, :ad] = pred
        return actions, valid


def strip_prefix(
    ids: np.ndarray, lengths: np.ndarray, prefix: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """pi0-FAST: remove every occurrence of ``prefix`` ("Action: ") from each row's first
    ``lengths`` ids, scanning as LeRobot's ``detokenize_actions`` does. ids int64 [B, T], lengths
    [B] -> (ids [B, T], lengths [B], the row started with the prefix bool [B])."""
    out, new_len = np.zeros_like(ids), np.zeros_like(lengths)
    started = np.zeros(len(ids), dtype=bool)
    k = len(prefix)
    for r in range(len(ids)):
        seq = ids[r, : lengths[r]].tolist()
        started[r] = seq[:k] == prefix
        i = 0
        while i <= len(seq) - k:
            if seq[i : i + k] == prefix:
                seq = seq[:i] + seq[i + k :]
            else:
                i += 1
        out[r, : len(seq)], new_len[r] = seq, len(seq)
    return out, new_len, started
