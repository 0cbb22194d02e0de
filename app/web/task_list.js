// The task list of Sandhive's page: status, duration, steps, model and a short id per task;
// search (`q`) and filters (status, model, metadata key=value) sent to GET /v1/tasks as they
// are, "load more" past the first page through the cursor, and two tasks picked to compare
// (#/compare/A/B, compare.js). The filters live in the list's hash (#/?q=…&status=…), so a
// filtered list can be bookmarked; a task's own hash (#/tasks/ID) keeps them in memory.
// Prompts, ids and models are the API's: inserted as text only (el()), never as HTML.
"use strict";

(() => {
  const S = window.Sandhive;
  const { el, show, apiJson, formatAgo, formatMs } = S;
  const PAGE = 30;
  const POLL_MS = 3000;
  const STATUSES = ["queued", "running", "succeeded", "failed", "cancelled"];
  const FILTERS = ["q", "status", "model", "meta", "origin"];
  /** Which tasks the list shows: `in_experiment` of GET /v1/tasks for each choice. */
  const ORIGINS = { "": "false", experiments: "true", all: null };

  const $ = (selector) => document.querySelector(selector);

  /** "#/", "#" or "" or "#/?…": the list's own hash (no task, no other view). */
  function isListHash(hash) {
    return hash === "" || hash === "#" || /^#\/(\?.*)?$/.test(hash);
  }

  function shortId(id) {
    return id.length > 8 ? id.slice(-8) : id;
  }

  function durationMs(task) {
    if (!task.started_at) return null;
    const end = task.finished_at ? Date.parse(task.finished_at) : Date.now();
    return Math.max(0, end - Date.parse(task.started_at));
  }

  /** `key=value` → ["metadata.key", "value"]; anything else → null (not sent). */
  function metadataParam(text) {
    const at = text.indexOf("=");
    if (at <= 0) return null;
    return [`metadata.${text.slice(0, at).trim()}`, text.slice(at + 1).trim()];
  }

  /** An experiment item's task: which experiment and arm it runs (its metadata says). */
  function experimentLabel(task) {
    const meta = task.metadata || {};
    if (typeof meta.experiment !== "string") return null;
    return el("span", {
      class: "tl-experiment",
      title: `experiment ${meta.experiment}, arm ${meta.arm}, row ${meta.row}, attempt ${meta.attempt}`,
      text: `exp ${shortId(meta.experiment)} · ${meta.arm}`,
    });
  }

  const taskList = {
    filters: { q: "", status: "", model: "", meta: "", origin: "" },
    items: [],
    cursor: null,
    selected: [],
    signature: "",
    generation: 0,
    error: null,
    typingTimer: null,

    init() {
      this.build();
      this.fromHash(location.hash);
      window.addEventListener("hashchange", () => {
        if (!isListHash(location.hash)) return this.draw(true);
        // Back to the bare list (← All tasks, the logo): keep the filters, and say so in the hash.
        if (!location.hash.includes("?") && this.hashQuery()) return this.writeHash();
        if (this.fromHash(location.hash)) this.reload();
        return undefined;
      });
      this.reload();
      setInterval(() => {
        if (!document.hidden) this.refresh();
      }, POLL_MS);
      document.addEventListener("visibilitychange", () => {
        if (!document.hidden) this.refresh();
      });
    },

    build() {
      const card = $(".card.tasks");
      const field = (name, props) =>
        el("input", { name, autocomplete: "off", spellcheck: "false", ...props });
      this.form = el(
        "form",
        { id: "task-filters", class: "task-filters", role: "search", onsubmit: (e) => e.preventDefault() },
        el("label", { class: "visually-hidden", for: "tl-q", text: "Search prompts and ids" }),
        field("q", { id: "tl-q", type: "search", placeholder: "Search prompt or id", maxlength: "200" }),
        el(
          "div",
          { class: "tl-row" },
          el(
            "select",
            { name: "status", "aria-label": "Status" },
            el("option", { value: "", text: "any status" }),
            ...STATUSES.map((s) => el("option", { value: s, text: s })),
          ),
          field("model", { placeholder: "model", "aria-label": "Model", maxlength: "200" }),
          field("meta", { placeholder: "metadata key=value", "aria-label": "Metadata key=value" }),
          el(
            "select",
            { name: "origin", "aria-label": "Which tasks" },
            el("option", { value: "", text: "not experiments'" }),
            el("option", { value: "experiments", text: "experiment items" }),
            el("option", { value: "all", text: "all tasks" }),
          ),
        ),
      );
      this.form.addEventListener("input", (event) => {
        clearTimeout(this.typingTimer);
        const wait = event.target.tagName === "SELECT" ? 0 : 300;
        this.typingTimer = setTimeout(() => this.changed(), wait);
      });
      this.compareButton = el("button", {
        id: "compare-selected",
        type: "button",
        class: "small",
        disabled: true,
        text: "Compare 2 selected",
        onclick: () => {
          if (this.selected.length === 2) location.hash = `#/compare/${this.selected[0]}/${this.selected[1]}`;
        },
      });
      this.moreButton = el("button", {
        id: "load-more",
        type: "button",
        class: "ghost small load-more",
        hidden: true,
        text: "Load more",
        onclick: () => this.more(),
      });
      card.querySelector("h2").after(this.form);
      $("#task-list").after(this.moreButton);
      card.append(el("div", { class: "row tl-compare" }, this.compareButton, el("span", { class: "hint", id: "compare-hint", text: "tick two tasks to compare them" })));
    },

    /** Reads the filters from a list hash; true when they changed. */
    fromHash(hash) {
      if (!isListHash(hash)) return false;
      const params = new URLSearchParams(hash.replace(/^#\/?\??/, ""));
      const next = {};
      for (const name of FILTERS) next[name] = params.get(name) || "";
      const changed = FILTERS.some((name) => next[name] !== this.filters[name]);
      this.filters = next;
      for (const name of FILTERS) if (this.form.elements[name].value !== next[name]) this.form.elements[name].value = next[name];
      return changed;
    },

    changed() {
      for (const name of FILTERS) this.filters[name] = this.form.elements[name].value.trim();
      if (isListHash(location.hash)) this.writeHash();
      this.reload();
    },

    writeHash() {
      const query = this.hashQuery();
      history.replaceState(null, "", query ? `#/?${query}` : "#/");
    },

    hashQuery() {
      const params = new URLSearchParams();
      for (const name of FILTERS) if (this.filters[name]) params.set(name, this.filters[name]);
      return params.toString();
    },

    apiQuery(extra) {
      const params = new URLSearchParams({ limit: String(PAGE) });
      const f = this.filters;
      if (f.q) params.set("q", f.q);
      if (f.status) params.set("status", f.status);
      if (f.model) params.set("model", f.model);
      const meta = f.meta ? metadataParam(f.meta) : null;
      if (meta) params.set(meta[0], meta[1]);
      const origin = ORIGINS[f.origin] === undefined ? ORIGINS[""] : ORIGINS[f.origin];
      if (origin !== null) params.set("in_experiment", origin);
      for (const [name, value] of Object.entries(extra || {})) params.set(name, value);
      return params.toString();
    },

    filtered() {
      const f = this.filters;
      return Boolean(f.q || f.status || f.model || f.meta || f.origin);
    },

    /** The first page again, dropping what was loaded (the filters changed). */
    async reload() {
      this.generation += 1;
      const generation = this.generation;
      const page = await this.fetch({});
      if (!page || generation !== this.generation) return;
      this.items = page.items;
      this.cursor = page.next_cursor;
      this.draw(true);
    },

    /** The first page again, merged with what is loaded (new tasks on top, statuses fresh). */
    async refresh() {
      const generation = this.generation;
      const page = await this.fetch({});
      if (!page || generation !== this.generation) return;
      const byId = new Map(this.items.map((t) => [t.id, t]));
      for (const task of page.items) byId.set(task.id, task);
      this.items = [...byId.values()].sort((a, b) =>
        a.created_at === b.created_at ? (a.id < b.id ? 1 : -1) : a.created_at < b.created_at ? 1 : -1,
      );
      if (this.items.length <= PAGE) this.cursor = page.next_cursor;
      this.draw(false);
    },

    async more() {
      if (!this.cursor) return;
      const generation = this.generation;
      this.moreButton.disabled = true;
      const page = await this.fetch({ cursor: this.cursor });
      this.moreButton.disabled = false;
      if (!page || generation !== this.generation) return;
      const known = new Set(this.items.map((t) => t.id));
      this.items = [...this.items, ...page.items.filter((t) => !known.has(t.id))];
      this.cursor = page.next_cursor;
      this.draw(true);
    },

    async fetch(extra) {
      try {
        const page = await apiJson(`/v1/tasks?${this.apiQuery(extra)}`);
        if (this.error) {
          this.error = null;
          this.note();
        }
        return page;
      } catch (error) {
        this.error = error;
        if (error.status === 401) {
          // Refused: what the previous key listed is not this visitor's to see.
          this.items = [];
          this.cursor = null;
          this.selected = [];
          this.draw(true);
        }
        this.note();
        return null;
      }
    },

    /** Why the list is empty or stale: the API's error (with its details), or no match. */
    note() {
      const note = $("#task-list-note");
      if (this.error) {
        note.replaceChildren(S.errorView ? S.errorView(this.error, "Could not load tasks") : `Could not load tasks: ${this.error.message}`);
      } else if (this.filters.meta && !metadataParam(this.filters.meta)) {
        note.textContent = "The metadata filter is not applied: write it as key=value.";
      } else if (!this.items.length) {
        note.textContent = this.filtered() ? "No task matches these filters." : "No tasks yet.";
      } else {
        note.replaceChildren();
      }
    },

    draw(force) {
      const current = S.currentTaskId ? S.currentTaskId() : null;
      const signature = JSON.stringify([
        current,
        this.selected,
        this.items.map((t) => [t.id, t.status, t.usage.steps, t.finished_at]),
      ]);
      if (!force && signature === this.signature) {
        this.updateTimes();
        return;
      }
      this.signature = signature;
      $("#task-list").replaceChildren(...this.items.map((task) => this.row(task, current)));
      this.note();
      show(this.moreButton, Boolean(this.cursor));
      this.compareButton.disabled = this.selected.length !== 2;
    },

    row(task, current) {
      const ms = durationMs(task);
      const picked = this.selected.includes(task.id);
      const box = el("input", {
        type: "checkbox",
        class: "tl-pick",
        "aria-label": `Select ${task.id} to compare`,
        checked: picked,
        onchange: (event) => this.pick(task.id, event.target.checked),
      });
      return el(
        "li",
        { class: task.id === current ? "active" : "", "data-id": task.id, "data-status": task.status },
        box,
        el(
          "a",
          { href: `#/tasks/${encodeURIComponent(task.id)}`, title: task.prompt },
          el("span", { class: `dot ${task.status}`, title: task.status }),
          el("span", { class: "task-prompt", text: task.prompt.split("\n")[0] }),
          el("span", { class: "task-when", "data-created": task.created_at, text: formatAgo(task.created_at) }),
          el(
            "span",
            { class: "task-cols" },
            experimentLabel(task),
            el("span", { class: `tl-status ${task.status}`, text: task.status }),
            el("span", { class: "tl-duration", "data-started": task.started_at || "", "data-finished": task.finished_at || "", text: ms == null ? "—" : formatMs(ms) }),
            el("span", { class: "tl-steps", text: `${task.usage.steps} step${task.usage.steps === 1 ? "" : "s"}` }),
            el("span", { class: "tl-model", text: task.llm.model }),
            el("code", { class: "tl-id", title: task.id, text: shortId(task.id) }),
          ),
        ),
      );
    },

    pick(id, on) {
      this.selected = this.selected.filter((x) => x !== id);
      if (on) this.selected.push(id);
      if (this.selected.length > 2) this.selected = this.selected.slice(-2); // the two last ticked
      this.draw(true);
    },

    updateTimes() {
      for (const node of document.querySelectorAll(".task-when[data-created]")) {
        node.textContent = formatAgo(node.dataset.created);
      }
      for (const node of document.querySelectorAll(".tl-duration[data-started]")) {
        if (!node.dataset.started || node.dataset.finished) continue;
        node.textContent = formatMs(Math.max(0, Date.now() - Date.parse(node.dataset.started)));
      }
    },
  };

  S.taskList = taskList;
})();
