"""vlastack: Pi0-style and token-based Vision-Language-Action policies in plain PyTorch."""

__version__ = "0.1.0"
