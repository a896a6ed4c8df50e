"""A pytest fixture for tests that lower with Vulkan's partitioner (Vulkan, WebGPU).

Vulkan's pattern registry builds its pattern graphs (RoPE, HF RoPE, ...: torch exports of
model-independent snippets) anew on every partition and every preprocess: seconds per build on CI's
cores, four builds per compared model (partition and preprocess, texir's side and ExecuTorch's),
whatever the model. Under this fixture each graph is built once per test module and shared by both
sides: the same graphs, read-only to the subgraph matcher, so both lowerings see what they would."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="module")
def vulkan_pattern_graphs_once() -> Iterator[None]:
    from executorch.backends.vulkan.patterns import fusable_patterns

    with pytest.MonkeyPatch.context() as patch:
        for entry in fusable_patterns.values():
            if entry.get_graphs_fn is not None:
                patch.setattr(entry, "get_graphs_fn", functools.cache(entry.get_graphs_fn))
        yield
