// mhsafeeval HTML report renderer. Model text is only ever inserted as DOM text nodes
// (textContent / createTextNode): never as HTML.
(function () {
  "use strict";
  var DATA = JSON.parse(document.getElementById("data").textContent);
  var MAX_CONVERSATIONS = 300;

  function el(tag, cls, children) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    (children || []).forEach(function (c) {
      if (c === null || c === undefined) return;
      node.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    });
    return node;
  }
  function label(word) { return String(word).split("_").join(" "); }
  function option(value, text) {
    var o = el("option", "", [text]);
    o.value = value;
    return o;
  }
  function select(name, options) {
    var s = el("select", "filter");
    s.name = name;
    options.forEach(function (o) { s.appendChild(option(o[0], o[1])); });
    return s;
  }

  // The reply with every evidence quote wrapped in <mark>, built from text nodes.
  function highlight(text, quotes) {
    text = text || "";
    var ranges = [];
    var lower = text.toLowerCase();
    (quotes || []).forEach(function (q) {
      if (!q) return;
      var hay = text, needle = q;
      if (text.indexOf(q) < 0 && lower.length === text.length) { hay = lower; needle = q.toLowerCase(); }
      var at = hay.indexOf(needle);
      while (at >= 0) {
        ranges.push([at, at + needle.length]);
        at = hay.indexOf(needle, at + needle.length);
      }
    });
    ranges.sort(function (a, b) { return a[0] - b[0]; });
    var node = el("div", "reply"), pos = 0;
    ranges.forEach(function (r) {
      if (r[1] <= pos) return;
      var start = Math.max(r[0], pos);
      if (start > pos) node.appendChild(document.createTextNode(text.slice(pos, start)));
      node.appendChild(el("mark", "", [text.slice(start, r[1])]));
      pos = r[1];
    });
    if (pos < text.length) node.appendChild(document.createTextNode(text.slice(pos)));
    return node;
  }

  function line(name, value, cls) {
    return el("div", "line " + (cls || ""), [el("span", "k", [name + ": "]), el("span", "v", [value])]);
  }

  function attemptView(a, threshold, quotes) {
    var box = el("div", "attempt" + (a.success ? " hit" : ""));
    box.appendChild(el("div", "meta", [
      "turn " + a.turn + ", attempt " + (a.attempt + 1) + (a.branch ? " [" + a.branch + "]" : "") +
      " \u00b7 " + label(a.category) + " / " + label(a.role) + " \u00b7 operator " + (a.operator || "?") +
      (a.committed ? " \u00b7 committed" : "")
    ]));
    if (a.instruction) box.appendChild(line("instruction", a.instruction, "instr"));
    box.appendChild(line("client", a.utterance || "(none)", "client"));
    var r = el("div", "line counselor", [el("span", "k", ["counselor: "])]);
    r.appendChild(highlight(a.reply || "(no reply)", quotes ? a.evidence : []));
    box.appendChild(r);
    box.appendChild(verdictView(a, threshold));
    return box;
  }

  function verdictView(a, threshold) {
    if (a.outcome === "verdict") {
      var v = el("div", "verdict s" + a.severity, [
        el("b", "sevtext", ["severity " + a.severity]), " \u00b7 ", a.label || "",
        a.severity >= threshold ? " \u00b7 attack success" : ""
      ]);
      if (a.reasoning) v.appendChild(el("div", "reasoning", [a.reasoning]));
      if (a.evidence && a.evidence.length) {
        var ul = el("ul", "evidence");
        a.evidence.forEach(function (q) { ul.appendChild(el("li", "", ["\u201c" + q + "\u201d"])); });
        v.appendChild(ul);
      }
      return v;
    }
    return el("div", "verdict other", [a.outcome + (a.unjudged_reason ? ": " + a.unjudged_reason : "") +
      (a.failed_error ? ": " + (a.failed_agent || "") + " " + a.failed_error : "")]);
  }

  function showElite(c, index, model, cat, role) {
    var panel = document.getElementById("elite-" + index);
    panel.hidden = false;
    panel.textContent = "";
    var elite = (c.archive[model] || {})[cat + "/" + role];
    panel.appendChild(el("h4", "", ["Elite trajectory: " + model + " \u00b7 " + label(cat) + " / " + label(role)]));
    var close = el("button", "close", ["close"]);
    close.addEventListener("click", function () { panel.hidden = true; });
    panel.appendChild(close);
    if (!elite) {
      panel.appendChild(el("p", "", ["No elite in this cell: nothing was found here yet."]));
      return;
    }
    // The conversation's committed turns before the elite's (kept inline even when the
    // transcripts are paged out).
    var before = (c.context[elite.conversation] || []).filter(function (a) {
      return a.turn < elite.turn;
    }).sort(function (a, b) { return a.turn - b.turn; });
    panel.appendChild(el("p", "meta", ["conversation " + elite.conversation + " \u00b7 " +
      before.length + " earlier committed turn(s), then the elite attempt"]));
    before.forEach(function (a) {
      var t = el("div", "turn", [el("div", "meta", ["turn " + a.turn])]);
      t.appendChild(line("client", a.utterance || "", "client"));
      t.appendChild(line("counselor", a.reply || "", "counselor"));
      panel.appendChild(t);
    });
    var e = {
      turn: elite.turn, attempt: elite.attempt, branch: "", category: elite.category, role: elite.role,
      operator: elite.operator, instruction: elite.instruction, utterance: elite.utterance,
      reply: elite.reply, outcome: "verdict", severity: elite.severity, label: elite.label,
      reasoning: elite.reasoning, evidence: elite.evidence, success: elite.severity >= c.threshold
    };
    var view = attemptView(e, c.threshold, true);
    view.classList.add("elite-attempt");
    panel.appendChild(view);
    panel.scrollIntoView({ block: "nearest" });
  }

  function heatmaps(root, c, index) {
    var mode = select("mode", [["severity", "best severity"], ["asr", "ASR"]]);
    root.appendChild(el("label", "switch", ["show: ", mode]));
    var legend = el("span", "legend");
    root.appendChild(legend);
    var grid = el("div", "grid");
    root.appendChild(grid);
    var cells = [];
    Object.keys(c.models).forEach(function (model) {
      var byCell = {};
      c.models[model].forEach(function (m) { byCell[m.category + "/" + m.role] = m; });
      var table = el("table", "heatmap", [el("caption", "", [model])]);
      var head = el("tr", "", [el("th", "", [""])]);
      c.roles.forEach(function (r) { head.appendChild(el("th", "", [label(r)])); });
      table.appendChild(el("thead", "", [head]));
      var body = el("tbody");
      c.categories.forEach(function (cat) {
        var row = el("tr", "", [el("th", "rowh", [label(cat)])]);
        c.roles.forEach(function (role) {
          var m = byCell[cat + "/" + role] || { attempts: 0 };
          var td = el("td", "cell");
          td.dataset.model = model;
          td.dataset.category = cat;
          td.dataset.role = role;
          var unconfirmed = (m.candidates || 0) - (m.confirmed || 0);
          td.title = label(cat) + " / " + label(role) + ": " + m.attempts + " judged attempt(s), " +
            (m.successes || 0) + " success(es)" +
            (unconfirmed ? ", " + unconfirmed + " unconfirmed candidate(s)" : "");
          if (m.attempts && m.best_severity >= c.threshold) td.classList.add("filled");
          if (m.attempts && m.attempts < 5) td.classList.add("sparse");
          td.addEventListener("click", function () { showElite(c, index, model, cat, role); });
          cells.push([td, m]);
          row.appendChild(td);
        });
        body.appendChild(row);
      });
      table.appendChild(body);
      grid.appendChild(table);
    });
    function paint() {
      legend.textContent = " colour = " + (mode.value === "asr" ? "share of judged attempts that succeeded" :
        "best severity") + " (\u00b7 = not tried; dashed = fewer than 5 judged attempts, too few " +
        "for its ASR to mean much; ? = only unconfirmed candidates, no finding); click a cell " +
        "for its elite trajectory";
      cells.forEach(function (pair) {
        var td = pair[0], m = pair[1];
        td.className = td.className.replace(/\bs\d\b/g, "").trim();
        td.style.background = "";
        td.style.color = "";
        if (!m.attempts) { td.textContent = "\u00b7"; return; }
        if (mode.value === "asr") {
          td.textContent = (m.asr || 0).toFixed(2);
          td.style.background = "hsl(" + (120 - 120 * (m.asr || 0)) + ", 70%, " + (85 - 30 * (m.asr || 0)) + "%)";
          td.style.color = "#222";
        } else {
          var only = (m.candidates || 0) > 0 && !(m.best_severity >= c.threshold);
          td.textContent = String(m.best_severity || "\u2013") + (only ? "?" : "");
          td.classList.add("s" + (m.best_severity || 0));
        }
      });
    }
    mode.addEventListener("change", paint);
    paint();
  }

  function transcripts(root, c) {
    var models = Object.keys(c.models);
    var cellKeys = [];
    c.categories.forEach(function (cat) {
      c.roles.forEach(function (r) { cellKeys.push([cat + "/" + r, label(cat) + " / " + label(r)]); });
    });
    var f = {
      model: select("model", [["", "all models"]].concat(models.map(function (m) { return [m, m]; }))),
      cell: select("cell", [["", "all cells"]].concat(cellKeys)),
      severity: select("severity", [["", "any severity"], ["1", "1"], ["2", "2"], ["3", "3"], ["4", "4"], ["5", "5"], ["none", "no verdict"]]),
      outcome: select("outcome", [["", "any outcome"], ["success", "attack success"], ["safe", "judged safe"],
        ["unjudged", "unjudged"], ["failed", "failed call"], ["incomplete", "incomplete"]])
    };
    var search = el("input", "filter");
    search.type = "search";
    search.name = "text";
    search.placeholder = "text contains\u2026";
    var count = el("span", "count");
    var pager = null, status = null;
    if (c.pages.length) {
      // Large campaign: the transcripts are in side files, one page of conversations each,
      // loaded with a script element (a file:// page may do that; it may not fetch()).
      pager = select("page", c.pages.map(function (p, i) {
        return [String(i), "page " + (i + 1) + " of " + c.pages.length + ": " + p.conversations +
          " conversation(s), " + p.attempts + " attempt(s) (" + p.first + " \u2026)"];
      }));
      status = el("span", "meta");
      root.appendChild(el("div", "filters", [el("label", "", ["transcripts: ", pager]), status]));
    }
    root.appendChild(el("div", "filters", [f.model, f.cell, f.severity, f.outcome, search, count]));
    var list = el("div", "list");
    root.appendChild(list);
    function keep(a) {
      if (f.model.value && a.counselor_model !== f.model.value) return false;
      if (f.cell.value && a.category + "/" + a.role !== f.cell.value) return false;
      if (f.severity.value === "none" && a.severity !== null) return false;
      if (f.severity.value && f.severity.value !== "none" && String(a.severity) !== f.severity.value) return false;
      var o = f.outcome.value;
      if (o === "success" && a.success !== true) return false;
      if (o === "safe" && !(a.outcome === "verdict" && a.success === false)) return false;
      if (o && o !== "success" && o !== "safe" && a.outcome !== o) return false;
      var q = search.value.toLowerCase();
      if (q && [a.instruction, a.utterance, a.reply, a.reasoning].join("\n").toLowerCase().indexOf(q) < 0) return false;
      return true;
    }
    function render() {
      list.textContent = "";
      var groups = {}, order = [], n = 0;
      c.attempts.forEach(function (a) {
        if (!keep(a)) return;
        n += 1;
        if (!groups[a.conversation]) { groups[a.conversation] = []; order.push(a.conversation); }
        groups[a.conversation].push(a);
      });
      count.textContent = n + " attempt(s) in " + order.length + " conversation(s)" +
        (pager ? " on this page (" + c.total + " attempts in all)" : "");
      count.dataset.attempts = String(n);
      order.slice(0, MAX_CONVERSATIONS).forEach(function (conv) {
        var rows = groups[conv], first = rows[0];
        var worst = Math.max.apply(null, rows.map(function (a) { return a.severity || 0; }));
        var d = el("details", "conversation", [el("summary", "", [
          conv + " \u00b7 " + first.counselor_model + " \u00b7 " + (first.profile_id || "?") + " \u00b7 " +
          (first.style ? "style: " + first.style + " \u00b7 " : "") +
          rows.length + " attempt(s) \u00b7 worst severity " + (worst || "\u2013")
        ])]);
        d.addEventListener("toggle", function () {
          if (!d.open || d.dataset.filled) return;
          d.dataset.filled = "1";
          rows.forEach(function (a) { d.appendChild(attemptView(a, c.threshold, true)); });
        });
        list.appendChild(d);
      });
      if (order.length > MAX_CONVERSATIONS) {
        list.appendChild(el("p", "meta", ["(first " + MAX_CONVERSATIONS + " conversations shown; narrow the filters)"]));
      }
    }
    [f.model, f.cell, f.severity, f.outcome].forEach(function (s) { s.addEventListener("change", render); });
    search.addEventListener("input", render);
    if (!pager) { render(); return null; }
    var script = null;
    function load() {
      var i = Number(pager.value), page = c.pages[i];
      if (script) script.remove();
      c.attempts = [];
      render();
      status.textContent = " loading " + page.src + "\u2026";
      script = document.createElement("script");
      script.src = page.src;
      script.onerror = function () {
        status.textContent = " could not load " + page.src + ": keep its folder next to the report";
        status.dataset.failed = "1";
      };
      document.head.appendChild(script);
    }
    pager.addEventListener("change", load);
    load();
    // What a page file calls: its attempts replace the shown ones (one page at a time).
    return function (page, attempts) {
      if (String(page) !== pager.value) return;
      c.attempts = attempts;
      status.textContent = " page " + (page + 1) + " of " + c.pages.length + " loaded";
      status.dataset.page = String(page + 1);
      render();
    };
  }

  var pages = {};
  window.mhsafeevalPage = function (campaign, page, attempts) {
    if (pages[campaign]) pages[campaign](page, attempts);
  };
  DATA.forEach(function (c, index) {
    var h = document.querySelector('.heatmaps[data-campaign="' + index + '"]');
    if (h) heatmaps(h, c, index);
    var t = document.querySelector('.transcripts[data-campaign="' + index + '"]');
    if (t) pages[index] = transcripts(t, c);
  });
  document.body.dataset.ready = "1";
})();
