// The time zone page: offer the browser's own zone when it is not the one the form would save.
(() => {
  "use strict";
  const select = document.getElementById("id_time_zone");
  const holder = document.getElementById("browser-zone");
  const button = document.getElementById("use-browser-zone");
  let zone = "";
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "";
  } catch (error) {
    return;  // no Intl time zone support: the list alone is enough
  }
  if (!select || !holder || !button || !zone) return;
  const offered = Array.from(select.options).some((option) => option.value === zone);
  const chosen = () => select.value || holder.dataset.institutionZone;
  const refresh = () => { holder.hidden = !offered || chosen() === zone; };
  button.textContent = button.dataset.label.replace("%(zone)s", zone);
  button.addEventListener("click", () => {
    select.value = zone;
    refresh();
    select.focus();
  });
  select.addEventListener("change", refresh);
  refresh();
})();
