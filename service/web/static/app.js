/* leakbisect status page: memory curves (uPlot), "Copy as Markdown", and marking that
   JavaScript runs. Everything else is server-rendered HTML refreshed by htmx; the page
   works without this file. No inline script anywhere (the CSP forbids it). */
(function () {
  "use strict";
  document.documentElement.classList.add("js");

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
  }

  function overlayPlugin(data) {
    // Warm-up shading (before the judged window) and step ticks, drawn under the series.
    return {
      hooks: {
        drawClear: [function (u) {
          var ctx = u.ctx, top = u.bbox.top, h = u.bbox.height;
          var from = (data.host && data.host.judged_from);
          if (from !== undefined && from !== null && data.t.length) {
            var x0 = u.valToPos(data.t[0], "x", true), x1 = u.valToPos(from, "x", true);
            ctx.save();
            ctx.fillStyle = css("--warmup");
            ctx.fillRect(x0, top, Math.max(0, x1 - x0), h);
            ctx.restore();
          }
          if (data.steps && data.steps.length) {
            ctx.save();
            ctx.strokeStyle = css("--muted");
            ctx.lineWidth = 1;
            ctx.beginPath();
            data.steps.forEach(function (t) {
              var x = u.valToPos(t, "x", true);
              ctx.moveTo(x, top + h);
              ctx.lineTo(x, top + h - 6 * devicePixelRatio);
            });
            ctx.stroke();
            ctx.restore();
          }
        }]
      }
    };
  }

  function plot(el, data) {
    var tables = [[data.t, data.rss]];
    var series = [{ label: "t (s)" }, { label: "host RSS", stroke: css("--rss"), width: 1.5 }];
    [["anon", "anonymous", "--anon"], ["shared", "shared", "--shared"], ["gpu", "GPU", "--gpu"]].forEach(function (s) {
      if (data[s[0]]) {
        tables[0].push(data[s[0]]);
        series.push({ label: s[1], stroke: css(s[2]), width: 1 });
      }
    });
    [["host", "RSS"], ["gpu_overlay", "GPU"]].forEach(function (o) {
      var ov = data[o[0]];
      if (!ov) { return; }
      if (ov.floors && ov.floors.length) {
        tables.push([ov.floors.map(function (p) { return p[0]; }), ov.floors.map(function (p) { return p[1]; })]);
        series.push({ label: o[1] + " floors", stroke: css("--floor"), width: 0,
          points: { show: true, size: 6, fill: css("--floor") }, paths: function () { return null; } });
      }
      if (ov.slope && ov.slope.length === 2) {
        tables.push([ov.slope.map(function (p) { return p[0]; }), ov.slope.map(function (p) { return p[1]; })]);
        series.push({ label: o[1] + " fitted slope", stroke: css("--slope"), width: 2, dash: [6, 4], spanGaps: true });
      }
    });
    var joined = tables.length > 1 ? uPlot.join(tables) : tables[0];
    var width = Math.max(280, el.clientWidth || 600);
    var opts = {
      width: width, height: Math.round(Math.min(320, width * 0.45)),
      scales: { x: { time: false } },
      axes: [
        { label: "seconds", stroke: css("--muted"), grid: { stroke: css("--line") } },
        { label: "MiB", stroke: css("--muted"), grid: { stroke: css("--line") } }
      ],
      series: series,
      plugins: [overlayPlugin(data)]
    };
    el.textContent = "";
    new uPlot(opts, joined, el);
    var note = document.createElement("p");
    note.className = "muted";
    note.textContent = data.points + " of " + data.samples + " samples drawn (min and max per bucket); shaded: warm-up; ticks: steps.";
    el.appendChild(note);
    el.dataset.drawn = "done";
  }

  function drawCurves(root) {
    if (typeof uPlot === "undefined") { return; }
    root.querySelectorAll("[data-curve]").forEach(function (el) {
      if (el.dataset.drawn) { return; }
      el.dataset.drawn = "loading";
      fetch(el.dataset.curve, { credentials: "same-origin" })
        .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
        .then(function (d) { plot(el, d); })
        .catch(function (e) { el.textContent = "curve unavailable: " + e.message; el.dataset.drawn = "failed"; });
    });
  }

  // The live panel (#job-live) refreshes itself (SSE "changed", every 30 s) for the release
  // it shows; a click on a release of its strip replaces it with that release's. A refresh
  // never undoes a click: none is sent while a click's request is in flight, and the answer
  // to one sent before a click is not swapped in (it would show the old release, and swap
  // the click's panel out). Not hx-sync's "replace": it aborts the refresh, and htmx logs
  // every aborted request to the console as an error.
  // Each request is marked when sent (swap events fire on the target, not the requester).
  var clicks = 0, clicking = 0;
  document.addEventListener("htmx:beforeRequest", function (e) {
    var d = e.detail;
    if (d.elt && d.elt.id === "job-live") {
      if (clicking) { e.preventDefault(); return; }
      d.xhr.leakbisect = { refresh: true, clicks: clicks };
    } else if (d.target && d.target.id === "job-live") {
      clicks += 1;
      clicking += 1;
      d.xhr.leakbisect = { click: true };
    }
  });
  document.addEventListener("htmx:beforeSwap", function (e) {
    var mark = e.detail.xhr && e.detail.xhr.leakbisect;
    if (mark && mark.refresh && mark.clicks !== clicks) { e.detail.shouldSwap = false; }
  });
  document.addEventListener("htmx:afterRequest", function (e) {
    var mark = e.detail.xhr && e.detail.xhr.leakbisect;
    if (mark && mark.click) { clicking = Math.max(0, clicking - 1); }
  });

  // A live refresh replaces the fragment: keep the sections the reader opened open.
  var opened = [];
  document.addEventListener("htmx:beforeSwap", function () {
    opened = Array.prototype.map.call(document.querySelectorAll("details[open][id]"), function (d) { return d.id; });
  });
  document.addEventListener("htmx:afterSettle", function () {
    opened.forEach(function (id) {
      var d = document.getElementById(id);
      if (d) { d.open = true; }
    });
  });

  document.addEventListener("DOMContentLoaded", function () { drawCurves(document); });
  document.addEventListener("htmx:afterSettle", function () { drawCurves(document); });
  // htmx's own history is off (its snapshots re-parse the page, which the CSP's style-src
  // refuses); a selected cell still gets its permalink in the address bar.
  document.addEventListener("click", function (e) {
    var cell = e.target.closest ? e.target.closest("a.cell[hx-get]") : null;
    if (cell && window.htmx && !e.ctrlKey && !e.metaKey && !e.shiftKey) {
      history.pushState({ leakbisect: true }, "", cell.href);
    }
  });
  window.addEventListener("popstate", function () { location.reload(); });
  document.addEventListener("click", function (e) {
    var button = e.target.closest ? e.target.closest("[data-copy]") : null;
    if (!button) { return; }
    var source = document.querySelector(button.dataset.copy);
    if (!source) { return; }
    var done = function () { button.textContent = "Copied"; };
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(source.value).then(done, function () { source.select(); document.execCommand("copy"); done(); });
    } else {
      source.select(); document.execCommand("copy"); done();
    }
  });
})();
