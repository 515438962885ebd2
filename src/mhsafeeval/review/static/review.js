// The review workbench's only script (the Content-Security-Policy allows no other): keyboard
// shortcuts, and marking spans of the reply. Text is only ever inserted as DOM text nodes.
"use strict";

(function () {
  const reply = document.getElementById("reply");
  const spansInput = document.getElementById("spans");
  const form = document.getElementById("rate");
  let original = "";   // the reply as stored: markers of invisible characters count as one
  let units = [];      // [{node, start}] in document order, for turning a selection into offsets
  let spans = [];      // [[start, end]] in code points

  const cpLength = (s) => Array.from(s).length;

  function readOriginal() {
    let text = "";
    for (const node of reply.childNodes) {
      if (node.nodeType === Node.TEXT_NODE) {
        text += node.data;
      } else if (node.classList && node.classList.contains("ctl")) {
        const ch = String.fromCodePoint(parseInt(node.dataset.cp, 16));
        serverMarked.add(ch);
        text += ch;
      } else {
        text += node.textContent;
      }
    }
    return text;
  }

  function covered(i) {
    return spans.some(([s, e]) => s <= i && i < e);
  }

  function render() {
    const chars = Array.from(original);
    reply.textContent = "";
    units = [];
    let i = 0;
    while (i < chars.length) {
      const marked = covered(i);
      let j = i;
      while (j < chars.length && covered(j) === marked) j++;
      const holder = marked ? document.createElement("mark") : reply;
      let k = i;
      while (k < j) {
        const ch = chars[k];
        const cp = ch.codePointAt(0);
        if (isControl(ch)) {
          const el = document.createElement("span");
          el.className = "ctl";
          el.dataset.cp = cp.toString(16).padStart(4, "0");
          el.title = "U+" + el.dataset.cp.toUpperCase();
          el.textContent = el.title;
          holder.appendChild(el);
          units.push({ node: el, start: k, ctl: true });
          k++;
        } else {
          let m = k;
          while (m < j && !isControl(chars[m])) m++;
          const t = document.createTextNode(chars.slice(k, m).join(""));
          holder.appendChild(t);
          units.push({ node: t, start: k, ctl: false });
          k = m;
        }
      }
      if (marked) reply.appendChild(holder);
      i = j;
    }
    const list = document.getElementById("span-list");
    if (list) {
      list.textContent = "";
      for (const [s, e] of spans) {
        const q = document.createElement("q");
        q.className = "span";
        q.textContent = chars.slice(s, e).join("");
        list.appendChild(q);
        list.appendChild(document.createTextNode(" "));
      }
    }
    spansInput.value = JSON.stringify(spans);
  }

  const serverMarked = new Set();  // what the server showed as a marker is one here too
  const invisible = /^[\p{Cc}\p{Cf}\p{Co}\p{Cn}\p{Zl}\p{Zp}]$/u;

  function isControl(ch) {
    // As the server decides (Python's str.isprintable): controls but tab and newline,
    // format characters (bidirectional controls, zero-width ones), private use, unassigned,
    // line and paragraph separators.
    return ch !== "\n" && ch !== "\t" && (serverMarked.has(ch) || invisible.test(ch));
  }

  function offsetOf(container, offset) {
    const ctl = container.nodeType === Node.ELEMENT_NODE ? container.closest(".ctl")
      : container.parentElement && container.parentElement.closest(".ctl");
    for (const u of units) {
      if (u.ctl && ctl === u.node) return u.start + (offset > 0 ? 1 : 0);
      if (u.node === container) return u.start + cpLength(container.data.slice(0, offset));
    }
    const point = document.createRange();
    point.setStart(container, offset);
    for (const u of units) {
      if (point.comparePoint(u.node, 0) > 0) return u.start;
    }
    return cpLength(original);
  }

  function markSelection() {
    const sel = window.getSelection();
    if (!sel || sel.rangeCount === 0 || sel.isCollapsed) return;
    const range = sel.getRangeAt(0);
    if (!reply.contains(range.commonAncestorContainer)) return;
    const start = offsetOf(range.startContainer, range.startOffset);
    const end = offsetOf(range.endContainer, range.endOffset);
    if (end > start) {
      spans.push([start, end]);
      spans.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
    }
    sel.removeAllRanges();
    render();
  }

  function go(id) {
    const link = document.getElementById(id);
    if (link) window.location.assign(link.getAttribute("href"));
  }

  function toggle(id) {
    const box = document.getElementById(id);
    if (box) box.checked = !box.checked;
  }

  document.addEventListener("keydown", (event) => {
    const target = event.target;
    const typing = target && (target.tagName === "TEXTAREA" || target.tagName === "INPUT");
    if (typing) {
      if (event.key === "Escape") target.blur();
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && form) form.requestSubmit();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const key = event.key;
    if (form && /^[1-5]$/.test(key)) {
      const radio = document.getElementById("severity-" + key);
      if (radio) radio.checked = true;
    } else if (key === "r") toggle("refused");
    else if (key === "c") toggle("understood");
    else if (key === "m" && reply) markSelection();
    else if (key === "x" && reply) { spans = []; render(); }
    else if (key === "t") { const c = document.getElementById("comment"); if (c) c.focus(); }
    else if (key === "Enter" && form) form.requestSubmit();
    else if (key === "n") go("next");
    else if (key === "p") go("prev");
    else if (key === "a") window.location.assign("/adjudicate");
    else if (key === "b") { const u = document.getElementById("unblind"); if (u) u.requestSubmit(); }
    else return;
    event.preventDefault();
  });

  if (reply && spansInput) {
    original = readOriginal();
    try {
      spans = JSON.parse(spansInput.value || "[]");
    } catch (e) {
      spans = [];
    }
    render();
  }
  document.body.dataset.ready = "1";
})();
