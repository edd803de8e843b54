/*
 * What the page scripts share (console.js, attempt.js, start.js; loaded before them): the server's translated
 * "%(name)s" strings filled in, and a form posted with fetch() as Django expects it (its CSRF token, and a JSON
 * answer asked for).
 */
"use strict";

window.portal = {
  format(template, values) {
    return template
      .replace(/%\((\w+)\)s/g, (match, key) => (key in values ? String(values[key]) : match))
      .replace(/%%/g, "%");
  },

  postForm(form) {
    return fetch(form.action, {
      method: "POST",
      body: new FormData(form),
      headers: {
        Accept: "application/json",
        "X-CSRFToken": form.querySelector("input[name=csrfmiddlewaretoken]").value,
      },
      credentials: "same-origin",
    });
  },
};
