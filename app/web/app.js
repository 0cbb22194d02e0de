// Sandhive's browser page: submit a task, watch its trajectory live, browse its artifacts.
// Plain JavaScript, no build step; it uses only the public /v1 API. Everything that
// comes from a task (prompt, model text, commands, output, file names) is inserted
// as text (textContent / text nodes), never as HTML.
"use strict";

(() => {
  const KEY_STORAGE = "sandhive.apiKey";
  const LIST_POLL_MS = 3000;
  const SILENCE_MS = 45000; // the server sends a keepalive every 15 s
  const MAX_RETRY_MS = 10000;
  const PREVIEW_MAX_BYTES = 4 * 1024 * 1024;
  const TEXT_PREVIEW_MAX_BYTES = 512 * 1024;
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const TEXT_EXTENSIONS = new Set([
    "txt", "md", "csv", "tsv", "json", "jsonl", "py", "js", "ts", "sh", "c", "h", "cpp", "rs",
    "go", "java", "rb", "r", "tex", "yaml", "yml", "toml", "ini", "cfg", "log", "xml", "sql",
    "css", "ipynb", "out", "err", "diff", "patch",
  ]);

  // ------------------------------------------------------------------ small helpers

  const $ = (selector) => document.querySelector(selector);

  /** Build an element; string children become text nodes (never parsed as HTML). */
  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") node.className = value;
      else if (name === "text") node.textContent = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === undefined || child === null || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  function show(node, visible) {
    node.hidden = !visible;
  }

  function formatBytes(bytes) {
    if (bytes < 1024) return `${bytes} B`;
    const units = ["KiB", "MiB", "GiB"];
    let value = bytes;
    let unit = -1;
    do {
      value /= 1024;
      unit += 1;
    } while (value >= 1024 && unit < units.length - 1);
    return `${value < 10 ? value.toFixed(1) : Math.round(value)} ${units[unit]}`;
  }

  function formatMs(ms) {
    if (ms == null) return "";
    if (ms < 1000) return `${ms} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
    const minutes = Math.floor(ms / 60000);
    return `${minutes} min ${Math.round((ms % 60000) / 1000)} s`;
  }

  function formatAgo(iso) {
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (seconds < 60) return `${seconds} s ago`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
    return new Date(iso).toLocaleDateString();
  }

  function formatTime(iso) {
    return iso ? new Date(iso).toLocaleTimeString() : "";
  }

  const number = new Intl.NumberFormat();

  function basename(path) {
    return path.split("/").pop() || path;
  }

  function extension(path) {
    const name = basename(path);
    return name.includes(".") ? name.split(".").pop().toLowerCase() : "";
  }

  // ------------------------------------------------------------------ the API

  const auth = {
    key: localStorage.getItem(KEY_STORAGE) || "",
    headers() {
      return this.key ? { Authorization: `Bearer ${this.key}` } : {};
    },
  };

  class ApiError extends Error {
    constructor(status, message, details) {
      super(message);
      this.status = status;
      this.details = Array.isArray(details) ? details : []; // the error body's {loc, msg}s
    }
  }

  async function api(path, options = {}) {
    let response;
    try {
      response = await fetch(path, { ...options, headers: { ...auth.headers(), ...(options.headers || {}) } });
    } catch (error) {
      throw new ApiError(0, "the server cannot be reached");
    }
    if (!response.ok) {
      let message = `${response.status} ${response.statusText}`;
      let details = [];
      try {
        const body = await response.json();
        if (body && body.error && body.error.message) message = body.error.message;
        if (body && body.error && Array.isArray(body.error.details)) details = body.error.details;
      } catch (ignored) {
        // not JSON: keep the status line
      }
      if (response.status === 401) keyPanel.refused();
      throw new ApiError(response.status, message, details);
    }
    return response;
  }

  async function apiJson(path, options) {
    return (await api(path, options)).json();
  }

  function streamUrl(taskId, after) {
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const token = auth.key ? `&token=${encodeURIComponent(auth.key)}` : "";
    return `${scheme}://${location.host}/v1/tasks/${encodeURIComponent(taskId)}/stream?after=${after}${token}`;
  }

  // ------------------------------------------------------------------ connection badge

  const conn = {
    set(state, text) {
      const node = $("#conn");
      node.dataset.state = state;
      node.textContent = text;
    },
  };

  // ------------------------------------------------------------------ API key panel

  const keyPanel = {
    rejected: false, // the server answered 401 to the key it holds
    init() {
      $("#key-toggle").addEventListener("click", () => (this.isOpen() ? this.close() : this.open()));
      $("#key-panel").addEventListener("submit", (event) => {
        event.preventDefault();
        this.save($("#key-input").value.trim());
      });
      $("#key-clear").addEventListener("click", () => this.save(""));
      this.label();
    },
    isOpen() {
      return !$("#key-panel").hidden;
    },
    open(note) {
      if (!this.isOpen()) $("#key-input").value = auth.key; // never clobber what is being typed
      show($("#key-panel"), true);
      $("#key-toggle").setAttribute("aria-expanded", "true");
      const noteNode = $("#key-note");
      noteNode.textContent = note || "";
      show(noteNode, Boolean(note));
    },
    close() {
      show($("#key-panel"), false);
      $("#key-toggle").setAttribute("aria-expanded", "false");
    },
    /** A 401: a key the server does not take is not "✓"; without one, ask for one. */
    refused() {
      this.rejected = Boolean(auth.key);
      this.label();
      this.open(auth.key ? "The server refused this API key (401): enter another." : "This server wants an API key.");
    },
    save(key) {
      auth.key = key;
      this.rejected = false;
      if (key) localStorage.setItem(KEY_STORAGE, key);
      else localStorage.removeItem(KEY_STORAGE);
      this.label();
      this.close();
      taskList.refresh();
      profiles.refresh();
      limits.refresh();
      if (router.view) router.view.reconnectNow();
      for (const name of OTHER_VIEWS) if (window.Sandhive[name]) window.Sandhive[name].refresh();
    },
    label() {
      $("#key-toggle").textContent = !auth.key ? "API key" : this.rejected ? "API key ✗ refused" : "API key ✓";
    },
    placeholder(required) {
      $("#key-input").placeholder = required
        ? "the key printed by sandhive keys create"
        : "not needed: auth is disabled on this server";
    },
  };

  // ------------------------------------------------------------------ LLM profiles (the form's picker)

  const profiles = {
    list: [],
    async refresh() {
      let body;
      try {
        body = await apiJson("/v1/llm/profiles");
      } catch (error) {
        if (error.status === 401) keyPanel.placeholder(true);
        return;
      }
      if (!auth.key) keyPanel.placeholder(false); // answered without a key: auth is disabled
      this.list = body.profiles;
      this.render(body.notice);
    },
    render(notice) {
      const select = $("#task-form").elements.profile;
      const chosen = select.value;
      select.replaceChildren(
        ...this.list.map((p) =>
          el("option", { value: p.name, text: p.scripted ? `${p.name} (scripted demo, not a real model)` : `${p.name} (${p.kind})` }),
        ),
      );
      if (this.list.some((p) => p.name === chosen)) select.value = chosen;
      const node = $("#model-notice");
      node.textContent = this.list.length ? notice || "" : "No model configured: set SANDHIVE_LLM_BASE_URL and SANDHIVE_LLM_MODEL, or SANDHIVE_SCRIPTED_PROFILE=true for the scripted demo profile, then restart the service.";
      show(node, Boolean(node.textContent));
      this.picked();
    },
    picked() {
      const form = $("#task-form");
      const profile = this.list.find((p) => p.name === form.elements.profile.value);
      const models = profile ? [...new Set([profile.model, ...profile.models].filter(Boolean))] : [];
      $("#profile-models").replaceChildren(...models.map((m) => el("option", { value: m })));
      form.elements.model.placeholder = profile && profile.model ? `${profile.model} (profile default)` : "profile default";
    },
  };

  // ------------------------------------------------------------------ the task list (task_list.js)

  const taskList = {
    lastRendered: "", // kept for the router; task_list.js redraws when the open task changes
    init() {
      if (window.Sandhive.taskList) window.Sandhive.taskList.init();
    },
    refresh() {
      if (window.Sandhive.taskList) window.Sandhive.taskList.refresh();
    },
  };

  // ------------------------------------------------------------------ observations as the package's console shows them

  /**
   * The package prints its observation markers through rich, where `\[` is the escape of a
   * literal `[`: the stored text keeps `Execution output of \[execute_bash]:` byte for byte,
   * the page shows `[execute_bash]` as the package's console does. Only the markers the
   * package writes change; a command's own output is shown as it was.
   */
  function consoleText(text) {
    return String(text)
      .replace(/^((?:Exit code: -?\d+\n)?Execution output of )\\\[([A-Za-z_]+)\]:/, "$1[$2]:")
      .replace(/^\\\[(STDOUT|STDERR)\]$/gm, "[$1]");
  }

  // ------------------------------------------------------------------ errors as the API words them

  /** "N bytes" in a server message, as KiB/MiB. */
  function humanSizes(text) {
    return String(text).replace(/\b(\d{4,}) bytes\b/g, (_all, n) => formatBytes(Number(n)));
  }

  /** An error's message, then each of its details with where it is (`limits.max_steps: …`). */
  function errorView(error, prefix) {
    const details = (error.details || []).filter((d) => d && typeof d === "object" && d.msg);
    const where = (d) => (Array.isArray(d.loc) ? d.loc.filter((p, i) => !(i === 0 && ["body", "query", "path"].includes(p))).join(".") : "");
    const view = el("span", { class: "api-error" }, el("span", { class: "api-error-message", text: `${prefix}: ${humanSizes(error.message)}` }));
    if (details.length > 1 || (details.length === 1 && !error.message.includes(details[0].msg))) {
      view.append(
        el(
          "ul",
          { class: "api-error-details" },
          ...details.slice(0, 20).map((d) => el("li", {}, where(d) ? el("code", { text: where(d) }) : null, where(d) ? ": " : "", humanSizes(d.msg))),
        ),
      );
    }
    return view;
  }

  // ------------------------------------------------------------------ the server's submission limits (GET /v1/limits)

  const limits = {
    value: null,
    async refresh() {
      try {
        this.value = await apiJson("/v1/limits");
      } catch (ignored) {
        this.value = null; // the server then checks alone, as it always does
      }
    },
    /** Why these files would be refused, before sending them; null when they fit. */
    problem(files) {
      const l = this.value;
      if (!l || !files.length) return null;
      if (files.length > l.max_input_files) return `${files.length} files: at most ${l.max_input_files} per task`;
      const big = files.find((f) => f.file.size > l.max_input_file_bytes);
      if (big) return `${big.path} is ${formatBytes(big.file.size)}: at most ${formatBytes(l.max_input_file_bytes)} per file`;
      const total = files.reduce((sum, f) => sum + f.file.size, 0);
      if (total > l.max_input_total_bytes) return `the files are ${formatBytes(total)} together: at most ${formatBytes(l.max_input_total_bytes)} in all`;
      return null;
    },
  };

  // ------------------------------------------------------------------ the submit form

  const submitForm = {
    files: [],
    init() {
      const form = $("#task-form");
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        this.submit();
      });
      $("#prompt").addEventListener("keydown", (event) => {
        if (event.key === "Enter" && (event.metaKey || event.ctrlKey)) {
          event.preventDefault();
          this.submit();
        }
      });
      const drop = $("#drop");
      for (const name of ["dragenter", "dragover"]) {
        drop.addEventListener(name, (event) => {
          event.preventDefault();
          drop.classList.add("over");
        });
      }
      for (const name of ["dragleave", "drop"]) {
        drop.addEventListener(name, () => drop.classList.remove("over"));
      }
      drop.addEventListener("drop", (event) => {
        event.preventDefault();
        this.add(event.dataTransfer.files);
      });
      $("#file-input").addEventListener("change", (event) => {
        this.add(event.target.files);
        event.target.value = "";
      });
    },
    add(fileList) {
      for (const file of fileList) {
        const path = file.webkitRelativePath || file.name;
        this.files = this.files.filter((f) => f.path !== path);
        this.files.push({ path, file });
      }
      this.renderFiles();
      const problem = limits.problem(this.files); // said at once, not only when submitting
      const error = $("#form-error");
      error.textContent = problem ? `Too large for this server: ${problem}.` : "";
      show(error, Boolean(problem));
    },
    renderFiles() {
      $("#file-list").replaceChildren(
        ...this.files.map((entry) =>
          el(
            "li",
            {},
            el("span", { class: "file-name", text: entry.path }),
            el("span", { class: "hint", text: formatBytes(entry.file.size) }),
            el("button", {
              type: "button",
              class: "ghost small",
              "aria-label": `Remove ${entry.path}`,
              text: "✕",
              onclick: () => {
                this.files = this.files.filter((f) => f !== entry);
                this.renderFiles();
              },
            }),
          ),
        ),
      );
    },
    body() {
      const form = $("#task-form");
      const value = (name) => form.elements[name].value.trim();
      const task = {
        prompt: form.elements.prompt.value,
        llm: { profile: value("profile") || "default" },
        tools: { profile: value("tools") },
        limits: {},
      };
      if (value("model")) task.llm.model = value("model");
      for (const name of ["max_steps", "timeout_s", "command_timeout_s"]) {
        if (value(name)) task.limits[name] = Number(value(name));
      }
      return task;
    },
    async submit() {
      const error = $("#form-error");
      show(error, false);
      const task = this.body();
      if (!task.prompt.trim()) {
        error.textContent = "Write a prompt first.";
        show(error, true);
        $("#prompt").focus();
        return;
      }
      const tooLarge = limits.problem(this.files);
      if (tooLarge) {
        error.textContent = `Not submitted (nothing was uploaded): ${tooLarge}.`;
        show(error, true);
        return;
      }
      const button = $("#submit");
      button.disabled = true;
      button.textContent = "Submitting…";
      try {
        const created = await apiJson("/v1/tasks", this.request(task));
        this.files = [];
        this.renderFiles();
        $("#task-form").elements.prompt.value = "";
        location.hash = `#/tasks/${created.id}`;
        taskList.refresh();
      } catch (failure) {
        error.replaceChildren(errorView(failure, "Not submitted"));
        show(error, true);
      } finally {
        button.disabled = false;
        button.textContent = "Run task";
      }
    },
    request(task) {
      if (!this.files.length) {
        return { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(task) };
      }
      const form = new FormData();
      form.append("task", new Blob([JSON.stringify(task)], { type: "application/json" }), "task.json");
      for (const entry of this.files) form.append("files", entry.file, entry.path);
      return { method: "POST", body: form };
    },
  };

  // ------------------------------------------------------------------ rendering one step

  function exitBadge(code) {
    if (code === null || code === undefined) return null;
    if (code === 0) return el("span", { class: "exit ok", text: "exit 0" });
    if (code === -1) return el("span", { class: "exit bad", text: "timed out" });
    return el("span", { class: "exit bad", text: `exit ${code}` });
  }

  function codeBlock(text, className) {
    return el("pre", { class: `code ${className || ""}` }, el("code", { text }));
  }

  function diffBlock(oldText, newText) {
    const lines = [];
    for (const line of String(oldText ?? "").split("\n")) lines.push(el("span", { class: "del", text: `- ${line}\n` }));
    for (const line of String(newText ?? "").split("\n")) lines.push(el("span", { class: "add", text: `+ ${line}\n` }));
    return el("pre", { class: "code diff" }, el("code", {}, lines));
  }

  function insertBlock(text) {
    const lines = String(text ?? "").split("\n").map((line) => el("span", { class: "add", text: `+ ${line}\n` }));
    return el("pre", { class: "code diff" }, el("code", {}, lines));
  }

  function editorAction(args) {
    const path = el("code", { class: "path", text: args.path || "" });
    switch (args.command) {
      case "create":
        return [el("p", { class: "action-line" }, "create ", path), codeBlock(args.file_text ?? "")];
      case "str_replace":
        return [el("p", { class: "action-line" }, "edit ", path), diffBlock(args.old_str, args.new_str)];
      case "insert":
        return [
          el("p", { class: "action-line" }, "insert into ", path, ` after line ${args.insert_line}`),
          insertBlock(args.new_str),
        ];
      case "view": {
        const range = Array.isArray(args.view_range) ? ` lines ${args.view_range.join("–")}` : "";
        return [el("p", { class: "action-line" }, "view ", path, range)];
      }
      case "undo_edit":
        return [el("p", { class: "action-line" }, "undo the last edit of ", path)];
      default:
        return [codeBlock(JSON.stringify(args, null, 2))];
    }
  }

  function renderAction(action) {
    if (!action) return [];
    const args = action.arguments || {};
    if (action.tool === "execute_bash") return [codeBlock(String(args.command ?? ""), "shell")];
    if (action.tool === "str_replace_editor") return editorAction(args);
    if (action.tool === "submit") return [el("p", { class: "action-line", text: "submitted the task" })];
    return [codeBlock(JSON.stringify(args, null, 2))];
  }

  class StepCard {
    constructor(attempt, index) {
      this.attempt = attempt;
      this.index = index;
      this.thoughtText = el("div", { class: "text" });
      this.reasoningText = el("div", { class: "text" });
      this.thought = el("details", { class: "thought", open: true }, el("summary", { text: "Thought" }), this.thoughtText);
      this.reasoning = el("details", { class: "reasoning" }, el("summary", { text: "Reasoning" }), this.reasoningText);
      this.toolChip = el("span", { class: "tool-chip" });
      this.metaLine = el("span", { class: "step-meta" });
      this.action = el("div", { class: "action" });
      this.liveOutput = el("pre", { class: "code live-output" });
      this.observation = el("div", { class: "observation" });
      show(this.thought, false);
      show(this.reasoning, false);
      show(this.liveOutput, false);
      show(this.observation, false);
      this.node = el(
        "li",
        { class: "step card", "data-state": "running", "data-index": index, "data-attempt": attempt },
        el("div", { class: "step-head" }, el("span", { class: "step-no", text: `Step ${index + 1}` }), this.toolChip, this.metaLine),
        this.reasoning,
        this.thought,
        this.action,
        this.liveOutput,
        this.observation,
      );
      this.metaLine.textContent = "thinking…";
    }

    appendDelta(data) {
      if (this.node.dataset.state === "done") return;
      if (typeof data.reasoning === "string") {
        this.reasoningText.append(data.reasoning);
        show(this.reasoning, true);
      }
      if (typeof data.text === "string") {
        this.thoughtText.append(data.text);
        show(this.thought, true);
      }
      this.metaLine.textContent = "the model is writing…";
    }

    announce(data) {
      if (this.node.dataset.state === "done") return;
      this.toolChip.textContent = data.tool || "";
      if (data.arguments) this.action.replaceChildren(...renderAction({ tool: data.tool, arguments: data.arguments }));
      this.metaLine.textContent = "running…";
    }

    appendOutput(data) {
      if (this.node.dataset.state === "done") return;
      const chunk = el("span", { class: data.stream === "stderr" ? "stderr" : "stdout", text: data.chunk });
      this.liveOutput.append(chunk);
      this.liveOutput.scrollTop = this.liveOutput.scrollHeight;
      show(this.liveOutput, true);
      this.metaLine.textContent = "running…";
    }

    complete(step) {
      this.node.dataset.state = "done";
      this.thoughtText.textContent = step.thought || "";
      this.reasoningText.textContent = step.reasoning || "";
      show(this.thought, Boolean(step.thought));
      show(this.reasoning, Boolean(step.reasoning));
      this.toolChip.textContent = step.action ? step.action.tool : "no tool call";
      this.action.replaceChildren(...renderAction(step.action));
      show(this.liveOutput, false);
      this.liveOutput.replaceChildren();
      const cut = step.interrupted ? el("span", { class: "interrupted", text: `interrupted: ${step.interrupted}` }) : null;
      const title = step.interrupted ? "Output so far" : "Observation";
      const head = el("div", { class: "obs-head" }, el("span", { text: title }), exitBadge(step.exit_code), cut);
      this.observation.replaceChildren(head, el("pre", { class: "code output", text: consoleText(step.observation || "") }));
      show(this.observation, true);
      this.node.dataset.ended = step.interrupted || "";
      const parts = [`model ${formatMs(step.llm_ms)}`];
      if (step.action && step.action.tool !== "submit") parts.push(`tool ${formatMs(step.tool_ms)}`);
      parts.push(`${number.format(step.prompt_tokens)} → ${number.format(step.completion_tokens)} tokens`);
      this.metaLine.textContent = parts.join(" · ");
    }

    /** The task ended while this card was open and no step.completed came (older tasks). */
    endWith(reason) {
      if (this.node.dataset.state === "done") return;
      this.node.dataset.state = "done";
      this.node.dataset.ended = reason || "ended";
      show(this.liveOutput, false);
      this.metaLine.textContent = `ended: ${reason || "the task finished"}`;
    }
  }

  // ------------------------------------------------------------------ artifacts

  async function fetchBlob(url) {
    return (await api(url)).blob();
  }

  async function download(url, filename) {
    const blob = await fetchBlob(url);
    const href = URL.createObjectURL(blob);
    const link = el("a", { href, download: filename });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(href), 10000);
  }

  function previewKind(item) {
    const type = (item.content_type || "").split(";")[0].trim().toLowerCase();
    if (type.startsWith("image/")) return "image";
    if (type.startsWith("audio/")) return "audio";
    if (type.startsWith("video/")) return "video";
    if (type === "text/html" || type === "application/xhtml+xml") return "html";
    if (type.startsWith("text/") || type.endsWith("json") || type.endsWith("xml") || type.includes("javascript")) {
      return "text";
    }
    if (TEXT_EXTENSIONS.has(extension(item.path))) return "text";
    return null;
  }

  class ArtifactList {
    constructor(taskId, urls) {
      this.taskId = taskId;
      this.urls = urls;
      this.loadedFor = null;
    }

    base() {
      return `/v1/tasks/${encodeURIComponent(this.taskId)}`;
    }

    async load() {
      const page = await apiJson(`${this.base()}/artifacts`);
      const signature = JSON.stringify(page.items.map((a) => [a.path, a.sha256]));
      if (signature === this.loadedFor) return;
      this.loadedFor = signature;
      $("#zip").onclick = () => download(`${this.base()}/artifacts.zip`, `${this.taskId}.zip`).catch(alertError);
      $("#artifact-list").replaceChildren(...page.items.map((item) => this.row(item)));
      show($("#artifacts"), page.items.length > 0);
    }

    row(item) {
      const url = `${this.base()}/artifacts/${item.path.split("/").map(encodeURIComponent).join("/")}`;
      const preview = el("div", { class: "preview" });
      const kind = previewKind(item);
      const row = el(
        "li",
        { class: "artifact", "data-path": item.path },
        el(
          "div",
          { class: "artifact-head" },
          el("span", { class: "artifact-name", text: item.path }),
          el("span", { class: "hint", text: `${formatBytes(item.size)} · ${item.content_type}` }),
          el("button", {
            type: "button",
            class: "ghost small",
            text: "Download",
            onclick: () => download(url, basename(item.path)).catch(alertError),
          }),
        ),
        preview,
      );
      const limit = kind === "text" || kind === "html" ? TEXT_PREVIEW_MAX_BYTES : PREVIEW_MAX_BYTES;
      if (kind && item.size <= limit) {
        this.preview(kind, url, item, preview).catch((error) => {
          preview.replaceChildren(el("p", { class: "hint", text: `No preview: ${error.message}` }));
        });
      } else if (kind) {
        preview.append(el("p", { class: "hint", text: "Too large to preview here; download it." }));
      }
      return row;
    }

    async preview(kind, url, item, into) {
      if (kind === "text" || kind === "html") {
        const text = await (await fetchBlob(url)).text();
        if (kind === "text") {
          into.replaceChildren(el("pre", { class: "code output", text }));
          return;
        }
        // A sandboxed frame with no permissions: the page's policy also keeps its scripts off.
        const frame = el("iframe", { sandbox: "", title: item.path, referrerpolicy: "no-referrer" });
        frame.srcdoc = text;
        into.replaceChildren(frame);
        return;
      }
      const blob = await fetchBlob(url);
      const typed = blob.type ? blob : new Blob([blob], { type: item.content_type });
      const src = URL.createObjectURL(typed);
      this.urls.push(src);
      if (kind === "image") into.replaceChildren(el("img", { src, alt: item.path }));
      else if (kind === "audio") into.replaceChildren(el("audio", { src, controls: true, preload: "metadata" }));
      else into.replaceChildren(el("video", { src, controls: true, preload: "metadata", playsinline: true }));
    }
  }

  function alertError(error) {
    const node = $("#t-error");
    node.className = "error";
    node.textContent = error.message;
    show(node, true);
  }

  // ------------------------------------------------------------------ watching one task

  class TaskView {
    constructor(id) {
      this.id = id;
      this.lastSeq = 0;
      this.attempt = 1;
      this.cards = new Map();
      this.task = null;
      this.reloads = 0; // reload() calls so far: only the newest one's answer is shown
      // Steps of this attempt seen completed: a running task's stored usage is written only
      // when it ends (GET says steps 0 until then), so its count is the page's own.
      this.stepsDone = 0;
      this.ws = null;
      this.stopped = false;
      this.finished = false;
      this.retries = 0;
      this.retryTimer = null;
      this.silenceTimer = null;
      this.clock = null;
      this.objectUrls = [];
      this.artifacts = new ArtifactList(id, this.objectUrls);
    }

    async start() {
      $("#steps").replaceChildren();
      show($("#answer"), false);
      show($("#artifacts"), false);
      show($("#t-error"), false);
      $("#t-id").textContent = this.id;
      $("#t-prompt").textContent = "";
      $("#t-meta").replaceChildren();
      this.setStatus("loading");
      $("#cancel").onclick = () => this.cancel();
      // Follow mode, step rail, outcome card, charts: task_view.js.
      this.extras = window.Sandhive.taskView ? window.Sandhive.taskView.attach(this) : null;
      // The running sandbox's Files panel: task_files.js.
      this.files = window.Sandhive.taskFiles ? window.Sandhive.taskFiles.attach(this) : null;
      // "Fork from here" on each step and the family card: task_fork.js.
      this.forks = window.Sandhive.taskFork ? window.Sandhive.taskFork.attach(this) : null;
      this.clock = setInterval(() => this.renderMeta(), 1000);
      await this.reload();
      this.connect();
    }

    stop() {
      this.stopped = true;
      clearTimeout(this.retryTimer);
      clearTimeout(this.silenceTimer);
      clearInterval(this.clock);
      if (this.extras) this.extras.stop();
      if (this.files) this.files.stop();
      if (this.forks) this.forks.stop();
      if (this.ws) this.ws.close(1000);
      for (const url of this.objectUrls) URL.revokeObjectURL(url);
    }

    async reload() {
      const call = ++this.reloads;
      let task;
      try {
        task = await apiJson(`/v1/tasks/${encodeURIComponent(this.id)}`);
      } catch (error) {
        if (call !== this.reloads || this.stopped) return;
        if (error.status === 404) this.notFound();
        else alertError(error);
        return;
      }
      if (call !== this.reloads || this.stopped) return; // a newer answer is on its way
      this.clampSteps(task);
      this.task = task;
      $("#t-prompt").textContent = this.task.prompt;
      this.setStatus(this.task.status);
      this.renderMeta();
      if (TERMINAL.has(this.task.status)) this.renderFinish(this.task);
      if (this.extras) this.extras.task(this.task);
      if (this.forks) this.forks.task(this.task);
    }

    // -- the stream

    connect() {
      if (this.stopped || this.finished) return;
      clearTimeout(this.retryTimer);
      const ws = new WebSocket(streamUrl(this.id, this.lastSeq));
      this.ws = ws;
      conn.set("connecting", "connecting…");
      ws.onopen = () => {
        if (ws !== this.ws) return;
        conn.set("live", "live");
        this.touch();
      };
      ws.onmessage = (message) => {
        if (ws !== this.ws) return;
        this.retries = 0;
        this.touch();
        this.onEvent(JSON.parse(message.data));
      };
      ws.onclose = (closed) => {
        if (ws === this.ws) this.onClose(closed);
      };
    }

    reconnectNow() {
      if (this.finished || this.stopped) return;
      if (this.ws) {
        const old = this.ws;
        this.ws = null;
        old.close(1000);
      }
      this.connect();
    }

    touch() {
      clearTimeout(this.silenceTimer);
      this.silenceTimer = setTimeout(() => {
        // No keepalive for too long: the connection is dead even if the browser has not noticed.
        this.scheduleReconnect("no news from the server; reconnecting…", 0);
      }, SILENCE_MS);
    }

    onClose(closed) {
      clearTimeout(this.silenceTimer);
      if (this.stopped) return;
      if (closed.code === 1000 && this.finished) {
        conn.set("done", "finished");
        return;
      }
      if (closed.code === 4404) return this.notFound();
      if (closed.code === 4401) {
        conn.set("error", "API key needed");
        keyPanel.open(closed.reason || "This server wants an API key.");
        return;
      }
      if (closed.code === 4408) return this.scheduleReconnect("catching up…", 0);
      const delay = Math.min(MAX_RETRY_MS, 500 * 2 ** this.retries);
      this.retries += 1;
      this.scheduleReconnect(`reconnecting in ${Math.ceil(delay / 1000)} s…`, delay);
    }

    scheduleReconnect(text, delay) {
      if (this.stopped || this.finished) return;
      conn.set("reconnecting", text);
      clearTimeout(this.retryTimer);
      if (this.ws) {
        const old = this.ws;
        this.ws = null;
        old.onclose = null;
        old.close();
      }
      this.retryTimer = setTimeout(() => this.connect(), delay);
    }

    notFound() {
      this.stopped = true;
      conn.set("error", "not found");
      this.setStatus("not found");
      alertError(new Error("There is no such task (or it is not yours)."));
    }

    // -- events

    onEvent(event) {
      if (event.seq !== null && event.seq !== undefined) {
        if (event.seq <= this.lastSeq) return; // already shown: never twice
        this.lastSeq = event.seq;
      }
      const data = event.data || {};
      switch (event.type) {
        case "task.queued":
          this.setStatus("queued");
          this.waiting("Queued: waiting for a worker…");
          break;
        case "task.started":
          if ((data.attempt || 1) !== this.attempt) this.stepsDone = 0; // a new attempt counts anew
          this.attempt = data.attempt || 1;
          if (this.attempt > 1) $("#steps").append(el("li", { class: "attempt", text: `Attempt ${this.attempt}` }));
          this.setStatus("running");
          this.waiting("Starting the sandbox…");
          this.reload();
          break;
        case "step.started":
          this.card(this.attempt, data.index);
          this.waiting(null);
          break;
        case "step.completed":
          this.card(data.attempt || this.attempt, data.index).complete(data);
          this.waiting("The model is thinking…");
          this.bumpSteps(data);
          break;
        case "llm.delta":
          this.card(this.attempt, data.index).appendDelta(data);
          break;
        case "tool.started":
          this.card(this.attempt, data.index).announce(data);
          break;
        case "tool.output":
          this.card(this.attempt, data.index).appendOutput(data);
          break;
        case "artifact.created":
          this.artifacts.load().catch(alertError);
          break;
        case "task.finished":
          this.finished = true;
          this.waiting(null);
          for (const open of this.cards.values()) open.endWith(data.finish_reason);
          this.renderFinish(data);
          this.reload();
          taskList.refresh();
          break;
        default:
          break; // keepalive and anything newer than this page
      }
      if (this.extras) this.extras.event(event);
      if (this.forks) this.forks.event(event);
    }

    card(attempt, index) {
      const key = `${attempt}:${index}`;
      let card = this.cards.get(key);
      if (!card) {
        card = new StepCard(attempt, index);
        this.cards.set(key, card);
        $("#steps").append(card.node);
      }
      return card;
    }

    bumpSteps(step) {
      if ((step.attempt || this.attempt) === this.attempt) this.stepsDone = Math.max(this.stepsDone, step.index + 1);
      if (!this.task || TERMINAL.has(this.task.status)) return;
      this.clampSteps(this.task);
      this.renderMeta();
    }

    // A running task reports 0 steps until it ends (its usage is stored then): never show
    // fewer than the steps already seen done. A finished task's count is final.
    clampSteps(task) {
      if (!TERMINAL.has(task.status)) task.usage.steps = Math.max(task.usage.steps, this.stepsDone);
    }

    waiting(text) {
      show($("#waiting"), Boolean(text) && !this.finished);
      if (text) $("#waiting-text").textContent = text;
    }

    // -- the header

    setStatus(status) {
      const badge = $("#t-status");
      badge.textContent = status;
      badge.className = `badge ${status.replace(/\s+/g, "-")}`;
      const over = TERMINAL.has(status) || status === "not found";
      show($("#cancel"), !over);
      $("#cancel").disabled = over;
      if (this.files) this.files.status(status);
    }

    renderFinish(data) {
      this.setStatus(data.status);
      if (data.answer !== null && data.answer !== undefined) {
        $("#answer-text").textContent = data.answer;
        show($("#answer"), true);
      }
      const note = $("#t-error");
      if (data.error) {
        // A cancel is what someone asked for: a neutral note, not an error.
        note.className = data.finish_reason === "cancelled" ? "note" : "error";
        note.textContent = data.finish_reason === "cancelled" ? "Cancelled." : `${data.finish_reason || "failed"}: ${data.error}`;
        show(note, true);
      }
      this.artifacts.load().catch(alertError);
    }

    renderMeta() {
      const task = this.task;
      if (!task) return;
      const end = task.finished_at ? Date.parse(task.finished_at) : Date.now();
      const items = [["model", task.llm ? `${task.llm.profile} / ${task.llm.model}` : ""]];
      if (task.started_at) items.push(["started", formatTime(task.started_at)]);
      if (task.started_at) {
        items.push([task.finished_at ? "took" : "running for", formatMs(end - Date.parse(task.started_at))]);
      }
      items.push(["steps", String(task.usage.steps)]);
      const tokens = task.usage.prompt_tokens + task.usage.completion_tokens;
      if (tokens) items.push(["tokens", number.format(tokens)]);
      if (task.attempt > 1) items.push(["attempt", String(task.attempt)]);
      if (task.finish_reason) items.push(["finish", task.finish_reason]);
      $("#t-meta").replaceChildren(
        ...items.map(([name, value]) => el("div", {}, el("dt", { text: name }), el("dd", { text: value }))),
      );
    }

    async cancel() {
      const button = $("#cancel");
      button.disabled = true;
      try {
        await api(`/v1/tasks/${encodeURIComponent(this.id)}/cancel`, { method: "POST" });
        this.waiting("Cancelling…");
      } catch (error) {
        alertError(new Error(`Cancel failed: ${error.message}`));
        button.disabled = Boolean(this.task && TERMINAL.has(this.task.status));
      }
    }
  }

  // ------------------------------------------------------------------ routing

  const OTHER_VIEWS = ["experiments", "sandboxes"];

  const router = {
    view: null,
    init() {
      window.addEventListener("hashchange", () => this.route());
      window.addEventListener("online", () => this.view && this.view.reconnectNow());
      this.route();
    },
    route() {
      // Views of their own own their hashes: experiments.js #/experiments…, sandboxes.js
      // #/sandboxes…, each drawn in the <main> of its name; this router, the rest (tasks).
      const owner = OTHER_VIEWS.find((name) => window.Sandhive[name] && window.Sandhive[name].claims(location.hash)) || null;
      for (const link of document.querySelectorAll("[data-nav]")) {
        if (link.dataset.nav === (owner || "tasks")) link.setAttribute("aria-current", "page");
        else link.removeAttribute("aria-current");
      }
      const elsewhere = Boolean(owner);
      document.body.classList.toggle("in-experiments", owner === "experiments");
      show($("#tasks-main"), !elsewhere);
      for (const name of OTHER_VIEWS) {
        show($(`#${name}`), owner === name);
        if (window.Sandhive[name]) window.Sandhive[name].route(owner === name ? location.hash : null);
      }
      if (elsewhere) {
        if (this.view) this.view.stop();
        this.view = null;
        return;
      }
      // Two tasks side by side (compare.js) owns #/compare/A/B.
      const compare = window.Sandhive.compare;
      const comparing = Boolean(compare && compare.claims(location.hash));
      if (compare) compare.route(comparing ? location.hash : null);
      const match = location.hash.match(/^#\/tasks\/([A-Za-z0-9_-]+)(?:\/steps\/(\d+))?$/);
      const id = match ? match[1] : null;
      const step = match && match[2] ? Number(match[2]) : null; // #/tasks/ID/steps/N: step N, from 1
      if (this.view && this.view.id === id) {
        if (step && this.view.extras) this.view.extras.goto(step);
        return;
      }
      if (this.view) this.view.stop();
      this.view = null;
      document.body.classList.toggle("has-task", Boolean(id) || comparing);
      show($("#task"), Boolean(id));
      show($("#empty"), !id && !comparing);
      if (!id) {
        conn.set("idle", "");
        taskList.lastRendered = "";
        taskList.refresh();
        return;
      }
      this.view = new TaskView(id);
      this.view.step = step;
      this.view.start();
      taskList.lastRendered = "";
      taskList.refresh();
      window.scrollTo(0, 0);
    },
  };

  // What experiments.js and sandboxes.js (loaded after this script) build on: one API client, one way to
  // insert text, one connection badge.
  window.Sandhive = { el, show, api, apiJson, auth, conn, download, formatAgo, formatBytes, formatMs };
  // task_list.js and compare.js: the open task (to highlight it) and errors with their details.
  window.Sandhive.currentTaskId = () => (router.view ? router.view.id : null);
  window.Sandhive.errorView = errorView;

  document.addEventListener("DOMContentLoaded", () => {
    keyPanel.init();
    submitForm.init();
    $("#task-form").elements.profile.addEventListener("change", () => profiles.picked());
    profiles.refresh();
    limits.refresh();
    taskList.init();
    router.init();
  });
})();
