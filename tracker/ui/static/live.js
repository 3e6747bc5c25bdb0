// kiln console live updates: a page whose body names a JSON form
// (data-api) asks for it every data-poll milliseconds while the page is
// visible and puts the fresh content in place.
(function () {
  "use strict";
  var body = document.body, api = body.getAttribute("data-api");
  var period = parseInt(body.getAttribute("data-poll"), 10) || 2000;
  if (!api) { return; }
  var content = document.getElementById("content");
  var state = document.getElementById("live-state");
  var updated = document.getElementById("updated");
  var busy = false;

  function focusedInside() {
    var a = document.activeElement;
    return a && a !== body && content.contains(a) && (a.tagName === "INPUT" || a.tagName === "SELECT");
  }

  function poll() {
    if (busy || document.hidden || focusedInside()) { return; }
    busy = true;
    fetch(api + window.location.search, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) {
        if (r.status === 401) { window.location.assign("/login?next=" + encodeURIComponent(window.location.pathname + window.location.search)); throw new Error("logged out"); }
        return r.json();
      })
      .then(function (j) {
        if (typeof j.html !== "string") { throw new Error(j.error || "no content"); }
        content.innerHTML = j.html;
        if (window.KilnChart) { window.KilnChart.drawAll(content); }
        var d = new Date(j.updated);
        updated.textContent = d.toLocaleTimeString();
        updated.setAttribute("datetime", j.updated);
        state.textContent = "live";
        state.className = "";
      })
      .catch(function (e) {
        state.textContent = "not updating (" + e.message + ")";
        state.className = "stale";
      })
      .then(function () { busy = false; });
  }

  setInterval(poll, period);
  document.addEventListener("visibilitychange", poll);
})();
