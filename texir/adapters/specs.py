"""Pytree specs to and from their serialized text, with typed errors."""

from __future__ import annotations

from torch.utils import _pytree as pytree

from texir.adapters.torch_patches import name_structseq_types
from texir.errors import ConversionError, UnsupportedError

__all__ = ["NEG_INF_MIN", "dump_spec", "load_spec"]

# A range constraint's lower bound of minus infinity (unbacked symbols) is stored as this
# sentinel because RangeConstraint.min is an int; it is read back as -infinity.
NEG_INF_MIN = -(2**63)


def dump_spec(spec: pytree.TreeSpec, where: str) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except NotImplementedError:
        name_structseq_types()
    try:
        return pytree.treespec_dumps(spec)
    except (NotImplementedError, TypeError) as exc:
        raise UnsupportedError(
            f"{where}: its pytree spec cannot be serialized ({exc}); register the container type "
            "with torch.utils._pytree.register_pytree_node(..., serialized_type_name=...)"
        ) from exc


def load_spec(text: str, where: str) -> pytree.TreeSpec:
    for attempt in range(2):
        try:
            return pytree.treespec_loads(text)
        except NotImplementedError as exc:
            if attempt:
                raise UnsupportedError(
                    f"{where}: its pytree spec names a container type that is not registered ({exc})"
                ) from exc
            name_structseq_types()
        except (ValueError, TypeError, KeyError) as exc:
            raise ConversionError(f"{where}: malformed pytree spec ({exc})") from exc
    raise AssertionError("unreachable")


