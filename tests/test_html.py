"""The HTML graph page: self-contained, atomic, and rendered by a real headless chromium.

Chromium comes from the project's set-up (tests/browser_setup.sh, run by `make test`); when it is
missing these tests fail and say how to install it, they never skip.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import texir.backends  # noqa: F401  (registers the demo and reference backends)
from texir.errors import TexirError
from texir.ir import verify
from texir.testing.programs import chain_program, delegated_program, wide_program
from texir.viz.html import build_model, render_html, write_html

CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", "--window-size=1280,800",
)


def _chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.fail("chromium is not installed: run `sh tests/browser_setup.sh` (as root: "
                    "apt-get update && apt-get install -y chromium), as `make test` does")
    return path


class Page:
    def __init__(self, dom: str, console: list[str]) -> None:
        self.dom = dom
        self.console = console
        body = re.search(r"<body([^>]*)>", dom)
        assert body is not None, dom[:500]
        self.body = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1)))

    @property
    def partitions(self) -> list[str]:
        return re.findall(r'<li class="partition" data-tag="([^"]*)"', self.dom)

    @property
    def partition_labels(self) -> list[str]:
        return re.findall(r'<li class="partition" data-tag="[^"]*">(?:<span[^>]*></span>)?([^<]*)</li>', self.dom)


def render_in_browser(path: Path, fragment: str = "") -> Page:
    """Load `path` in headless chromium; return the DOM after the scripts ran and every console
    message (the viewer logs nothing, so any message is a problem)."""
    with tempfile.TemporaryDirectory(prefix="texir-chromium-") as profile:
        proc = subprocess.run(
            [_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom",
             path.resolve().as_uri() + fragment],
            capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    return Page(proc.stdout, console)


def _assert_clean(page: Page) -> None:
    assert page.console == [], page.console
    assert page.body.get("data-rendered") == "1", page.body
    assert page.body.get("data-errors", "0") == "0", page.dom[-2000:]


def test_page_renders_partitions_in_chromium(tmp_path: Path) -> None:
    program = delegated_program(partitions=3)
    verify(program)
    out = tmp_path / "delegated.html"
    stats = write_html(program, out)
    page = render_in_browser(out)
    _assert_clean(page)
    assert page.body["data-partitions"] == "3"
    assert page.partitions == ["lowered_module_0", "lowered_module_1", "lowered_module_2"]
    counts = [sum(1 for n in m.module.original_program.graph.nodes if type(n).__name__ == "CallFunction")
              for m in program.lowered_modules]
    assert page.partition_labels == [
        f"lowered_module_{i} \u2014 {m.module.backend_id} ({c} node{'' if c == 1 else 's'})"
        for i, (m, c) in enumerate(zip(program.lowered_modules, counts))]
    # Main graph: x, 3 x (get_attr, delegate call, getitem), sin, one output spec.
    assert page.body["data-nodes"] == str(stats.nodes) == "12"
    assert int(page.body["data-drawn"]) == 12  # a small graph is drawn whole
    assert page.body["data-graphs"] == "4"  # main graph plus one page per lowered module

    # Details of a node (what a click shows), and a lowered module's own graph page.
    page = render_in_browser(out, "#node=sin")
    _assert_clean(page)
    assert page.body["data-selected"] == "sin"
    details = re.search(r'<pre id="details">(.*?)</pre>', page.dom, re.S)
    assert details is not None
    assert "op: aten::sin.default" in details.group(1) and "debug handle: 9" in details.group(1)
    page = render_in_browser(out, "#graph=2&node=relu_0")
    _assert_clean(page)
    assert page.body["data-graph"] == "2" and page.body["data-nodes"] == "3"  # x, relu, output
    assert "partition: lowered_module_1 (backend DemoBackend)" in page.dom  # inside the partition


def test_ten_thousand_nodes_in_chromium(tmp_path: Path) -> None:
    program = wide_program(10_000, partitions=4)
    verify(program)
    out = tmp_path / "big.html"
    start = time.perf_counter()
    stats = write_html(program, out)
    seconds = time.perf_counter() - start
    print(f"\n10k-node page: {stats.nodes} nodes, {stats.edges} edges, "
          f"{stats.bytes / 1e6:.2f} MB, written in {seconds:.2f} s")
    assert stats.nodes >= 10_000
    assert stats.bytes < 4_000_000  # compact arrays, not one DOM element per node
    page = render_in_browser(out)
    _assert_clean(page)
    assert page.body["data-nodes"] == str(stats.nodes)
    assert page.body["data-partitions"] == "4"
    # Culling: the first frame draws what is in view, not all 10k nodes.
    assert 0 < int(page.body["data-drawn"]) < 2_000


def test_browser_check_catches_script_errors(tmp_path: Path) -> None:
    """The check above would notice a broken page: a thrown error shows up as a console line."""
    page_text = render_html(chain_program()).replace(
        'document.body.setAttribute("data-rendered", "1");', "undefinedFunction();"
    )
    out = tmp_path / "broken.html"
    out.write_text(page_text)
    page = render_in_browser(out)
    assert any("undefinedFunction" in line for line in page.console), page.console
    assert page.body.get("data-rendered") == "0"
    assert page.body.get("data-errors") == "1"


def test_page_is_self_contained_and_deterministic() -> None:
    program = delegated_program(partitions=2)
    text = render_html(program, title="demo")
    assert text == render_html(program, title="demo")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "<link" not in text and "@import" not in text and "fetch(" not in text
    assert text.count("<script") == 2  # the data and the inline viewer
    # Node details carry op, args, meta and debug handle.
    model = build_model(program)
    main = model["graphs"][0]
    sin = main["d"][[n[0] for n in main["n"]].index("sin")]
    assert "op: aten::sin.default" in sin and "debug handle: 9" in sin and "meta: f32[2, 3]" in sin
    # Inputs and outputs by kind; delegate calls coloured by their partition.
    kinds = {n[0]: model["kinds"][n[1]]["name"] for n in main["n"]}
    assert kinds["x"] == "user input" and kinds["out[0]"] == "user output"
    calls = [n for n in main["n"] if model["kinds"][n[1]]["name"] == "delegate call"]
    assert [c[2] for c in calls] == [0, 1] and all(c[5] >= 1 for c in calls)


def test_kinds_of_inputs_and_outputs() -> None:
    model = build_model(chain_program(with_buffer=True))
    main = model["graphs"][0]
    kinds = {n[0]: model["kinds"][n[1]]["name"] for n in main["n"]}
    assert kinds["p_w"] == "parameter"
    assert kinds["b_count"] == "buffer"
    assert kinds["out[0]"] == "buffer mutation" and kinds["out[1]"] == "user output"
    # Layering: every edge goes down at least one layer.
    for src, dst in zip(main["e"][::2], main["e"][1::2]):
        assert main["n"][src][4] < main["n"][dst][4]


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "page.html"
    out.write_text("old page")

    def failing_replace(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(TexirError, match="cannot write"):
        write_html(chain_program(), out)
    assert out.read_text() == "old page"
    assert os.listdir(tmp_path) == ["page.html"]  # no temp file left behind
    with pytest.raises(TexirError, match="cannot write"):
        write_html(chain_program(), tmp_path / "missing-dir" / "page.html")


def test_show_html_for_snapshot_and_pte(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`texir show X --html out.html` for a snapshot and for a delegated .pte file."""
    import texir.cli.main as cli_main
    from texir.lowering import OpSupportPartitioner, to_backend
    from texir.serialize.pte import codec
    from texir.emit import emit
    from texir.serialize.snapshot import dumps

    program = chain_program(("aten::relu.default", "aten::sin.default", "aten::cos.default"),
                            with_param=False)
    lowered = to_backend(program, OpSupportPartitioner("texir-reference", ops={"aten::sin.default"}))
    snap, pte = tmp_path / "lowered.json", tmp_path / "lowered.pte"
    snap.write_bytes(dumps(lowered))
    pte.write_bytes(codec.dumps(emit(lowered)))

    out = tmp_path / "snap.html"
    assert cli_main.main(["show", str(snap), "--html", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"wrote {out}: ") and "1 partition," in printed
    assert "placeholder" not in printed  # the page is written instead of the text

    out_pte = tmp_path / "pte.html"
    assert cli_main.main(["show", str(pte), "--html", str(out_pte)]) == 0
    capsys.readouterr()
    page = render_in_browser(out_pte)
    _assert_clean(page)
    assert page.body["data-partitions"] == "1"
    assert page.partitions == ["forward:delegate#0"]
    assert page.partition_labels == ["forward:delegate#0 \u2014 texir-reference (1 call)"]  # a .pte has no nodes
    assert page.body["data-nodes"] == "5"  # input, relu, delegate call, cos, output

    assert cli_main.main(["show", str(pte)]) == 0
    text = capsys.readouterr().out
    assert "delegate #0 texir-reference(%1, %2)" in text and "aten::cos.out" in text


def test_page_bytes_independent_of_hash_seed(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = ("import sys; from texir.testing.programs import wide_program; "
              "from texir.viz.html import write_html; write_html(wide_program(600), sys.argv[1])")
    pages = []
    for seed in ("1", "2"):
        (tmp_path / seed).mkdir()
        out = tmp_path / seed / "page.html"  # same name: the title is the file name
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-c", script, str(out)], check=True, env=env, timeout=120)
        pages.append(out.read_bytes())
    assert pages[0] == pages[1]


def test_nested_graphs_get_pages() -> None:
    import msgspec

    from texir.ir import Subgraph, build_graph
    from texir.ir.types import GetAttr, SubgraphMeta

    inner = chain_program(("aten::sin.default",), with_param=False)
    base = chain_program(("aten::relu.default",), with_param=False)
    entries = base.graph.entries()
    entries.insert(1, (GetAttr(name="true_graph_0", target="true_graph_0"), SubgraphMeta(graph="true_graph_0"), None))
    program = msgspec.structs.replace(base, graph=build_graph(
        entries, (Subgraph(name="true_graph_0", graph=inner.graph),)))
    verify(program)
    model = build_model(program, title="cond")
    names = [g["name"] for g in model["graphs"]]
    assert names == ["cond", "cond > true_graph_0"]
    attr = next(n for n in model["graphs"][0]["n"] if n[0] == "true_graph_0")
    assert attr[5] == 1  # the get_attr node links to the branch's page
