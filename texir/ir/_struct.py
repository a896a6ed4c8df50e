"""The two bases every IR struct derives from (texir.ir.types, texir.ir.meta)."""

from __future__ import annotations

import msgspec


# gc=False: IR objects are immutable and built bottom-up, so they can never form reference cycles;
# untracked structs make decoding a 100k-node snapshot ~1.7x faster. omit_defaults=True keeps
# snapshots small (a default field is simply absent and decodes to its default).
class _Frozen(msgspec.Struct, frozen=True, kw_only=True, gc=False, omit_defaults=True):
    """Base of every non-union IR struct."""


class _Tagged(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", gc=False, omit_defaults=True):
    """Base of every tagged-union variant; the tag is the lower-case variant name unless given."""
