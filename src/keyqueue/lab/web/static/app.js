// keyqueue lab: the page's behaviour. No framework, no build step.
//
// The page does no queue arithmetic of its own: each fluid-model step, the
// prediction and the M/M/1 figures come from /api/model (lab model's
// run_model), the backoff table and herd from /api/backoff (lab backoff's
// run_backoff), and the live trace from /api/live/events (the server's
// AsyncWorkQueue, through queue.subscribe). Requests that change state are
// chained, so clicks apply in the order they were made. A module: numbers and
// durations are written by format.js, as the lab's commands write them.

import { count, duration, number, numbered } from "/static/format.js";

(() => {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const PLAY_MS = 300; // one model step per this many ms while playing
  const MAX_LOG = 500;

  // -- helpers ------------------------------------------------------------------

  function fmt(x) {
    if (x === null || x === undefined) return "–";
    return Number.isInteger(x) ? count(x) : number(x, 4);
  }

  // A fraction as a whole percent, as the CLI writes it: 4/3 is "133%".
  function pct(x) {
    return `${count(x * 100)}%`;
  }

  // A form value for the server to judge: a number if it is one, else the text.
  function value(id) {
    const raw = $(id).value.trim();
    return raw !== "" && Number.isFinite(Number(raw)) ? Number(raw) : raw;
  }

  // A chart's viewBox is as wide as the chart is drawn (600 until it is laid out),
  // so its labels keep their CSS size on a phone instead of shrinking with it.
  function chartWidth(svg) {
    const width = Math.round(svg.getBoundingClientRect().width);
    const W = width > 0 ? Math.max(width, 240) : 600;
    svg.setAttribute("viewBox", `0 0 ${W} ${svg.viewBox.baseVal.height}`);
    return W;
  }

  async function api(path, body) {
    const init = body === undefined ? {} : {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
    };
    const response = await fetch(path, init);
    const data = await response.json();
    if (!response.ok) throw new Error(data.error || `${response.status} ${response.statusText}`);
    return data;
  }

  function query(params) {
    return new URLSearchParams(Object.entries(params).map(([k, v]) => [k, String(v)])).toString();
  }

  function el(tag, attrs = {}, ...children) {
    const node = tag.startsWith("svg:")
      ? document.createElementNS(SVG, tag.slice(4))
      : document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === "text") node.textContent = v;
      else node.setAttribute(k, v);
    }
    node.append(...children);
    return node;
  }

  function showError(id, error) {
    $(id).textContent = error ? String(error.message || error) : "";
  }

  // -- panel 1: the fluid model -----------------------------------------------------

  const model = {
    t: 0,
    backlog: 4,
    history: [[0, 4]],
    playing: false,
    stale: false, // the prediction was cleared by bad input
    timer: null,
    chain: Promise.resolve(),
  };

  function modelQuery(t, backlog) {
    return query({ arrival: value("lambda"), service: value("mu"), backlog, t });
  }

  function showModelFacts(data) {
    model.stale = false;
    $("prediction").textContent = data.prediction;
    $("utilisation").textContent = pct(data.utilisation);
    const mm1 = data.mm1;
    $("mm1").hidden = mm1 === null;
    if (mm1 !== null) {
      $("mm1-rho").textContent = pct(mm1.rho);
      $("mm1-l").textContent = numbered(mm1.mean_in_system, "key", "keys", 4);
      $("mm1-w").textContent = numbered(mm1.mean_time_in_system, "step", "steps", 4);
      $("mm1-warning").textContent = data.warnings[0];
    }
  }

  // The inputs are not valid: no prediction rather than the last valid one's.
  function clearModelFacts() {
    model.stale = true;
    $("prediction").textContent = "none until the input is fixed";
    $("utilisation").textContent = "–";
    $("mm1").hidden = true;
  }

  function showModelState() {
    $("t").textContent = fmt(model.t);
    $("backlog").textContent = fmt(model.backlog);
    drawModelChart();
  }

  function drawModelChart() {
    const svg = $("model-chart");
    const W = chartWidth(svg), H = 200, L = 40, R = 10, T = 10, B = 24;
    const pts = model.history;
    const maxT = Math.max(10, pts[pts.length - 1][0]);
    const top = Math.max(1, ...pts.map((p) => p[1]));
    const maxB = top * 1.15;
    const x = (t) => L + ((W - L - R) * t) / maxT;
    const y = (b) => H - B - ((H - T - B) * b) / maxB;
    const series = pts.map(([t, b]) => `${x(t).toFixed(1)},${y(b).toFixed(1)}`).join(" ");
    const nodes = [
      el("svg:line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
      el("svg:line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }),
      el("svg:text", { x: L - 6, y: H - B, "text-anchor": "end", text: "0" }),
      el("svg:line", { class: "axis", x1: L - 3, y1: y(top), x2: L, y2: y(top) }),
      el("svg:text", { x: L - 6, y: y(top) + 4, "text-anchor": "end", text: fmt(top) }),
      el("svg:text", { x: W - R, y: H - 6, "text-anchor": "end", text: `t=${maxT}` }),
      el("svg:text", { x: L + 4, y: T + 10, text: "backlog" }),
      el("svg:polyline", { class: "series", points: series }),
    ];
    if (pts.length <= 80) {
      for (const [t, b] of pts) nodes.push(el("svg:circle", { class: "dot", cx: x(t), cy: y(b), r: 3 }));
    }
    svg.replaceChildren(...nodes);
    svg.setAttribute("aria-label", `Backlog over t: ${fmt(model.backlog)} at t=${fmt(model.t)}`);
  }

  function queueModel(work) {
    model.chain = model.chain.then(work).then(
      () => showError("model-error", null),
      (error) => {
        stopPlaying();
        clearModelFacts();
        showError("model-error", error);
      },
    );
    return model.chain;
  }

  function reset() {
    stopPlaying();
    return queueModel(async () => {
      const data = await api(`/api/model?${modelQuery(0, value("backlog0"))}`);
      model.t = 0;
      model.backlog = data.backlog;
      model.history = [[0, data.backlog]];
      showModelFacts(data);
      showModelState();
    });
  }

  function step() {
    return queueModel(async () => {
      const data = await api(`/api/model?${modelQuery(model.t, model.backlog)}`);
      model.t = data.next.t;
      model.backlog = data.next.backlog;
      model.history.push([model.t, model.backlog]);
      if (model.history.length > 5000) model.history.shift();
      if (model.stale) showModelFacts(data);
      else $("utilisation").textContent = pct(data.utilisation);
      showModelState();
    });
  }

  // The inputs changed: the prediction is now from here on, with the new λ and μ.
  function preview() {
    return queueModel(async () => {
      showModelFacts(await api(`/api/model?${modelQuery(model.t, model.backlog)}`));
    });
  }

  function setPlaying(playing) {
    model.playing = playing;
    $("play").textContent = playing ? "Pause" : "Play";
    $("step").disabled = playing;
  }

  function stopPlaying() {
    if (model.timer !== null) clearTimeout(model.timer);
    model.timer = null;
    setPlaying(false);
  }

  // Play steps until the backlog clears (then pauses), or until Pause.
  function playTick() {
    model.timer = null;
    step().then(() => {
      if (!model.playing) return;
      if (model.backlog === 0) stopPlaying();
      else model.timer = setTimeout(playTick, PLAY_MS);
    });
  }

  function togglePlay() {
    if (model.playing) {
      stopPlaying();
    } else {
      setPlaying(true);
      model.timer = setTimeout(playTick, PLAY_MS);
    }
  }

  // -- panel 2: the live key trace ------------------------------------------------

  const live = { lab: null, chain: Promise.resolve(), lines: new Map(), rows: new Map() };

  function act(action, body) {
    live.chain = live.chain
      .then(() => api(`/api/live/${action}`, body))
      .then(() => showError("live-error", null), (error) => showError("live-error", error));
    return live.chain;
  }

  const STATE_CLASS = {
    absent: "absent",
    waiting: "waiting",
    processing: "processing",
    "processing + pending": "pending",
  };

  function renderLines(lines) {
    const log = $("log");
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 30;
    for (const line of lines) {
      let li = live.lines.get(line.n);
      if (li === undefined) {
        li = el("li", { "data-tag": line.tag, "data-key": line.key },
          el("span", { class: "n", text: String(line.n).padStart(4, " ") }), " ",
          el("span", { class: "time", text: `${line.t.toFixed(2)}s` }), " ",
          el("span", { class: "text" }));
        live.lines.set(line.n, li);
        log.append(li);
      }
      li.querySelector(".text").textContent = line.text;
    }
    while (live.lines.size > MAX_LOG) {
      const [n, li] = live.lines.entries().next().value;
      li.remove();
      live.lines.delete(n);
    }
    if (atBottom) log.scrollTop = log.scrollHeight;
  }

  function nextCell(row) {
    const cell = el("td");
    if (row.held) {
      const button = el("button", { type: "button", class: "primary", text: `Release ${row.key}` });
      button.addEventListener("click", () => act("release", { key: row.key }));
      cell.append(button);
      return cell;
    }
    const notes = [];
    if (row.hold_next) notes.push("next reconcile held");
    if (row.fail_next === 1) notes.push("next reconcile fails");
    else if (row.fail_next) notes.push(`next ${fmt(row.fail_next)} reconciles fail`);
    if (row.retry_in_ms !== null) notes.push(`retry in ${duration(row.retry_in_ms / 1000)}`);
    cell.textContent = notes.join(" · ");
    return cell;
  }

  function renderKeys(keys) {
    const body = $("keys").tBodies[0];
    const seen = new Set();
    for (const row of keys) {
      seen.add(row.key);
      const sig = JSON.stringify(row);
      let entry = live.rows.get(row.key);
      if (entry !== undefined && entry.sig === sig) continue;
      const tr = el("tr", { "data-key": row.key, "data-state": row.state },
        el("td", { text: row.key }),
        el("td", {}, el("span", { class: `state ${STATE_CLASS[row.state]}`, text: row.state })),
        el("td", { text: row.worker === null ? "" : `WORKER-${row.worker}` }),
        nextCell(row));
      if (entry === undefined) body.append(tr);
      else entry.tr.replaceWith(tr);
      live.rows.set(row.key, { sig, tr });
    }
    for (const [key, entry] of live.rows) {
      if (!seen.has(key)) {
        entry.tr.remove();
        live.rows.delete(key);
      }
    }
  }

  function renderSnapshot(snap) {
    if (snap.lab !== live.lab) { // a new server: start the log afresh
      live.lab = snap.lab;
      live.lines.clear();
      $("log").replaceChildren();
      $("workers").value = snap.workers;
      $("reconcile").value = snap.reconcile_ms;
      $("limiter").textContent =
        `${duration(snap.limiter.base)} doubling, cap ${duration(snap.limiter.cap)}`;
    }
    const c = snap.counters;
    const set = (id, text) => { document.querySelector(`[data-testid="${id}"]`).textContent = text; };
    set("adds", fmt(c.adds));
    set("coalesced", fmt(c.coalesced));
    set("marked", fmt(c.marked_while_processing));
    set("redeliveries", fmt(c.redeliveries));
    set("depth", fmt(c.depth));
    set("wait-p50", c.wait_p50_ms === null ? "–" : duration(c.wait_p50_ms / 1000));
    set("reconcile-p50", c.reconcile_p50_ms === null ? "–" : duration(c.reconcile_p50_ms / 1000));
    $("fifo").replaceChildren(...snap.fifo.map((key) => el("li", { text: key })));
    renderKeys(snap.keys);
    renderLines(snap.lines);
  }

  function connect() {
    const source = new EventSource("/api/live/events");
    source.addEventListener("open", () => { $("conn").textContent = "live"; });
    source.addEventListener("error", () => { $("conn").textContent = "reconnecting…"; });
    source.addEventListener("message", (event) => renderSnapshot(JSON.parse(event.data)));
  }

  // -- panel 3: backoff -------------------------------------------------------------

  let backoffTimer = null;
  let backoffChain = Promise.resolve();
  const backoff = { herd: null }; // the herd last drawn, to redraw on resize

  function drawHerd(herd) {
    const svg = $("herd-chart");
    const W = chartWidth(svg), H = 160, L = 40, R = 10, T = 10, B = 24;
    const counts = herd.readds_per_second;
    const max = Math.max(1, ...counts);
    const bw = (W - L - R) / Math.max(counts.length, 1);
    const nodes = [
      el("svg:line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }),
      el("svg:text", { x: L - 6, y: T + 10, "text-anchor": "end", text: fmt(max) }),
      el("svg:text", { x: L - 6, y: H - B, "text-anchor": "end", text: "0" }),
      el("svg:text", { x: L, y: H - 6, text: "0s" }),
      el("svg:text", { x: W - R, y: H - 6, "text-anchor": "end", text: `${counts.length}s` }),
    ];
    counts.forEach((n, i) => {
      const h = ((H - T - B) * n) / max;
      nodes.push(el("svg:rect", {
        class: i === 0 ? "bar burst" : "bar",
        x: (L + i * bw + bw * 0.1).toFixed(1),
        y: (H - B - h).toFixed(1),
        width: Math.max(bw * 0.8, 0.5).toFixed(1),
        height: h.toFixed(1),
      }));
    });
    svg.replaceChildren(...nodes);
    svg.setAttribute("aria-label",
      `Re-adds per second: ${counts.slice(0, 5).map(fmt).join(", ")}${counts.length > 5 ? ", …" : ""}`);
  }

  function renderBackoff(data) {
    const rows = data.rows.map((row) => el("tr", row.capped ? { class: "capped" } : {},
      el("td", { class: "num", text: String(row.attempt) }),
      el("td", { class: "num", text: duration(row.delay) + (row.capped ? " (cap)" : "") }),
      el("td", { class: "num", text: duration(row.total) })));
    $("backoff-table").tBodies[0].replaceChildren(...rows);
    const h = data.herd;
    const rest = h.keys - h.within_burst;
    $("herd-summary").textContent = h.keys === 1
      ? `1 key fails: it comes back after its own ${duration(h.first_readd)}, within the ` +
        `token bucket's burst of ${fmt(h.burst)}.`
      : rest === 0
      ? `${fmt(h.keys)} keys fail at the same instant: all come back after their own ` +
        `${duration(h.first_readd)}, within the token bucket's burst of ${fmt(h.burst)}.`
      : `${fmt(h.keys)} keys fail at the same instant: ${fmt(h.within_burst)} come back after ` +
        `their own ${duration(h.first_readd)} (the token bucket's burst of ${fmt(h.burst)}); ` +
        `the other ${fmt(rest)} are held to ${fmt(h.qps)}/s, the last re-added after ` +
        `${duration(h.last_readd)}.`;
    backoff.herd = h;
    drawHerd(h);
  }

  function computeBackoff() {
    const q = query({ base_ms: value("base"), cap: value("cap"), herd: value("herd") });
    backoffChain = backoffChain
      .then(() => api(`/api/backoff?${q}`))
      .then((data) => {
        renderBackoff(data);
        $("backoff-results").hidden = false;
        showError("backoff-error", null);
      }, (error) => {
        $("backoff-results").hidden = true; // no table for other inputs than these
        showError("backoff-error", error);
      });
    return backoffChain;
  }

  // -- wiring ----------------------------------------------------------------------

  function init() {
    for (const form of document.querySelectorAll("form")) {
      form.addEventListener("submit", (event) => event.preventDefault());
    }
    $("reset").addEventListener("click", reset);
    $("step").addEventListener("click", step);
    $("play").addEventListener("click", togglePlay);
    $("lambda").addEventListener("change", preview);
    $("mu").addEventListener("change", preview);

    const key = () => $("key").value;
    $("add").addEventListener("click", () => act("add", { key: key() }));
    $("burst").addEventListener("click", () => act("burst", { key: key(), n: value("burst-n") }));
    $("hold").addEventListener("click", () => act("hold", { key: key() }));
    $("fail").addEventListener("click", () => act("fail", { key: key(), n: value("fail-n") }));
    $("workers").addEventListener("change", () => act("config", { workers: value("workers") }));
    $("reconcile").addEventListener("change",
      () => act("config", { reconcile_ms: value("reconcile") }));

    for (const id of ["base", "cap", "herd"]) {
      $(id).addEventListener("input", () => {
        clearTimeout(backoffTimer);
        backoffTimer = setTimeout(computeBackoff, 250);
      });
    }

    let resizeTimer = null;
    window.addEventListener("resize", () => {
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => {
        drawModelChart();
        if (backoff.herd !== null) drawHerd(backoff.herd);
      }, 100);
    });

    reset();
    computeBackoff();
    connect();
  }

  init();
})();
