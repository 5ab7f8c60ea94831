// The Ankusa console's one script: a page marked `data-live` refreshes its content from the
// server every few seconds, while the tab is visible and nobody is using a control on it.
// Bounded: one request at a time; after an error it waits up to a minute.
(function () {
  "use strict";
  var main = document.getElementById("main");
  if (!main || !main.dataset.live) return;
  var every = Math.max(1000, parseInt(main.dataset.live, 10) || 5000);
  var wait = every;
  var busy = false;
  function inUse() {
    var a = document.activeElement;
    return a && a !== main && a !== document.body && main.contains(a);
  }
  function tick() {
    if (busy || document.visibilityState !== "visible" || inUse()) {
      return schedule();
    }
    busy = true;
    fetch(location.href, { headers: { "x-console-fragment": "1" }, credentials: "same-origin", redirect: "error" })
      .then(function (r) {
        if (!r.ok) throw new Error(String(r.status));
        return r.text();
      })
      .then(function (html) {
        if (!inUse()) main.innerHTML = html;
        wait = every;
      })
      .catch(function () {
        wait = Math.min(wait * 2, 60000);
      })
      .then(function () {
        busy = false;
        schedule();
      });
  }
  var timer = null;
  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(tick, wait);
  }
  schedule();
})();
