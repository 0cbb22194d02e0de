// The Experiments view of Sandhive's page: the list, a create form (a dataset file, arms, a
// scorer), one experiment live (progress per arm, results, plots, items) and one row's arms
// side by side. Plain JavaScript on the public /v1 API like app.js, whose helpers it borrows
// (window.Sandhive). Dataset rows, answers, names and scorer details are hostile: every value
// from the API is inserted as text (el() / textContent), never as HTML; plots are drawn on
// canvases by the vendored Chart.js (static/chart.umd.min.js, see app/web/vendor/README.md).
"use strict";

(() => {
  const S = window.Sandhive;
  const { el, show, apiJson, auth, conn } = S;
  const POLL_MS = 2000; // when the event stream is not there
  const DETAIL_EVERY_MS = 3000; // results and items while running: at most this often
  const STREAM_RETRY_MS = 10000;
  const LIST_POLL_MS = 5000;
  const ITEMS_SHOWN = 300; // the items table's first page; "Show all" for the rest
  const ITEM_PAGES = 50; // a paginated items list is followed this many pages at most
  const ANSWER_CHARS = 140;
  const TERMINAL = new Set(["finished", "cancelled"]);
  const STATUS_ORDER = ["scored", "error", "not-scored", "cancelled", "scoring", "running", "pending"];
  const SCORERS = {
    exact: '{"case_sensitive": false}',
    contains: '{"case_sensitive": false}',
    math: '{"tolerance": 1e-6}',
    mcq: '{"choices": "ABCD"}',
    regex: '{"pattern": "\\\\b42\\\\b", "flags": "i"}',
    f1: "{}",
    rouge_l: '{"use_stemmer": false}',
    instruction_following: '{"loose": false}',
    llm_judge: '{"profile": "default", "rubric": "Is the answer correct?", "repeats": 1}',
    python: '{"code": "def compute_score(agent_answer, ground_truth, **row):\\n    return float(agent_answer.strip() == ground_truth)"}',
  };
  const PALETTE = {
    light: ["#b7791f", "#2563eb", "#1a7f4b", "#c0362c", "#7c3aed", "#0e7490", "#be185d", "#4d7c0f"],
    dark: ["#e0a840", "#7aa2f7", "#4cc38a", "#f0776c", "#b197fc", "#5ec8e0", "#f28dbd", "#a3d977"],
  };
  const dark = window.matchMedia("(prefers-color-scheme: dark)");
  const number = new Intl.NumberFormat();

  // ------------------------------------------------------------------ small helpers

  const root = () => document.querySelector("#experiments");
  const enc = encodeURIComponent;

  function fixed(value, digits = 3) {
    return value === null || value === undefined ? "—" : Number(value).toFixed(digits);
  }

  const VERDICTS = {
    a_higher: "a higher",
    b_higher: "b higher",
    no_clear_difference: "no clear difference",
    too_few_pairs: "too few pairs",
  };

  function interval(ci) {
    return ci ? `${fixed(ci.low)} – ${fixed(ci.high)}` : "—";
  }

  function median(value) {
    if (value === null || value === undefined) return "—";
    return Number.isInteger(value) ? number.format(value) : Number(value).toFixed(1);
  }

  function errorsText(errors) {
    const parts = Object.entries(errors || {}).map(([kind, count]) => `${kind} ${count}`);
    return parts.length ? parts.join(", ") : "0";
  }

  /** Arms that ran the built-in scripted profile: a fixed script, not a model. */
  function scriptedNotice(arms) {
    const scripted = arms.filter((arm) => arm.profile === "scripted").map((arm) => arm.name);
    if (!scripted.length) return null;
    const which = scripted.length === 1 ? `Arm ${scripted[0]} runs` : `Arms ${scripted.join(", ")} run`;
    return el("p", { class: "notice", id: "exp-scripted", text: `${which} the scripted profile: a fixed script, not a model, so these numbers say nothing about a model.` });
  }

  /** "8/10 scored · 2 not scored": what an arm's mean stands on. */
  function coverageText(coverage) {
    if (!coverage) return "—";
    const text = `${coverage.scored}/${coverage.items} scored`;
    return coverage.not_scored ? `${text} · ${coverage.not_scored} not scored` : text;
  }

  function passText(passAtK) {
    if (!passAtK) return "—";
    return Object.entries(passAtK)
      .sort((a, b) => Number(a[0]) - Number(b[0]))
      .map(([k, value]) => `@${k} ${fixed(value)}`)
      .join(" · ");
  }

  function colors() {
    return dark.matches ? PALETTE.dark : PALETTE.light;
  }

  function armColor(index) {
    const palette = colors();
    return palette[index % palette.length];
  }

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function badge(status) {
    return el("span", { class: `badge ${String(status).replace(/[^a-z-]/gi, "")}`, text: status });
  }

  /** Replace a node's children, leaving out the null / false ones (optional parts). */
  function fill(node, ...children) {
    node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  }

  /** Over, and every item ended: a cancelled experiment's running items end after it does. */
  function settled(exp) {
    if (!TERMINAL.has(exp.status)) return false;
    return Object.values(exp.progress || {}).every((p) => !p.running && !p.pending && !p.scoring);
  }

  function cell(field, text, value) {
    return el("td", { "data-field": field, "data-value": value === undefined ? null : JSON.stringify(value), text });
  }

  /** A table that scrolls sideways inside its card instead of widening a phone's page. */
  function table(caption, headers, rows, className) {
    return el(
      "div",
      { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption },
      el(
        "table",
        { class: `exp-table ${className || ""}` },
        el("caption", { class: "visually-hidden", text: caption }),
        el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col", text: h })))),
        el("tbody", {}, rows),
      ),
    );
  }

  function problem(message, details) {
    const node = el("div", { class: "error", role: "alert" }, el("p", { class: "flush", text: message }));
    if (Array.isArray(details) && details.length) {
      node.append(
        el(
          "ul",
          { class: "details" },
          details.slice(0, 30).map((d) => el("li", { text: `${(d.loc || []).join(".")}: ${d.msg || JSON.stringify(d)}` })),
        ),
      );
    }
    return node;
  }

  /** POST that keeps the error's details (a 422 lists every problem with its location). */
  async function post(path, body) {
    let response;
    try {
      response = await fetch(path, { method: "POST", headers: auth.headers(), body });
    } catch (error) {
      return { ok: false, message: "the server cannot be reached", details: null };
    }
    let data = null;
    try {
      data = await response.json();
    } catch (ignored) {
      // no JSON body
    }
    if (response.ok) return { ok: true, data };
    const err = (data && data.error) || {};
    return { ok: false, message: err.message || `${response.status} ${response.statusText}`, details: err.details };
  }

  async function allItems(id) {
    const items = [];
    let cursor = null;
    for (let page = 0; page < ITEM_PAGES; page += 1) {
      const query = cursor ? `?cursor=${enc(cursor)}` : "";
      const body = await apiJson(`/v1/experiments/${enc(id)}/items${query}`);
      items.push(...body.items);
      cursor = body.next_cursor;
      if (!cursor) break;
    }
    return items;
  }

  /** The next 2 s wait, or the stream's events: whichever the server offers. */
  class Follower {
    constructor(id, onEvent, onState) {
      this.id = id;
      this.onEvent = onEvent;
      this.onState = onState;
      this.seq = 0;
      this.stopped = false;
      this.controller = null;
      this.retry = null;
    }

    start() {
      this.connect();
    }

    stop() {
      this.stopped = true;
      clearTimeout(this.retry);
      if (this.controller) this.controller.abort();
    }

    async connect() {
      if (this.stopped) return;
      this.controller = new AbortController();
      let response;
      try {
        response = await fetch(`/v1/experiments/${enc(this.id)}/events?after=${this.seq}`, {
          headers: { ...auth.headers(), Accept: "text/event-stream" },
          signal: this.controller.signal,
        });
      } catch (error) {
        return this.lost(true);
      }
      const type = response.headers.get("content-type") || "";
      if (!response.ok || !type.startsWith("text/event-stream")) {
        response.body && response.body.cancel().catch(() => {});
        return this.lost(response.status !== 404); // 404: this server has no experiment stream
      }
      this.onState("live");
      try {
        await this.read(response.body.getReader());
      } catch (error) {
        return this.lost(true);
      }
      this.lost(true); // the server ended it: after the experiment's end, or a restart
    }

    async read(reader) {
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) return;
        buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let end = buffer.indexOf("\n\n");
        while (end >= 0) {
          this.block(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
          end = buffer.indexOf("\n\n");
        }
      }
    }

    block(text) {
      const data = [];
      let id = null;
      for (const line of text.split("\n")) {
        if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
        else if (line.startsWith("id:")) id = Number(line.slice(3).trim());
      }
      if (!data.length) return; // a comment: keepalive
      let event;
      try {
        event = JSON.parse(data.join("\n"));
      } catch (ignored) {
        return;
      }
      const seq = Number.isFinite(event.seq) ? event.seq : id;
      if (Number.isFinite(seq)) {
        if (seq <= this.seq) return;
        this.seq = seq;
      }
      this.onEvent(event);
    }

    lost(retry) {
      if (this.stopped) return;
      this.onState("polling");
      if (retry) this.retry = setTimeout(() => this.connect(), STREAM_RETRY_MS);
    }
  }

  // ------------------------------------------------------------------ plots (Chart.js)

  /** Draws each bar's 95 % interval (`dataset.errorBars[i] = {low, high}`) over it. */
  const errorBars = {
    id: "sandhiveErrorBars",
    afterDatasetsDraw(chart) {
      const { ctx } = chart;
      chart.data.datasets.forEach((dataset, index) => {
        const meta = chart.getDatasetMeta(index);
        if (!dataset.errorBars || meta.hidden) return;
        const scale = chart.scales[meta.yAxisID];
        meta.data.forEach((bar, i) => {
          const ci = dataset.errorBars[i];
          if (!ci) return;
          const top = scale.getPixelForValue(ci.high);
          const bottom = scale.getPixelForValue(ci.low);
          const half = Math.max(3, Math.min(8, (bar.width || 16) / 4));
          ctx.save();
          ctx.strokeStyle = cssVar("--ink");
          ctx.lineWidth = 1.5;
          ctx.beginPath();
          ctx.moveTo(bar.x, top);
          ctx.lineTo(bar.x, bottom);
          ctx.moveTo(bar.x - half, top);
          ctx.lineTo(bar.x + half, top);
          ctx.moveTo(bar.x - half, bottom);
          ctx.lineTo(bar.x + half, bottom);
          ctx.stroke();
          ctx.restore();
        });
      });
    },
  };

  function chartDefaults() {
    Chart.defaults.color = cssVar("--muted");
    Chart.defaults.borderColor = cssVar("--line");
    Chart.defaults.font.family = cssVar("--sans");
    Chart.defaults.animation = false; // drawn at once: calm while it updates live, and testable
    Chart.defaults.maintainAspectRatio = false;
  }

  /** Equal-width bins over every arm's values (one bin per integer when they are few). */
  function bins(values) {
    if (!values.length) return [];
    const low = Math.min(...values);
    const high = Math.max(...values);
    const integers = values.every(Number.isInteger);
    if (integers && high - low <= 20) {
      const out = [];
      for (let v = low; v <= high; v += 1) out.push({ from: v, to: v + 1, label: String(v) });
      return out;
    }
    const count = 10;
    const width = (high - low) / count || 1;
    return Array.from({ length: count }, (_, i) => {
      const from = low + i * width;
      const to = i === count - 1 ? high + 1e-9 : from + width;
      return { from, to, label: `${number.format(Math.round(from))}–${number.format(Math.round(low + (i + 1) * width))}` };
    });
  }

  function histogram(values, ranges) {
    const counts = ranges.map(() => 0);
    for (const v of values) {
      const i = ranges.findIndex((r) => v >= r.from && v < r.to);
      if (i >= 0) counts[i] += 1;
    }
    return counts;
  }

  function scoreScale() {
    return { min: 0, max: 1, title: { display: true, text: "score" } };
  }

  /** The plot specs for one experiment: what is drawn, and what a screen reader hears. */
  function plotSpecs(arms, results, items) {
    const names = arms.map((a) => a.name);
    const byArm = new Map(results.arms.map((r) => [r.arm, r]));
    const ran = items.filter((i) => i.task_id && (i.status === "scored" || i.status === "error"));
    const specs = [];

    const means = names.map((n) => (byArm.get(n) ? byArm.get(n).mean : null));
    specs.push({
      key: "score",
      title: "Score per arm (95 % interval)",
      summary: names.map((n, i) => `${n} ${fixed(means[i])} (${interval(byArm.get(n) && byArm.get(n).ci95)})`).join("; "),
      config: {
        type: "bar",
        data: {
          labels: names,
          datasets: [
            {
              label: "mean score",
              data: means,
              backgroundColor: names.map((_, i) => armColor(i)),
              errorBars: names.map((n) => (byArm.get(n) ? byArm.get(n).ci95 : null)),
            },
          ],
        },
        options: { scales: { y: scoreScale() }, plugins: { legend: { display: false } } },
        plugins: [errorBars],
      },
    });

    const domains = [...new Set(results.arms.flatMap((r) => Object.keys(r.domains || {})))].sort();
    if (domains.length) {
      specs.push({
        key: "domains",
        title: "Score per domain (95 % interval)",
        summary: domains
          .map((d) => `${d}: ${names.map((n) => `${n} ${fixed(byArm.get(n) && byArm.get(n).domains[d] ? byArm.get(n).domains[d].mean : null)}`).join(", ")}`)
          .join("; "),
        config: {
          type: "bar",
          data: {
            labels: domains,
            datasets: names.map((n, i) => {
              const dom = (byArm.get(n) && byArm.get(n).domains) || {};
              return {
                label: n,
                data: domains.map((d) => (dom[d] ? dom[d].mean : null)),
                backgroundColor: armColor(i),
                errorBars: domains.map((d) => (dom[d] ? dom[d].ci95 : null)),
              };
            }),
          },
          options: { scales: { y: scoreScale() } },
          plugins: [errorBars],
        },
      });
    }

    for (const [key, title, value] of [
      ["tokens", "Tokens per item (prompt + completion)", (i) => i.prompt_tokens + i.completion_tokens],
      ["steps", "Steps per item", (i) => i.steps],
    ]) {
      const ranges = bins(ran.map(value));
      specs.push({
        key,
        title,
        summary: names.map((n) => `${n}: ${ran.filter((i) => i.arm === n).length} items`).join("; "),
        config: {
          type: "bar",
          data: {
            labels: ranges.map((r) => r.label),
            datasets: names.map((n, i) => ({
              label: n,
              data: histogram(ran.filter((it) => it.arm === n).map(value), ranges),
              backgroundColor: armColor(i),
            })),
          },
          options: {
            scales: {
              x: { title: { display: true, text: key } },
              y: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: "items" } },
            },
          },
        },
      });
    }

    const scored = items.filter((i) => i.status === "scored" && i.score !== null);
    specs.push({
      key: "score-steps",
      title: "Score against steps",
      summary: `${scored.length} scored items`,
      config: {
        type: "scatter",
        data: {
          datasets: names.map((n, i) => ({
            label: n,
            data: scored.filter((it) => it.arm === n).map((it) => ({ x: it.steps, y: it.score })),
            backgroundColor: `${armColor(i)}80`,
            borderColor: armColor(i),
            pointRadius: 5,
            clip: 8, // points on 0 and 1 drawn whole
          })),
        },
        options: {
          scales: {
            x: { beginAtZero: true, ticks: { precision: 0 }, title: { display: true, text: "steps" } },
            y: scoreScale(),
          },
        },
      },
    });
    return specs;
  }

  // ------------------------------------------------------------------ the list

  class ListView {
    constructor() {
      this.timer = null;
      this.cursor = null;
      this.stopped = false;
    }

    start() {
      this.body = el("div", { class: "exp-list-body" });
      this.note = el("p", { class: "hint", "aria-live": "polite" });
      this.more = el("button", { type: "button", class: "ghost", text: "Show more", hidden: true, onclick: () => this.load(true) });
      root().replaceChildren(
        el(
          "section",
          { class: "card" },
          el(
            "div",
            { class: "row spread" },
            el("h1", { class: "exp-title", text: "Experiments" }),
            el("a", { class: "button primary", href: "#/experiments/new", text: "New experiment" }),
          ),
          el("p", { class: "hint", text: "Every row of a dataset through each arm, scored; sandbox against vanilla, side by side." }),
          this.body,
          this.more,
          this.note,
        ),
      );
      conn.set("idle", "");
      this.load(false);
      this.timer = setInterval(() => {
        if (!document.hidden && !this.cursor) this.load(false);
      }, LIST_POLL_MS);
    }

    stop() {
      this.stopped = true;
      clearInterval(this.timer);
    }

    refresh() {
      this.load(false);
    }

    async load(more) {
      let page;
      try {
        page = await apiJson(`/v1/experiments?limit=50${more && this.cursor ? `&cursor=${enc(this.cursor)}` : ""}`);
      } catch (error) {
        this.note.textContent = `Could not list experiments: ${error.message}`;
        return;
      }
      if (this.stopped) return;
      this.rows = more ? [...(this.rows || []), ...page.experiments] : page.experiments;
      this.cursor = page.next_cursor || null;
      show(this.more, Boolean(this.cursor));
      this.note.textContent = this.rows.length ? "" : "No experiments yet.";
      this.body.replaceChildren(this.rows.length ? this.render(this.rows) : "");
    }

    render(experiments) {
      return table(
        "Experiments",
        ["Name", "Status", "Arms", "Rows", "Done", "Created"],
        experiments.map((exp) => {
          const counts = Object.values(exp.progress || {});
          // `not_scored` is a part of `error`, not a status of its own: not counted twice.
          const total = counts.reduce((s, { not_scored: _, ...p }) => s + Object.values(p).reduce((a, b) => a + b, 0), 0);
          const done = counts.reduce((s, p) => s + (p.scored || 0) + (p.error || 0) + (p.cancelled || 0), 0);
          return el(
            "tr",
            { "data-id": exp.id },
            el("td", {}, el("a", { href: `#/experiments/${enc(exp.id)}`, class: "exp-name", text: exp.name })),
            el("td", {}, badge(exp.status)),
            cell("arms", exp.arms.map((a) => `${a.name} (${a.mode})`).join(", ")),
            cell("rows", number.format(exp.rows)),
            cell("done", `${number.format(done)} / ${number.format(total)}`),
            el("td", { class: "hint", text: S.formatAgo(exp.created_at) }),
          );
        }),
        "exp-list",
      );
    }
  }

  // ------------------------------------------------------------------ the create form

  class CreateView {
    constructor() {
      this.profiles = [];
      this.file = null;
      this.armCount = 0;
    }

    start() {
      conn.set("idle", "");
      this.arms = el("div", { class: "exp-arms" });
      this.fileNote = el("p", { class: "hint", id: "exp-file-note", "aria-live": "polite" });
      this.error = el("div", { class: "exp-form-error" });
      this.submitButton = el("button", { type: "submit", class: "primary", id: "exp-submit", text: "Start experiment" });
      const kinds = Object.keys(SCORERS);
      this.kind = el("select", { name: "scorer_kind", id: "exp-scorer-kind" }, kinds.map((k) => el("option", { value: k, text: k })));
      this.options = el("textarea", { name: "scorer_options", id: "exp-scorer-options", rows: "3", spellcheck: "false", placeholder: SCORERS.exact });
      this.kind.addEventListener("change", () => (this.options.placeholder = SCORERS[this.kind.value]));
      this.fileInput = el("input", { type: "file", id: "exp-dataset", name: "dataset", accept: ".jsonl,.json,application/json", class: "visually-hidden" });
      this.fileInput.addEventListener("change", () => this.pick(this.fileInput.files[0]));
      const drop = el(
        "label",
        { class: "drop", for: "exp-dataset" },
        el("span", {}, "Drop a dataset file here or ", el("span", { class: "link", text: "browse" })),
        el("span", { class: "hint", text: ".jsonl (one row a line) or .json (a list of rows, or {\"rows\": [...]}); each row: id, problem_statement, ground_truth, optional input_files and domain" }),
      );
      for (const name of ["dragenter", "dragover"]) {
        drop.addEventListener(name, (event) => {
          event.preventDefault();
          drop.classList.add("over");
        });
      }
      for (const name of ["dragleave", "drop"]) drop.addEventListener(name, () => drop.classList.remove("over"));
      drop.addEventListener("drop", (event) => {
        event.preventDefault();
        if (event.dataTransfer.files.length) this.pick(event.dataTransfer.files[0]);
      });

      this.form = el(
        "form",
        { class: "card exp-form", id: "exp-form", novalidate: true },
        el("a", { class: "exp-back", href: "#/experiments", text: "← All experiments" }),
        el("h1", { class: "exp-title", text: "New experiment" }),
        el("label", { class: "field" }, "Name", el("input", { name: "name", id: "exp-name", required: true, maxlength: "200", autocomplete: "off", placeholder: "math, sandbox vs vanilla" })),
        el("fieldset", {}, el("legend", { text: "Dataset" }), this.fileInput, drop, this.fileNote),
        el(
          "fieldset",
          {},
          el("legend", { text: "Arms" }),
          this.arms,
          el("button", { type: "button", class: "ghost small", id: "exp-add-arm", text: "+ Add an arm", onclick: () => this.addArm("", "sandbox") }),
        ),
        el(
          "fieldset",
          { class: "exp-grid" },
          el("legend", { text: "Scoring and pace" }),
          el("label", { class: "field" }, "Scorer", this.kind),
          el("label", { class: "field wide" }, "Scorer options (JSON object)", this.options),
          el("label", { class: "field" }, "Attempts per row and arm", el("input", { name: "attempts", id: "exp-attempts", type: "number", min: "1", value: "1" })),
          el("label", { class: "field" }, "Concurrency (items at once)", el("input", { name: "concurrency", id: "exp-concurrency", type: "number", min: "1", value: "8" })),
        ),
        el("div", { class: "row" }, this.submitButton),
        this.error,
      );
      this.form.addEventListener("submit", (event) => {
        event.preventDefault();
        this.submit();
      });
      root().replaceChildren(this.form);
      this.addArm("sandbox", "sandbox");
      this.addArm("vanilla", "vanilla");
      this.loadProfiles();
    }

    stop() {}

    refresh() {
      this.loadProfiles();
    }

    async loadProfiles() {
      try {
        this.profiles = (await apiJson("/v1/llm/profiles")).profiles;
      } catch (error) {
        return;
      }
      for (const arm of this.arms.querySelectorAll(".exp-arm")) this.fillProfiles(arm);
    }

    fillProfiles(arm) {
      const select = arm.querySelector("select[name=profile]");
      const chosen = select.value;
      const list = this.profiles.length ? this.profiles : [{ name: "default", kind: "", models: [] }];
      select.replaceChildren(...list.map((p) => el("option", { value: p.name, text: p.scripted ? `${p.name} (scripted demo)` : p.name })));
      if (list.some((p) => p.name === chosen)) select.value = chosen;
      this.fillModels(arm);
    }

    fillModels(arm) {
      const profile = this.profiles.find((p) => p.name === arm.querySelector("select[name=profile]").value);
      const models = profile ? [...new Set([profile.model, ...(profile.models || [])].filter(Boolean))] : [];
      arm.querySelector("datalist").replaceChildren(...models.map((m) => el("option", { value: m })));
      arm.querySelector("input[name=model]").placeholder = profile && profile.model ? `${profile.model} (profile default)` : "profile default";
    }

    addArm(name, mode) {
      this.armCount += 1;
      const n = this.armCount;
      const modeSelect = el(
        "select",
        { name: "mode" },
        el("option", { value: "sandbox", text: "sandbox (agent loop)" }),
        el("option", { value: "vanilla", text: "vanilla (one model call)" }),
      );
      modeSelect.value = mode;
      const steps = el("input", { name: "max_steps", type: "number", min: "1", placeholder: "default" });
      const sync = () => {
        steps.disabled = modeSelect.value === "vanilla";
        steps.placeholder = steps.disabled ? "one call" : "default";
      };
      modeSelect.addEventListener("change", sync);
      const profile = el("select", { name: "profile" }, el("option", { value: "default", text: "default" }));
      const arm = el(
        "fieldset",
        { class: "exp-arm", "data-arm": String(n) },
        el("legend", { text: `Arm ${n}` }),
        el("label", { class: "field" }, "Name", el("input", { name: "arm_name", value: name, required: true, autocomplete: "off", pattern: "[A-Za-z0-9][A-Za-z0-9_.-]{0,63}" })),
        el("label", { class: "field" }, "Mode", modeSelect),
        el("label", { class: "field" }, "LLM profile", profile),
        el("label", { class: "field" }, "Model", el("input", { name: "model", list: `exp-models-${n}`, autocomplete: "off" })),
        el("datalist", { id: `exp-models-${n}` }),
        el("label", { class: "field" }, "Max steps", steps),
        el("button", {
          type: "button",
          class: "ghost small exp-remove",
          text: "Remove",
          "aria-label": `Remove arm ${n}`,
          onclick: () => {
            if (this.arms.children.length > 1) arm.remove();
          },
        }),
      );
      profile.addEventListener("change", () => this.fillModels(arm));
      sync();
      this.arms.append(arm);
      this.fillProfiles(arm);
    }

    /** Reads the file here too, only to say what it holds; the server's checks are the ones that count. */
    async pick(file) {
      this.file = file || null;
      if (!file) {
        this.fileNote.textContent = "";
        return;
      }
      const label = `${file.name} · ${S.formatBytes(file.size)}`;
      let rows;
      try {
        const text = await file.text();
        if (/\.jsonl$/i.test(file.name)) {
          rows = text.split("\n").filter((line) => line.trim()).map((line) => JSON.parse(line));
        } else {
          const data = JSON.parse(text);
          rows = Array.isArray(data) ? data : data && data.rows;
        }
        if (!Array.isArray(rows)) throw new Error("no list of rows in it");
      } catch (error) {
        this.fileNote.textContent = `${label} · could not read it here (${error.message}); the server will say what is wrong`;
        return;
      }
      const domains = new Set(rows.map((r) => r && r.domain).filter((d) => typeof d === "string"));
      this.fileNote.textContent = `${label} · ${number.format(rows.length)} rows${domains.size ? ` · domains: ${[...domains].slice(0, 8).join(", ")}` : ""}`;
    }

    spec() {
      const f = this.form.elements;
      const arms = [...this.arms.querySelectorAll(".exp-arm")].map((arm) => {
        const value = (name) => arm.querySelector(`[name=${name}]`).value.trim();
        const task = { llm: { profile: value("profile") || "default" } };
        if (value("model")) task.llm.model = value("model");
        if (value("mode") === "sandbox" && value("max_steps")) task.limits = { max_steps: Number(value("max_steps")) };
        return { name: value("arm_name"), mode: value("mode"), task };
      });
      let options = {};
      const raw = f.scorer_options.value.trim();
      if (raw) {
        try {
          options = JSON.parse(raw);
        } catch (error) {
          throw new Error(`The scorer options are not JSON: ${error.message}`);
        }
        if (!options || typeof options !== "object" || Array.isArray(options)) throw new Error("The scorer options must be a JSON object.");
      }
      return {
        name: f.name.value.trim(),
        arms,
        scorer: { ...options, kind: f.scorer_kind.value },
        attempts: Number(f.attempts.value || 1),
        concurrency: Number(f.concurrency.value || 8),
      };
    }

    async submit() {
      this.error.replaceChildren();
      let spec;
      try {
        spec = this.spec();
      } catch (error) {
        this.error.replaceChildren(problem(error.message));
        return;
      }
      if (!spec.name) return this.refuse("Give the experiment a name.", this.form.elements.name);
      if (!this.file) return this.refuse("Choose a dataset file (.jsonl or .json).", this.fileInput);
      const body = new FormData();
      body.append("spec", JSON.stringify(spec));
      body.append("dataset", this.file, this.file.name);
      this.submitButton.disabled = true;
      this.submitButton.textContent = "Starting…";
      const answer = await post("/v1/experiments", body);
      this.submitButton.disabled = false;
      this.submitButton.textContent = "Start experiment";
      if (!answer.ok) {
        this.error.replaceChildren(problem(`Not started: ${answer.message}`, answer.details));
        return;
      }
      location.hash = `#/experiments/${enc(answer.data.id)}`;
    }

    refuse(message, focus) {
      this.error.replaceChildren(problem(message));
      focus.focus();
    }
  }

  // ------------------------------------------------------------------ one experiment

  class ExperimentView {
    constructor(id) {
      this.id = id;
      this.exp = null;
      this.charts = [];
      this.stopped = false;
      this.poll = null;
      this.detailTimer = null;
      this.lastDetail = 0;
      this.progressSeen = "";
      this.finalLoaded = false;
      this.filter = { arm: "", status: "" };
      this.showAll = false;
      this.onScheme = () => this.drawPlots();
    }

    start() {
      this.head = el("header", { class: "card exp-head" });
      this.progress = el("section", { class: "card exp-progress", "aria-labelledby": "exp-progress-title" });
      this.results = el("section", { class: "card exp-results", "aria-labelledby": "exp-results-title", hidden: true });
      this.plots = el("section", { class: "card exp-plots", "aria-labelledby": "exp-plots-title", hidden: true });
      this.itemsNode = el("section", { class: "card exp-items", "aria-labelledby": "exp-items-title", hidden: true });
      this.errorNode = el("div", { class: "exp-error" });
      root().replaceChildren(el("article", { class: "exp", "data-id": this.id }, this.head, this.errorNode, this.progress, this.results, this.plots, this.itemsNode));
      dark.addEventListener("change", this.onScheme);
      conn.set("connecting", "connecting…");
      this.follower = new Follower(
        this.id,
        () => this.refreshSoon(),
        (state) => this.streamState(state),
      );
      this.refresh().then(() => {
        if (!this.stopped && this.exp && !settled(this.exp)) this.follower.start();
      });
    }

    stop() {
      this.stopped = true;
      if (this.follower) this.follower.stop();
      clearInterval(this.poll);
      clearTimeout(this.detailTimer);
      clearTimeout(this.soon);
      dark.removeEventListener("change", this.onScheme);
      for (const chart of this.charts) chart.destroy();
    }

    refresh() {
      return this.load();
    }

    streamState(state) {
      if (this.stopped) return;
      if (this.exp && settled(this.exp)) return;
      clearInterval(this.poll);
      this.poll = null;
      if (state === "live") {
        conn.set("live", "live");
        this.refreshSoon();
      } else {
        conn.set("polling", "updating every 2 s");
        this.poll = setInterval(() => this.load(), POLL_MS);
      }
    }

    refreshSoon() {
      if (this.soon) return;
      this.soon = setTimeout(() => {
        this.soon = null;
        this.load();
      }, 250);
    }

    async load() {
      if (this.loading) {
        this.again = true;
        return;
      }
      this.loading = true;
      try {
        const exp = await apiJson(`/v1/experiments/${enc(this.id)}`);
        if (this.stopped) return;
        this.exp = exp;
        this.errorNode.replaceChildren();
        this.renderHead(exp);
        this.renderProgress(exp);
        this.detailsWhenDue(exp);
        if (settled(exp)) this.ended();
      } catch (error) {
        if (this.stopped) return;
        if (error.status === 404) {
          this.stop();
          conn.set("error", "not found");
          this.errorNode.replaceChildren(problem("There is no such experiment (or it is not yours)."));
          return;
        }
        this.errorNode.replaceChildren(problem(`Could not load the experiment: ${error.message}`));
      } finally {
        this.loading = false;
        if (this.again && !this.stopped) {
          this.again = false;
          this.refreshSoon();
        }
      }
    }

    ended() {
      if (this.follower) this.follower.stop();
      clearInterval(this.poll);
      this.poll = null;
      conn.set("done", this.exp.status);
    }

    detailsWhenDue(exp) {
      const signature = JSON.stringify([exp.status, exp.grading, exp.progress]);
      const terminal = settled(exp);
      if (signature === this.progressSeen && (this.finalLoaded || !terminal)) return;
      this.progressSeen = signature;
      clearTimeout(this.detailTimer);
      const wait = terminal ? 0 : Math.max(0, this.lastDetail + DETAIL_EVERY_MS - Date.now());
      this.detailTimer = setTimeout(() => this.loadDetails(terminal), wait);
    }

    async loadDetails(terminal) {
      this.lastDetail = Date.now();
      let results;
      let items;
      try {
        [results, items] = await Promise.all([apiJson(`/v1/experiments/${enc(this.id)}/results`), allItems(this.id)]);
      } catch (error) {
        if (!this.stopped) this.errorNode.replaceChildren(problem(`Could not load the results: ${error.message}`));
        return;
      }
      if (this.stopped) return;
      this.resultsData = results;
      this.items = items;
      this.renderResults(results);
      this.drawPlots();
      this.renderItems();
      if (terminal) {
        this.finalLoaded = true;
        root().querySelector("article.exp").dataset.loaded = "final";
      }
    }

    // -- the header and progress

    renderHead(exp) {
      const cancel = el("button", { type: "button", class: "danger", id: "exp-cancel", text: "Cancel", onclick: () => this.cancel(cancel) });
      const meta = [
        ["scorer", exp.scorer ? exp.scorer.kind : ""],
        ["rows", number.format(exp.rows)],
        ["attempts", String(exp.attempts)],
        ["concurrency", String(exp.concurrency)],
        ["created", new Date(exp.created_at).toLocaleString()],
      ];
      if (exp.finished_at) meta.push(["ended", new Date(exp.finished_at).toLocaleString()]);
      if (exp.grading && exp.grading > 1) meta.push(["grading", String(exp.grading)]);
      this.head.replaceChildren(
        el("a", { class: "exp-back", href: "#/experiments", text: "← All experiments" }),
        el(
          "div",
          { class: "row spread" },
          el("div", { class: "row" }, el("span", { id: "exp-status", class: `badge ${exp.status}`, text: exp.status }), el("h1", { class: "exp-title", id: "exp-name-title", text: exp.name })),
          TERMINAL.has(exp.status) ? null : cancel,
        ),
        el("code", { class: "task-id", text: exp.id }),
        el("dl", { class: "meta" }, meta.map(([k, v]) => el("div", {}, el("dt", { text: k }), el("dd", { text: v })))),
        scriptedNotice(exp.arms),
      );
    }

    async cancel(button) {
      button.disabled = true;
      const answer = await post(`/v1/experiments/${enc(this.id)}/cancel`, null);
      if (!answer.ok) {
        this.errorNode.replaceChildren(problem(`Cancel failed: ${answer.message}`));
        button.disabled = false;
      }
      this.load();
    }

    renderProgress(exp) {
      const rows = exp.arms.map((arm, index) => {
        // An error the service or the scorer made has no score: its own colour, apart from
        // the agent's errors (which score 0).
        const { not_scored: notScored = 0, ...given } = exp.progress[arm.name] || {};
        const counts = { ...given, error: (given.error || 0) - notScored, "not-scored": notScored };
        const keys = [...STATUS_ORDER.filter((k) => k in counts), ...Object.keys(counts).filter((k) => !STATUS_ORDER.includes(k))];
        const total = keys.reduce((s, k) => s + counts[k], 0);
        const done = (counts.scored || 0) + (counts.error || 0) + counts["not-scored"] + (counts.cancelled || 0);
        const bar = el(
          "div",
          {
            class: "exp-bar",
            role: "progressbar",
            "aria-valuemin": "0",
            "aria-valuemax": String(total),
            "aria-valuenow": String(done),
            "aria-label": `${arm.name}: ${done} of ${total} items ended`,
          },
          keys
            .filter((k) => counts[k] > 0 && k !== "pending")
            .map((k) => {
              const part = el("span", { class: `seg ${k.replace(/[^a-z-]/gi, "")}`, title: `${k}: ${counts[k]}` });
              part.style.width = `${(100 * counts[k]) / (total || 1)}%`;
              return part;
            }),
        );
        return el(
          "div",
          { class: "exp-arm-progress", "data-arm": arm.name, "data-done": String(done), "data-total": String(total) },
          el(
            "div",
            { class: "row spread" },
            el("span", { class: "row" }, el("span", { class: "swatch", "data-index": String(index % 8) }), el("strong", { text: arm.name }), el("span", { class: "hint", text: arm.mode })),
            el("span", { class: "hint counts", text: [...keys.filter((k) => counts[k] > 0).map((k) => `${counts[k]} ${k.replace("-", " ")}`), `of ${total}`].join(" · ") }),
          ),
          bar,
        );
      });
      this.progress.replaceChildren(el("h2", { id: "exp-progress-title", text: "Progress" }), ...rows);
    }

    // -- results

    renderResults(results) {
      const modes = new Map(this.exp.arms.map((a) => [a.name, a.mode]));
      const armRows = results.arms.map((r) =>
        el(
          "tr",
          { "data-arm": r.arm },
          el("th", { scope: "row", text: r.arm }),
          cell("mode", modes.get(r.arm) || ""),
          cell("n", number.format(r.n), r.n),
          cell("coverage", coverageText(r.coverage), r.coverage ? [r.coverage.scored, r.coverage.items] : null),
          cell("mean", fixed(r.mean), r.mean),
          cell("ci95", interval(r.ci95), r.ci95),
          cell("pass_at_k", passText(r.pass_at_k), r.pass_at_k),
          cell("errors", errorsText(r.errors), r.errors),
          cell("tokens", `${median(r.prompt_tokens.median)} → ${median(r.completion_tokens.median)}`, [r.prompt_tokens.median, r.completion_tokens.median]),
          cell("steps", median(r.steps.median), r.steps.median),
          cell("seconds", fixed(r.seconds.median, 1), r.seconds.median),
        ),
      );
      const pairRows = results.pairs.map((p) =>
        el(
          "tr",
          { "data-pair": `${p.a}|${p.b}` },
          el("th", { scope: "row", text: `${p.a} − ${p.b}` }),
          cell("n", number.format(p.n), p.n),
          cell("mean_a", fixed(p.mean_a), p.mean_a),
          cell("mean_b", fixed(p.mean_b), p.mean_b),
          cell("difference", fixed(p.difference), p.difference),
          cell("ci95", `${interval(p.ci95)} ${p.ci95_method || ""}`.trim(), p.ci95),
          cell("wlt", `${p.wins} / ${p.ties} / ${p.losses}`, [p.wins, p.ties, p.losses]),
          cell("p_value", p.p_value === undefined ? "–" : p.p_value < 0.001 ? "< 0.001" : p.p_value.toFixed(3), p.p_value),
          cell("verdict", VERDICTS[p.verdict] || p.verdict || "", p.verdict),
        ),
      );
      fill(
        this.results,
        el(
          "div",
          { class: "row spread" },
          el("h2", { id: "exp-results-title", text: "Results" }),
          settled(this.exp) ? null : el("span", { class: "hint", text: "so far: updates as items end" }),
        ),
        table(
          "Results per arm",
          ["Arm", "Mode", "n", "Coverage", "Mean", "95 % interval", "pass@k", "Errors", "Tokens (median, prompt → completion)", "Steps (median)", "Seconds (median)"],
          armRows,
          "exp-arms-table",
        ),
        el("p", { class: "hint", text: "n counts scored items; coverage says how many of the arm's items that is (not scored: the service or the scorer failed, never a zero); the mean is mean@k (each row's attempts averaged, then the rows) and its interval is over rows; errors are counted apart, never as zeros." }),
        pairRows.length
          ? el(
              "div",
              {},
              el("h3", { text: "Paired comparison (rows both arms scored)" }),
              table("Paired comparison", ["a − b", "Rows", "Mean a", "Mean b", "Difference", "95 % interval (method)", "Wins / ties / losses (a)", "p (sign test)", "Verdict"], pairRows, "exp-pairs-table"),
              el("ul", { class: "exp-pair-summaries" }, results.pairs.map((p) => el("li", { "data-pair": `${p.a}|${p.b}`, text: p.summary || "" }))),
              el("p", { class: "hint", text: "A difference is clear only when the sign test's p is under 0.05 and the interval excludes 0; under 8 rows with a winner none can be shown. Wins count rows where a scored higher." }),
            )
          : null,
      );
      show(this.results, true);
    }

    drawPlots() {
      if (!this.resultsData || !this.items || typeof Chart === "undefined") return;
      for (const chart of this.charts) chart.destroy();
      this.charts = [];
      if (!this.items.some((i) => i.status === "scored" || i.status === "error")) {
        show(this.plots, false); // nothing to plot before an item ends
        return;
      }
      chartDefaults();
      const specs = plotSpecs(this.exp.arms, this.resultsData, this.items);
      const figures = specs.map((spec) => {
        const canvas = el("canvas", { role: "img", "aria-label": `${spec.title}: ${spec.summary}`, "data-plot": spec.key }, spec.summary);
        const figure = el("figure", { class: "exp-plot", "data-plot": spec.key }, el("figcaption", { text: spec.title }), el("div", { class: "exp-canvas" }, canvas));
        return { figure, canvas, spec };
      });
      this.plots.replaceChildren(el("h2", { id: "exp-plots-title", text: "Plots" }), el("div", { class: "exp-plot-grid" }, figures.map((f) => f.figure)));
      show(this.plots, true);
      for (const { canvas, spec } of figures) this.charts.push(new Chart(canvas, spec.config));
    }

    // -- items

    renderItems() {
      const items = this.items;
      const arms = this.exp.arms.map((a) => a.name);
      const statuses = [...new Set(items.map((i) => i.status))].sort();
      const select = (name, label, values) => {
        const node = el("select", { name, "aria-label": label }, el("option", { value: "", text: `every ${label}` }), values.map((v) => el("option", { value: v, text: v })));
        node.value = this.filter[name];
        node.addEventListener("change", () => {
          this.filter[name] = node.value;
          this.renderItems();
        });
        return node;
      };
      const shown = items.filter((i) => (!this.filter.arm || i.arm === this.filter.arm) && (!this.filter.status || i.status === this.filter.status));
      const page = this.showAll ? shown : shown.slice(0, ITEMS_SHOWN);
      const rows = page.map((item) => {
        const answer = item.answer === null ? "" : item.answer;
        return el(
          "tr",
          { "data-row": item.row_id, "data-arm": item.arm, "data-attempt": String(item.attempt) },
          el("td", {}, el("a", { href: `#/experiments/${enc(this.id)}/rows/${enc(item.row_id)}`, class: "row-link", title: "this row's arms side by side", text: item.row_id })),
          cell("arm", item.arm),
          cell("attempt", String(item.attempt), item.attempt),
          el("td", { "data-field": "status" }, badge(item.status), item.error_kind ? el("span", { class: "hint", text: ` ${item.error_kind}` }) : null),
          cell("score", fixed(item.score), item.score),
          el("td", { "data-field": "answer", class: "answer-cell", title: answer.slice(0, 2000), text: answer.length > ANSWER_CHARS ? `${answer.slice(0, ANSWER_CHARS)}…` : answer }),
          cell("tokens", number.format(item.prompt_tokens + item.completion_tokens)),
          cell("steps", String(item.steps), item.steps),
          cell("seconds", fixed(item.seconds, 1), item.seconds),
          el("td", {}, item.task_id ? el("a", { href: `#/tasks/${enc(item.task_id)}`, class: "task-link", text: "trajectory" }) : el("span", { class: "hint", text: "no task yet" })),
        );
      });
      const csv = el("button", {
        type: "button",
        class: "ghost small",
        text: "Download CSV",
        onclick: () => S.download(`/v1/experiments/${enc(this.id)}/items?format=csv`, `${this.id}-items.csv`).catch((e) => this.errorNode.replaceChildren(problem(e.message))),
      });
      fill(
        this.itemsNode,
        el("div", { class: "row spread" }, el("h2", { id: "exp-items-title", text: `Items (${number.format(items.length)})` }), el("div", { class: "row" }, select("arm", "arm", arms), select("status", "status", statuses), csv)),
        table("Items", ["Row", "Arm", "Attempt", "Status", "Score", "Answer", "Tokens", "Steps", "Seconds", "Task"], rows, "exp-items-table"),
        shown.length > page.length
          ? el("button", {
              type: "button",
              class: "ghost",
              text: `Show all ${number.format(shown.length)}`,
              onclick: () => {
                this.showAll = true;
                this.renderItems();
              },
            })
          : null,
      );
      show(this.itemsNode, true);
    }
  }

  // ------------------------------------------------------------------ one row, its arms side by side

  class RowView {
    constructor(id, rowId) {
      this.id = id;
      this.rowId = rowId;
    }

    async start() {
      conn.set("idle", "");
      const body = el("div", { class: "exp-row-body" }, el("p", { class: "hint", text: "Loading…" }));
      this.body = body;
      root().replaceChildren(
        el(
          "article",
          { class: "exp exp-row", "data-row": this.rowId },
          el(
            "header",
            { class: "card exp-head" },
            el("a", { class: "exp-back", href: `#/experiments/${enc(this.id)}`, text: "← The experiment" }),
            el("h1", { class: "exp-title" }, "Row ", el("code", { text: this.rowId })),
            (this.problem = el("pre", { class: "code exp-problem", hidden: true })),
            (this.nav = el("nav", { class: "row spread exp-row-nav", "aria-label": "Rows" })),
          ),
          body,
        ),
      );
      let exp;
      let items;
      try {
        [exp, items] = await Promise.all([apiJson(`/v1/experiments/${enc(this.id)}`), allItems(this.id)]);
      } catch (error) {
        body.replaceChildren(problem(`Could not load the row: ${error.message}`));
        return;
      }
      if (this.stopped) return;
      const order = [...new Set(items.map((i) => i.row_id))];
      const at = order.indexOf(this.rowId);
      const link = (rowId, text) => (rowId === undefined ? el("span") : el("a", { href: `#/experiments/${enc(this.id)}/rows/${enc(rowId)}`, text }));
      this.nav.replaceChildren(link(order[at - 1], "← previous row"), link(order[at + 1], "next row →"));
      const mine = items.filter((i) => i.row_id === this.rowId);
      if (!mine.length) {
        body.replaceChildren(problem("This experiment has no such row."));
        return;
      }
      body.replaceChildren(
        el(
          "div",
          { class: "exp-row-grid" },
          exp.arms.map((arm, index) =>
            el(
              "section",
              { class: "card exp-row-arm", "data-arm": arm.name },
              el("h2", { class: "row" }, el("span", { class: "swatch", "data-index": String(index % 8) }), el("span", { text: `${arm.name} · ${arm.mode}` })),
              mine.filter((i) => i.arm === arm.name).sort((a, b) => a.attempt - b.attempt).map((item) => this.attempt(item)),
            ),
          ),
        ),
      );
      const first = mine.find((i) => i.task_id);
      if (first) {
        apiJson(`/v1/tasks/${enc(first.task_id)}`)
          .then((task) => {
            this.problem.textContent = task.prompt;
            show(this.problem, true);
          })
          .catch(() => {});
      }
    }

    attempt(item) {
      return el(
        "div",
        { class: "exp-attempt", "data-attempt": String(item.attempt) },
        el(
          "div",
          { class: "row spread" },
          el("span", { class: "row" }, el("strong", { text: `attempt ${item.attempt}` }), badge(item.status), item.error_kind ? el("span", { class: "hint", text: item.error_kind }) : null),
          el("span", { class: "score", "data-field": "score", text: `score ${fixed(item.score)}` }),
        ),
        item.answer === null ? el("p", { class: "hint", text: "no answer" }) : el("pre", { class: "code answer-text", text: item.answer }),
        el("p", { class: "hint", text: `${item.steps} ${item.steps === 1 ? "step" : "steps"} · ${number.format(item.prompt_tokens + item.completion_tokens)} tokens · ${fixed(item.seconds, 1)} s` }),
        item.detail && Object.keys(item.detail).length
          ? el("details", {}, el("summary", { text: "what the scorer saw" }), el("pre", { class: "code", text: JSON.stringify(item.detail, null, 2) }))
          : null,
        item.task_id ? el("a", { href: `#/tasks/${enc(item.task_id)}`, class: "task-link", text: "open the trajectory →" }) : null,
      );
    }

    stop() {
      this.stopped = true;
    }

    refresh() {}
  }

  // ------------------------------------------------------------------ routing (called by app.js's router)

  const ROUTE = /^#\/experiments(?:\/([A-Za-z0-9_-]+)(?:\/rows\/([^/]+))?)?\/?$/;

  function decode(part) {
    try {
      return decodeURIComponent(part);
    } catch (ignored) {
      return part;
    }
  }

  S.experiments = {
    view: null,
    hash: null,
    claims(hash) {
      return /^#\/experiments(\/|$)/.test(hash);
    },
    /** The hash when it is this view's, else null (the task view's turn). */
    route(hash) {
      if (hash === this.hash) return;
      this.hash = hash;
      if (this.view) this.view.stop();
      this.view = null;
      if (!hash) return;
      const match = hash.match(ROUTE);
      if (!match) this.view = new ListView();
      else if (match[1] === "new") this.view = new CreateView();
      else if (match[1] && match[2]) this.view = new RowView(match[1], decode(match[2]));
      else if (match[1]) this.view = new ExperimentView(match[1]);
      else this.view = new ListView();
      this.view.start();
      window.scrollTo(0, 0);
    },
    refresh() {
      if (this.view) this.view.refresh();
    },
  };
})();
