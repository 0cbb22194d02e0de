// The Sandboxes view of Sandhive's page: the tenant's sandboxes (GET /v1/sandboxes, newest
// first, "Load more" through the cursor), and one sandbox with its command log
// (GET /v1/sandboxes/{id}/commands), followed while it runs. Plain JavaScript on the public
// /v1 API like app.js, whose helpers it borrows (window.Sandhive). Commands, labels, users
// and paths are hostile: every value from the API is inserted as text (el() / textContent),
// never as HTML, and characters that would hide or reorder text are shown as their codes.
"use strict";

(() => {
  const S = window.Sandhive;
  const { el, show, apiJson, conn, formatAgo, formatBytes, formatMs } = S;
  const PAGE = 30; // the list's first page; "Load more" for the next ones
  const MAX_PAGE = 100; // the API's largest page
  const LIST_POLL_MS = 3000; // while a listed sandbox runs
  const IDLE_POLL_MS = 15000; // none runs: new ones still show up
  const LOG_POLL_MS = 2000;
  const LOG_PAGE = 200; // the API's largest page of a command log
  const LOG_PAGES_PER_TICK = 10; // a long log is read a few pages a tick, never all at once
  const COMMAND_CHARS = 4000; // longer commands are cut, with "show all"
  const number = new Intl.NumberFormat();
  const enc = encodeURIComponent;
  const root = () => document.querySelector("#sandboxes");

  // ------------------------------------------------------------------ small helpers

  const live = (box) => box.status !== "ended";

  /** Control characters (C0, C1), zero-width and separator characters and bidirectional
   * overrides shown as codes, so text cannot hide or reorder what was run; newlines and
   * tabs stay. */
  function visible(text) {
    return String(text)
      .replace(/[\u0000-\u0008\u000b-\u001f\u007f]/g, (c) => (c === "\u007f" ? "\u2421" : String.fromCharCode(0x2400 + c.charCodeAt(0))))
      .replace(/[\u0080-\u009f\u061c\u200b-\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]/g, (c) => `[U+${c.charCodeAt(0).toString(16).toUpperCase().padStart(4, "0")}]`);
  }

  /** One argv word as a POSIX shell would need it written (Python's shlex.quote). */
  function shellQuote(word) {
    if (word === "") return "''";
    if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(word)) return word;
    return `'${word.replace(/'/g, `'"'"'`)}'`;
  }

  function commandText(entry) {
    return entry.argv ? entry.argv.map(shellQuote).join(" ") : entry.command || "";
  }

  function formatIn(iso) {
    const seconds = Math.round((Date.parse(iso) - Date.now()) / 1000);
    if (seconds <= 0) return "due now";
    if (seconds < 60) return `in ${seconds} s`;
    if (seconds < 3600) return `in ${Math.floor(seconds / 60)} min`;
    return `in ${Math.floor(seconds / 3600)} h ${Math.floor((seconds % 3600) / 60)} min`;
  }

  const fullTime = (iso) => new Date(iso).toLocaleString();

  /** "in 4 min" until it expires, "3 min ago" once ended; kept current by `tickTimes`. */
  function when(box) {
    if (box.ended_at) return el("span", { "data-ended": box.ended_at, title: `ended ${fullTime(box.ended_at)}`, text: formatAgo(box.ended_at) });
    return el("span", { "data-expires": box.expires_at, title: `expires ${fullTime(box.expires_at)}`, text: formatIn(box.expires_at) });
  }

  function tickTimes(node) {
    for (const span of node.querySelectorAll("[data-expires]")) span.textContent = formatIn(span.dataset.expires);
    for (const span of node.querySelectorAll("[data-ended]")) span.textContent = formatAgo(span.dataset.ended);
  }

  function statusBadge(box, id) {
    const text = box.end_reason ? `${box.status} · ${box.end_reason}` : box.status;
    return el("span", { id, class: `badge ${box.status.replace(/[^a-z]/g, "")}`, "data-reason": box.end_reason, text });
  }

  function resources(box) {
    return `${box.cpus} CPU · ${formatBytes(box.memory_mb * 1024 * 1024)}`;
  }

  function labels(metadata) {
    const pairs = Object.entries(metadata || {});
    if (!pairs.length) return el("span", { class: "hint", text: "—" });
    return el(
      "span",
      { class: "sbx-labels" },
      pairs.map(([key, value]) => {
        const text = visible(`${key}=${value}`);
        return el("span", { class: "sbx-label", title: text, text });
      }),
    );
  }

  /** Replace a node's children, leaving out the null ones (optional parts). */
  function fill(node, ...children) {
    node.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
  }

  function problem(error, prefix) {
    return el("div", { class: "error", role: "alert" }, S.errorView ? S.errorView(error, prefix) : `${prefix}: ${error.message}`);
  }

  function table(caption, headers, body, className) {
    return el(
      "div",
      { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption },
      el(
        "table",
        { class: `exp-table ${className}` },
        el("caption", { class: "visually-hidden", text: caption }),
        el("thead", {}, el("tr", {}, headers.map((h) => el("th", { scope: "col", text: h })))),
        body,
      ),
    );
  }

  const newestFirst = (a, b) => (a.created_at === b.created_at ? (a.id < b.id ? 1 : -1) : a.created_at < b.created_at ? 1 : -1);

  // ------------------------------------------------------------------ the list

  class ListView {
    constructor() {
      this.items = [];
      this.cursor = null;
      this.stopped = false;
      this.busy = false;
      this.timer = null;
      this.signature = "";
      this.failed = false; // the last request was refused: no "No sandboxes yet"
      this.generation = 0; // a new key starts a new one: older answers are dropped
    }

    start() {
      this.errorNode = el("div", { id: "sbx-list-error" });
      this.body = el("div", { class: "sbx-list-body" });
      this.note = el("p", { class: "hint", id: "sbx-list-note", "aria-live": "polite" });
      this.more = el("button", { type: "button", id: "sbx-load-more", class: "ghost small load-more", hidden: true, text: "Load more", onclick: () => this.loadMore() });
      root().replaceChildren(
        el(
          "section",
          { class: "card sbx-list" },
          el("h1", { class: "exp-title", text: "Sandboxes" }),
          el("p", { class: "hint", text: "Sandboxes driven through the API (/v1/sandboxes), newest first; open one for its command log." }),
          this.errorNode,
          this.body,
          this.more,
          this.note,
        ),
      );
      conn.set("idle", "");
      this.onVisible = () => {
        if (!document.hidden) this.poll();
      };
      document.addEventListener("visibilitychange", this.onVisible);
      this.clock = setInterval(() => tickTimes(this.body), 1000);
      this.poll();
    }

    stop() {
      this.stopped = true;
      clearTimeout(this.timer);
      clearInterval(this.clock);
      document.removeEventListener("visibilitychange", this.onVisible);
    }

    /** Another key: another tenant's list, from scratch. */
    refresh() {
      this.generation += 1;
      this.items = [];
      this.cursor = null;
      this.busy = false;
      this.more.disabled = false;
      this.draw();
      this.poll();
    }

    /** The loaded rows again (up to the API's largest page), new ones on top. */
    async poll() {
      clearTimeout(this.timer);
      if (this.busy || this.stopped) return;
      this.busy = true;
      const generation = this.generation;
      const limit = Math.min(MAX_PAGE, Math.max(PAGE, this.items.length));
      const page = await this.fetch(null, limit);
      if (this.stopped || generation !== this.generation) return;
      this.busy = false;
      if (page) {
        const byId = new Map(this.items.map((box) => [box.id, box]));
        for (const box of page.items) byId.set(box.id, box);
        this.items = [...byId.values()].sort(newestFirst);
        if (this.items.length <= limit) this.cursor = page.next_cursor;
        this.draw();
      }
      const wait = this.items.some(live) ? LIST_POLL_MS : IDLE_POLL_MS;
      this.timer = setTimeout(() => (document.hidden ? null : this.poll()), wait);
    }

    async loadMore() {
      if (!this.cursor || this.busy) return;
      this.busy = true;
      this.more.disabled = true;
      const generation = this.generation;
      const page = await this.fetch(this.cursor, PAGE);
      if (this.stopped || generation !== this.generation) return;
      this.busy = false;
      this.more.disabled = false;
      if (!page) return;
      const known = new Set(this.items.map((box) => box.id));
      this.items = [...this.items, ...page.items.filter((box) => !known.has(box.id))];
      this.cursor = page.next_cursor;
      this.draw();
      this.poll(); // a poll that came while this loaded returned early: keep the list fresh
    }

    async fetch(cursor, limit) {
      const params = new URLSearchParams({ limit: String(limit) });
      if (cursor) params.set("cursor", cursor);
      try {
        const page = await apiJson(`/v1/sandboxes?${params}`);
        this.failed = false;
        this.errorNode.replaceChildren();
        return page;
      } catch (error) {
        if (this.stopped) return null;
        this.failed = true;
        if (error.status === 401) {
          // Refused: what the previous key listed is not this visitor's to see.
          this.items = [];
          this.cursor = null;
          this.draw();
        }
        this.errorNode.replaceChildren(problem(error, "Could not list sandboxes"));
        return null;
      }
    }

    draw() {
      const signature = JSON.stringify(this.items);
      show(this.more, Boolean(this.cursor));
      this.note.textContent = this.items.length || this.failed ? "" : "No sandboxes yet: POST /v1/sandboxes makes one (docs/sandboxes.md).";
      if (signature === this.signature) return;
      this.signature = signature;
      this.body.replaceChildren(
        this.items.length
          ? table(
              "Sandboxes",
              ["Sandbox", "Status", "Image", "CPU / memory", "Labels", "Commands", "Expires / ended"],
              el("tbody", {}, this.items.map((box) => this.row(box))),
              "sbx-table",
            )
          : "",
      );
    }

    row(box) {
      return el(
        "tr",
        { "data-id": box.id, "data-status": box.status },
        el("td", { "data-field": "id" }, el("a", { href: `#/sandboxes/${enc(box.id)}`, class: "sbx-id" }, el("code", { text: box.id }))),
        el("td", { "data-field": "status" }, statusBadge(box)),
        el("td", { "data-field": "image", text: visible(box.image) }),
        el("td", { "data-field": "resources", class: "sbx-nowrap", text: resources(box) }),
        el("td", { "data-field": "metadata" }, labels(box.metadata)),
        el("td", { "data-field": "commands", text: number.format(box.commands) }),
        el("td", { "data-field": "when", class: "sbx-nowrap" }, when(box)),
      );
    }
  }

  // ------------------------------------------------------------------ one sandbox

  class SandboxView {
    constructor(id) {
      this.id = id;
      this.box = null;
      this.lastSeq = 0; // the command log's last `seq` shown
      this.bySeq = new Map(); // seq -> its row
      this.unfinished = new Set(); // seqs shown before they ended: asked again until they do
      this.stopped = false;
      this.busy = false;
      this.timer = null;
      this.headSeen = "";
    }

    start() {
      this.head = el("header", { class: "card exp-head sbx-head" }, this.back(), el("code", { class: "task-id", text: this.id }));
      this.errorNode = el("div", { id: "sbx-error" });
      this.rows = el("tbody");
      this.logTitle = el("h2", { id: "sbx-log-title", text: "Commands" });
      this.logNote = el("p", { class: "hint", id: "sbx-log-note" });
      root().replaceChildren(
        el(
          "article",
          { class: "exp sbx", "data-id": this.id },
          this.head,
          this.errorNode,
          el(
            "section",
            { class: "card sbx-log", "aria-labelledby": "sbx-log-title" },
            this.logTitle,
            table("Command log", ["#", "Started", "Command", "User", "Directory", "Exit", "Took", "Key"], this.rows, "sbx-commands"),
            this.logNote,
          ),
        ),
      );
      conn.set("connecting", "loading…");
      this.onVisible = () => {
        if (!document.hidden) this.tick();
      };
      document.addEventListener("visibilitychange", this.onVisible);
      this.clock = setInterval(() => tickTimes(this.head), 1000);
      this.tick();
    }

    stop() {
      this.stopped = true;
      clearTimeout(this.timer);
      clearInterval(this.clock);
      document.removeEventListener("visibilitychange", this.onVisible);
    }

    refresh() {
      this.tick();
    }

    back() {
      return el("a", { class: "exp-back", href: "#/sandboxes", text: "← All sandboxes" });
    }

    /** The sandbox, then the commands after the last one shown; again in 2 s until it ended
     * and its whole log is shown. */
    async tick() {
      if (this.stopped || this.busy) return;
      clearTimeout(this.timer);
      if (document.hidden && this.box) {
        this.timer = setTimeout(() => this.tick(), LOG_POLL_MS);
        return;
      }
      this.busy = true;
      let again = true;
      try {
        const box = await apiJson(`/v1/sandboxes/${enc(this.id)}`);
        if (this.stopped) return;
        this.box = box;
        this.errorNode.replaceChildren();
        this.renderHead(box);
        await this.follow();
        if (this.stopped) return;
        if (!live(box) && this.lastSeq >= box.commands) {
          again = false;
          conn.set("done", "ended");
        } else {
          conn.set("polling", "updating every 2 s");
        }
      } catch (error) {
        if (this.stopped) return;
        if (error.status === 404) {
          again = false;
          conn.set("error", "not found");
          this.errorNode.replaceChildren(problem(new Error("There is no such sandbox (or it is not yours)."), "Not found"));
          return;
        }
        conn.set("error", "retrying");
        this.errorNode.replaceChildren(problem(error, "Could not load the sandbox"));
      } finally {
        this.busy = false;
        if (again && !this.stopped) this.timer = setTimeout(() => this.tick(), LOG_POLL_MS);
      }
    }

    /** Appends the commands after the last one shown, and redraws only the rows of commands
     * that were still running when shown (a command enters the log as it is sent): the
     * cursor starts before the first of those, else after the last seq seen. */
    async follow() {
      let cursor = this.unfinished.size ? Math.min(...this.unfinished) - 1 : this.lastSeq;
      for (let pages = 0; pages < LOG_PAGES_PER_TICK; pages += 1) {
        const params = new URLSearchParams({ limit: String(LOG_PAGE) });
        if (cursor) params.set("cursor", String(cursor));
        const page = await apiJson(`/v1/sandboxes/${enc(this.id)}/commands?${params}`);
        if (this.stopped) return;
        for (const entry of page.items) this.place(entry);
        if (page.items.length) cursor = page.items[page.items.length - 1].seq;
        if (!page.next_cursor) break;
      }
      const shown = this.rows.childElementCount;
      this.logTitle.textContent = `Commands (${number.format(shown)})`;
      this.logNote.textContent = shown
        ? "In the order they were sent (each shows as it is sent, its exit code once it ends); their output is the caller's, not kept."
        : live(this.box)
          ? "No command yet: POST /v1/sandboxes/{id}/exec runs one, and it shows here as it is sent."
          : "No command was run in it.";
    }

    /** A new command appended; a running one's row replaced once it changed. */
    place(entry) {
      const shown = this.bySeq.get(entry.seq);
      const ended = entry.duration_ms !== null || entry.timed_out;
      if (!shown) {
        const row = this.row(entry);
        this.rows.append(row);
        this.bySeq.set(entry.seq, row);
        this.lastSeq = Math.max(this.lastSeq, entry.seq);
      } else if (this.unfinished.has(entry.seq) && ended) {
        const row = this.row(entry);
        shown.replaceWith(row);
        this.bySeq.set(entry.seq, row);
      }
      if (ended) this.unfinished.delete(entry.seq);
      else this.unfinished.add(entry.seq);
    }

    row(entry) {
      const exit = entry.timed_out
        ? el("span", { class: "exit bad", text: "timed out" })
        : entry.duration_ms === null
          ? el("span", { class: "hint", text: "running (or its answer was lost)" })
          : entry.exit_code === null
          ? el("span", { class: "hint", text: "—" })
          : el("span", { class: `exit ${entry.exit_code === 0 ? "ok" : "bad"}`, text: String(entry.exit_code) });
      const workdir = this.box ? this.box.workdir : "";
      return el(
        "tr",
        { "data-seq": String(entry.seq), "data-id": entry.id },
        el("td", { "data-field": "seq", text: String(entry.seq) }),
        el("td", { "data-field": "started", class: "sbx-nowrap", title: fullTime(entry.started_at), text: new Date(entry.started_at).toLocaleTimeString() }),
        el("td", { "data-field": "command", class: "sbx-command" }, this.command(entry)),
        el("td", { "data-field": "user" }, entry.user === null ? el("span", { class: "hint", text: "root" }) : visible(entry.user)),
        el("td", { "data-field": "cwd" }, entry.cwd === null ? el("span", { class: "hint", text: visible(workdir) }) : el("code", { text: visible(entry.cwd) })),
        el("td", { "data-field": "exit" }, exit),
        el("td", { "data-field": "duration", class: "sbx-nowrap", text: formatMs(entry.duration_ms) }),
        el("td", { "data-field": "key" }, entry.key_id === null ? el("span", { class: "hint", text: "—" }) : el("code", { text: visible(entry.key_id) })),
      );
    }

    /** The argv shell-quoted, or the shell line as given; a very long one cut, "show all". */
    command(entry) {
      const text = visible(commandText(entry));
      const kind = entry.argv ? "argv" : "shell";
      const title = entry.argv ? "an argv, run as it is (shown shell-quoted)" : "a line run by /bin/sh -c";
      const code = el("code", { "data-kind": kind, title, text: text.length > COMMAND_CHARS ? `${text.slice(0, COMMAND_CHARS)}…` : text });
      if (text.length <= COMMAND_CHARS) return code;
      const all = el("button", {
        type: "button",
        class: "ghost small",
        text: `show all ${number.format(text.length)} characters`,
        onclick: () => {
          code.textContent = text;
          all.remove();
        },
      });
      return [code, all];
    }

    renderHead(box) {
      const signature = JSON.stringify(box);
      if (signature === this.headSeen) return;
      this.headSeen = signature;
      const mib = (n) => formatBytes(n * 1024 * 1024);
      const facts = [
        ["image", visible(box.image)],
        ["cpus", String(box.cpus)],
        ["memory", mib(box.memory_mb)],
        ["disk", mib(box.disk_mb)],
        ["network", box.allow_domains.length ? `${box.network}: ${box.allow_domains.map(visible).join(", ")}` : box.network],
        ["workdir", visible(box.workdir)],
        ["image files", box.read_only_rootfs ? "read-only" : "writable"],
        ["created", fullTime(box.created_at)],
        ["commands", number.format(box.commands)],
      ];
      const until = box.ended_at
        ? ["ended", el("span", {}, `${fullTime(box.ended_at)} (`, when(box), ")")]
        : ["expires", el("span", {}, when(box), ` (${fullTime(box.expires_at)})`)];
      fill(
        this.head,
        this.back(),
        el("div", { class: "row" }, statusBadge(box, "sbx-status"), el("h1", { class: "exp-title" }, el("code", { id: "sbx-id", text: box.id }))),
        el(
          "dl",
          { class: "meta", id: "sbx-facts" },
          [...facts.slice(0, 8), until, facts[8]].map(([name, value]) => el("div", { "data-field": name }, el("dt", { text: name }), el("dd", {}, value))),
        ),
        el("div", { class: "row sbx-head-labels" }, el("span", { class: "hint", text: "labels" }), labels(box.metadata)),
        box.error ? el("p", { class: "error", id: "sbx-why", text: visible(box.error) }) : null,
      );
    }
  }

  // ------------------------------------------------------------------ routing (called by app.js's router)

  const ROUTE = /^#\/sandboxes(?:\/([A-Za-z0-9_-]+))?\/?$/;

  S.sandboxes = {
    view: null,
    hash: null,
    claims(hash) {
      return /^#\/sandboxes(\/|$)/.test(hash);
    },
    /** The hash when it is this view's, else null (another view's turn). */
    route(hash) {
      if (hash === this.hash) return;
      this.hash = hash;
      if (this.view) this.view.stop();
      this.view = null;
      if (!hash) return;
      const match = hash.match(ROUTE);
      this.view = match && match[1] ? new SandboxView(match[1]) : new ListView();
      this.view.start();
      window.scrollTo(0, 0);
    },
    refresh() {
      if (this.view) this.view.refresh();
    },
  };
})();
