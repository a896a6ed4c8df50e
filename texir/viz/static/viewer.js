// texir graph viewer: draws the precomputed layout on a canvas, culling to the viewport.
// Data: #texir-data JSON {title, graphs:[{name, part, n:[[label, kind, part, x, layer, link]], e:[src, dst, ...], d:[details]}],
// partitions:[{tag, backend, color, nodes, graph?}], kinds:[{name, color}], geometry:{w, h, dy}}.
"use strict";
(function () {
  const errors = [];
  function noteError(message) {
    errors.push(String(message));
    document.body.setAttribute("data-errors", String(errors.length));
    const box = document.getElementById("errors");
    if (box) { box.textContent = errors.join("\n"); box.hidden = false; }
  }
  window.addEventListener("error", (ev) => noteError(ev.message || "script error"));
  window.addEventListener("unhandledrejection", (ev) => noteError("unhandled rejection: " + ev.reason));
  const consoleError = console.error.bind(console);
  console.error = (...args) => { noteError(args.join(" ")); consoleError(...args); };

  const DATA = JSON.parse(document.getElementById("texir-data").textContent);
  const G = DATA.geometry, KINDS = DATA.kinds, PARTS = DATA.partitions;
  const DELEGATE = KINDS.findIndex((k) => k.name === "delegate call");
  const OP = KINDS.findIndex((k) => k.name === "op");
  const GETITEM = KINDS.findIndex((k) => k.name === "getitem");
  const canvas = document.getElementById("view");
  const ctx = canvas.getContext("2d");
  const tip = document.getElementById("tip");
  const details = document.getElementById("details");
  const openLink = document.getElementById("open-link");
  const view = { g: null, index: 0, scale: 1, tx: 0, ty: 0, hover: -1, selected: -1, drawn: 0, pending: false };

  function prepare(g) {
    if (g.rows) return;
    g.rows = new Map();
    g.adj = new Map();
    for (let i = 0; i < g.n.length; i++) {
      const layer = g.n[i][4];
      if (!g.rows.has(layer)) g.rows.set(layer, []);
      g.rows.get(layer).push(i);
    }
    let minX = 0, maxX = 0, maxLayer = 0;
    for (const node of g.n) {
      minX = Math.min(minX, node[3]); maxX = Math.max(maxX, node[3]); maxLayer = Math.max(maxLayer, node[4]);
    }
    g.fanout = new Int32Array(g.n.length);
    for (let k = 0; k < g.e.length; k += 2) g.fanout[g.e[k]]++;
    g.bounds = { x0: minX - G.w, x1: maxX + G.w, y0: -G.h, y1: maxLayer * G.dy + G.h * 2 };
  }

  function neighbours(g, i) {
    if (!g.adj.has(i)) {
      const list = [];
      for (let k = 0; k < g.e.length; k += 2) if (g.e[k] === i || g.e[k + 1] === i) list.push(k);
      g.adj.set(i, list);
    }
    return g.adj.get(i);
  }

  function resize() {
    const dpr = window.devicePixelRatio || 1;
    const rect = canvas.getBoundingClientRect();
    canvas.width = Math.max(1, Math.floor(rect.width * dpr));
    canvas.height = Math.max(1, Math.floor(rect.height * dpr));
    schedule();
  }

  function fit() {
    const g = view.g, rect = canvas.getBoundingClientRect();
    const w = Math.max(1, rect.width), h = Math.max(1, rect.height);
    const bw = g.bounds.x1 - g.bounds.x0, bh = g.bounds.y1 - g.bounds.y0;
    // Small graphs fit whole; big ones fit their width (within limits) and start at the top.
    let scale = Math.min(w / bw, h / bh, 1.5), top = false;
    if (scale < 0.35) { scale = Math.min(Math.max(w / bw, 0.05), 1); top = bh * scale > h; }
    view.scale = scale;
    view.tx = w / 2 - ((g.bounds.x0 + g.bounds.x1) / 2) * scale;
    view.ty = top ? 10 - g.bounds.y0 * scale : (h - bh * scale) / 2 - g.bounds.y0 * scale;
    schedule();
  }

  function nodeColor(node) {
    if (node[2] >= 0 && (node[1] === OP || node[1] === DELEGATE || node[1] === GETITEM || KINDS[node[1]].name === "get_attr")) {
      return PARTS[node[2]].color;
    }
    return KINDS[node[1]].color;
  }

  function draw() {
    view.pending = false;
    const g = view.g, dpr = window.devicePixelRatio || 1;
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    ctx.setTransform(dpr * view.scale, 0, 0, dpr * view.scale, dpr * view.tx, dpr * view.ty);
    const x0 = -view.tx / view.scale, y0 = -view.ty / view.scale;
    const x1 = x0 + canvas.width / dpr / view.scale, y1 = y0 + canvas.height / dpr / view.scale;
    const hw = G.w / 2, hh = G.h / 2;
    // Edges: one path for all visible edges, then the selected node's edges on top.
    ctx.lineWidth = 1 / view.scale;
    // Edges from values with many users (a weight read everywhere) are drawn faint.
    const e = g.e;
    for (const faint of [false, true]) {
      ctx.strokeStyle = faint ? "rgba(154, 167, 178, 0.18)" : "#9aa7b2";
      ctx.beginPath();
      for (let k = 0; k < e.length; k += 2) {
        if ((g.fanout[e[k]] > 12) !== faint) continue;
        const a = g.n[e[k]], b = g.n[e[k + 1]];
        const ax = a[3], ay = a[4] * G.dy + hh, bx = b[3], by = b[4] * G.dy - hh;
        if (Math.max(ax, bx) < x0 || Math.min(ax, bx) > x1 || by < y0 || ay > y1) continue;
        ctx.moveTo(ax, ay);
        ctx.lineTo(bx, by);
      }
      ctx.stroke();
    }
    if (view.selected >= 0) {
      ctx.strokeStyle = "#d81b60";
      ctx.lineWidth = 2.5 / view.scale;
      ctx.beginPath();
      for (const k of neighbours(g, view.selected)) {
        const a = g.n[e[k]], b = g.n[e[k + 1]];
        ctx.moveTo(a[3], a[4] * G.dy + hh);
        ctx.lineTo(b[3], b[4] * G.dy - hh);
      }
      ctx.stroke();
    }
    // Nodes: only rows and columns in view.
    const labels = view.scale * G.h >= 10;
    ctx.font = "12px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    let drawn = 0;
    const firstRow = Math.max(0, Math.floor((y0 - G.h) / G.dy)), lastRow = Math.ceil((y1 + G.h) / G.dy);
    for (let layer = firstRow; layer <= lastRow; layer++) {
      const row = g.rows.get(layer);
      if (!row) continue;
      const y = layer * G.dy;
      for (const i of row) {
        const node = g.n[i], x = node[3];
        if (x + hw < x0 || x - hw > x1) continue;
        drawn++;
        ctx.fillStyle = nodeColor(node);
        ctx.fillRect(x - hw, y - hh, G.w, G.h);
        if (node[1] === DELEGATE || i === view.selected || i === view.hover) {
          ctx.lineWidth = (node[1] === DELEGATE ? 3 : 2) / view.scale;
          ctx.strokeStyle = i === view.selected ? "#d81b60" : "#263238";
          ctx.strokeRect(x - hw, y - hh, G.w, G.h);
        } else if (node[2] >= 0 && PARTS[node[2]]) {
          ctx.lineWidth = 1 / view.scale;
          ctx.strokeStyle = "#0005";
          ctx.strokeRect(x - hw, y - hh, G.w, G.h);
        }
        if (labels) {
          const dark = node[1] === DELEGATE && node[2] < 0;
          ctx.fillStyle = dark ? "#fff" : "#1d2329";
          let text = node[0];
          if (text.length > 22) text = text.slice(0, 21) + "\u2026";
          ctx.fillText(text, x, y);
        }
      }
    }
    view.drawn = drawn;
    document.body.setAttribute("data-drawn", String(drawn));
  }

  function schedule() {
    if (!view.pending) { view.pending = true; requestAnimationFrame(draw); }
  }

  function toWorld(clientX, clientY) {
    const rect = canvas.getBoundingClientRect();
    return [(clientX - rect.left - view.tx) / view.scale, (clientY - rect.top - view.ty) / view.scale];
  }

  function hit(clientX, clientY) {
    const [wx, wy] = toWorld(clientX, clientY), g = view.g;
    const layer = Math.round(wy / G.dy);
    if (Math.abs(wy - layer * G.dy) > G.h / 2) return -1;
    const row = g.rows.get(layer);
    if (!row) return -1;
    for (const i of row) if (Math.abs(g.n[i][3] - wx) <= G.w / 2) return i;
    return -1;
  }

  function select(i, center) {
    const g = view.g;
    view.selected = i;
    if (i < 0) { details.textContent = "click a node"; openLink.hidden = true; schedule(); return; }
    const node = g.n[i];
    const part = node[2] >= 0 ? PARTS[node[2]] : null;
    details.textContent = g.d[i] + "\nkind: " + KINDS[node[1]].name + (part ? "\npartition tag: " + part.tag : "");
    openLink.hidden = !(node[5] >= 0);
    openLink.dataset.graph = String(node[5]);
    if (center) {
      const rect = canvas.getBoundingClientRect();
      view.scale = Math.max(view.scale, 0.8);
      view.tx = rect.width / 2 - node[3] * view.scale;
      view.ty = rect.height / 2 - node[4] * G.dy * view.scale;
    }
    schedule();
  }

  function show(index) {
    view.index = index;
    view.g = DATA.graphs[index];
    prepare(view.g);
    view.selected = -1;
    view.hover = -1;
    document.getElementById("graph-select").value = String(index);
    const g = view.g;
    document.getElementById("stats").textContent = g.n.length + " nodes, " + (g.e.length / 2) + " edges";
    document.body.setAttribute("data-graph", String(index));
    document.body.setAttribute("data-nodes", String(g.n.length));
    document.body.setAttribute("data-edges", String(g.e.length / 2));
    select(-1, false);
    fit();
  }

  function buildSide() {
    document.getElementById("title").textContent = DATA.title;
    const select = document.getElementById("graph-select");
    DATA.graphs.forEach((g, i) => {
      const option = document.createElement("option");
      option.value = String(i);
      option.textContent = g.name + " (" + g.n.length + ")";
      select.appendChild(option);
    });
    select.addEventListener("change", () => show(Number(select.value)));
    const parts = document.getElementById("partitions");
    if (!PARTS.length) {
      const li = document.createElement("li");
      li.textContent = "none (nothing delegated)";
      parts.appendChild(li);
    }
    PARTS.forEach((p) => {
      const li = document.createElement("li");
      li.className = "partition";
      li.dataset.tag = p.tag;
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = p.color;
      li.appendChild(swatch);
      // a lowered module knows its delegated nodes; a .pte delegate only how often it is called
      const count = p.nodes !== undefined ? p.nodes : p.calls;
      const unit = p.nodes !== undefined ? "node" : "call";
      li.appendChild(document.createTextNode(
        p.tag + " \u2014 " + p.backend + " (" + count + " " + unit + (count === 1 ? "" : "s") + ")"));
      if (p.graph !== undefined) li.addEventListener("click", () => show(p.graph));
      parts.appendChild(li);
    });
    const kinds = document.getElementById("kinds");
    KINDS.forEach((k) => {
      const li = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = k.color;
      li.appendChild(swatch);
      li.appendChild(document.createTextNode(k.name));
      kinds.appendChild(li);
    });
    document.body.setAttribute("data-partitions", String(PARTS.length));
    document.body.setAttribute("data-graphs", String(DATA.graphs.length));
  }

  // Interaction: drag to pan, wheel to zoom at the cursor, click for details, hover for a tip.
  let drag = null;
  canvas.addEventListener("mousedown", (ev) => {
    drag = { x: ev.clientX, y: ev.clientY, tx: view.tx, ty: view.ty, moved: false };
    canvas.classList.add("dragging");
  });
  window.addEventListener("mouseup", (ev) => {
    if (drag && !drag.moved && ev.target === canvas) select(hit(ev.clientX, ev.clientY), false);
    drag = null;
    canvas.classList.remove("dragging");
  });
  window.addEventListener("mousemove", (ev) => {
    if (drag) {
      const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
      view.tx = drag.tx + dx;
      view.ty = drag.ty + dy;
      tip.hidden = true;
      schedule();
      return;
    }
    if (ev.target !== canvas) { tip.hidden = true; return; }
    const i = hit(ev.clientX, ev.clientY);
    if (i !== view.hover) { view.hover = i; schedule(); }
    if (i >= 0) {
      // The canvas label is cut at 22 characters: the tip starts with the full name.
      const label = view.g.n[i][0];
      tip.textContent = (label.length > 22 ? label + "\n" : "") + view.g.d[i];
      tip.style.left = ev.clientX + 14 + "px";
      tip.style.top = ev.clientY + 14 + "px";
      tip.hidden = false;
    } else {
      tip.hidden = true;
    }
  });
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const rect = canvas.getBoundingClientRect();
    const mx = ev.clientX - rect.left, my = ev.clientY - rect.top;
    const factor = Math.exp(-ev.deltaY * 0.0015);
    const scale = Math.min(4, Math.max(0.005, view.scale * factor));
    view.tx = mx - ((mx - view.tx) * scale) / view.scale;
    view.ty = my - ((my - view.ty) * scale) / view.scale;
    view.scale = scale;
    schedule();
  }, { passive: false });
  document.getElementById("fit").addEventListener("click", fit);
  openLink.addEventListener("click", () => show(Number(openLink.dataset.graph)));
  document.getElementById("search").addEventListener("keydown", (ev) => {
    if (ev.key !== "Enter") return;
    const query = ev.target.value.trim().toLowerCase();
    if (!query) return;
    const g = view.g, start = view.selected + 1;
    for (let k = 0; k < g.n.length; k++) {
      const i = (start + k) % g.n.length;
      if (g.n[i][0].toLowerCase().includes(query) || g.d[i].toLowerCase().includes(query)) { select(i, true); return; }
    }
  });
  window.addEventListener("keydown", (ev) => {
    if (ev.target instanceof HTMLInputElement) return;
    if (ev.key === "f") fit();
  });
  window.addEventListener("resize", resize);

  // Deep links: #graph=N opens a graph page, #node=NAME selects a node (also used by the tests).
  function applyHash() {
    const params = new URLSearchParams(location.hash.slice(1));
    const graph = Number(params.get("graph") || "0");
    if (graph >= 0 && graph < DATA.graphs.length && graph !== view.index) show(graph);
    const name = params.get("node");
    if (name) {
      const g = view.g;
      for (let i = 0; i < g.n.length; i++) {
        if (g.d[i].startsWith("name: " + name + "\n") || g.n[i][0] === name) { select(i, true); break; }
      }
    }
    document.body.setAttribute("data-selected", view.selected >= 0 ? view.g.n[view.selected][0] : "");
  }
  window.addEventListener("hashchange", applyHash);

  buildSide();
  if (DATA.graphs.length) {
    resize();
    show(0);
    applyHash();
    draw();
  }
  document.body.setAttribute("data-rendered", "1");
})();
