"""ExecuTorch 1.5.1's ChannelsLastTaggedReshapePass and RemoveRedundantCopyPass on the working
graph, with their quantized forms (a copy between q/dq nodes gets its own implicit q/dq pair), and
RemoveGetItemPass (max.dim as amax). `passes.PASSES` runs them."""

from __future__ import annotations

from texir.backends.xnnpack.checks import refuse
from texir.backends.xnnpack.errors import XnnpackUnsupportedError
from texir.backends.xnnpack.graph import CHANNELS_LAST, CONTIGUOUS, XGraph, WorkNode
from texir.backends.xnnpack.ops import (
    AMAX,
    BROADCAST_OPS,
    DEQUANTIZE,
    DQ_PER_TENSOR,
    MAX_DIM,
    NCHW_OPS,
    NHWC_OPS,
    Q_PER_TENSOR,
    QUANTIZE,
    TO_COPY,
)
from texir.ir import TensorMeta

__all__ = ["max_dims_as_amax", "remove_redundant_copies", "tag_channels_last"]


def _is_nhwc_meta(meta: TensorMeta) -> bool:
    """A tensor strided channels-last and not also contiguous (as torch decides both)."""
    if len(meta.shape) != 4 or not all(isinstance(d, int) for d in (*meta.shape, *meta.strides)):
        return False
    n, c, h, w = (int(d) for d in meta.shape)

    def strided(order: tuple[int, ...]) -> bool:
        expected = 1
        for dim in reversed(order):
            size = int(meta.shape[dim])
            if size != 1 and int(meta.strides[dim]) != expected:
                return False
            expected *= size
        return True

    return strided((0, 2, 3, 1)) and not strided((0, 1, 2, 3)) and n * c * h * w > 0


class _ChannelsLast:
    """ChannelsLastTaggedReshapePass and RemoveRedundantCopyPass (float graphs)."""

    def __init__(self, g: XGraph) -> None:
        self.g = g

    def is_nhwc(self, n: WorkNode) -> bool:
        return bool(n.nhwc)

    def placeholder_nhwc(self, n: WorkNode) -> bool:
        return isinstance(n.meta, TensorMeta) and _is_nhwc_meta(n.meta)

    def can_be_nhwc(self, n: WorkNode) -> bool:
        nchw_const = n.const is not None and n.nhwc is False
        return n.rank == 4 and not nchw_const

    def copy(self, src: WorkNode, to_nhwc: bool) -> WorkNode:
        fmt = CHANNELS_LAST if to_nhwc else CONTIGUOUS
        node = WorkNode(f"{src.name}_to_{fmt}", TO_COPY, [src], {"memory_format": fmt}, src.meta, None)
        node.nhwc = to_nhwc
        self.g.insert_after(src, node)
        return node

    def to_format(self, src: WorkNode, user: WorkNode, nhwc: bool) -> None:
        if src.const is not None:
            if src.nhwc is not None and src.nhwc != nhwc:
                raise refuse("constant_one_layout", user, f"its input, constant '{src.name}', is also read "
                             f"{'contiguous' if nhwc else 'channels-last'} elsewhere; XNNPACK stores a constant once",
                             "give each use its own copy of the constant")
            src.nhwc = nhwc
        if src.target == "placeholder":
            if self.placeholder_nhwc(src) == nhwc:
                return
        elif bool(src.nhwc) == nhwc:
            return
        if nhwc and not self.can_be_nhwc(src):
            raise refuse("nhwc_compatible", user, f"its input '{src.name}' ({src.rank}-D) cannot be converted to "
                         "channels-last", "give the op a 4-D (N, C, H, W) input")
        partner = src.partner
        if partner is None:
            partner = self.copy(src, nhwc)
        # Around a q/dq node the copy gets its own implicit q/dq pair, and no partner is kept
        # (ExecuTorch's insert_copy_q_dq / insert_dq_copy_q).
        if src.target == DQ_PER_TENSOR:
            self.copy_q_dq(src, partner)
        elif src.target == Q_PER_TENSOR:
            self.dq_copy_q(src, user, partner)
        else:
            self.g.replace_input(user, src, partner)
            src.partner, partner.partner = partner, src

    def _qdq(self, target: str, src: WorkNode, params: WorkNode, like: WorkNode, name: str) -> WorkNode:
        node = WorkNode(f"{src.name}_{name}", target, [src, *params.args[1:]], {}, like.meta, None)
        node.nhwc = like.nhwc
        node.implicit = True
        return node

    def copy_q_dq(self, before: WorkNode, copy: WorkNode) -> None:
        """dq -> op becomes dq -> copy -> q -> dq -> op (every user of `before` reads the new dq)."""
        q = self._qdq(Q_PER_TENSOR, copy, before, copy, "q")
        self.g.insert_after(copy, q)
        dq = self._qdq(DQ_PER_TENSOR, q, before, copy, "dq")
        dq.implicit = before.implicit
        self.g.insert_after(q, dq)
        before.implicit = True
        self.g.replace_all_uses(before, dq)
        self.g.replace_input(copy, dq, before)

    def dq_copy_q(self, before: WorkNode, user: WorkNode, copy: WorkNode) -> None:
        """q -> user becomes q -> dq -> copy -> q -> user."""
        dq = self._qdq(DQ_PER_TENSOR, before, before, before, "dq")
        self.g.insert_after(before, dq)
        q = self._qdq(Q_PER_TENSOR, copy, before, copy, "q")
        self.g.insert_after(copy, q)
        self.g.replace_input(copy, before, dq)
        self.g.replace_input(user, before, q)

    def tag(self) -> None:
        g = self.g
        for node in list(g.nodes):
            inputs = node.inputs() if node.target != "output" else list(node.args[0])
            if not inputs:
                if node.rank == 4:
                    node.nhwc = self.placeholder_nhwc(node)
                continue
            if node.target == "output":
                for out in node.args[0]:
                    self.to_format(out, node, isinstance(out.meta, TensorMeta) and _is_nhwc_meta(out.meta))
            elif node.target in NHWC_OPS:
                first = node.args[0]
                for arg in first if isinstance(first, list) else [first]:
                    if isinstance(arg, WorkNode):
                        self.to_format(arg, node, True)
                for other in node.inputs()[1:]:
                    if other.target == "placeholder" and other.nhwc:
                        raise refuse("channels_last_inputs", node, f"its input '{other.name}' (not the first) is a "
                                     "channels-last graph input or weight", "make that tensor contiguous (a model "
                                     "moved to channels_last has channels-last weights)")
                node.nhwc = True
            elif node.target in NCHW_OPS:
                for i in node.inputs():
                    self.to_format(i, node, False)
            elif node.target == TO_COPY:
                node.nhwc = node.kwargs.get("memory_format") == CHANNELS_LAST
            else:
                layouts = [self.is_nhwc(i) for i in inputs]
                if all(layouts):
                    node.nhwc = True
                elif any(layouts):
                    if all(self.can_be_nhwc(i) for i in inputs):
                        for i in inputs:
                            self.to_format(i, node, True)
                        node.nhwc = True
                    else:
                        for i in inputs:
                            self.to_format(i, node, False)
        for n in g.nodes:
            n.partner = None
        reconverged = False
        for node in list(g.nodes):
            if node.target not in BROADCAST_OPS or len(node.inputs()) != 2:
                continue
            a, b = node.inputs()
            if self.is_nhwc(a) == self.is_nhwc(b):
                continue
            nhwc = self.can_be_nhwc(a) and self.can_be_nhwc(b)
            for i in (a, b):
                self.to_format(i, node, nhwc)
            if nhwc:
                node.nhwc = True
            reconverged = True
        if reconverged:
            for n in g.nodes:
                n.partner = None

    def remove_redundant(self) -> None:
        g = self.g
        for node in list(g.nodes):
            if node.target != TO_COPY or node not in g.nodes:
                continue
            src = node.args[0]
            if src.target in DEQUANTIZE:
                self.remove_quantized(node)
            elif src.target == TO_COPY and (not src.nhwc) != (not node.nhwc) and len(g.users(src)) == 1:
                g.replace_all_uses(node, src.args[0])
                g.remove(node)
                if not g.users(src):
                    g.remove(src)
            elif self.is_nhwc(src) == self.is_nhwc(node):
                g.replace_all_uses(node, src)
                g.remove(node)


    def _drop(self, node: WorkNode) -> None:
        if node in self.g.nodes and not self.g.users(node):
            self.g.remove(node)

    def remove_quantized(self, node: WorkNode) -> None:
        """dq1 -> copy1 -> q1 -> dq2 -> copy2 -> q2 with opposite copies: both go; with copies to the
        same format: the second copy and its q/dq go."""
        g = self.g
        users = g.users(node)
        if len(users) != 1 or users[0].target not in QUANTIZE:
            return
        q, dq = users[0], node.args[0]
        if len(dq.inputs()) != 1:
            return
        prev_q = dq.args[0]
        if prev_q.target not in QUANTIZE or len(prev_q.inputs()) != 1:
            return
        prev_copy = prev_q.args[0]
        if prev_copy.target == TO_COPY and bool(prev_copy.nhwc) != bool(node.nhwc) and len(g.users(prev_copy)) == 1:
            prev_dq = prev_copy.args[0]
            if prev_dq.target not in DEQUANTIZE or len(prev_dq.inputs()) != 1:
                return
            original = prev_dq.args[0]
            for user in g.users(q):
                g.replace_input(user, q, original)
            for dead in (q, node, dq, prev_q, prev_copy, prev_dq):
                self._drop(dead)
        elif bool(prev_copy.nhwc) == bool(node.nhwc):
            original = dq.args[0]
            for user in g.users(q):
                g.replace_input(user, q, original)
            for dead in (q, node, dq):
                self._drop(dead)


def max_dims_as_amax(g: XGraph) -> None:
    """RemoveGetItemPass: a max.dim whose one user takes its values becomes an amax (the max.dim's
    debug handle) in that user's place."""
    for n in [n for n in g.nodes if n.target == MAX_DIM]:
        users = g.users(n)
        if len(users) != 1 or users[0].args[1] != 0:
            raise XnnpackUnsupportedError(f"'{n.name}': max.dim's indices are read (XNNPACK computes the values only)",
                                          node=n.name, op=n.target)
        amax = WorkNode(n.name, AMAX, list(n.args), dict(n.kwargs), users[0].meta, n.handle)
        g.nodes[g.nodes.index(n)] = amax
        g._users = None
        g.replace_all_uses(users[0], amax)
        g.nodes.remove(users[0])
        g._users = None


def tag_channels_last(g: XGraph) -> None:
    """ChannelsLastTaggedReshapePass: NHWC ops tagged, copies inserted where a layout changes."""
    _ChannelsLast(g).tag()


def remove_redundant_copies(g: XGraph) -> None:
    """RemoveRedundantCopyPass: back-to-back copies that undo each other go."""
    _ChannelsLast(g).remove_redundant()
