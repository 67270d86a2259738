// knopt's HTML report: a pannable, zoomable view of one graph. dagre (inlined in the page as
// text) lays the graph out in a worker thread, slice by slice, and each slice is drawn as SVG as
// soon as it is ready, so that a large graph never blocks the page.
"use strict";
const KnoptGraph = (function () {
  const LAYOUT_LIBRARY = document.getElementById("layout-library").textContent;
  const SVG_NS = "http://www.w3.org/2000/svg";

  function esc(text) {
    return String(text).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
  }
  // A light fill of a kind's colour, so that black labels stay readable.
  function tint(hex, amount) {
    const n = parseInt(hex.slice(1), 16);
    const mix = (c) => Math.round(c + (255 - c) * amount);
    return `rgb(${mix(n >> 16)},${mix((n >> 8) & 255)},${mix(n & 255)})`;
  }

  // ---- layout (in a worker) ------------------------------------------------------

  // dagre in one piece takes minutes on a chain of a few thousand nodes, or overflows the stack
  // (measured on a 2,737-node BERT-like graph), so large graphs are laid out in slices of
  // consecutive nodes (in topological order), stacked top to bottom: about 1 ms a node (2-3 s
  // for that graph), and each slice is drawn as soon as it is ready.
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
    // `labels(i)` gives [title, subtitle] of node i; `handlers` has `onHover(i|null)` and
    // `onClick(i|null)`; `colours` maps a node's kind to its colour.
    constructor(pane, graph, labels, handlers, colours) {
      this.colours = colours;
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
      const c = this.colours[node.kind] || "#8c959f";
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

  return { GraphView: GraphView, esc: esc, tint: tint };
})();
