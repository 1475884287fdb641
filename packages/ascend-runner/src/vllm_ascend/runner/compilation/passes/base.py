"""What every Ascend graph pass shares: :class:`BasePattern` (one rewrite), :class:`AscendGraphPass` (runs
patterns over a post-grad graph and counts matches), FX helpers, and the process-wide match record.

Passes run on Inductor's functionalized post-grad ATen graph, where each ``torch.ops.vllm_ascend`` call
is one node (``torch.ops.vllm_ascend.<op>.default``, tuple outputs read through ``operator.getitem``)
and ``node.meta["val"]`` holds the fake output. A rewrite inserts the fused node (with its fake value),
points the users of the replaced outputs at it and erases the replaced nodes; a candidate that does not
fit (an intermediate also used elsewhere, a non-scalar factor, ...) is left untouched.
"""

from __future__ import annotations

import abc
import operator
import threading
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch._ops import OpOverload
from torch.fx.experimental.symbolic_shapes import statically_known_true
from vllm.compilation.passes.vllm_inductor_pass import VllmInductorPass
from vllm.config import VllmConfig

from vllm_ascend.core.sdk import init_logger

logger = init_logger(__name__)

aten = torch.ops.aten
#: ATen ops that only reinterpret the shape of their input (post-grad graphs hold all three).
VIEW_OPS: tuple[OpOverload, ...] = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)

_counts_lock = threading.Lock()
_match_counts: dict[str, int] = {}


def fusion_match_counts() -> dict[str, int]:
    """Matches per pass name, summed over every graph the passes ran on since the last reset
    (a pass that ran and matched nothing is listed with 0)."""
    with _counts_lock:
        return dict(_match_counts)


def reset_fusion_match_counts() -> None:
    """Forget the recorded matches (tests call this before compiling)."""
    with _counts_lock:
        _match_counts.clear()


def _record(pass_name: str, matches: int) -> None:
    with _counts_lock:
        _match_counts[pass_name] = _match_counts.get(pass_name, 0) + matches


# -- FX helpers ------------------------------------------------------------------------------------


def vllm_ascend_op(name: str) -> OpOverload:
    """``torch.ops.vllm_ascend.<name>.default`` (the ops are registered by core on first use)."""
    from vllm_ascend.kernels.device.graph_ops import register_device_ops

    register_device_ops()
    return getattr(torch.ops.vllm_ascend, name).default


def is_op(node: Any, *targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """Argument ``index`` / ``name`` of a call node, positional or keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def fake(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def same_shape(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two (possibly symbolic) shapes are provably equal."""
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b, strict=True))


def shape_kept(node: fx.Node, source: Any) -> bool:
    """Whether ``node``'s output provably has the shape of ``source``'s."""
    out, inp = fake(node), fake(source)
    return (
        isinstance(out, torch.Tensor) and isinstance(inp, torch.Tensor) and same_shape(out.shape, inp.shape)
    )


def only_user(node: fx.Node, user: fx.Node) -> bool:
    return len(node.users) == 1 and user in node.users


def through_noop_views(node: Any, user: fx.Node) -> tuple[Any, list[fx.Node]]:
    """Walk up from ``node`` (an input of ``user``) through shape-keeping view/reshape nodes, each used
    only by the next: ``(source, [views from the source's side to user's])``."""
    chain: list[fx.Node] = []
    while is_op(node, *VIEW_OPS) and only_user(node, user) and shape_kept(node, node.args[0]):
        chain.insert(0, node)
        user, node = node, node.args[0]
    return node, chain


def getitem_users(node: fx.Node) -> dict[int, fx.Node] | None:
    """``{index: getitem node}`` of a tuple-returning node; None if anything else uses it (or an index twice)."""
    items: dict[int, fx.Node] = {}
    for user in node.users:
        if not is_op(user, operator.getitem) or user.args[1] in items:
            return None
        items[int(user.args[1])] = user
    return items


def _fake_value(target: Any, args: tuple[Any, ...]) -> Any:
    vals = [fake(a) if isinstance(a, fx.Node) else a for a in args]
    if any(isinstance(a, fx.Node) and v is None for a, v in zip(args, vals, strict=True)):
        return None
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None:
        return None
    with mode:
        return target(*vals)


def insert_call(graph: fx.Graph, before: fx.Node, target: Any, args: tuple[Any, ...]) -> fx.Node:
    """A new call node placed before ``before``, with its fake output in ``meta["val"]`` where the inputs
    carry theirs."""
    with graph.inserting_before(before):
        node = graph.call_function(target, args)
    value = _fake_value(target, args)
    if value is not None:
        node.meta["val"] = value
    return node


def insert_getitems(graph: fx.Graph, node: fx.Node, count: int) -> list[fx.Node]:
    """``node[0] .. node[count-1]`` as getitem nodes right after ``node``."""
    items = []
    anchor = node.next
    for i in range(count):
        with graph.inserting_before(anchor):
            item = graph.call_function(operator.getitem, (node, i))
        value = fake(node)
        if value is not None:
            item.meta["val"] = value[i]
        items.append(item)
    return items


def insertion_point(
    graph: fx.Graph, candidates: Sequence[fx.Node], inputs: Iterable[Any], consumers: Iterable[fx.Node]
) -> fx.Node | None:
    """The first candidate node that every input node precedes and every consumer follows (a new node
    inserted before it sees its inputs and is seen by the consumers), or None."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    last_input = max((order[a] for a in inputs if isinstance(a, fx.Node)), default=-1)
    first_consumer = min((order[c] for c in consumers), default=len(order))
    for candidate in candidates:
        if last_input < order[candidate] <= first_consumer:
            return candidate
    return None


def erase(graph: fx.Graph, nodes: Iterable[fx.Node]) -> None:
    """Erase nodes (given users first); each must have no users left."""
    for node in nodes:
        graph.erase_node(node)


# -- patterns and passes ---------------------------------------------------------------------------


class BasePattern(abc.ABC):
    """One fusion rewrite: the ops a match starts from, and the check-and-rewrite at such a node."""

    @abc.abstractmethod
    def anchors(self) -> tuple[OpOverload, ...]:
        """The ops whose nodes may be the last node of a match."""

    @abc.abstractmethod
    def rewrite(self, graph: fx.Graph, node: fx.Node) -> bool:
        """Rewrite the match ending at ``node``; False (graph untouched) where there is none."""


class AscendGraphPass(VllmInductorPass):
    """Runs its patterns at every anchor node of the graph once; records and logs the matches.

    A subclass sets :attr:`NAME` (its key in :func:`fusion_match_counts`) and :meth:`patterns`.
    """

    NAME: ClassVar[str] = ""

    def __init__(self, config: VllmConfig) -> None:
        super().__init__(config)
        self.pass_name = self.NAME
        self._patterns = self.patterns()
        self.matched_count = 0

    @abc.abstractmethod
    def patterns(self) -> list[BasePattern]:
        """The rewrites this pass applies."""

    def apply(self, graph: fx.Graph) -> int:
        """Apply every pattern once at each of its anchor nodes; returns the number of rewrites."""
        by_op: dict[Any, list[BasePattern]] = {}
        for pattern in self._patterns:
            for op in pattern.anchors():
                by_op.setdefault(op, []).append(pattern)
        count = 0
        for node in list(graph.nodes):
            if node._erased or node.op != "call_function":
                continue
            for pattern in by_op.get(node.target, ()):
                if pattern.rewrite(graph, node):
                    count += 1
                    break
        return count

    @VllmInductorPass.time_and_log
    def __call__(self, graph: fx.Graph) -> None:
        self.matched_count = self.apply(graph)
        _record(self.NAME, self.matched_count)
        logger.info("%s: %d match(es)", self.NAME, self.matched_count)

    def uuid(self) -> str:
        return VllmInductorPass.hash_source(type(self), *[type(p) for p in self._patterns])
