// keyqueue dashboard: the page's behaviour. No framework, no build step.
//
// Every number comes from the server: /api/events sends each queue's reading
// once a second (the first event with the last 10 minutes of history, then
// one point each), and the page only draws it. Every duration, rate and row
// cell arrives as text, written by the server's one formatter (the text
// `keyqueue inspect` and `top` print), and the verdict is the server's: the
// page formats nothing but whole counts, and computes no verdict of its own. Actions are POSTs carrying the
// token this page was served with; each is confirmed first and its answer shown.
// Paths are relative, so the page also works behind a proxy at a sub-path.
// A module: whole counts and the chart's scale are written by format.js, as `top` writes them.

import { count, number } from "./format.js";

(() => {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const HISTORY = 600; // seconds of chart
  const meta = (name) => document.querySelector(`meta[name="${name}"]`).content;
  const TOKEN = meta("keyqueue-token");
  const READ_ONLY = meta("keyqueue-read-only") === "true";
  const queues = new Map(); // name -> {section, history: [[t, depth, adds/s, dones/s]], now}
  let columns = {}; // list -> its column labels after the key (the server's, as the CLI's tables)

  // -- formatting -------------------------------------------------------------------

  function fmt(x) {
    if (x === null || x === undefined) return "–";
    return Number.isInteger(x) ? count(x) : number(x, 3);
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // -- one queue's section ----------------------------------------------------------

  function section(name) {
    let q = queues.get(name);
    if (q) return q;
    const node = $("queue-template").content.firstElementChild.cloneNode(true);
    node.dataset.queue = name;
    node.querySelector(".name").textContent = name;
    $("queues").append(node);
    q = { section: node, history: [], now: null };
    queues.set(name, q);
    return q;
  }

  const COUNTERS = [
    ["depth", "waiting", (s) => s.depth],
    ["processing", "held", (s) => s.processing],
    ["delayed", "delayed", (s) => s.delayed],
    ["adds-rate", "adds/s", (s, r) => r.adds],
    ["gets-rate", "gets/s", (s, r) => r.gets],
    ["dones-rate", "dones/s", (s, r) => r.dones],
    ["failures-rate", "failures/s", (s, r) => r.failures],
    ["adds", "adds", (s) => s.adds],
    ["coalesced", "coalesced", (s) => s.coalesced + s.marked_while_processing],
    ["dones", "dones", (s) => s.dones],
    ["retries", "retries", (s) => s.retries],
    ["leases-expired", "leases expired", (s) => s.leases_expired],
  ];

  function drawCounters(box, now) {
    box.replaceChildren(
      ...COUNTERS.map(([id, label, pick]) => {
        const cell = el("div", "counter");
        cell.dataset.testid = id;
        const value = pick(now.stats, now.shown.rates);
        cell.append(el("span", "value", typeof value === "string" ? value : fmt(value)), el("span", "label", label));
        return cell;
      }),
    );
  }

  // A chart's viewBox is as wide as the chart is drawn, so labels keep their size on a phone.
  // x runs from t1 - span to t1 (the server clock; span and its label are the server's);
  // y from 0 to the largest value shown. A null value (a counter reset) breaks the line.
  function chart(svg, history, series, t1, span, spanLabel) {
    const width = Math.round(svg.getBoundingClientRect().width);
    const W = width > 0 ? Math.max(width, 200) : 600, H = 140, L = 44, R = 8, T = 8, B = 20;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const top = Math.max(1, ...history.flatMap((p) => series.map(([i]) => p[i] ?? 0)));
    const x = (t) => L + ((t - (t1 - span)) / span) * (W - L - R);
    const y = (v) => T + (1 - v / top) * (H - T - B);
    const nodes = [];
    const line = (x1, y1, x2, y2, cls) => {
      const n = document.createElementNS(SVG, "line");
      for (const [k, v] of Object.entries({ x1, y1, x2, y2 })) n.setAttribute(k, v);
      n.setAttribute("class", cls);
      nodes.push(n);
    };
    const text = (tx, ty, s, anchor) => {
      const n = document.createElementNS(SVG, "text");
      n.setAttribute("x", tx);
      n.setAttribute("y", ty);
      n.setAttribute("text-anchor", anchor);
      n.setAttribute("class", "tick");
      n.textContent = s;
      nodes.push(n);
    };
    line(L, T, L, H - B, "axis");
    line(L, H - B, W - R, H - B, "axis");
    line(L, T, W - R, T, "grid");
    text(L - 4, T + 4, fmt(top), "end");
    text(L - 4, H - B, "0", "end");
    text(L, H - 4, spanLabel, "start");
    text(W - R, H - 4, "now", "end");
    for (const [i, cls] of series) {
      const runs = [[]];
      for (const p of history) {
        if (p[i] === null || p[i] === undefined) runs.push([]);
        else runs.at(-1).push(`${x(p[0]).toFixed(1)},${y(Math.max(0, p[i])).toFixed(1)}`);
      }
      for (const run of runs.filter((r) => r.length)) {
        const n = document.createElementNS(SVG, "polyline");
        n.setAttribute("points", run.join(" "));
        n.setAttribute("class", `series ${cls}`);
        nodes.push(n);
      }
    }
    svg.replaceChildren(...nodes);
  }

  const ACTIONS = [["retry", "Retry now"], ["forget", "Forget"]];
  const DEAD_ACTIONS = [["replay", "Replay"]];

  function actions(name, key, list) {
    const box = el("span", "actions");
    if (READ_ONLY) return box;
    for (const [action, label] of list === "dead" ? DEAD_ACTIONS : ACTIONS) {
      const button = el("button", action === "forget" ? "" : "primary", label);
      button.type = "button";
      button.dataset.action = action;
      button.dataset.queue = name;
      button.dataset.key = key;
      button.setAttribute("aria-label", `${label} ${key}`);
      box.append(button);
    }
    return box;
  }

  function nums(pairs) {
    const box = el("span", "nums");
    for (const [label, value] of pairs) {
      const n = el("span", "num");
      n.append(el("span", "label", label), document.createTextNode(" "), el("b", "", value));
      box.append(n);
    }
    return box;
  }

  function drawList(box, name, list, rows, total) {
    const body = box.querySelector(".rows");
    const title = box.querySelector("h3");
    title.textContent = `${title.textContent.split(" (")[0]} (${fmt(total)})`;
    if (!rows.length) {
      body.replaceChildren(el("p", "empty", "none"));
      return;
    }
    body.replaceChildren(
      ...rows.map((r) => {
        const row = el("div", "row");
        row.dataset.key = r.key;
        const labels = columns[list] || [];
        row.append(el("span", "key", r.key), nums(labels.map((label, i) => [label, r.cells[i]])));
        if (list === "processing") {
          const bar = el("span", "lease");
          bar.title = `lease ends ${r.cells[labels.indexOf("lease ends")]}`;
          const fill = el("span", "fill");
          fill.style.width = `${Math.round(Math.min(1, r.lease_fraction ?? 0) * 100)}%`;
          bar.append(fill);
          row.append(bar);
        }
        row.append(actions(name, r.key, list));
        return row;
      }),
    );
  }

  function draw(name) {
    const q = queues.get(name);
    const s = q.section;
    const error = s.querySelector(".error");
    error.hidden = !q.error;
    error.textContent = q.error || "";
    const verdict = s.querySelector(".verdict");
    const health = q.health;
    if (health) {
      verdict.replaceChildren(...health.findings.map((f) => {
        const line = el("span", "finding", f.text);
        line.dataset.state = f.state;
        return line;
      }));
      verdict.dataset.state = health.state;
    }
    const now = q.now;
    if (!now) return;
    drawCounters(s.querySelector(".counters"), now);
    const { span, label } = now.chart;
    chart(s.querySelector(".chart.depth"), q.history, [[1, "depth"]], now.taken_at, span, label);
    chart(s.querySelector(".chart.rates"), q.history, [[2, "adds"], [3, "dones"]], now.taken_at, span, label);
    s.querySelector(".oldest-wait").textContent = now.shown.oldest_wait;
    s.querySelector(".mean-work").textContent = now.shown.mean_work;
    s.querySelector(".longest-backoff").textContent = now.shown.longest_backoff;
    const shards = s.querySelector(".shards");
    shards.textContent = now.shown.shards || "";
    shards.hidden = !now.shown.shards;
    const totals = {
      waiting: now.stats.depth, processing: now.stats.processing,
      delayed: now.stats.delayed, failing: now.failing_keys ?? now.failing.length,
      dead: (now.dead || []).length,
    };
    for (const box of s.querySelectorAll(".list")) {
      const list = box.dataset.list;
      drawList(box, name, list, now[list] || [], totals[list]);
    }
  }

  function header(h) {
    const conn = $("conn");
    conn.textContent = h.text;
    conn.dataset.state = h.state;
  }

  function receive(state) {
    if (state.columns) columns = state.columns;
    if (state.header) header(state.header);
    for (const item of state.queues) {
      const q = section(item.name);
      q.error = item.error;
      q.section.querySelector(".name").title = item.server || "";
      q.health = item.health;
      if (item.history) q.history = item.history;
      else if (item.point && (!q.history.length || item.point[0] > q.history.at(-1)[0])) {
        q.history.push(item.point);
      }
      if (item.now) {
        q.now = item.now;
        const from = item.now.taken_at - HISTORY;
        while (q.history.length && q.history[0][0] < from) q.history.shift();
      }
      draw(item.name);
    }
  }

  // -- actions ----------------------------------------------------------------------

  const WORDS = {
    retry: (k, q) => `Retry ${k} now in ${q}? Its failures are cleared and it is added again.`,
    forget: (k, q) => `Forget ${k}'s failures in ${q}? A delayed retry still comes due.`,
    replay: (k, q) => `Replay ${k} in ${q}? The key given up is added again, its failures cleared.`,
  };

  function confirmed(text, ok) {
    const dialog = $("confirm");
    $("confirm-text").textContent = text;
    $("confirm-ok").textContent = ok;
    dialog.returnValue = "";
    dialog.showModal();
    return new Promise((resolve) => {
      dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    });
  }

  function say(text, failed) {
    const m = $("message");
    m.textContent = text;
    m.classList.toggle("failed", Boolean(failed));
  }

  async function act(button) {
    const { action, queue, key } = button.dataset;
    if (!(await confirmed(WORDS[action](JSON.stringify(key), queue), button.textContent))) {
      say("Cancelled: nothing changed.");
      return;
    }
    try {
      const response = await fetch(`api/${action}`, {
        method: "POST",
        headers: { "Content-Type": "application/json", "X-Keyqueue-Token": TOKEN },
        body: JSON.stringify({ queue, key }),
      });
      const answer = await response.json();
      if (response.ok) say(`Done: ${answer.message}.`);
      else say(`Refused: ${answer.error}`, true);
    } catch (error) {
      say(`Failed: ${error}`, true);
    }
  }

  document.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (button) act(button);
  });

  // -- the stream -------------------------------------------------------------------

  $("mode").textContent = READ_ONLY ? "read-only: no actions" : "";
  const source = new EventSource("api/events");
  // "live" is said by the server's header, once a reading arrives: an open stream
  // whose queues cannot be read is not live.
  source.addEventListener("error", () => header({ state: "down", text: "reconnecting…" }));
  source.addEventListener("message", (event) => receive(JSON.parse(event.data)));
  window.addEventListener("resize", () => { for (const name of queues.keys()) draw(name); });
})();
