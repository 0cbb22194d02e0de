// Two tasks side by side (#/compare/A/B): their facts, their steps aligned by step number
// (tool, command, exit, duration; rows that differ are marked), their answers as a line diff,
// and their artifacts by name, size and sha256. Plain JavaScript on the public /v1 API like
// app.js, whose helpers it borrows (window.Sandhive). Everything from the API is hostile:
// inserted as text only (el() / textContent), never as HTML.
"use strict";

(() => {
  const S = window.Sandhive;
  const { el, show, apiJson, formatBytes, formatMs } = S;
  const HASH = /^#\/compare\/([A-Za-z0-9_-]+)\/([A-Za-z0-9_-]+)$/;
  const COMMAND_CHARS = 160;
  const DIFF_MAX_LINES = 2000; // past this, each side's lines are shown whole, not diffed

  const enc = encodeURIComponent;

  /** The longest common subsequence of two line lists, as [op, line] (" ", "-", "+"). */
  function lineDiff(a, b) {
    const n = a.length;
    const m = b.length;
    const lcs = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i -= 1) {
      for (let j = m - 1; j >= 0; j -= 1) {
        lcs[i][j] = a[i] === b[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
      }
    }
    const out = [];
    let i = 0;
    let j = 0;
    while (i < n && j < m) {
      if (a[i] === b[j]) {
        out.push([" ", a[i]]);
        i += 1;
        j += 1;
      } else if (lcs[i + 1][j] >= lcs[i][j + 1]) {
        out.push(["-", a[i]]);
        i += 1;
      } else {
        out.push(["+", b[j]]);
        j += 1;
      }
    }
    while (i < n) out.push(["-", a[i++]]);
    while (j < m) out.push(["+", b[j++]]);
    return out;
  }

  function lines(text) {
    return text === null || text === undefined ? [] : String(text).split("\n");
  }

  /** What a step did, in one line: the command, the edit, or the tool's arguments. */
  function actionText(action) {
    if (!action) return "—";
    const args = action.arguments || {};
    let text;
    if (action.tool === "execute_bash") text = String(args.command ?? "");
    else if (action.tool === "str_replace_editor") text = `${args.command || ""} ${args.path || ""}`.trim();
    else if (action.tool === "submit") text = "submit";
    else text = JSON.stringify(args);
    return text.length > COMMAND_CHARS ? `${text.slice(0, COMMAND_CHARS)}…` : text;
  }

  /** When one side is a fork of the other (docs/fork.md): which, and its branch step. */
  function branchOf(sides) {
    const [a, b] = sides.map((side) => side.task);
    if (b.fork && b.fork.parent_id === a.id) return { parent: "A", child: "B", step: b.fork.step };
    if (a.fork && a.fork.parent_id === b.id) return { parent: "B", child: "A", step: a.fork.step };
    return null;
  }

  function durationMs(task) {
    if (!task.started_at) return null;
    const end = task.finished_at ? Date.parse(task.finished_at) : Date.now();
    return Math.max(0, end - Date.parse(task.started_at));
  }

  /** The latest attempt's steps by step number (1-based, as the task view numbers them). */
  function stepsByNumber(trajectory, task) {
    const attempt = Math.max(task.attempt || 1, ...trajectory.steps.map((s) => s.attempt));
    const map = new Map();
    for (const step of trajectory.steps) if (step.attempt === attempt) map.set(step.index + 1, step);
    return map;
  }

  const compare = {
    ids: null,
    generation: 0,

    claims(hash) {
      return HASH.test(hash);
    },

    node() {
      let node = document.querySelector("#compare");
      if (!node) {
        node = el("section", { id: "compare", class: "compare", hidden: true });
        document.querySelector("#view").append(node);
      }
      return node;
    },

    /** The hash when it is a comparison, else null (hide). */
    route(hash) {
      const node = this.node();
      const match = hash ? hash.match(HASH) : null;
      show(node, Boolean(match));
      if (!match) {
        this.ids = null;
        return;
      }
      const ids = [match[1], match[2]];
      if (this.ids && this.ids[0] === ids[0] && this.ids[1] === ids[1]) return;
      this.ids = ids;
      this.load(ids);
    },

    async load(ids) {
      this.generation += 1;
      const generation = this.generation;
      const node = this.node();
      node.replaceChildren(el("p", { class: "hint", text: "Loading both tasks…" }));
      let sides;
      try {
        sides = await Promise.all(ids.map((id) => this.fetchSide(id)));
      } catch (error) {
        if (generation !== this.generation) return;
        node.replaceChildren(
          el("a", { class: "back", href: "#/", text: "← All tasks" }),
          el("div", { class: "error" }, S.errorView ? S.errorView(error, "Cannot compare") : `Cannot compare: ${error.message}`),
        );
        return;
      }
      if (generation !== this.generation) return;
      node.replaceChildren(
        el("a", { class: "back", href: "#/", text: "← All tasks" }),
        el("h2", { text: "Compare two tasks" }),
        this.facts(sides),
        this.steps(sides),
        this.answers(sides),
        this.artifacts(sides),
      );
    },

    async fetchSide(id) {
      const path = `/v1/tasks/${enc(id)}`;
      const [task, trajectory, artifacts] = await Promise.all([
        apiJson(path),
        apiJson(`${path}/trajectory`),
        apiJson(`${path}/artifacts`),
      ]);
      return { id, task, trajectory, artifacts };
    },

    facts(sides) {
      const row = (label, get) =>
        el("tr", {}, el("th", { scope: "row", text: label }), ...sides.map((side) => el("td", {}, get(side.task))));
      const duration = (task) => {
        const ms = durationMs(task);
        return ms == null ? "—" : formatMs(ms);
      };
      return el(
        "section",
        { class: "card cmp-facts" },
        el(
          "table",
          { class: "cmp-table" },
          el(
            "thead",
            {},
            el("tr", {}, el("th", {}), ...sides.map((s) => el("th", {}, el("a", { href: `#/tasks/${enc(s.id)}` }, el("code", { text: s.id }))))),
          ),
          el(
            "tbody",
            {},
            row("status", (t) => el("span", { class: `badge ${t.status}`, text: t.finish_reason ? `${t.status} · ${t.finish_reason}` : t.status })),
            row("prompt", (t) => el("span", { class: "cmp-prompt", text: t.prompt })),
            row("model", (t) => `${t.llm.profile} / ${t.llm.model}`),
            row("duration", duration),
            row("steps", (t) => String(t.usage.steps)),
            row("tokens", (t) => `${t.usage.prompt_tokens} in / ${t.usage.completion_tokens} out`),
          ),
        ),
      );
    },

    steps(sides) {
      const maps = sides.map((side) => stepsByNumber(side.trajectory, side.task));
      const numbers = [...new Set([...maps[0].keys(), ...maps[1].keys()])].sort((x, y) => x - y);
      const cell = (step) => {
        if (!step) return el("td", { class: "cmp-none", text: "—" });
        const exit = step.exit_code;
        return el(
          "td",
          {},
          el("span", { class: "cmp-tool", text: step.action ? step.action.tool : "(no action)" }),
          el("code", { class: "cmp-cmd", text: actionText(step.action) }),
          el(
            "span",
            { class: "cmp-step-meta" },
            el("span", { class: `cmp-exit ${exit === null || exit === undefined ? "" : exit === 0 ? "ok" : "bad"}`, text: exit === null || exit === undefined ? "no exit" : `exit ${exit}` }),
            ` · ${formatMs(step.llm_ms + step.tool_ms)}`,
          ),
        );
      };
      const branch = branchOf(sides);
      const rows = [];
      for (const n of numbers) {
        if (branch && n === branch.step + 1) {
          const text = `${branch.child} was forked from ${branch.parent} here: steps 1–${branch.step} were replayed, step ${n} on are its own`;
          rows.push(el("tr", { class: "cmp-branch" }, el("td", { colspan: "3", text })));
        }
        const [a, b] = [maps[0].get(n), maps[1].get(n)];
        const same = a && b && actionText(a.action) === actionText(b.action) && a.exit_code === b.exit_code;
        const replayed = branch && n <= branch.step ? " replayed" : "";
        rows.push(el("tr", { class: (same ? "same" : "differs") + replayed, "data-step": n }, el("th", { scope: "row", text: String(n) }), cell(a), cell(b)));
      }
      return el(
        "section",
        { class: "card cmp-steps" },
        el("h3", { text: "Steps, aligned by number" }),
        numbers.length
          ? el(
              "table",
              { class: "cmp-table" },
              el("thead", {}, el("tr", {}, el("th", { text: "#" }), el("th", { text: "A" }), el("th", { text: "B" }))),
              el("tbody", {}, ...rows),
            )
          : el("p", { class: "hint", text: "Neither task has recorded a step." }),
      );
    },

    answers(sides) {
      const [a, b] = sides.map((side) => side.task.answer);
      const section = el("section", { class: "card cmp-answers" }, el("h3", { text: "Answers (A → B)" }));
      if (a === b) {
        section.append(el("p", { class: "hint", text: a === null ? "Neither task has an answer." : "The answers are the same." }));
        if (a !== null) section.append(el("pre", { class: "cmp-diff", text: a }));
        return section;
      }
      const [la, lb] = [lines(a), lines(b)];
      const ops =
        la.length + lb.length > DIFF_MAX_LINES
          ? [...la.map((l) => ["-", l]), ...lb.map((l) => ["+", l])]
          : lineDiff(la, lb);
      const pre = el(
        "pre",
        { class: "cmp-diff" },
        ...ops.map(([op, line]) => el("span", { class: op === "+" ? "add" : op === "-" ? "del" : "ctx", text: `${op} ${line}\n` })),
      );
      section.append(pre);
      return section;
    },

    artifacts(sides) {
      const maps = sides.map((side) => new Map(side.artifacts.items.map((item) => [item.path, item])));
      const paths = [...new Set([...maps[0].keys(), ...maps[1].keys()])].sort();
      const cell = (item) =>
        item
          ? el("td", {}, formatBytes(item.size), " ", el("code", { class: "cmp-sha", title: item.sha256, text: item.sha256.slice(0, 12) }))
          : el("td", { class: "cmp-none", text: "—" });
      const rows = paths.map((path) => {
        const [a, b] = [maps[0].get(path), maps[1].get(path)];
        const verdict = !a ? "only in B" : !b ? "only in A" : a.sha256 === b.sha256 ? "same" : "differs";
        return el(
          "tr",
          { class: verdict === "same" ? "same" : "differs" },
          el("th", { scope: "row" }, el("code", { text: path })),
          cell(a),
          cell(b),
          el("td", { class: "cmp-verdict", text: verdict }),
        );
      });
      return el(
        "section",
        { class: "card cmp-artifacts" },
        el("h3", { text: "Artifacts" }),
        paths.length
          ? el(
              "table",
              { class: "cmp-table" },
              el("thead", {}, el("tr", {}, el("th", { text: "file" }), el("th", { text: "A" }), el("th", { text: "B" }), el("th", {}))),
              el("tbody", {}, ...rows),
            )
          : el("p", { class: "hint", text: "Neither task left artifacts." }),
      );
    },
  };

  S.compare = compare;
  S.lineDiff = lineDiff;
})();
