// knopt's HTML report: draws the data that knopt/opt/report_html.py embeds in the page.
// Graphs are laid out by dagre (inlined as text) in a worker thread, so a large graph never
// blocks the page; everything else is plain DOM and SVG.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const LAYOUT_LIBRARY = document.getElementById("layout-library").textContent;
  const COLOURS = DATA.colours;
  const ORIGINAL = DATA.original;
  const PROGRAM = DATA.program;
  const KIND_NAMES = {
    op: "single op (unfused)", view: "view (free)", removed: "folded or removed",
    layer_norm: "layer norm", rms_norm: "RMS norm",
  };
  const SVG_NS = "http://www.w3.org/2000/svg";

  // ---- formatting ----------------------------------------------------------------------

  function us(seconds) {
    const v = seconds * 1e6;
    if (v >= 1000) return (v / 1000).toFixed(2) + " ms";
    return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + " µs";
  }
  function esc(text) {
    return String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  }
  function shortName(name) {
    const parts = name.split("/").filter(Boolean);
    return parts.length ? parts[parts.length - 1] : name;
  }
  function clip(text, n) {
    return text.length > n ? text.slice(0, n - 1) + "…" : text;
  }
  function kindName(kind) {
    return KIND_NAMES[kind] || kind.replace(/_/g, " ");
  }
  function colour(kind) {
    return COLOURS[kind] || "#8c959f";
  }
  // A light fill of a kind's colour, so that black labels stay readable.
  function tint(hex, amount) {
    const n = parseInt(hex.slice(1), 16);
    const mix = (c) => Math.round(c + (255 - c) * amount);
    return `rgb(${mix(n >> 16)},${mix((n >> 8) & 255)},${mix(n & 255)})`;
  }
  // "#17 LayerNorm": the kernel's main op (its kind when it has none, as elementwise kernels).
  function kernelTitle(j) {
    return `#${j + 1} ${PROGRAM.nodes[j].name}`;
  }
  // The path shared by `names` ("/model/encoder/layer.0/attention/self/" for an attention).
  function commonPath(names) {
    const split = names.map((n) => n.split("/"));
    const shared = [];
    for (let i = 0; split.every((p) => i < p.length - 1 && p[i] === split[0][i]); i++) shared.push(split[0][i]);
    const path = shared.filter(Boolean).join("/");
    return path.length > 44 ? "…" + path.slice(-43) : path;
  }

  // ---- summary and legend --------------------------------------------------------------

  function drawSummary() {
    const s = DATA.summary;
    const speedup = s.cost_after > 0 ? `<span class="x">${(s.cost_before / s.cost_after).toFixed(2)}×</span>` : "";
    const cards = [
      [`${us(s.cost_before)} → ${us(s.cost_after)}${speedup}`, `estimated time (${esc(s.profile)} cost model)`],
      [`${s.nodes_before} → ${s.nodes_after}`, "IR nodes before → after"],
      [`${ORIGINAL.nodes.filter((n) => !n.kind.match(/^(input|output)$/)).length} → ${PROGRAM.kernels}`, "original nodes → kernel launches"],
      [`${s.seconds.toFixed(2)} s`, "optimization time"],
      [`${s.egraph_nodes.toLocaleString()}`, s.stopped_by ? `e-nodes (stopped by the ${esc(s.stopped_by)})` : "e-nodes (saturation ran to the end)"],
    ];
    if (s.user_rules.length) cards.push([esc(s.user_rules.join(", ")), "user rule files"]);
    document.getElementById("summary").innerHTML = cards
      .map(([v, l]) => `<div class="c"><div class="v">${v}</div><div class="l">${l}</div></div>`)
      .join("");
  }

  function drawLegend() {
    const used = new Set(ORIGINAL.nodes.map((n) => n.kind).concat(PROGRAM.nodes.map((n) => n.kind)));
    document.getElementById("legend").innerHTML = Object.keys(COLOURS)
      .filter((k) => used.has(k))
      .map((k) => `<span><i style="background:${tint(colour(k), 0.7)};border-color:${colour(k)}"></i>${esc(kindName(k))}</span>`)
      .join("");
  }

  // ---- graph layout (in a worker) ------------------------------------------------------

  // dagre's time grows faster than the graph and its recursion overflows the stack past a few
  // thousand nodes in a chain, so large graphs are laid out in slices of consecutive nodes (in
  // topological order), stacked top to bottom; each slice is drawn as soon as it is ready.
  const SLICE = 300;

  // The worker's code: dagre's text, then these functions, run there and never here.
  function layoutWorker() {
    self.onmessage = function (event) {
      layOutSlices(event.data, (slice) => self.postMessage(slice), (next) => next());
    };
  }

  // Splits `job` ({sizes: [[w, h]...], edges: [[a, b]...]}) into slices and lays each out with
  // dagre, calling `emit` with {nodes, xy, edges, points, width, height, last} per slice and
  // `then(f)` to go on to the next (at once in a worker, after a pause on the page's thread).
  function layOutSlices(job, emit, then) {
    const n = job.sizes.length;
    // Nodes come in topological order except sources listed late (graph inputs): each goes
    // just before its first reader.
    const key = job.sizes.map((_, i) => i);
    const hasInput = new Uint8Array(n);
    job.edges.forEach((e) => { hasInput[e[1]] = 1; });
    job.edges.forEach((e) => { if (!hasInput[e[0]]) key[e[0]] = Math.min(key[e[0]], e[1] - 0.5); });
    const order = key.map((_, i) => i).sort((a, b) => key[a] - key[b] || a - b);
    const slices = Math.max(1, Math.round(n / SLICE));
    const sliceOf = new Int32Array(n);
    order.forEach((node, position) => { sliceOf[node] = Math.floor((position * slices) / n); });
    const run = (s) => {
      const nodes = order.filter((i) => sliceOf[i] === s);
      const edges = job.edges.map((e, i) => i).filter((i) => sliceOf[job.edges[i][0]] === s && sliceOf[job.edges[i][1]] === s);
      // Past ~150 nodes, longest-path ranks several times faster than network-simplex, and
      // aligning up-left keeps long chains from drifting sideways (3x narrower on BERT-like
      // graphs); smaller slices get the balanced, better-looking defaults.
      const big = nodes.length > 150;
      const g = new dagre.graphlib.Graph();
      g.setGraph({ rankdir: "TB", align: big ? "UL" : undefined, nodesep: 16, ranksep: big ? 22 : 30, edgesep: 8,
                   marginx: 20, marginy: 20, ranker: big ? "longest-path" : "network-simplex" });
      g.setDefaultEdgeLabel(() => ({}));
      nodes.forEach((i) => g.setNode(String(i), { width: job.sizes[i][0], height: job.sizes[i][1] }));
      edges.forEach((i) => g.setEdge(String(job.edges[i][0]), String(job.edges[i][1])));
      dagre.layout(g);
      emit({
        nodes: nodes,
        xy: nodes.map((i) => { const p = g.node(String(i)); return [p.x, p.y]; }),
        edges: edges,
        points: edges.map((i) => g.edge(String(job.edges[i][0]), String(job.edges[i][1])).points.map((p) => [p.x, p.y])),
        width: g.graph().width,
        height: g.graph().height,
        last: s === slices - 1,
      });
      if (s + 1 < slices) then(() => run(s + 1));
    };
    run(0);
  }

  function layOut(job, emit, fail) {
    const source = LAYOUT_LIBRARY + "\n;const SLICE = " + SLICE + ";\n" + layOutSlices.toString() +
      "\n;(" + layoutWorker.toString() + ")();";
    let worker = null;
    try {
      const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
      worker = new Worker(url);
      URL.revokeObjectURL(url);
    } catch (err) {
      worker = null; // a browser may refuse workers on file:// pages: lay out here instead
    }
    if (!worker) {
      const dagre = new Function(LAYOUT_LIBRARY + "\n;return dagre;")();
      const here = new Function("dagre", "SLICE", "return " + layOutSlices.toString())(dagre, SLICE);
      setTimeout(() => here(job, emit, (next) => setTimeout(next, 0)), 0);
      return;
    }
    worker.onmessage = (event) => {
      if (event.data.last) worker.terminate();
      emit(event.data);
    };
    worker.onerror = (event) => { worker.terminate(); fail(event.message); };
    worker.postMessage(job);
  }

  // ---- graph views ---------------------------------------------------------------------

  const measure = document.createElement("canvas").getContext("2d");
  function textWidth(text, px) {
    measure.font = `${px}px system-ui, -apple-system, "Segoe UI", Roboto, Arial, sans-serif`;
    return measure.measureText(text).width;
  }

  class GraphView {
    // `labels(i)` gives [title, subtitle] of node i; `onHover(i|null)`, `onClick(i|null)`.
    constructor(pane, graph, labels, handlers) {
      this.pane = pane;
      this.graph = graph;
      this.view = pane.querySelector(".view");
      this.handlers = handlers;
      this.labels = graph.nodes.map((_, i) => labels(i));
      this.sizes = this.labels.map(([a, b]) => [
        Math.ceil(Math.max(56, textWidth(a, 12), textWidth(b, 10.5)) + 18), b ? 36 : 24]);
      this.scale = 1;
      this.tx = 0;
      this.ty = 0;
      this.highlighted = [];
      this.pinned = null;
      this.xy = new Array(graph.nodes.length);  // centre of each node placed so far
      this.nodeElements = new Array(graph.nodes.length);
      this.box = { left: 0, right: 0, height: 0 };  // of what is drawn; slices centre on x = 0
      this.crossing = [];  // edges between slices, drawn once both ends are placed
      this.ready = false;
    }

    start(done) {
      this.view.innerHTML =
        `<svg xmlns="${SVG_NS}"><defs><marker id="arrow-${this.pane.id}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">` +
        `<path d="M0,1 L9,5 L0,9 z" fill="#8c959f"/></marker></defs><g class="world"><g class="edges"></g><g class="nodes"></g></g></svg>` +
        '<div class="status">Laying out…</div>';
      this.svg = this.view.querySelector("svg");
      this.world = this.view.querySelector(".world");
      this.listen();
      const inSlice = new Set();
      layOut({ sizes: this.sizes, edges: this.graph.edges }, (slice) => {
        slice.edges.forEach((e) => inSlice.add(e));
        this.drawSlice(slice, inSlice);
        const status = this.view.querySelector(".status");
        status.classList.add("corner");
        status.textContent = `Laying out… ${slice.nodes.length ? Math.round((100 * this.xy.filter(Boolean).length) / this.xy.length) : 100}%`;
        if (slice.last) {
          this.view.querySelector(".status").remove();
          this.ready = true;
          done();
        }
      }, (message) => {
        this.view.querySelector(".status").textContent = `Could not lay out this graph: ${message}`;
      });
    }

    drawSlice(slice, inSlice) {
      const dx = -slice.width / 2;
      const dy = this.box.height;
      const first = dy === 0;
      slice.nodes.forEach((i, k) => { this.xy[i] = [slice.xy[k][0] + dx, slice.xy[k][1] + dy]; });
      const marker = `url(#arrow-${this.pane.id})`;
      const edges = slice.points.map((points) =>
        `<path class="e" d="${curve(points.map(([x, y]) => [x + dx, y + dy]))}" marker-end="${marker}"/>`);
      this.graph.edges.forEach((e, i) => {
        if (!inSlice.has(i) && this.xy[e[0]] && this.xy[e[1]] && !this.crossing[i]) {
          this.crossing[i] = true;
          edges.push(`<path class="e" d="${this.bridge(e[0], e[1])}" marker-end="${marker}"/>`);
        }
      });
      this.world.querySelector(".edges").insertAdjacentHTML("beforeend", edges.join(""));
      const group = document.createElementNS(SVG_NS, "g");
      group.innerHTML = slice.nodes.map((i) => this.nodeSvg(i)).join("");
      this.world.querySelector(".nodes").appendChild(group);
      group.querySelectorAll(".n").forEach((el) => { this.nodeElements[Number(el.dataset.i)] = el; });
      this.box = {
        left: Math.min(this.box.left, dx), right: Math.max(this.box.right, -dx), height: dy + slice.height,
      };
      if (first) this.fitWidth();
      if (this.highlighted.length) this.highlight(this.highlighted, this.pinned);
    }

    // An edge between slices: a vertical S-curve from the bottom of one node to the top of the other.
    bridge(a, b) {
      const [x0, y0] = this.xy[a];
      const [x1, y1] = this.xy[b];
      const top = y0 + this.sizes[a][1] / 2;
      const bottom = y1 - this.sizes[b][1] / 2;
      const bend = Math.max(30, (bottom - top) / 3);
      return `M${x0},${top}C${x0},${top + bend} ${x1},${bottom - bend} ${x1},${bottom}`;
    }

    nodeSvg(i) {
      const node = this.graph.nodes[i];
      const [w, h] = this.sizes[i];
      const [title, sub] = this.labels[i];
      const [x, y] = this.xy[i];
      const io = node.kind === "input" || node.kind === "output";
      const c = colour(node.kind);
      const removed = node.kind === "removed";
      const style = io ? "" : ` style="fill:${tint(c, removed ? 0.2 : 0.72)};stroke:${removed ? "#afb8c1" : c}"`;
      return `<g class="n${io ? " io" : ""} ${node.kind}" data-i="${i}" transform="translate(${(x - w / 2).toFixed(1)},${(y - h / 2).toFixed(1)})">` +
        `<rect width="${w}" height="${h}" rx="${io ? h / 2 : 5}"${style}/>` +
        `<text x="9" y="${sub ? 15 : 16}">${esc(title)}</text>` +
        (sub ? `<text class="sub" x="9" y="29">${esc(sub)}</text>` : "") + "</g>";
    }

    apply() {
      this.world.setAttribute("transform", `translate(${this.tx.toFixed(1)},${this.ty.toFixed(1)}) scale(${this.scale.toFixed(4)})`);
    }

    // The whole width, from the top: a tall graph is read by scrolling down.
    fitWidth() {
      const box = this.view.getBoundingClientRect();
      const width = this.box.right - this.box.left;
      this.scale = Math.min(1, box.width / width);
      this.tx = (box.width - width * this.scale) / 2 - this.box.left * this.scale;
      this.ty = 0;
      this.apply();
    }

    fitAll() {
      const box = this.view.getBoundingClientRect();
      const width = this.box.right - this.box.left;
      this.scale = Math.min(1, box.width / width, box.height / this.box.height);
      this.tx = (box.width - width * this.scale) / 2 - this.box.left * this.scale;
      this.ty = (box.height - this.box.height * this.scale) / 2;
      this.apply();
    }

    zoom(factor, cx, cy) {
      const next = Math.min(3, Math.max(0.02, this.scale * factor));
      this.tx = cx - (cx - this.tx) * (next / this.scale);
      this.ty = cy - (cy - this.ty) * (next / this.scale);
      this.scale = next;
      this.apply();
    }

    // Brings nodes `indices` into view (centred), unless they all are visible already.
    reveal(indices) {
      const placed = indices.filter((i) => this.xy[i]);
      if (!placed.length) return;
      const box = this.view.getBoundingClientRect();
      const xs = placed.map((i) => this.xy[i][0]);
      const ys = placed.map((i) => this.xy[i][1]);
      const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
      const visible = (x, y) => {
        const sx = x * this.scale + this.tx;
        const sy = y * this.scale + this.ty;
        return sx > 0 && sx < box.width && sy > 0 && sy < box.height;
      };
      if (visible(x0, y0) && visible(x1, y1)) return;
      if ((y1 - y0) * this.scale > box.height * 0.9) {
        this.scale = Math.max(0.05, (box.height * 0.9) / (y1 - y0 + 40));
      } else if (this.scale < 0.5) {
        this.scale = Math.min(1, Math.max(this.scale, 0.6));
      }
      this.tx = box.width / 2 - ((x0 + x1) / 2) * this.scale;
      this.ty = box.height / 2 - ((y0 + y1) / 2) * this.scale;
      this.apply();
    }

    highlight(indices, pinned) {
      for (const i of this.highlighted) if (this.nodeElements[i]) this.nodeElements[i].classList.remove("hl", "pin");
      this.highlighted = indices;
      this.pinned = pinned;
      for (const i of indices) if (this.nodeElements[i]) this.nodeElements[i].classList.add("hl");
      if (pinned !== null && this.nodeElements[pinned]) this.nodeElements[pinned].classList.add("pin");
      this.svg.classList.toggle("focus", indices.length > 0);
    }

    listen() {
      const view = this.view;
      let drag = null;
      let moved = false;
      const nodeOf = (event) => {
        const g = event.target.closest(".n");
        return g ? Number(g.dataset.i) : null;
      };
      view.addEventListener("mouseover", (event) => this.handlers.onHover(nodeOf(event)));
      view.addEventListener("mouseleave", () => this.handlers.onHover(null));
      view.addEventListener("pointerdown", (event) => {
        drag = { x: event.clientX, y: event.clientY, tx: this.tx, ty: this.ty };
        moved = false;
      });
      window.addEventListener("pointermove", (event) => {
        if (!drag) return;
        const dx = event.clientX - drag.x;
        const dy = event.clientY - drag.y;
        if (!moved && Math.abs(dx) + Math.abs(dy) < 4) return;
        moved = true;
        view.classList.add("dragging");
        this.tx = drag.tx + dx;
        this.ty = drag.ty + dy;
        this.apply();
      });
      window.addEventListener("pointerup", (event) => {
        if (drag && !moved && view.contains(event.target)) this.handlers.onClick(nodeOf(event));
        drag = null;
        view.classList.remove("dragging");
      });
      view.addEventListener("wheel", (event) => {
        event.preventDefault();
        const box = view.getBoundingClientRect();
        if (event.ctrlKey || event.metaKey) {
          this.zoom(Math.exp(-event.deltaY * 0.002), event.clientX - box.left, event.clientY - box.top);
        } else {
          this.tx -= event.deltaX;
          this.ty -= event.deltaY;
          this.apply();
        }
      }, { passive: false });
      this.pane.querySelectorAll("[data-zoom]").forEach((button) => {
        button.addEventListener("click", () => {
          const box = view.getBoundingClientRect();
          const how = button.dataset.zoom;
          if (how === "fit") this.fitAll();
          else this.zoom(how === "in" ? 1.25 : 0.8, box.width / 2, box.height / 2);
        });
      });
    }
  }

  // A smooth path through dagre's edge points (a uniform B-spline, as d3's curveBasis draws).
  function curve(points) {
    const p = points.map(([x, y]) => [x.toFixed(1), y.toFixed(1)].map(Number));
    if (p.length < 3) return `M${p[0]}L${p[p.length - 1]}`;
    let d = `M${p[0]}L${(5 * p[0][0] + p[1][0]) / 6},${(5 * p[0][1] + p[1][1]) / 6}`;
    for (let i = 1; i < p.length - 1; i++) {
      const [a, b, c] = [p[i - 1], p[i], p[i + 1]];
      d += `C${(2 * a[0] + b[0]) / 3},${(2 * a[1] + b[1]) / 3} ${(a[0] + 2 * b[0]) / 3},${(a[1] + 2 * b[1]) / 3} ` +
        `${(a[0] + 4 * b[0] + c[0]) / 6},${(a[1] + 4 * b[1] + c[1]) / 6}`;
    }
    const [a, b] = [p[p.length - 2], p[p.length - 1]];
    d += `C${(2 * a[0] + b[0]) / 3},${(2 * a[1] + b[1]) / 3} ${(a[0] + 2 * b[0]) / 3},${(a[1] + 2 * b[1]) / 3} ${b[0]},${b[1]}`;
    return d;
  }

  // ---- linking the two graphs, the charts and the info line ------------------------------

  // A selection is {side: "original"|"program", index} or {pattern: index} or {search: text}.
  let pinned = null;
  let views = {};

  function linked(sel) {
    if (sel.side === "program") {
      const k = PROGRAM.nodes[sel.index];
      return { program: [sel.index], original: k.covers || [], pin: ["program", sel.index] };
    }
    if (sel.side === "original") {
      return { original: [sel.index], program: ORIGINAL.nodes[sel.index].kernels, pin: ["original", sel.index] };
    }
    if (sel.pattern !== undefined) {
      const covers = DATA.patterns[sel.pattern].covers;
      const kernels = new Set();
      covers.forEach((i) => ORIGINAL.nodes[i].kernels.forEach((k) => kernels.add(k)));
      return { original: covers, program: Array.from(kernels), pin: null };
    }
    const text = sel.search.toLowerCase();
    const hits = (nodes, name) => nodes.flatMap((n, i) => (name(n, i).toLowerCase().includes(text) ? [i] : []));
    return {
      original: hits(ORIGINAL.nodes, (n) => n.name),
      program: hits(PROGRAM.nodes, (n, i) => (n.covers ? kernelTitle(i) : n.name)),
      pin: null,
    };
  }

  function show(sel, reveal) {
    const links = sel ? linked(sel) : { original: [], program: [], pin: null };
    for (const side of ["original", "program"]) {
      const pin = links.pin && links.pin[0] === side ? links.pin[1] : null;
      views[side].highlight(links[side], pin);
      if (reveal) views[side].reveal(links[side]);
    }
    describe(sel, links);
  }

  function hover(sel) {
    if (sel) show(sel, false);
    else show(pinned, false);
  }

  function pin(sel) {
    pinned = sel;
    show(sel, true);
  }

  function describe(sel, links) {
    const info = document.getElementById("info");
    if (!sel) {
      info.innerHTML = '<span class="hint">Hover or click a node: its kernel and the original nodes it covers light up on both sides. Scroll or drag to move, Ctrl + scroll to zoom, Esc to clear.</span>';
      return;
    }
    const names = (indices, n) => indices.slice(0, n).map((i) => esc(shortName(ORIGINAL.nodes[i].name))).join(", ") +
      (indices.length > n ? ` and ${indices.length - n} more` : "");
    const sw = (kind) => `<span class="swatch" style="background:${colour(kind)}"></span>`;
    if (sel.side === "program" && PROGRAM.nodes[sel.index].covers) {
      const k = PROGRAM.nodes[sel.index];
      info.innerHTML = `${sw(k.kind)}<b>${esc(kernelTitle(sel.index))}</b> <span class="tag">${esc(kindName(k.kind))}</span> ` +
        `<code>${esc(k.type)}</code> · estimated ${us(k.before)} → <b>${us(k.cost)}</b>` +
        (k.detail.length ? ` · <code>${esc(k.detail.join("; "))}</code>` : "") +
        `<br><span class="names">${k.covers.length ? `covers ${k.covers.length} original node${k.covers.length === 1 ? "" : "s"}: ${names(k.covers, 12)}` :
          "no original node is attributed to it: the rewrites made it anew, and the nodes it replaced count with the kernels that read it"}</span>`;
    } else if (sel.side === "original" && !ORIGINAL.nodes[sel.index].kernels.length && ORIGINAL.nodes[sel.index].kind !== "input") {
      const n = ORIGINAL.nodes[sel.index];
      info.innerHTML = `${sw(n.kind)}<b>${esc(n.name)}</b> ${n.ops ? `<code>${esc(n.ops)}</code>` : ""} ` +
        `${n.type ? `<code>${esc(n.type)}</code>` : ""} · estimated ${us(n.cost)} before · ` +
        `<span class="names">${n.kind === "view" ? "became a view (free: read through strides)" : n.kind === "output" ? "graph output" : "folded into a constant or simplified away"}</span>`;
    } else if (sel.side === "original") {
      const n = ORIGINAL.nodes[sel.index];
      const kernels = n.kernels.map((k) => `${sw(PROGRAM.nodes[k].kind)}${esc(kernelTitle(k))}`).join(", ");
      info.innerHTML = `${sw(n.kind)}<b>${esc(n.name)}</b> ${n.ops ? `<code>${esc(n.ops)}</code>` : ""} ` +
        `${n.type ? `<code>${esc(n.type)}</code>` : ""}` + (n.kind === "input" ? " · graph input" : ` · estimated ${us(n.cost)} before`) +
        (kernels ? `<br><span class="names">computed by ${kernels}</span>` : "");
    } else if (sel.side === "program") {
      info.innerHTML = `<b>${esc(PROGRAM.nodes[sel.index].name)}</b> · graph ${PROGRAM.nodes[sel.index].kind}`;
    } else if (sel.pattern !== undefined) {
      const p = DATA.patterns[sel.pattern];
      info.innerHTML = `<b>${esc(p.op)}</b> (estimated ${us(p.cost)}) replaces ${p.covers.length} original nodes: ` +
        `<span class="names">${names(p.covers, 12)}</span>`;
    } else {
      info.innerHTML = `“${esc(sel.search)}”: ${links.original.length} original node${links.original.length === 1 ? "" : "s"}, ` +
        `${links.program.length} kernel${links.program.length === 1 ? "" : "s"}` +
        (links.original.length ? `: <span class="names">${names(links.original, 10)}</span>` : "");
    }
  }

  // ---- cost chart ----------------------------------------------------------------------

  const SHOWN = 30;

  function drawCosts(order, all) {
    const kernels = PROGRAM.nodes.slice(0, PROGRAM.kernels).map((k, j) => ({ k, j }));
    if (order === "cost") kernels.sort((a, b) => b.k.cost - a.k.cost || b.k.before - a.k.before);
    const top = Math.max(1e-15, ...kernels.map(({ k }) => Math.max(k.cost, k.before)));
    const shown = all ? kernels : kernels.slice(0, SHOWN);
    const rows = [
      '<div class="head">kernel</div><div class="head"><span class="keyline" style="margin:0"><span><i style="background:#c9d1d9"></i>before (its original nodes)</span><span><i style="background:#59a14f"></i>after (the kernel, coloured by kind)</span></span></div><div class="head num">before → after</div>',
    ];
    for (const { k, j } of shown) {
      const w = (v) => ((100 * v) / top).toFixed(2);
      rows.push(
        `<div class="lab" data-k="${j}" title="${esc(kernelTitle(j))}"><span class="swatch" style="background:${colour(k.kind)}"></span>${esc(kernelTitle(j))}</div>` +
        `<div class="track" data-k="${j}"><div class="b before" style="width:${w(k.before)}%"></div><div class="b after" style="width:${w(k.cost)}%;background:${colour(k.kind)}"></div></div>` +
        `<div class="num" data-k="${j}">${us(k.before)} → ${us(k.cost)}</div>`);
    }
    if (kernels.length > SHOWN) {
      rows.push(`<div class="more"><button>${all ? `show the ${SHOWN} slowest only` : `show all ${kernels.length} kernels`}</button></div>`);
    }
    const chart = document.getElementById("cost-chart");
    chart.innerHTML = rows.join("");
    const more = chart.querySelector(".more button");
    if (more) more.addEventListener("click", () => drawCosts(order, !all));
  }

  function drawByKind() {
    // Time before (the original nodes, by the kind of kernel that now covers them) and after.
    const before = {};
    const after = {};
    ORIGINAL.nodes.forEach((n) => { before[n.kind] = (before[n.kind] || 0) + n.cost; });
    // Constants and what folds from them are not drawn; their share of the estimate was removed.
    const drawn = ORIGINAL.nodes.reduce((sum, n) => sum + n.cost, 0);
    before.removed = (before.removed || 0) + Math.max(0, DATA.summary.cost_before - drawn);
    PROGRAM.nodes.slice(0, PROGRAM.kernels).forEach((k) => { after[k.kind] = (after[k.kind] || 0) + k.cost; });
    const total = Math.max(DATA.summary.cost_before, DATA.summary.cost_after);
    const bar = (parts) => Object.keys(COLOURS).filter((k) => parts[k] > 0)
      .map((k) => `<span title="${esc(kindName(k))}: ${us(parts[k])}" style="width:${((100 * parts[k]) / total).toFixed(3)}%;background:${colour(k)}"></span>`).join("");
    document.getElementById("by-kind").innerHTML =
      '<div class="note">Estimated time by kind of kernel (colours as in the graphs), then per kernel.</div>' +
      `<div class="kindrow"><span>before</span><div class="kindbar">${bar(before)}</div><span class="num">${us(DATA.summary.cost_before)}</span></div>` +
      `<div class="kindrow"><span>after</span><div class="kindbar">${bar(after)}</div><span class="num">${us(DATA.summary.cost_after)}</span></div>`;
  }

  // ---- rules, patterns, phases ---------------------------------------------------------

  function drawRules() {
    const rows = (rules) => {
      const top = Math.max(1, ...rules.map((r) => r.count));
      return "<table><tr><th>rule</th><th>ruleset</th><th class=\"r\">matches</th><th></th></tr>" +
        rules.map((r) => `<tr><td class="mono">${esc(r.name)}</td><td>${esc(r.ruleset)}</td><td class="r">${r.count.toLocaleString()}</td>` +
          `<td style="width:30%"><span class="mini" style="width:${((100 * r.count) / top).toFixed(1)}%"></span></td></tr>`).join("") + "</table>";
    };
    const rewrites = DATA.rules.filter((r) => !r.fact);
    const facts = DATA.rules.filter((r) => r.fact);
    const total = (rules) => rules.reduce((s, r) => s + r.count, 0).toLocaleString();
    const section = document.getElementById("rules");
    section.insertAdjacentHTML("beforeend",
      `<p class="note">${rewrites.length} rewrite rules matched ${total(rewrites)} times (egglog counts matches, not places: ` +
      "where the rules recognised a pattern, and which original nodes it replaced, is under Recognised patterns).</p>" +
      `<div class="scroll">${rows(rewrites)}</div>` +
      `<details><summary>${facts.length} typing and folding rules (${total(facts)} matches)</summary>${rows(facts)}</details>`);
  }

  function drawPatterns() {
    const section = document.getElementById("patterns");
    if (!DATA.patterns.length) {
      section.insertAdjacentHTML("beforeend", "<p>No pattern was recognised.</p>");
      return;
    }
    const groups = new Map();
    DATA.patterns.forEach((p, i) => { if (!groups.has(p.op)) groups.set(p.op, []); groups.get(p.op).push(i); });
    let html = '<p class="note">Hover or click a row to see the nodes it replaced in the graphs.</p>' +
      '<div class="scroll"><table><tr><th>pattern</th><th>where</th><th class="r">estimated</th><th>replaces</th></tr>';
    for (const [op, members] of groups) {
      html += `<tr><td colspan="4"><b>${esc(op)}</b> <span class="tag">×${members.length}</span></td></tr>`;
      for (const i of members) {
        const p = DATA.patterns[i];
        const names = p.covers.map((c) => shortName(ORIGINAL.nodes[c].name));
        const where = commonPath(p.covers.map((c) => ORIGINAL.nodes[c].name));
        html += `<tr class="pattern" data-p="${i}"><td></td><td class="mono">${esc(where)}</td><td class="r">${us(p.cost)}</td>` +
          `<td class="names">${esc(clip(names.join(", "), 90))}</td></tr>`;
      }
    }
    section.insertAdjacentHTML("beforeend", html + "</table></div>");
  }

  // "algebra: round 3/12: (seq (run algebra) ...)" is shown as "algebra: round 3/12".
  function phaseLabel(name) {
    const round = name.match(/^(.*?round \d+\/\d+):/);
    return round ? round[1] : name;
  }

  function drawPhases() {
    const phases = DATA.phases.slice();
    const rest = DATA.summary.seconds - phases.reduce((s, p) => s + p.seconds, 0);
    if (rest > 0) phases.push({ name: "other: loading rules and the graph, rebuilding", seconds: rest, matches: 0 });
    const top = Math.max(1e-9, ...phases.map((p) => p.seconds));
    const rows = phases.map((p) =>
      `<div class="lab mono" title="${esc(p.name)}">${esc(phaseLabel(p.name))}</div>` +
      `<div class="track"><div class="b one" style="width:${((100 * p.seconds) / top).toFixed(2)}%"></div></div>` +
      `<div class="num">${(p.seconds * 1e3).toFixed(1)} ms · ${((100 * p.seconds) / DATA.summary.seconds).toFixed(1)}%` +
      `${p.matches ? ` · ${p.matches.toLocaleString()} matches` : ""}</div>`);
    document.getElementById("phases").insertAdjacentHTML("beforeend", `<div class="bars">${rows.join("")}</div>`);
  }

  // ---- wiring --------------------------------------------------------------------------

  function hookCharts() {
    const target = (event, attr) => {
      const el = event.target.closest(`[${attr}]`);
      return el ? Number(el.getAttribute(attr)) : null;
    };
    const chart = document.getElementById("cost-chart");
    chart.addEventListener("mouseover", (event) => {
      const j = target(event, "data-k");
      hover(j === null ? null : { side: "program", index: j });
    });
    chart.addEventListener("mouseleave", () => hover(null));
    chart.addEventListener("click", (event) => {
      const j = target(event, "data-k");
      if (j !== null) pin({ side: "program", index: j });
    });
    const patterns = document.getElementById("patterns");
    patterns.addEventListener("mouseover", (event) => {
      const i = target(event, "data-p");
      hover(i === null ? null : { pattern: i });
    });
    patterns.addEventListener("mouseleave", () => hover(null));
    patterns.addEventListener("click", (event) => {
      const i = target(event, "data-p");
      if (i !== null) pin({ pattern: i });
    });
    document.querySelectorAll('input[name="order"]').forEach((radio) => {
      radio.addEventListener("change", () => drawCosts(radio.value, false));
    });
    document.getElementById("search").addEventListener("input", (event) => {
      const text = event.target.value.trim();
      pin(text ? { search: text } : null);
    });
    document.addEventListener("keydown", (event) => {
      if (event.key === "Escape") pin(null);
    });
  }

  function originalLabels(i) {
    const n = ORIGINAL.nodes[i];
    if (n.kind === "input" || n.kind === "output") return [clip(n.name, 30), ""];
    return [clip(shortName(n.name), 30), clip(n.ops, 34)];
  }

  function programLabels(j) {
    const k = PROGRAM.nodes[j];
    if (!k.covers) return [clip(k.name, 30), ""];
    return [clip(`#${j + 1} ${k.name}`, 34), us(k.cost)];
  }

  function main() {
    drawSummary();
    drawLegend();
    drawByKind();
    drawCosts("cost", false);
    drawRules();
    drawPatterns();
    drawPhases();
    const handlers = (side) => ({
      onHover: (i) => hover(i === null ? null : { side: side, index: i }),
      onClick: (i) => pin(i === null ? null : { side: side, index: i }),
    });
    views = {
      original: new GraphView(document.getElementById("pane-original"), ORIGINAL, originalLabels, handlers("original")),
      program: new GraphView(document.getElementById("pane-program"), PROGRAM, programLabels, handlers("program")),
    };
    const originalCount = ORIGINAL.nodes.filter((n) => n.kind !== "input" && n.kind !== "output").length;
    document.querySelector("#pane-original .count").textContent = `${originalCount} nodes`;
    document.querySelector("#pane-program .count").textContent = `${PROGRAM.kernels} kernels`;
    hookCharts();
    let pending = 2;
    const finished = () => {
      pending -= 1;
      if (pending === 0) document.body.dataset.ready = "1";
    };
    views.program.start(finished);
    views.original.start(finished);
  }

  main();
})();
