// The task view's Files panel: while a task runs, browse its sandbox (GET /v1/tasks/ID/files)
// and show a text file inline. app.js calls attach(view) when it opens a task and status(s)
// on every status change; the panel shows only while the task runs. Names and contents come
// from the hostile sandbox: always inserted as text, never as HTML.
"use strict";

(() => {
  const S = window.Sandhive;
  if (!S) return;
  const { el, show, api, apiJson, formatBytes } = S;
  const VIEW_MAX_BYTES = 256 * 1024; // larger files are offered as a download only

  class FilesPanel {
    constructor(view) {
      this.view = view;
      this.dir = "";
      this.running = false;
      this.list = el("ul", { id: "files-list", class: "files-list" });
      this.where = el("code", { id: "files-path" });
      this.note = el("p", { id: "files-note", class: "files-note", hidden: true });
      this.text = el("pre", { id: "files-view", class: "files-view", hidden: true });
      const refresh = el("button", { class: "ghost", type: "button", text: "Refresh", onclick: () => this.load() });
      this.root = el(
        "details",
        { id: "files", class: "card files", open: true, hidden: true },
        el("summary", { text: "Files (the running sandbox)" }),
        el("div", { class: "row spread" }, this.where, refresh),
        this.note,
        this.list,
        this.text,
      );
      const old = document.getElementById("files");
      if (old) old.remove();
      const artifacts = document.getElementById("artifacts");
      artifacts.parentNode.insertBefore(this.root, artifacts);
    }

    base() {
      return `/v1/tasks/${encodeURIComponent(this.view.id)}/files`;
    }

    status(status) {
      // Running as the task itself was last read, not only as an event says: opening a
      // finished task replays its `task.started`, and its sandbox is long gone.
      const read = this.view.task;
      const running = status === "running" && (!read || read.status === "running");
      show(this.root, running);
      if (running && !this.running) this.load();
      this.running = running;
    }

    async load(dir = this.dir) {
      this.dir = dir;
      this.where.textContent = dir ? `/testbed/${dir}` : "/testbed";
      try {
        const listing = await apiJson(`${this.base()}?path=${encodeURIComponent(dir)}`);
        this.where.textContent = listing.path;
        this.say(listing.truncated ? "Only the first entries are listed." : "");
        this.render(listing.entries);
      } catch (error) {
        this.fail(error);
      }
    }

    render(entries) {
      const items = [];
      if (this.dir) {
        const up = this.dir.split("/").slice(0, -1).join("/");
        items.push(el("li", {}, el("button", { class: "link", type: "button", text: "..", onclick: () => this.load(up) })));
      }
      for (const entry of entries) {
        const path = this.dir ? `${this.dir}/${entry.name}` : entry.name;
        const label = entry.type === "dir" ? `${entry.name}/` : entry.name;
        const open = entry.type === "dir" ? () => this.load(path) : entry.type === "file" ? () => this.open(path, entry.size) : null;
        const name = open ? el("button", { class: "link", type: "button", text: label, onclick: open }) : el("span", { text: `${label} (${entry.type})` });
        items.push(el("li", { "data-name": entry.name }, name, el("span", { class: "muted", text: entry.type === "file" ? ` ${formatBytes(entry.size)}` : "" })));
      }
      this.list.replaceChildren(...items);
    }

    async open(path, size) {
      if (size > VIEW_MAX_BYTES) {
        this.say(`${path} is ${formatBytes(size)}: too large to show here.`);
        return;
      }
      try {
        const response = await api(`${this.base()}/${path.split("/").map(encodeURIComponent).join("/")}`);
        const bytes = new Uint8Array(await response.arrayBuffer());
        this.text.textContent = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
        this.text.dataset.path = path;
        show(this.text, true);
        this.say("");
      } catch (error) {
        this.fail(error);
      }
    }

    fail(error) {
      if (error.status === 409) {
        this.say("The task has ended: its files are in Artifacts below.");
        this.list.replaceChildren();
        show(this.text, false);
        return;
      }
      this.say(error.message || String(error));
    }

    say(message) {
      this.note.textContent = message;
      show(this.note, Boolean(message));
    }

    stop() {
      this.root.remove();
    }
  }

  S.taskFiles = {
    attach(view) {
      return new FilesPanel(view);
    },
  };
})();
