"""A head added the way docs/adding-a-head.md says, as a test fixture: this folder plus one registry
entry (``MDN_SPEC``, registered by ``tests/models/test_new_head.py``), nothing edited elsewhere."""

from tests.models.mdn_head.head import MDNHead, MDNOptions

__all__ = ["MDNHead", "MDNOptions"]
