// Forks on the task view (docs/fork.md): a "Fork from here" button on every completed step
// (the child replays the steps before it, then its model, this one's or another, takes that
// step), and the family card: the parent this task was forked from, at which step, with a
// link to compare the two aligned at the branch point, and this task's own forks by branch
// step. app.js calls attach(view) when it opens a task, task(t) on every read of it and
// event(e) on every event. Everything from the API is inserted as text, never as HTML.
"use strict";

(() => {
  const S = window.Sandhive;
  if (!S) return;
  const { el, show, apiJson } = S;
  const enc = encodeURIComponent;
  const MAX_CHILDREN = 8; // the page's own bound; the API allows SANDHIVE_FORK_MAX_CHILDREN
  const CHILDREN_PAGE = 100;

  const taskHref = (id) => `#/tasks/${enc(id)}`;

  class ForkPanel {
    constructor(view) {
      this.view = view;
      this.current = null; // the task as last read
      this.stopped = false;
      this.children = null; // this task's forks once read
      this.profiles = null;
      this.origin = el("p", { id: "family-origin", class: "family-origin" });
      this.tree = el("ul", { id: "family-tree", class: "family-tree" });
      this.root = el(
        "section",
        { id: "family", class: "card family", hidden: true },
        el("h3", { text: "Family" }),
        this.origin,
        this.tree,
      );
      const old = document.getElementById("family");
      if (old) old.remove();
      const outcome = document.getElementById("outcome");
      outcome.parentNode.insertBefore(this.root, outcome.nextSibling);
    }

    stop() {
      this.stopped = true;
      this.root.remove();
    }

    /** A fresh read of the task: its origin, its forks, and a button on each card. */
    task(task) {
      const first = this.current === null;
      this.current = task;
      this.renderOrigin();
      if (first) this.loadChildren();
      for (const card of this.view.cards.values()) this.offer(card);
    }

    event(event) {
      if (event.type === "step.completed" && event.data) {
        const attempt = event.data.attempt || this.view.attempt;
        const card = this.view.cards.get(`${attempt}:${event.data.index}`);
        if (card) this.offer(card);
      }
      if (event.type === "task.finished") this.loadChildren();
    }

    // -- "Fork from here"

    forkable(card) {
      const task = this.current;
      if (!task || task.mode === "vanilla") return false;
      if (card.node.dataset.state !== "done" || card.node.dataset.ended) return false;
      return card.attempt === task.attempt; // a fork replays the latest attempt's steps
    }

    offer(card) {
      if (!this.forkable(card) || card.node.querySelector(".fork-here")) return;
      const button = el("button", {
        class: "ghost fork-here",
        type: "button",
        text: "Fork from here",
        title: `New tasks that replay steps 1–${card.index} in a fresh sandbox, then take step ${card.index + 1} with a model of your choice`,
        onclick: () => this.openForm(card, button),
      });
      card.node.querySelector(".step-head").append(button);
    }

    async openForm(card, button) {
      const existing = card.node.querySelector(".fork-form");
      if (existing) {
        existing.remove();
        return;
      }
      const model = el("select", { name: "model", "aria-label": "Model" });
      const count = el("input", { name: "n", type: "number", min: "1", max: String(MAX_CHILDREN), value: "1", "aria-label": "Children" });
      const diverge = el("input", { name: "allow_divergence", type: "checkbox" });
      const note = el("p", { class: "fork-note", hidden: true, role: "alert" });
      const form = el(
        "form",
        { class: "fork-form" },
        el("label", {}, "Model ", model),
        el("label", {}, "Children ", count),
        el("label", { title: "Go on past a replayed command whose answer differs from the record" }, diverge, " allow divergence"),
        el("button", { type: "submit", text: `Fork at step ${card.index + 1}` }),
        note,
      );
      form.addEventListener("submit", (e) => {
        e.preventDefault();
        this.submit(card, form, note);
      });
      card.node.querySelector(".step-head").after(form);
      button.setAttribute("aria-expanded", "true");
      for (const option of await this.modelOptions()) model.append(option);
    }

    /** The parent's model first, then every model each profile offers. */
    async modelOptions() {
      if (this.profiles === null) {
        try {
          this.profiles = (await apiJson("/v1/llm/profiles")).profiles;
        } catch (error) {
          this.profiles = [];
        }
      }
      const own = this.current.llm;
      const options = [el("option", { value: "", text: `${own.profile} / ${own.model} (this task's)` })];
      for (const profile of this.profiles) {
        for (const name of new Set([profile.model, ...profile.models].filter(Boolean))) {
          if (profile.name === own.profile && name === own.model) continue;
          options.push(el("option", { value: JSON.stringify({ profile: profile.name, model: name }), text: `${profile.name} / ${name}` }));
        }
      }
      return options;
    }

    async submit(card, form, note) {
      const fields = form.elements;
      const n = Math.max(1, Math.min(MAX_CHILDREN, Number(fields.n.value) || 1));
      const body = { step: card.index, n, allow_divergence: fields.allow_divergence.checked };
      if (fields.model.value) body.llm = JSON.parse(fields.model.value);
      const send = form.querySelector("button[type=submit]");
      send.disabled = true;
      show(note, false);
      try {
        const forked = await apiJson(`/v1/tasks/${enc(this.view.id)}/fork`, {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify(body),
        });
        form.remove();
        location.hash = taskHref(forked.tasks[0].id);
      } catch (error) {
        note.replaceChildren(S.errorView(error, "Could not fork"));
        show(note, true);
        send.disabled = false;
      }
    }

    // -- the family card

    renderOrigin() {
      const fork = this.current.fork;
      if (!fork) {
        this.origin.replaceChildren();
        show(this.origin, false);
      } else {
        const parts = [
          "Forked from ",
          el("a", { href: taskHref(fork.parent_id), text: fork.parent_id }),
          ` at step ${fork.step + 1}: steps 1–${fork.step} replayed. `,
          el("a", { class: "compare-parent", href: `#/compare/${enc(fork.parent_id)}/${enc(this.current.id)}`, text: "Compare with the parent" }),
        ];
        if (fork.diverged) {
          parts.push(el("span", { class: "diverged", text: ` The replay diverged at step ${fork.diverged.step + 1}.` }));
        }
        this.origin.replaceChildren(...parts);
        show(this.origin, true);
      }
      this.showCard();
    }

    async loadChildren() {
      let page;
      try {
        page = await apiJson(`/v1/tasks?forked_from=${enc(this.view.id)}&limit=${CHILDREN_PAGE}`);
      } catch (error) {
        return; // the family card is extra: the view works without it
      }
      if (this.stopped) return;
      this.children = page.items;
      const byStep = new Map();
      for (const child of this.children) {
        const step = child.fork ? child.fork.step : 0;
        if (!byStep.has(step)) byStep.set(step, []);
        byStep.get(step).push(child);
      }
      const steps = [...byStep.keys()].sort((a, b) => a - b);
      this.tree.replaceChildren(
        ...steps.map((step) =>
          el(
            "li",
            { class: "family-branch", "data-step": step },
            el("span", { class: "family-step", text: `from step ${step + 1}` }),
            el(
              "ul",
              {},
              ...byStep.get(step).map((child) =>
                el(
                  "li",
                  { class: "family-child" },
                  el("a", { href: taskHref(child.id), text: child.id }),
                  el("span", { class: `badge ${child.status}`, text: child.status }),
                  el("span", { class: "family-model", text: child.llm ? child.llm.model : "" }),
                  el("a", { class: "compare-child", href: `#/compare/${enc(this.view.id)}/${enc(child.id)}`, text: "compare" }),
                ),
              ),
            ),
          ),
        ),
      );
      this.showCard();
    }

    showCard() {
      const hasOrigin = Boolean(this.current && this.current.fork);
      show(this.root, hasOrigin || Boolean(this.children && this.children.length));
    }
  }

  S.taskFork = {
    attach(view) {
      return new ForkPanel(view);
    },
  };
})();
