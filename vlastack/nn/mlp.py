"""Feed-forward blocks."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class GeGLU(nn.Module):
    """Gemma MLP: down(gelu_tanh(gate(x)) * up(x)). [..., D] -> [..., D]."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class GeluMLP(nn.Module):
    """SigLIP MLP: fc2(gelu_tanh(fc1(x))). [..., D] -> [..., D]."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))
