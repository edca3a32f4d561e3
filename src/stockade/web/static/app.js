// stockade web UI: live updates applied in place, the step graph, the timeline.
// Plain JavaScript, no build step. Updates change text nodes and attributes of
// the elements they name (never innerHTML), so a selection elsewhere survives.
(() => {
  "use strict";

  const $ = (sel, root) => (root || document).querySelector(sel);
  const $$ = (sel, root) => Array.from((root || document).querySelectorAll(sel));
  const pageData = () => JSON.parse(($("#page-data") || {}).textContent || "{}");
  let DATA = pageData();
  const SVG = "http://www.w3.org/2000/svg";

  // -- formatting ---------------------------------------------------------------

  function dur(s) {
    if (s === null || s === undefined || isNaN(s)) return "-";
    if (s < 10) return s.toFixed(2) + "s";
    if (s < 60) return s.toFixed(1) + "s";
    let m = Math.floor(s / 60);
    const sec = Math.floor(s % 60);
    if (m < 60) return m + "m" + String(sec).padStart(2, "0") + "s";
    const h = Math.floor(m / 60);
    m = m % 60;
    return h + "h" + String(m).padStart(2, "0") + "m";
  }
  function when(ts) {
    if (!ts) return "-";
    const d = new Date(ts * 1000);
    const p = (n) => String(n).padStart(2, "0");
    return d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + " " +
      p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
  }
  function size(n) {
    if (n === null || n === undefined) return "-";
    let v = n;
    for (const u of ["B", "KiB", "MiB", "GiB"]) {
      if (v < 1024 || u === "GiB") return u === "B" ? v.toFixed(0) + " B" : v.toFixed(1) + " " + u;
      v /= 1024;
    }
    return n + " B";
  }
  function tokens(usage) {
    let t = 0;
    for (const [k, v] of Object.entries(usage || {})) if (k.endsWith("_tokens")) t += v;
    return t ? t.toLocaleString("en-US") : "-";
  }

  // -- in-place updates -----------------------------------------------------------

  // Change what an element shows by editing its one text node: the nodes around
  // (and any selection in them) stay as they are.
  function setText(el, text) {
    if (!el) return;
    text = String(text);
    const only = el.childNodes.length === 1 && el.firstChild.nodeType === Node.TEXT_NODE;
    if (only) {
      if (el.firstChild.data !== text) el.firstChild.data = text;
    } else if (el.textContent !== text) {
      el.textContent = text;
    }
  }
  function setPill(holder, status) {
    if (!holder || !status) return;
    let p = holder.classList && holder.classList.contains("pill") ? holder : $(".pill", holder);
    if (!p) {
      p = document.createElement("span");
      holder.appendChild(p);
    }
    setText(p, status);
    const cls = "pill s-" + status;
    if (p.className !== cls) p.className = cls;
  }
  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function pillEl(status) { return el("span", { class: "pill s-" + status }, status); }
  function toast(text) {
    const t = $("#toast");
    t.textContent = text;
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, 6000);
  }

  // Durations of running things tick here, not over the wire.
  function tickDurations() {
    const now = Date.now() / 1000;
    for (const e of $$("[data-start]")) {
      if (e.dataset.f === "span" || e.id === "timeline") continue;
      const start = parseFloat(e.dataset.start);
      const end = parseFloat(e.dataset.end);
      if (!isNaN(end) && e.dataset.end !== "") setText(e, dur(end - start));
      else if (e.dataset.running === "1" && !isNaN(start)) setText(e, dur(now - start));
    }
  }
  function setEnd(e, ended, running) {
    if (!e) return;
    e.dataset.end = ended || "";
    e.dataset.running = running ? "1" : "0";
  }

  // -- the event stream ---------------------------------------------------------

  let patches = 0;
  function live(url, onPatch) {
    const conn = $("#conn");
    let es = null;
    const connect = () => {
      const u = typeof url === "function" ? url() : url;
      if (!u) return;
      es = new EventSource(u);
      es.addEventListener("open", () => { conn.textContent = "live"; conn.className = "conn on"; });
      es.addEventListener("error", () => {
        conn.textContent = "reconnecting…";
        conn.className = "conn off";
        // Reconnect with the state the page has now (log offsets), not the first URL's.
        es.close();
        setTimeout(connect, 2000);
      });
      es.addEventListener("patch", (ev) => {
        const p = JSON.parse(ev.data);
        try { onPatch(p); } finally {
          patches += 1;
          document.body.dataset.patches = String(patches);
        }
      });
    };
    connect();
  }

  // -- actions (with --allow-actions) -----------------------------------------------

  function setupActions() {
    const meta = $("meta[name=stockade-token]");
    for (const b of $$("button[data-action]")) {
      b.addEventListener("click", async () => {
        const action = b.dataset.action;
        if (action === "cancel" && !confirm("Cancel run " + b.dataset.run + "?")) return;
        b.disabled = true;
        try {
          const r = await fetch("/actions/" + action + "/" + encodeURIComponent(b.dataset.run), {
            method: "POST", headers: { "X-Stockade-Token": meta ? meta.content : "" },
          });
          const body = await r.json();
          toast(body.ok ? body.message : "refused: " + body.error);
        } catch (e) {
          toast("failed: " + e);
        } finally {
          b.disabled = false;
        }
      });
    }
  }
  function showActions(status) {
    for (const b of $$("button[data-action]")) {
      const on = b.dataset.action === "cancel" ? status === "running"
        : ["crashed", "interrupted", "failed", "errored"].includes(status);
      b.hidden = !on;
    }
  }
  function applyRun(run) {
    if (!run) return;
    if (run.status) {
      setPill($("#run-status"), run.status);
      showActions(run.status);
    }
    const d = $("#run-duration");
    if (d && ("ended_at" in run || run.status)) setEnd(d, run.ended_at !== undefined ? run.ended_at : d.dataset.end,
      (run.status || "") === "running");
    if ("resume" in run) {
      const r = $("#run-resume");
      if (r) {
        r.hidden = !run.resume;
        if (run.resume) setText($("code", r), run.resume);
      }
    }
  }

  // -- the step graph (dagre lays it out) -------------------------------------------

  const FILL = {
    succeeded: "#dafbe1", failed: "#ffebe9", errored: "#ffebe9", running: "#ddf4ff",
    pending: "#f6f8fa", skipped: "#eaeef2", interrupted: "#fff8c5", crashed: "#ffebe9",
    item: "#f6f8fa", file: "#fff8c5", text: "#f6f8fa", current: "#ddf4ff",
  };
  const STROKE = {
    succeeded: "#1a7f37", failed: "#cf222e", errored: "#a40e26", running: "#0969da",
    pending: "#8c959f", skipped: "#6e7781", interrupted: "#9a6700", crashed: "#82071e",
    item: "#8c959f", file: "#bf8700", text: "#8c959f", current: "#0969da",
  };

  // nodes: [{id, label, sub, status, url}], edges: [{from, to, label, dashed}]
  function drawGraph(box, nodes, edges, rankdir) {
    if (!box || !window.dagre || !nodes.length) return {};
    const g = new dagre.graphlib.Graph({ multigraph: true });
    g.setGraph({ rankdir: rankdir || "LR", nodesep: 18, ranksep: 48, marginx: 8, marginy: 8 });
    g.setDefaultEdgeLabel(() => ({}));
    for (const n of nodes) {
      const w = Math.max(110, 8 + 7.4 * Math.max(n.label.length, (n.sub || "").length * 0.9));
      g.setNode(n.id, { width: Math.min(w, 320), height: n.sub !== undefined ? 44 : 30 });
    }
    edges.forEach((e, i) => {
      if (g.hasNode(e.from) && g.hasNode(e.to)) {
        g.setEdge(e.from, e.to, { label: e.label || "", width: e.label ? 7 * Math.min(e.label.length, 28) : 0,
          height: e.label ? 14 : 0, labelpos: "c" }, "e" + i);
      }
    });
    dagre.layout(g);
    const gg = g.graph();
    const svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("width", Math.ceil(gg.width || 0));
    svg.setAttribute("height", Math.ceil(gg.height || 0));
    svg.setAttribute("viewBox", "0 0 " + Math.ceil(gg.width || 0) + " " + Math.ceil(gg.height || 0));
    const defs = document.createElementNS(SVG, "defs");
    const marker = document.createElementNS(SVG, "marker");
    for (const [k, v] of Object.entries({ id: "arrow", viewBox: "0 0 10 10", refX: "9", refY: "5",
      markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse" })) marker.setAttribute(k, v);
    const tip = document.createElementNS(SVG, "path");
    tip.setAttribute("d", "M 0 0 L 10 5 L 0 10 z");
    tip.setAttribute("fill", "#8c959f");
    marker.appendChild(tip);
    defs.appendChild(marker);
    svg.appendChild(defs);
    for (const e of g.edges()) {
      const ed = g.edge(e);
      const grp = document.createElementNS(SVG, "g");
      const meta = edges[parseInt(e.name.slice(1), 10)];
      grp.setAttribute("class", "edge" + (meta && meta.dashed ? " dashed" : ""));
      const path = document.createElementNS(SVG, "path");
      path.setAttribute("d", ed.points.map((p, i) => (i ? "L" : "M") + p.x.toFixed(1) + " " + p.y.toFixed(1)).join(" "));
      path.setAttribute("marker-end", "url(#arrow)");
      grp.appendChild(path);
      if (ed.label) {
        const t = document.createElementNS(SVG, "text");
        t.setAttribute("x", ed.x);
        t.setAttribute("y", ed.y + 4);
        t.setAttribute("text-anchor", "middle");
        t.textContent = ed.label.length > 28 ? ed.label.slice(0, 27) + "…" : ed.label;
        grp.appendChild(t);
      }
      svg.appendChild(grp);
    }
    const byId = {};
    for (const n of nodes) {
      const nd = g.node(n.id);
      const grp = document.createElementNS(SVG, "g");
      grp.setAttribute("class", "node");
      grp.setAttribute("data-node", n.id);
      grp.setAttribute("transform", "translate(" + (nd.x - nd.width / 2) + "," + (nd.y - nd.height / 2) + ")");
      const rect = document.createElementNS(SVG, "rect");
      rect.setAttribute("width", nd.width);
      rect.setAttribute("height", nd.height);
      rect.setAttribute("rx", 7);
      grp.appendChild(rect);
      const title = document.createElementNS(SVG, "title");
      title.textContent = n.title || n.label;
      grp.appendChild(title);
      const t = document.createElementNS(SVG, "text");
      t.setAttribute("x", 10);
      t.setAttribute("y", n.sub !== undefined ? 18 : 19);
      t.textContent = n.label.length > 42 ? n.label.slice(0, 41) + "…" : n.label;
      grp.appendChild(t);
      let sub = null;
      if (n.sub !== undefined) {
        sub = document.createElementNS(SVG, "text");
        sub.setAttribute("x", 10);
        sub.setAttribute("y", 35);
        sub.setAttribute("class", "sub");
        sub.textContent = n.sub;
        grp.appendChild(sub);
      }
      if (n.url) grp.addEventListener("click", () => { location.href = n.url; });
      svg.appendChild(grp);
      byId[n.id] = { rect, sub, grp };
      paintNode(byId[n.id], n.status);
    }
    box.replaceChildren(svg);
    return byId;
  }
  function paintNode(node, status) {
    if (!node) return;
    node.rect.setAttribute("fill", FILL[status] || FILL.pending);
    node.rect.setAttribute("stroke", STROKE[status] || STROKE.pending);
    node.grp.setAttribute("data-status", status);
  }
  function stepSub(s) {
    const total = s.total === null || s.total === undefined ? "?" : s.total;
    let t = s.done + "/" + total + " done";
    if (s.running) t += " · " + s.running + " running";
    if (s.failed) t += " · " + s.failed + " failed";
    return t;
  }

  // -- the timeline -------------------------------------------------------------------

  const TL_COLORS = {
    succeeded: "#2da44e", failed: "#cf222e", errored: "#a40e26", fenced: "#8250df",
    skipped: "#8c959f", interrupted: "#bf8700", running: "#0969da", pending: "#d0d7de",
    retrying: "#bf8700",
  };
  function Timeline(canvas, tip, runUrl) {
    this.canvas = canvas;
    this.tip = tip;
    this.runUrl = runUrl;
    this.spans = [];
    this.running = [];
    this.steps = [];
    this.statuses = [];
    this.hits = [];
    this.pending = false;
    canvas.addEventListener("mousemove", (e) => this.hover(e));
    canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
    canvas.addEventListener("click", (e) => {
      const h = this.hit(e);
      if (h) location.href = h.url;
    });
  }
  // Columns from the server ({s, i, st, a, b, k}, times in ms) as rows here.
  function rowsOf(c) {
    const out = [];
    for (let n = 0; n < c.s.length; n++) {
      out.push([c.s[n], c.i[n], c.st[n], c.a[n] / 1000, c.b[n] / 1000,
        c.k.length && c.k[n] !== null ? c.k[n] : undefined]);
    }
    return out;
  }
  Timeline.prototype.load = function (d) {
    this.t0 = d.t0;
    this.steps = d.steps;
    this.statuses = d.statuses;
    if (d.bins) {
      // A big run: how many items of each step ended in each slice of time.
      this.binW = d.bins.w / 1000;
      this.bins = this.steps.map(() => new Map());
      for (let n = 0; n < d.bins.s.length; n++) this.count(d.bins.s[n], d.bins.b[n], d.bins.st[n], d.bins.n[n]);
    }
    d.spans = rowsOf(d.spans);
    d.running = (d.running || []).map((r) => [r[0], r[1], r[2] / 1000]);
    const seen = new Set();
    this.spans = d.spans.concat(this.spans || []).filter((s) => {
      const k = s[0] + ":" + s[1] + ":" + s[3];
      if (seen.has(k)) return false;
      seen.add(k);
      return true;
    });
    this.seen = seen;
    this.running = d.running || [];
    this.draw();
  };
  Timeline.prototype.count = function (step, bin, st, n) {
    const row = this.bins[step];
    if (!row) return;
    let c = row.get(bin);
    if (!c) { c = new Array(this.statuses.length).fill(0); row.set(bin, c); }
    c[st] += n;
  };
  Timeline.prototype.add = function (spans) {
    // The stream may repeat spans the first fetch had (its window overlaps).
    const seen = this.seen || (this.seen = new Set(this.spans.map((s) => s[0] + ":" + s[1] + ":" + s[3])));
    for (const s of spans) {
      const k = s[0] + ":" + s[1] + ":" + s[3];
      if (seen.has(k)) continue;
      seen.add(k);
      this.spans.push(s);
    }
    this.schedule();
  };
  Timeline.prototype.setRunning = function (r) { this.running = r || []; this.schedule(); };
  Timeline.prototype.schedule = function () {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.draw(); });
  };
  Timeline.prototype.draw = function () {
    if (this.bins) return this.drawBins();
    const width = this.canvas.clientWidth || 800;
    const gutter = 130;
    const laneH = 7;
    const maxLanes = 12;
    const now = Date.now() / 1000 - this.t0;
    let tmax = 0;
    for (const s of this.spans) if (s[4] > tmax) tmax = s[4];
    if (this.running.length) tmax = Math.max(tmax, now);
    tmax = Math.max(tmax, 0.001);
    // Pack each step's items into lanes: a lane holds items that do not overlap.
    const rows = this.steps.map(() => ({ lanes: [], items: [] }));
    const all = this.spans.map((s) => ({ step: s[0], item: s[1], st: this.statuses[s[2]], a: s[3], b: s[4], key: s[5] }))
      .concat(this.running.map((r) => ({ step: r[0], item: r[1], st: "running", a: r[2], b: now, key: r[3] })));
    all.sort((x, y) => x.a - y.a);
    const eps = tmax / 2000;
    for (const s of all) {
      const row = rows[s.step];
      if (!row) continue;
      let lane = row.lanes.findIndex((end) => end <= s.a + eps);
      if (lane < 0) {
        lane = row.lanes.length < maxLanes ? row.lanes.length : row.lanes.indexOf(Math.min(...row.lanes));
        if (lane === row.lanes.length) row.lanes.push(0);
      }
      row.lanes[lane] = Math.max(row.lanes[lane], s.b);
      s.lane = lane;
      row.items.push(s);
    }
    let y = 4;
    const tops = rows.map((r) => { const top = y; y += Math.max(1, r.lanes.length) * (laneH + 1) + 9; return top; });
    const height = y + 18;
    const ctx = this.canvasOf(width, height);
    const x = (t) => gutter + (width - gutter - 8) * (t / tmax);
    ctx.font = "12px ui-monospace, monospace";
    ctx.textBaseline = "middle";
    this.hits = [];
    rows.forEach((r, i) => {
      const top = tops[i];
      const h = Math.max(1, r.lanes.length) * (laneH + 1);
      ctx.fillStyle = i % 2 ? "#ffffff" : "#f6f8fa";
      ctx.fillRect(0, top - 3, width, h + 7);
      ctx.fillStyle = "#1f2328";
      const label = this.steps[i].length > 16 ? this.steps[i].slice(0, 15) + "…" : this.steps[i];
      ctx.fillText(label, 6, top + h / 2);
      for (const s of r.items) {
        const x0 = x(s.a);
        const w = Math.max(1, x(s.b) - x0);
        const yy = top + s.lane * (laneH + 1);
        ctx.fillStyle = TL_COLORS[s.st] || "#8c959f";
        ctx.fillRect(x0, yy, w, laneH);
        this.hits.push({ x0, x1: x0 + Math.max(w, 2), y0: yy, y1: yy + laneH, s });
      }
    });
    // The time axis.
    this.axis(ctx, x, tmax, height);
    if (!all.length) {
      ctx.fillStyle = "#656d76";
      ctx.fillText("no item has run yet", gutter, 12);
    }
  };
  // The canvas at ``width`` x ``height`` CSS pixels, cleared, scaled for the screen.
  Timeline.prototype.canvasOf = function (width, height) {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    if (c.height !== Math.round(height * dpr) || c.width !== Math.round(width * dpr)) {
      c.width = Math.round(width * dpr);
      c.height = Math.round(height * dpr);
      c.style.height = height + "px";
    }
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, width, height);
    return ctx;
  };
  // The time axis along the bottom.
  Timeline.prototype.axis = function (ctx, x, tmax, height) {
    ctx.fillStyle = "#656d76";
    ctx.font = "11px system-ui, sans-serif";
    for (let k = 0; k <= 4; k++) {
      const t = tmax * k / 4;
      const xx = x(t);
      ctx.fillRect(xx, height - 16, 1, 4);
      ctx.textAlign = k === 0 ? "left" : (k === 4 ? "right" : "center");
      ctx.fillText(dur(t), xx, height - 6);
    }
    ctx.textAlign = "left";
  };
  // A big run: per step, a bar per slice of time, as tall as the items that
  // ended in it (against the step's busiest slice), coloured by status.
  Timeline.prototype.drawBins = function () {
    const width = this.canvas.clientWidth || 800;
    const gutter = 130;
    const rowH = 32;
    const now = Date.now() / 1000 - this.t0;
    let tmax = 0.001;
    for (const row of this.bins) for (const b of row.keys()) tmax = Math.max(tmax, (b + 1) * this.binW);
    if (this.running.length) tmax = Math.max(tmax, now);
    const height = 4 + this.steps.length * (rowH + 9) + 18;
    const ctx = this.canvasOf(width, height);
    const x = (t) => gutter + (width - gutter - 8) * (t / tmax);
    ctx.font = "12px ui-monospace, monospace";
    ctx.textBaseline = "middle";
    this.hits = [];
    this.bins.forEach((row, i) => {
      const top = 4 + i * (rowH + 9);
      ctx.fillStyle = i % 2 ? "#ffffff" : "#f6f8fa";
      ctx.fillRect(0, top - 3, width, rowH + 7);
      ctx.fillStyle = "#1f2328";
      const label = this.steps[i].length > 16 ? this.steps[i].slice(0, 15) + "…" : this.steps[i];
      ctx.fillText(label, 6, top + rowH / 2);
      let most = 1;
      for (const counts of row.values()) most = Math.max(most, counts.reduce((a, b) => a + b, 0));
      for (const [b, counts] of row) {
        const x0 = x(b * this.binW);
        const w = Math.max(1, x((b + 1) * this.binW) - x0);
        let y = top + rowH;
        counts.forEach((n, st) => {
          if (!n) return;
          const h = Math.max(1, rowH * n / most);
          y -= h;
          ctx.fillStyle = TL_COLORS[this.statuses[st]] || "#8c959f";
          ctx.fillRect(x0, y, w, h);
        });
        this.hits.push({ x0, x1: x0 + Math.max(w, 2), y0: top, y1: top + rowH, bin: { step: i, b, counts } });
      }
      const running = this.running.filter((r) => r[0] === i);
      if (running.length) {
        ctx.fillStyle = TL_COLORS.running;
        for (const r of running) ctx.fillRect(x(r[2]), top - 2, Math.max(1, x(now) - x(r[2])), 2);
      }
    });
    this.axis(ctx, x, tmax, height);
  };
  Timeline.prototype.hit = function (e) {
    const r = this.canvas.getBoundingClientRect();
    const px = e.clientX - r.left;
    const py = e.clientY - r.top;
    for (let i = this.hits.length - 1; i >= 0; i--) {
      const h = this.hits[i];
      if (px >= h.x0 - 1 && px <= h.x1 + 1 && py >= h.y0 - 1 && py <= h.y1 + 1) {
        if (h.bin) {
          const step = this.steps[h.bin.step];
          return { bin: h.bin, step, url: this.runUrl + "/" + encodeURIComponent(step) };
        }
        const step = this.steps[h.s.step];
        const key = h.s.key !== undefined && h.s.key !== null ? h.s.key : String(h.s.item);
        return { s: h.s, step, key, url: this.runUrl + "/" + encodeURIComponent(step) + "/" + encodeURIComponent(key) };
      }
    }
    return null;
  };
  Timeline.prototype.hover = function (e) {
    const h = this.hit(e);
    if (!h) { this.tip.hidden = true; this.canvas.style.cursor = ""; return; }
    this.canvas.style.cursor = "pointer";
    if (h.bin) {
      const parts = [];
      let all = 0;
      h.bin.counts.forEach((n, st) => { if (n) { all += n; parts.push(n + " " + this.statuses[st]); } });
      const a = h.bin.b * this.binW;
      this.tip.textContent = h.step + " · " + dur(a) + "–" + dur(a + this.binW) + " · " + all +
        " ended: " + parts.join(", ");
    } else {
      this.tip.textContent = h.step + "/" + h.key + " · " + h.s.st + " · " + dur(h.s.b - h.s.a);
    }
    const r = this.canvas.getBoundingClientRect();
    this.tip.style.left = Math.min(e.clientX - r.left + 12, r.width - 200) + "px";
    this.tip.style.top = (e.clientY - r.top + 12) + "px";
    this.tip.hidden = false;
  };

  // -- pages ----------------------------------------------------------------------------

  const COUNTS = ["done", "running", "pending", "failed", "retried", "reused", "skipped", "interrupted"];

  function setBar(bar, c, total) {
    if (!bar) return;
    for (const seg of $$("[data-seg]", bar)) {
      const k = seg.dataset.seg;
      const w = total ? (100 * (c[k] || 0) / total) : 0;
      const v = w.toFixed(3) + "%";
      if (seg.style.width !== v) seg.style.width = v;
    }
  }

  function runsPage() {
    const tbody = $("#runs tbody");
    const rowEl = (r) => {
      const tr = el("tr", { "data-run": r.run_id });
      const a = el("a", { href: "/runs/" + encodeURIComponent(r.run_id) }, r.run_id);
      const td0 = el("td", { class: "mono" }); td0.appendChild(a); tr.appendChild(td0);
      tr.appendChild(el("td", {}, r.workflow));
      const st = el("td", { "data-f": "status" }); st.appendChild(pillEl(r.status)); tr.appendChild(st);
      tr.appendChild(el("td", { "data-f": "started_at" }, when(r.started_at)));
      tr.appendChild(el("td", { "data-f": "duration", "data-start": r.started_at, "data-end": r.ended_at || "",
        "data-running": r.status === "running" ? "1" : "0" }, "-"));
      const items = el("td", { class: "items" });
      items.appendChild(el("span", { "data-f": "done" }, r.done));
      items.appendChild(document.createTextNode(" / "));
      items.appendChild(el("span", { "data-f": "total" }, r.total));
      const bar = el("div", { class: "bar small" });
      bar.appendChild(el("span", { class: "seg g-done", "data-seg": "done" }));
      bar.appendChild(el("span", { class: "seg g-failed", "data-seg": "failed" }));
      items.appendChild(bar);
      tr.appendChild(items);
      tr.appendChild(el("td", { class: "num", "data-f": "failed" }, r.failed));
      tr.appendChild(el("td", { class: "num", "data-f": "usage" }, tokens(r.usage)));
      tr.appendChild(el("td", {}, r.sandbox + (r.enforced ? "" : " !")));
      setBar(bar, { done: r.done - r.failed, failed: r.failed }, r.total);
      return tr;
    };
    const update = (tr, ch, full) => {
      if (ch.status) setPill($("[data-f=status]", tr), ch.status);
      for (const k of ["done", "total", "failed"]) if (k in ch) setText($("[data-f=" + k + "]", tr), ch[k]);
      if ("usage" in ch) setText($("[data-f=usage]", tr), tokens(full.usage));
      const d = $("[data-f=duration]", tr);
      if ("ended_at" in ch || ch.status) setEnd(d, full.ended_at, full.status === "running");
      setBar($(".bar", tr), { done: full.done - full.failed, failed: full.failed }, full.total);
    };
    const known = {};
    for (const r of DATA.rows || []) known[r.run_id] = r;
    live(document.body.dataset.live, (p) => {
      for (const [id, ch] of Object.entries(p.rows || {})) {
        const tr = $("tr[data-run=\"" + CSS.escape(id) + "\"]", tbody);
        if (ch === null) { if (tr) tr.remove(); delete known[id]; continue; }
        if (!tr) continue;
        known[id] = Object.assign(known[id] || {}, ch);
        update(tr, ch, known[id]);
      }
      for (const id of p.new || []) {
        const r = p.rows[id];
        known[id] = r;
        const have = $("tr[data-run=\"" + CSS.escape(id) + "\"]", tbody);
        if (have) { update(have, r, r); continue; }
        const tr = rowEl(r);
        const pos = p.order.indexOf(id);
        const next = p.order.slice(pos + 1).map((k) => $("tr[data-run=\"" + CSS.escape(k) + "\"]", tbody)).find(Boolean);
        tbody.insertBefore(tr, next || null);
      }
      $("#no-runs").hidden = tbody.children.length > 0;
    });
  }

  function runPage() {
    const steps = {};
    for (const s of DATA.steps) steps[s.id] = s;
    const runUrl = "/runs/" + encodeURIComponent(DATA.run_id);
    const graphNodes = () => DATA.steps.map((s) => ({
      id: s.id, label: s.id, sub: stepSub(steps[s.id]), status: steps[s.id].status,
      url: runUrl + "/" + encodeURIComponent(s.id), title: s.id + " (" + s.kind + ")",
    }));
    const edges = [];
    for (const s of DATA.steps) for (const n of s.needs) edges.push({ from: n, to: s.id });
    let nodes = drawGraph($("#dag"), graphNodes(), edges, "LR");
    const tl = new Timeline($("#timeline"), $("#timeline-tip"), runUrl);
    const fetchTimeline = () => fetch("/api/runs/" + encodeURIComponent(DATA.run_id) + "/timeline")
      .then((r) => r.json()).then((d) => tl.load(d)).catch(() => {});
    fetchTimeline();
    setInterval(() => { if (tl.stale) { tl.stale = false; fetchTimeline(); } }, 5000);
    window.addEventListener("resize", () => tl.schedule());
    setInterval(() => { if (tl.running.length) tl.schedule(); }, 1000);
    live(document.body.dataset.live, (p) => {
      applyRun(p.run);
      if (p.usage) setText($("#run-usage"), tokens(Object.assign({}, p.usage)));
      for (const [id, ch] of Object.entries(p.steps || {})) {
        if (ch === null) continue;
        const s = steps[id] = Object.assign(steps[id] || { id }, ch);
        const tr = $("tr[data-step=\"" + CSS.escape(id) + "\"]");
        if (!tr) continue;
        if (ch.status) setPill($("[data-f=status]", tr), ch.status);
        if ("total" in ch) setText($("[data-f=total]", tr), ch.total === null ? "-" : ch.total);
        for (const k of COUNTS) if (k in ch) setText($("[data-f=" + k + "] a", tr) || $("[data-f=" + k + "]", tr), ch[k]);
        if ("usage" in ch) setText($("[data-f=usage]", tr), tokens(s.usage));
        if ("started_at" in ch || "ended_at" in ch) {
          const span = $("[data-f=span]", tr);
          setText(span, s.started_at && s.ended_at ? dur(s.ended_at - s.started_at) : "-");
        }
        setBar($("[data-bar]", tr), s, s.total);
        if (nodes[id]) {
          paintNode(nodes[id], s.status);
          if (nodes[id].sub) setText(nodes[id].sub, stepSub(s));
        }
      }
      for (const f of p.failures || []) {
        if ($("#failures li[data-url=\"" + CSS.escape(f.url) + "\"]")) continue;
        const li = el("li", { "data-url": f.url });
        const head = el("div");
        head.appendChild(el("a", { class: "mono", href: f.url }, f.step + "/" + f.key));
        head.appendChild(document.createTextNode(" "));
        head.appendChild(pillEl(f.status));
        head.appendChild(el("span", { class: "dim" }, " attempt " + f.attempt + " "));
        head.appendChild(el("span", { class: "message" }, f.message));
        li.appendChild(head);
        if (f.stderr) li.appendChild(el("pre", { class: "log small" }, f.stderr));
        $("#failures").appendChild(li);
        $("#no-failures").hidden = true;
      }
      if (p.spans) tl.add(rowsOf(p.spans));
      // A big run's counts: fetched again, at most every few seconds.
      if (p.timeline_stale) tl.stale = true;
      if (p.running) tl.setRunning(p.running.map((r) => [r[0], r[1], r[2] / 1000]));
    });
  }

  function stepPage() {
    const base = DATA.base;
    const tbody = $("#items tbody");
    const rows = {};
    for (const r of DATA.rows) rows[r.index] = r;
    const rowEl = (r) => {
      const tr = el("tr", { "data-index": r.index });
      tr.appendChild(el("td", { class: "num dim" }, r.index));
      const k = el("td", { class: "mono" });
      k.appendChild(el("a", { href: base + "/" + encodeURIComponent(r.key) }, r.key));
      tr.appendChild(k);
      const st = el("td", { "data-f": "status" }); st.appendChild(pillEl(r.status)); tr.appendChild(st);
      tr.appendChild(el("td", { class: "num", "data-f": "attempt" }, r.attempt || "-"));
      tr.appendChild(el("td", { "data-f": "started_at" }, when(r.started_at)));
      tr.appendChild(el("td", { "data-f": "duration", "data-start": r.started_at || "", "data-end": r.ended_at || "",
        "data-running": r.status === "running" ? "1" : "0" }, "-"));
      tr.appendChild(el("td", { class: "message", "data-f": "message" }, r.message));
      return tr;
    };
    live(document.body.dataset.live, (p) => {
      if (p.run) setPill($("#run-status"), p.run.status);
      if (p.status) setPill($("#step-status"), p.status);
      if ("matching" in p) {
        setText($("#matching"), p.matching);
      }
      if (p.counts) {
        for (const [k, v] of Object.entries(p.counts)) {
          const b = $("[data-c=" + k + "]");
          if (b) setText(b, v === null ? "-" : v);
        }
        const c = Object.assign({}, DATA.counts || {}, p.counts);
        DATA.counts = c;
      }
      if (p.total !== undefined) setText($("[data-c=total]"), p.total);
      for (const [idx, ch] of Object.entries(p.rows || {})) {
        let tr = $("tr[data-index=\"" + idx + "\"]", tbody);
        if (ch === null) { if (tr) tr.remove(); delete rows[idx]; continue; }
        const r = rows[idx] = Object.assign(rows[idx] || {}, ch);
        if (!tr) {
          tr = rowEl(r);
          const after = Array.from(tbody.children).find((t) => parseInt(t.dataset.index, 10) > parseInt(idx, 10));
          tbody.insertBefore(tr, after || null);
          continue;
        }
        if (ch.status) setPill($("[data-f=status]", tr), ch.status);
        if ("attempt" in ch) setText($("[data-f=attempt]", tr), r.attempt || "-");
        if ("started_at" in ch) setText($("[data-f=started_at]", tr), when(r.started_at));
        if ("message" in ch) setText($("[data-f=message]", tr), r.message);
        if ("key" in ch) {
          const a = $("td.mono a", tr);
          setText(a, r.key);
          a.setAttribute("href", base + "/" + encodeURIComponent(r.key));
        }
        const d = $("[data-f=duration]", tr);
        if (d && ("started_at" in ch || "ended_at" in ch || ch.status)) {
          d.dataset.start = r.started_at || "";
          setEnd(d, r.ended_at, r.status === "running");
        }
      }
      const bar = $(".card .bar");
      if (bar && DATA.counts) setBar(bar, DATA.counts, DATA.counts.total);
    });
  }

  const LOG_KEEP = 1 << 20;

  function itemPage() {
    const offsets = {};
    const logsUrl = () => {
      const parts = [];
      for (const [k, v] of Object.entries(offsets)) parts.push(k + ":" + v);
      const base = document.body.dataset.live.split("?")[0];
      return base + "?logs=" + parts.join(",") + "&finished=" + (DATA.finished ? 1 : 0);
    };
    const initial = new URLSearchParams(document.body.dataset.live.split("?")[1] || "");
    for (const part of (initial.get("logs") || "").split(",")) {
      const b = part.split(":");
      if (b.length === 3) offsets[b[0] + ":" + b[1]] = parseInt(b[2], 10);
    }
    DATA.finished = initial.get("finished") === "1";
    const chain = DATA.chain || { nodes: [], edges: [] };
    const drawChain = (c) => drawGraph($("#chain-graph"), c.nodes.map((n) => ({
      id: n.id, label: n.label + (n.run ? " @" + n.run.slice(0, 8) : ""), url: n.url,
      status: n.current ? "current" : n.kind, title: n.run ? n.label + " in run " + n.run : n.label,
    })), c.edges, "LR");
    drawChain(chain);
    const base = DATA.base;
    const logBox = (n) => {
      let d = $("details.attempt-logs[data-attempt=\"" + n + "\"]");
      if (d) return d;
      for (const o of $$("details.attempt-logs")) o.open = false;
      d = el("details", { class: "attempt-logs", "data-attempt": n });
      d.open = true;
      d.appendChild(el("summary", {}, "attempt " + n));
      for (const stream of ["stderr", "stdout"]) {
        const box = el("div", { class: "logbox" });
        const head = el("div", { class: "loghead" }, stream + " ");
        head.appendChild(el("a", { href: base + "/log/" + n + "/" + stream }, "whole file"));
        box.appendChild(head);
        box.appendChild(el("pre", { class: "log", id: "log-" + n + "-" + stream, "data-log": n + ":" + stream }));
        d.appendChild(box);
      }
      $("#logs").appendChild(d);
      return d;
    };
    const attemptRow = (n, a) => {
      const tr = el("tr", { "data-attempt": n });
      const td = el("td", { class: "num" });
      td.appendChild(el("a", { href: base + "?attempt=" + n }, n));
      tr.appendChild(td);
      const oc = el("td", { "data-f": "outcome" }); oc.appendChild(pillEl(a.outcome)); tr.appendChild(oc);
      tr.appendChild(el("td", { class: "num", "data-f": "exit_code" }, a.exit_code === null ? "-" : a.exit_code));
      if ($("#attempts th[data-col=worker]")) tr.appendChild(workerCell(a));
      tr.appendChild(el("td", {}, when(a.started_at)));
      tr.appendChild(el("td", { "data-f": "duration", "data-start": a.started_at || "", "data-end": a.ended_at || "",
        "data-running": a.outcome === "running" ? "1" : "0" }, "-"));
      for (const s of ["stdout", "stderr"]) {
        const c = el("td");
        c.appendChild(el("a", { href: base + "/log/" + n + "/" + s, "data-f": s + "_size" }, size(a[s + "_size"])));
        tr.appendChild(c);
      }
      tr.appendChild(el("td", { class: "message", "data-f": "message" }, a.message || ""));
      return tr;
    };
    const workerCell = (a) => el("td", { class: "mono", "data-f": "worker", title: a.worker_at || "" }, a.worker || "");
    // The column is drawn once an attempt names a worker (a Dask run); it can be
    // the first one to, after the page was drawn.
    const workerColumn = () => {
      if ($("#attempts th[data-col=worker]")) return;
      $("#attempts thead th:nth-child(3)").after(el("th", { "data-col": "worker" }, "worker"));
      for (const tr of $$("#attempts tbody tr")) $("[data-f=exit_code]", tr).after(workerCell({}));
    };
    // A note in a log: what is not shown, and a link to the whole file.
    const logNote = (k, cls, text) => {
      const [n, stream] = k.split(":");
      const note = el("span", { class: "log-note " + cls }, text + "; the whole log: ");
      note.appendChild(el("a", { href: base + "/log/" + n + "/" + stream }, "download"));
      note.appendChild(document.createTextNode("\n"));
      return note;
    };
    // A page that follows a chatty step for hours keeps only the last LOG_KEEP
    // characters of each log (oldest first out), under one note that says so.
    const keepTail = (pre, k) => {
      let top = $(".log-dropped", pre);
      let excess = pre.textContent.length - (top ? top.textContent.length : 0) - LOG_KEEP;
      if (excess <= 0) return;
      if (!top) {
        top = logNote(k, "log-dropped", "\u2026 older text dropped: this page keeps the last " + size(LOG_KEEP));
        pre.insertBefore(top, pre.firstChild);
      }
      let node = top.nextSibling;
      while (excess > 0 && node) {
        const next = node.nextSibling;
        const len = node.textContent.length;
        if (len <= excess || node.nodeType !== Node.TEXT_NODE) {
          node.remove();
          excess -= len;
        } else {
          // Cut at a line's start, so the oldest line kept is whole.
          const nl = node.data.indexOf("\n", excess - 1);
          node.data = node.data.slice(nl < 0 ? excess : nl + 1);
          excess = 0;
        }
        node = next;
      }
    };
    const attempts = {};
    const swapIn = async () => {
      // The item finished: its outputs, provenance and transcript exist now.
      const html = await (await fetch(location.href, { cache: "no-store" })).text();
      const doc = new DOMParser().parseFromString(html, "text/html");
      const sel = window.getSelection();
      for (const fresh of $$("[data-swap]", doc)) {
        const old = $("[data-swap=\"" + fresh.dataset.swap + "\"]");
        if (!old) {
          $("main").appendChild(document.importNode(fresh, true));
          continue;
        }
        if (sel && sel.rangeCount && old.contains(sel.anchorNode)) continue;
        old.replaceWith(document.importNode(fresh, true));
      }
      const d = JSON.parse(($("#page-data", doc) || {}).textContent || "{}");
      if (d.chain) drawChain(d.chain);
    };
    live(logsUrl, (p) => {
      applyRun(p.run);
      if (p.status) setPill($("#item-status"), p.status);
      for (const [n, ch] of Object.entries(p.attempts || {})) {
        if (ch === null) continue;
        const a = attempts[n] = Object.assign(attempts[n] || {}, ch);
        if (ch.worker) workerColumn();
        let tr = $("#attempts tr[data-attempt=\"" + n + "\"]");
        if (!tr) {
          tr = attemptRow(n, a);
          $("#attempts tbody").appendChild(tr);
          $("#no-attempts").hidden = true;
          logBox(n);
          continue;
        }
        if (ch.outcome) setPill($("[data-f=outcome]", tr), ch.outcome);
        if ("exit_code" in ch) setText($("[data-f=exit_code]", tr), ch.exit_code === null ? "-" : ch.exit_code);
        if ("message" in ch) setText($("[data-f=message]", tr), ch.message || "");
        const w = $("[data-f=worker]", tr);
        if (w && "worker" in ch) { setText(w, ch.worker || ""); w.title = ch.worker_at || ""; }
        for (const s of ["stdout", "stderr"]) if ((s + "_size") in ch) setText($("[data-f=" + s + "_size]", tr), size(ch[s + "_size"]));
        const d = $("[data-f=duration]", tr);
        if (d && ("ended_at" in ch || ch.outcome)) setEnd(d, a.ended_at, a.outcome === "running");
      }
      const skipped = p.skipped || {};
      for (const k of new Set([...Object.keys(skipped), ...Object.keys(p.logs || {})])) {
        const [n] = k.split(":");
        logBox(n);
        const pre = $("pre[data-log=\"" + k + "\"]");
        if (!pre) continue;
        const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
        // The server skipped ahead: the log grew faster than a stream can follow.
        if (skipped[k]) pre.appendChild(logNote(k, "log-skip", "\u2026 " + size(skipped[k]) + " skipped"));
        // A new text node at the end: the text already there, and a selection in it, stay.
        if (p.logs && p.logs[k]) pre.appendChild(document.createTextNode(p.logs[k]));
        keepTail(pre, k);
        if (atEnd) pre.scrollTop = pre.scrollHeight;
      }
      for (const [k, v] of Object.entries(p.offsets || {})) offsets[k] = v;
      if (p.finished) {
        DATA.finished = true;
        swapIn();
      }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    DATA = pageData();
    for (const s of $$("select[data-autosubmit]")) s.addEventListener("change", () => s.form.submit());
    setupActions();
    tickDurations();
    setInterval(tickDurations, 1000);
    const page = document.body.dataset.page;
    if (page === "runs") runsPage();
    else if (page === "run") runPage();
    else if (page === "step") stepPage();
    else if (page === "item") itemPage();
  });
})();
