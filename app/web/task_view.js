// The task view's reading aids, on top of app.js's TaskView: follow mode and "jump to live",
// the step rail and #/tasks/ID/steps/N, the outcome card, folded long observations, the
// failed-steps filter, and the timing and token charts (the vendored Chart.js). app.js
// calls attach(view) when it opens a task and hands over every new event; this file only
// reads the view's cards and adds to them. Everything from the API is inserted as text.
"use strict";

(() => {
  const S = window.Sandhive;
  if (!S) return;
  const { el, show, apiJson, formatMs, formatBytes } = S;
  const $ = (selector) => document.querySelector(selector);
  const number = new Intl.NumberFormat();
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
  const FOLD_LINES = 40; // an observation longer than this shows its head and tail only
  const FOLD_KEEP = 12; // lines kept at each end
  const FOLD_CHARS = 6000; // ... or, for a few very long lines, characters
  const AT_LIVE_SLACK_PX = 48;
  const UP_KEYS = new Set(["ArrowUp", "PageUp", "Home"]);
  const DOWN_KEYS = new Set(["ArrowDown", "PageDown", "End", " "]);
  // How long after the reader's own downward gesture a scroll counts as theirs.
  const GESTURE_MS = 1000;

  const cssVar = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

  function seconds(ms) {
    return `${(Math.max(0, ms) / 1000).toFixed(1)} s`;
  }

  function keyOf(attempt, index) {
    return `${attempt}:${index}`;
  }

  /** A failing step: a non-zero exit (-1 is a timeout) or cut short by anything but a cancel. */
  function isFailed(step) {
    const badExit = step.exit_code !== null && step.exit_code !== undefined && step.exit_code !== 0;
    return badExit || Boolean(step.interrupted && step.interrupted !== "cancelled");
  }

  /** The rail's short name of what a step did: bash, the editor's command, submit. */
  function toolLabel(tool, args) {
    if (tool === "execute_bash") return "bash";
    if (tool === "str_replace_editor") return args && typeof args.command === "string" ? args.command.replace("str_replace", "edit") : "editor";
    return tool || "";
  }

  function railStatus(step) {
    if (isFailed(step)) return "bad";
    if (step.interrupted) return "cut";
    return step.exit_code === 0 ? "ok" : "none";
  }

  /** Head, marker and tail of a long text; null when it is short enough to show whole. */
  function foldParts(text) {
    const lines = text.split("\n");
    if (lines.length > FOLD_LINES) {
      const hidden = lines.length - 2 * FOLD_KEEP;
      return {
        head: `${lines.slice(0, FOLD_KEEP).join("\n")}\n`,
        mark: `… ${number.format(hidden)} more lines …`,
        tail: `\n${lines.slice(-FOLD_KEEP).join("\n")}`,
        label: `Show all ${number.format(lines.length)} lines`,
      };
    }
    if (text.length > FOLD_CHARS) {
      const keep = FOLD_CHARS / 2;
      return {
        head: text.slice(0, keep),
        mark: ` … ${number.format(text.length - FOLD_CHARS)} more characters … `,
        tail: text.slice(-keep),
        label: `Show all ${number.format(text.length)} characters`,
      };
    }
    return null;
  }

  /**
   * The step that wrote an artifact (a path under /testbed/output), when the trajectory says:
   * the last edit of exactly that file, else the last command naming it, else the last
   * command whose output names it (a script that printed "saved …"). Null when none does.
   */
  function writerOf(path, steps) {
    const full = `/testbed/output/${path}`;
    const named = (text) => typeof text === "string" && (text.includes(full) || text.includes(`output/${path}`));
    const edits = ["create", "str_replace", "insert", "undo_edit"];
    const rules = [
      (s) => s.action.tool === "str_replace_editor" && s.action.arguments.path === full && edits.includes(s.action.arguments.command),
      (s) => s.action.tool === "execute_bash" && named(s.action.arguments.command),
      (s) => s.action.tool === "execute_bash" && named(s.observation),
    ];
    const acted = steps.filter((s) => s.action && s.action.arguments && !s.interrupted);
    for (const rule of rules) {
      const hits = acted.filter(rule);
      if (hits.length) return hits[hits.length - 1];
    }
    return null;
  }

  let profilesRequest = null;
  function profiles() {
    if (!profilesRequest) {
      profilesRequest = apiJson("/v1/llm/profiles")
        .then((body) => body.profiles)
        .catch(() => {
          profilesRequest = null;
          return [];
        });
    }
    return profilesRequest;
  }

  function costOf(task, profile) {
    if (!profile) return null;
    const input = profile.input_price_per_mtok;
    const output = profile.output_price_per_mtok;
    if (input == null && output == null) return null;
    return ((task.usage.prompt_tokens * (input || 0)) + (task.usage.completion_tokens * (output || 0))) / 1e6;
  }

  class TaskExtras {
    constructor(view) {
      this.view = view;
      this.steps = new Map(); // attempt:index -> the completed step (step.completed data)
      this.railItems = new Map(); // attempt:index -> its rail entry
      this.toolStarts = new Map(); // attempt:index -> when its command started (ms since epoch)
      this.following = true;
      this.finished = false;
      this.target = view.step || null; // a step number (from 1) to show, from #/tasks/ID/steps/N
      this.ownY = null; // where our last scroll left the page: a scroll event there is ours
      this.lastY = window.scrollY;
      this.charts = {};
      this.chartFrame = 0;
      this.current = null; // the task as last read
      this.artifactsRequest = null;
      this.outcomeVersion = 0;
      this.landed = null; // the step card we last scrolled to on request, and when
      this.landedAt = 0;
      this.userAt = 0; // the reader's last wheel, key, touch or click
      this.downAt = -Infinity; // the reader's last gesture that scrolls down (wheel, key, swipe)

      $("#rail-list").replaceChildren();
      show($("#rail"), false);
      show($("#outcome"), false);
      show($("#timing"), false);
      show($("#jump-live"), false);
      $("#outcome-facts").replaceChildren();
      $("#outcome-artifacts").replaceChildren();
      $("#failed-only").checked = false;
      $("#task").classList.remove("failed-only");
      $("#failed-count").textContent = "";
      $("#failed-only").onchange = (event) => $("#task").classList.toggle("failed-only", event.target.checked);
      $("#jump-live").onclick = () => this.jumpToLive();
      this.onScroll = () => this.scrolled();
      // Reading upwards is leaving the live end, even before the page has moved.
      this.onWheel = (event) => {
        this.userAt = performance.now();
        this.downAt = event.deltaY > 0 ? this.userAt : -Infinity;
        if (event.deltaY < 0) this.unfollow();
      };
      this.onKey = (event) => {
        this.userAt = performance.now();
        if (event.target.closest("input, textarea, select")) return;
        this.downAt = DOWN_KEYS.has(event.key) ? this.userAt : -Infinity;
        if (UP_KEYS.has(event.key)) this.unfollow();
      };
      this.onPointer = () => {
        this.userAt = performance.now();
      };
      this.onTouch = () => {
        this.userAt = performance.now();
        this.downAt = this.userAt; // a swipe may go either way
      };
      window.addEventListener("scroll", this.onScroll, { passive: true });
      window.addEventListener("wheel", this.onWheel, { passive: true });
      window.addEventListener("keydown", this.onKey);
      window.addEventListener("pointerdown", this.onPointer, { passive: true });
      window.addEventListener("touchstart", this.onTouch, { passive: true });
      this.ticker = setInterval(() => this.tick(), 200);
    }

    stop() {
      window.removeEventListener("scroll", this.onScroll);
      window.removeEventListener("wheel", this.onWheel);
      window.removeEventListener("keydown", this.onKey);
      window.removeEventListener("pointerdown", this.onPointer);
      window.removeEventListener("touchstart", this.onTouch);
      clearInterval(this.ticker);
      cancelAnimationFrame(this.chartFrame);
      for (const chart of Object.values(this.charts)) chart.destroy();
      this.charts = {};
      show($("#jump-live"), false);
    }

    // -- what app.js hands over

    /** The task as GET /v1/tasks/ID returned it (on open, on start and on finish). */
    task(task) {
      this.current = task;
      if (TERMINAL.has(task.status)) {
        this.finished = true;
        this.following = false;
        show($("#jump-live"), false);
        this.renderOutcome();
        this.resettle();
      }
    }

    event(event) {
      const data = event.data || {};
      const attempt = data.attempt || this.view.attempt;
      switch (event.type) {
        case "step.started":
          this.railEntry(attempt, data.index);
          break;
        case "tool.started": {
          const at = Date.parse(event.ts);
          this.toolStarts.set(keyOf(attempt, data.index), Number.isNaN(at) ? Date.now() : Math.min(at, Date.now()));
          this.railTool(this.railEntry(attempt, data.index), data.tool, data.arguments);
          break;
        }
        case "step.completed":
          this.stepDone(attempt, data);
          break;
        case "task.finished":
          this.finish(data);
          break;
        case "network.blocked": // the egress proxy refused a connection (docs/network.md)
          $("#rail-list").append(
            el("li", {
              class: "rail-blocked",
              title: data.reason || "",
              text: `network blocked: ${data.host || "(no name)"}`,
            }),
          );
          break;
        default:
          break;
      }
      if (this.target) this.seek();
      else this.follow();
    }

    // -- the step rail

    railEntry(attempt, index) {
      const key = keyOf(attempt, index);
      let item = this.railItems.get(key);
      if (item) return item;
      if (attempt > 1 && ![...this.railItems.keys()].some((k) => k.startsWith(`${attempt}:`))) {
        $("#rail-list").append(el("li", { class: "rail-attempt", text: `attempt ${attempt}` }));
      }
      const stepNo = index + 1;
      const href = `#/tasks/${encodeURIComponent(this.view.id)}/steps/${stepNo}`;
      item = el(
        "li",
        { class: "rail-step", "data-index": index, "data-attempt": attempt, "data-status": "running" },
        el(
          "a",
          {
            href,
            title: `Step ${stepNo}`,
            onclick: () => {
              if (location.hash === href) this.goto(stepNo); // same hash: no hashchange
            },
          },
          el("span", { class: "rail-no", text: String(stepNo) }),
          el("span", { class: "rail-tool" }),
          el("span", { class: "rail-time" }),
        ),
      );
      this.railItems.set(key, item);
      $("#rail-list").append(item);
      show($("#rail"), true);
      return item;
    }

    railTool(item, tool, args) {
      const node = item.querySelector(".rail-tool");
      node.textContent = toolLabel(tool, args);
      node.title = tool || "";
      item.dataset.tool = tool || "";
    }

    stepDone(attempt, step) {
      const key = keyOf(attempt, step.index);
      this.steps.set(key, { ...step, attempt });
      this.toolStarts.delete(key);
      const item = this.railEntry(attempt, step.index);
      item.dataset.status = railStatus(step);
      if (step.action) this.railTool(item, step.action.tool, step.action.arguments);
      else item.querySelector(".rail-tool").textContent = "no tool";
      item.querySelector(".rail-time").textContent = formatMs((step.llm_ms || 0) + (step.tool_ms || 0));
      const card = this.view.cards.get(key);
      if (card) {
        const elapsed = card.node.querySelector(".elapsed");
        if (elapsed) elapsed.remove();
        card.node.dataset.status = railStatus(step);
        if (isFailed(step)) {
          card.node.dataset.failed = "";
          item.dataset.failed = "";
        }
        this.fold(card);
      }
      const failed = [...this.steps.values()].filter(isFailed).length;
      $("#failed-count").textContent = `(${failed})`;
      this.scheduleCharts();
    }

    /** Long observations: head and tail, and a button for the whole text. */
    fold(card) {
      const pre = card.observation.querySelector("pre.output");
      if (!pre || pre.dataset.folded) return;
      const text = pre.textContent;
      const parts = foldParts(text);
      if (!parts) return;
      const folded = () => [parts.head, el("span", { class: "fold-mark", text: parts.mark }), parts.tail];
      pre.replaceChildren(...folded());
      pre.dataset.folded = "true";
      const button = el("button", { type: "button", class: "ghost small show-all", text: parts.label });
      button.addEventListener("click", () => {
        const open = pre.dataset.folded === "true";
        if (open) pre.textContent = text;
        else pre.replaceChildren(...folded());
        pre.dataset.folded = open ? "false" : "true";
        button.textContent = open ? "Show head and tail only" : parts.label;
      });
      pre.after(button);
    }

    /** A running command's elapsed time, on its card and in the rail. */
    tick() {
      for (const [key, start] of this.toolStarts) {
        const card = this.view.cards.get(key);
        if (!card) continue;
        const head = card.node.querySelector(".step-head");
        let span = head.querySelector(".elapsed");
        if (card.node.dataset.state !== "running") {
          if (span) span.remove();
          this.toolStarts.delete(key);
          continue;
        }
        if (!span) {
          span = el("span", { class: "elapsed", title: "the command has been running for" });
          head.append(span);
        }
        const text = seconds(Date.now() - start);
        span.textContent = text;
        const item = this.railItems.get(key);
        if (item) item.querySelector(".rail-time").textContent = text;
      }
    }

    // -- follow mode

    /** What is being written now: the last running step, else the "waiting" line. */
    liveNode() {
      let last = null;
      for (const card of this.view.cards.values()) if (card.node.dataset.state === "running") last = card.node;
      if (last) return last;
      const waiting = $("#waiting");
      return waiting.hidden ? null : waiting;
    }

    atLive() {
      const node = this.liveNode();
      if (!node) return true;
      const rect = node.getBoundingClientRect();
      return rect.bottom > 0 && rect.bottom <= window.innerHeight + AT_LIVE_SLACK_PX;
    }

    follow() {
      if (!this.following || this.finished) return;
      const node = this.liveNode();
      if (!node) return;
      const rect = node.getBoundingClientRect();
      const margin = 16;
      // Keep the live end (the newest text) on screen: the bottom of the running step.
      if (rect.bottom > window.innerHeight - margin || rect.bottom < 120) {
        this.scrollOwn(() => window.scrollTo(0, window.scrollY + rect.bottom - window.innerHeight + margin));
      }
    }

    /** Scroll, and remember where it left the page so its scroll event is not the user's. */
    scrollOwn(move) {
      move();
      this.ownY = window.scrollY;
      this.lastY = this.ownY;
    }

    scrolled() {
      const y = window.scrollY;
      const down = y > this.lastY;
      this.lastY = y;
      if (this.finished || (this.ownY !== null && Math.abs(y - this.ownY) < 2)) return;
      this.ownY = null;
      if (this.following && !this.atLive()) this.unfollow();
      else if (!this.following && down && this.readerScrolledDown() && this.liveNode() && this.atLive()) {
        this.following = true; // they scrolled back down to the live end themselves
        show($("#jump-live"), false);
      }
    }

    /** A downward scroll is the reader's only right after their own gesture: the page also
     * moves by itself (scroll anchoring as cards above change height, a smooth scroll's
     * frames), and those must never take a reader who left back to the live end. */
    readerScrolledDown() {
      return performance.now() - this.downAt < GESTURE_MS;
    }

    unfollow() {
      if (this.finished || !this.following) return;
      this.following = false; // the user scrolled away: stay where they are
      show($("#jump-live"), true);
    }

    jumpToLive() {
      this.target = null;
      this.following = true;
      show($("#jump-live"), false);
      const node = this.liveNode();
      if (node) this.scrollOwn(() => node.scrollIntoView({ block: "end" }));
      this.follow();
    }

    // -- one step on request

    cardFor(number) {
      let found = null;
      for (const card of this.view.cards.values()) if (card.index === number - 1) found = card; // the last attempt's
      return found;
    }

    goto(number) {
      this.target = number;
      this.seek();
    }

    seek() {
      const card = this.cardFor(this.target);
      if (!card) return;
      if (!this.finished) {
        this.following = false;
        show($("#jump-live"), true);
      }
      this.scrollOwn(() => card.node.scrollIntoView({ block: "start" }));
      this.landed = card.node;
      this.landedAt = performance.now();
      setTimeout(() => this.resettle(), 400);
      for (const node of document.querySelectorAll("li.step.targeted, .rail-step.targeted")) node.classList.remove("targeted");
      card.node.classList.add("targeted");
      const item = this.railItems.get(keyOf(card.attempt, card.index));
      if (item) item.classList.add("targeted");
      // A finished task's replay is over once task.finished came; a running one's step is there.
      if (this.finished || card.node.dataset.state === "done") this.target = null;
    }

    /** Content drawn above a step we scrolled to (charts, outcome) moved it: back to it,
     * unless the reader has scrolled since. */
    resettle() {
      if (!this.landed || this.userAt > this.landedAt || performance.now() - this.landedAt > 3000) return;
      const node = this.landed;
      this.scrollOwn(() => node.scrollIntoView({ block: "start" }));
    }

    // -- results first

    finish(data) {
      const wasFollowing = this.following && !this.finished;
      this.finished = true;
      this.following = false;
      show($("#jump-live"), false);
      this.current = this.current ? { ...this.current, ...data } : null;
      for (const item of this.railItems.values()) if (item.dataset.status === "running") item.dataset.status = "cut";
      this.renderOutcome();
      if (wasFollowing && !this.target) {
        this.scrollOwn(() => $("#task").scrollIntoView({ block: "start" }));
      }
    }

    renderOutcome() {
      const task = this.current;
      if (!task || !TERMINAL.has(task.status)) return;
      const facts = [["outcome", task.status + (task.finish_reason ? ` · ${task.finish_reason}` : "")]];
      if (task.started_at && task.finished_at) facts.push(["took", formatMs(Date.parse(task.finished_at) - Date.parse(task.started_at))]);
      if (task.usage) {
        facts.push(["steps", String(task.usage.steps)]);
        facts.push(["tokens", `${number.format(task.usage.prompt_tokens)} in · ${number.format(task.usage.completion_tokens)} out`]);
      }
      if (task.llm) facts.push(["model", `${task.llm.profile} / ${task.llm.model}`]);
      const render = (extra) =>
        $("#outcome-facts").replaceChildren(
          ...facts.concat(extra).map(([name, value]) => el("div", { "data-fact": name }, el("dt", { text: name }), el("dd", { text: value }))),
        );
      render([]);
      $("#outcome").dataset.status = task.status;
      show($("#outcome"), true);
      const version = ++this.outcomeVersion;
      profiles().then((list) => {
        if (version !== this.outcomeVersion || !task.usage || !task.llm) return;
        const cost = costOf(task, list.find((p) => p.name === task.llm.profile));
        if (cost !== null) render([["cost", `$${cost.toFixed(cost < 0.1 ? 4 : 2)}`]]);
      });
      if (!this.artifactsRequest) this.artifactsRequest = apiJson(`/v1/tasks/${encodeURIComponent(this.view.id)}/artifacts`);
      this.artifactsRequest
        .then((page) => {
          if (version === this.outcomeVersion) this.renderArtifacts(page.items);
          this.resettle();
        })
        .catch(() => {
          this.artifactsRequest = null;
        });
    }

    renderArtifacts(items) {
      const attempt = Math.max(0, ...[...this.steps.values()].map((s) => s.attempt));
      const steps = [...this.steps.values()].filter((s) => s.attempt === attempt).sort((a, b) => a.index - b.index);
      $("#outcome-artifacts").replaceChildren(
        ...items.map((item) => {
          const writer = writerOf(item.path, steps);
          const stepNo = writer ? writer.index + 1 : null;
          return el(
            "li",
            { "data-path": item.path },
            el("span", { class: "artifact-name", text: item.path }),
            el("span", { class: "hint", text: formatBytes(item.size) }),
            stepNo
              ? el("a", {
                  class: "writer",
                  href: `#/tasks/${encodeURIComponent(this.view.id)}/steps/${stepNo}`,
                  text: `written in step ${stepNo}`,
                })
              : el("span", { class: "hint", text: "step not known" }),
          );
        }),
      );
    }

    // -- timing and tokens (Chart.js)

    scheduleCharts() {
      cancelAnimationFrame(this.chartFrame);
      this.chartFrame = requestAnimationFrame(() => this.drawCharts());
    }

    drawCharts() {
      if (typeof Chart === "undefined" || !this.steps.size) return;
      const steps = [...this.steps.values()].sort((a, b) => a.attempt - b.attempt || a.index - b.index);
      const many = steps.some((s) => s.attempt > 1);
      const labels = steps.map((s) => `${many ? `${s.attempt}·` : ""}${s.index + 1} ${s.action ? s.action.tool : ""}`.trim());
      const t0 = Math.min(...steps.map((s) => Date.parse(s.started_at) || 0));
      const startOf = (s) => ((Date.parse(s.started_at) || t0) - t0) / 1000;
      const model = steps.map((s) => [startOf(s), startOf(s) + s.llm_ms / 1000]);
      const tool = steps.map((s) => [startOf(s) + s.llm_ms / 1000, startOf(s) + (s.llm_ms + s.tool_ms) / 1000]);
      show($("#timing"), true);
      $("#waterfall-chart").parentElement.style.height = `${Math.max(140, 24 * steps.length + 60)}px`;
      const onClick = (event, elements) => {
        if (elements.length) this.goto(steps[elements[0].index].index + 1);
      };
      const colors = { model: cssVar("--run"), tool: cssVar("--accent"), prompt: cssVar("--muted"), completion: cssVar("--ok") };
      const common = { responsive: true, maintainAspectRatio: false, animation: false, onClick };
      this.chart("waterfall", "#waterfall-chart", {
        type: "bar",
        data: {
          labels,
          datasets: [
            { label: "model", data: model, backgroundColor: colors.model, grouped: false },
            { label: "tool", data: tool, backgroundColor: colors.tool, grouped: false },
          ],
        },
        options: {
          ...common,
          indexAxis: "y",
          scales: { x: { min: 0, title: { display: true, text: "seconds since step 1 began" } } },
          plugins: {
            tooltip: {
              callbacks: {
                label: (ctx) => `${ctx.dataset.label}: ${seconds((ctx.raw[1] - ctx.raw[0]) * 1000)}`,
              },
            },
          },
        },
      });
      this.chart("tokens", "#tokens-chart", {
        type: "bar",
        data: {
          labels,
          datasets: [
            { label: "prompt tokens", data: steps.map((s) => s.prompt_tokens), backgroundColor: colors.prompt },
            { label: "completion tokens", data: steps.map((s) => s.completion_tokens), backgroundColor: colors.completion },
          ],
        },
        options: { ...common, scales: { x: { stacked: true }, y: { stacked: true, beginAtZero: true } } },
      });
      this.resettle();
    }

    chart(name, selector, config) {
      const existing = this.charts[name];
      if (existing) {
        existing.data = config.data;
        existing.update();
        return;
      }
      Chart.defaults.color = cssVar("--muted");
      Chart.defaults.borderColor = cssVar("--line");
      this.charts[name] = new Chart($(selector), config);
    }
  }

  S.taskView = {
    attach(view) {
      return new TaskExtras(view);
    },
  };
})();
