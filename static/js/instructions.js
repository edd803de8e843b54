/*
 * The lab's instructions: each code block gets Copy, and, on a page with the student's terminal, "Run in
 * terminal", which types the block into the console (a "portal:type" event that console.js sends as keystrokes).
 * Button words come from the instructions' data attributes (the page's language).
 */
"use strict";

(function () {
  const article = document.querySelector(".instructions[data-copy]");
  if (!article) {
    return;
  }
  const strings = article.dataset;

  function button(text, className) {
    const element = document.createElement("button");
    element.type = "button";
    element.className = "button small " + className;
    element.textContent = text;
    return element;
  }

  article.querySelectorAll("pre").forEach((pre) => {
    const code = pre.textContent.replace(/\n$/, "");
    pre.tabIndex = 0; // a block wider than the card scrolls, by keyboard too
    const bar = document.createElement("div");
    bar.className = "code-actions";
    const copy = button(strings.copy, "code-copy");
    copy.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(code);
        copy.textContent = strings.copied;
      } catch (error) {
        copy.textContent = strings.copyFailed;
      }
      window.setTimeout(() => { copy.textContent = strings.copy; }, 2000);
    });
    const run = button(strings.run, "code-run");
    // Offered only where a terminal the student may type in is on the page (console.js says so).
    run.hidden = !document.body.classList.contains("terminal-writable");
    run.addEventListener("click", () => {
      document.dispatchEvent(new CustomEvent("portal:type", { detail: { text: code.split("\n").join("\r") + "\r" } }));
    });
    bar.append(copy, run);
    pre.before(bar);
  });

  article.querySelectorAll("table").forEach((table) => { table.tabIndex = 0; }); // a wide one scrolls, by keyboard too

  // console.js toggles the class as the console's mode changes; the Run buttons follow.
  new MutationObserver(() => {
    const writable = document.body.classList.contains("terminal-writable");
    article.querySelectorAll(".code-run").forEach((run) => { run.hidden = !writable; });
  }).observe(document.body, { attributes: true, attributeFilter: ["class"] });
})();
