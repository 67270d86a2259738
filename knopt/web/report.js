// knopt's HTML report: draws the data that knopt/opt/report_html.py embeds in the page (the two
// graphs through graph_view.js; the summary, charts and tables as plain DOM) and links them:
// hovering or clicking a kernel, an original node, a chart row or a pattern lights up the rest.
"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const COLOURS = DATA.colours;
  const ORIGINAL = DATA.original;
  const PROGRAM = DATA.program;
  const KIND_NAMES = {
    op: "single op (unfused)", view: "view (free)", removed: "folded or removed",
    opaque: "opaque (an op knopt keeps as it is)",
    layer_norm: "layer norm", rms_norm: "RMS norm",
  };
  const { GraphView, esc, tint } = KnoptGraph;

  // ---- formatting ----------------------------------------------------------------------

  function us(seconds) {
    const v = seconds * 1e6;
    if (v >= 1000) return (v / 1000).toFixed(2) + " ms";
    return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + " µs";
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

  const HINT = "Hover or click a node: its kernel and the original nodes it covers light up on both sides. " +
    "Scroll or drag to move, Ctrl + scroll to zoom, Esc to clear.";

  // The info line under the graphs says what a selection is.
  function describe(sel, links) {
    let html = `<span class="hint">${HINT}</span>`;
    if (sel && sel.side === "program") html = describeKernel(sel.index);
    else if (sel && sel.side === "original") html = describeNode(sel.index);
    else if (sel && sel.pattern !== undefined) html = describePattern(DATA.patterns[sel.pattern]);
    else if (sel) html = describeSearch(sel.search, links);
    document.getElementById("info").innerHTML = html;
  }

  function swatch(kind) {
    return `<span class="swatch" style="background:${colour(kind)}"></span>`;
  }
  function plural(count, word) {
    return `${count} ${word}${count === 1 ? "" : "s"}`;
  }
  function originalNames(indices, shown) {
    return indices.slice(0, shown).map((i) => esc(shortName(ORIGINAL.nodes[i].name))).join(", ") +
      (indices.length > shown ? ` and ${indices.length - shown} more` : "");
  }
  function code(text) {
    return text ? ` <code>${esc(text)}</code>` : "";
  }

  function describeKernel(j) {
    const k = PROGRAM.nodes[j];
    if (!k.covers) return `<b>${esc(k.name)}</b> · graph ${k.kind}`;
    const covers = k.covers.length
      ? `covers ${plural(k.covers.length, "original node")}: ${originalNames(k.covers, 12)}`
      : "no original node is attributed to it: the rewrites made it anew, and the nodes it " +
        "replaced count with the kernels that read it";
    return `${swatch(k.kind)}<b>${esc(kernelTitle(j))}</b> <span class="tag">${esc(kindName(k.kind))}</span>` +
      `${code(k.type)} · estimated ${us(k.before)} → <b>${us(k.cost)}</b>` +
      (k.detail.length ? ` ·${code(k.detail.join("; "))}` : "") + `<br><span class="names">${covers}</span>`;
  }

  function describeNode(i) {
    const n = ORIGINAL.nodes[i];
    const head = `${swatch(n.kind)}<b>${esc(n.name)}</b>${code(n.ops)}${code(n.type)}`;
    if (n.kind === "input") return `${head} · graph input`;
    if (n.kind === "output") return `${head} · graph output`;
    const fate = n.kernels.length
      ? "computed by " + n.kernels.map((k) => `${swatch(PROGRAM.nodes[k].kind)}${esc(kernelTitle(k))}`).join(", ")
      : n.kind === "view" ? "became a view (free: read through strides)" : "folded into a constant or simplified away";
    return `${head} · estimated ${us(n.cost)} before<br><span class="names">${fate}</span>`;
  }

  function describePattern(p) {
    return `<b>${esc(p.op)}</b> (estimated ${us(p.cost)}) replaces ${plural(p.covers.length, "original node")}: ` +
      `<span class="names">${originalNames(p.covers, 12)}</span>`;
  }

  function describeSearch(text, links) {
    return `“${esc(text)}”: ${plural(links.original.length, "original node")}, ${plural(links.program.length, "kernel")}` +
      (links.original.length ? `: <span class="names">${originalNames(links.original, 10)}</span>` : "");
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
      original: new GraphView(document.getElementById("pane-original"), ORIGINAL, originalLabels, handlers("original"), COLOURS),
      program: new GraphView(document.getElementById("pane-program"), PROGRAM, programLabels, handlers("program"), COLOURS),
    };
    const originalCount = ORIGINAL.nodes.filter((n) => n.kind !== "input" && n.kind !== "output").length;
    document.querySelector("#pane-original .count").textContent = `${originalCount} nodes`;
    document.querySelector("#pane-program .count").textContent = `${PROGRAM.kernels} kernels`;
    hookCharts();
    describe(null, null);
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
