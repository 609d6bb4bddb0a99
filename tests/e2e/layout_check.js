// The layout check of tests/e2e/test_report_html.py, run by headless Chromium on a copy of a page once it
// has loaded. A person reading the page at this width sees what the check measures: every text box as
// laid out (HTML text by its line boxes, a chart's texts by their drawn glyphs), and it says what no one
// could read. Its findings go into the data-layout attribute of the root element, which
// `chromium --dump-dom` prints.
//
// The charts are <img> of inline SVG, whose insides a page's script cannot see; each is put back in its
// place as inline SVG at the size the <img> had, so its texts are laid out exactly as the image draws
// them. Matplotlib draws a text as glyph paths in a <g id="text_N"> (named by the comment in it) scaled
// from 100-unit glyphs; an SVG <text> is measured as well.
(function () {
  const TOL = 1;          // px: boxes may touch, or meet by antialiasing, without being flagged
  const MIN_PX = 8;       // px: the smallest font size read at this width (6 pt)
  const problems = [];
  const say = (msg) => { if (problems.length < 80) problems.push(msg); };
  const snip = (s) => JSON.stringify(s.replace(/\s+/g, " ").trim().slice(0, 50));

  function inlineCharts() {
    let n = 0;
    for (const img of Array.from(document.querySelectorAll('img[src^="data:image/svg+xml;base64,"]'))) {
      const w = img.clientWidth, h = img.clientHeight;
      const bytes = Uint8Array.from(atob(img.src.split(",")[1]), (c) => c.charCodeAt(0));
      const doc = new DOMParser().parseFromString(new TextDecoder().decode(bytes), "image/svg+xml");
      const svg = document.importNode(doc.documentElement, true);
      svg.setAttribute("width", w);
      svg.setAttribute("height", h);
      const cs = getComputedStyle(img);
      svg.style.border = cs.border;
      svg.style.display = cs.display;
      svg.style.verticalAlign = cs.verticalAlign;
      const fig = img.closest("figure");
      svg.dataset.chart = fig && fig.id ? fig.id : "chart " + ++n;
      img.replaceWith(svg);
    }
  }

  function chartTexts(out) {
    for (const svg of Array.from(document.querySelectorAll("svg"))) {
      const chart = svg.dataset.chart || "svg";
      const box = svg.getBoundingClientRect();
      for (const el of Array.from(svg.querySelectorAll('g[id^="text_"], text'))) {
        const r = el.getBoundingClientRect();
        if (r.width <= 0 || r.height <= 0) continue;
        const note = Array.from(el.childNodes).find((c) => c.nodeType === Node.COMMENT_NODE);
        const name = `${chart}: ${snip(note ? note.data : el.textContent)}`;
        out.push({ id: el, name, r, q: turned(el) });
        if (r.left < box.left - TOL || r.right > box.right + TOL || r.top < box.top - TOL
            || r.bottom > box.bottom + TOL) say(`outside: ${name} runs past its chart's edge`);
        let px;
        const glyphs = el.tagName === "text" ? null : el.querySelector('g[transform*="scale"]');
        if (glyphs) {
          const m = glyphs.getScreenCTM();
          px = 100 * Math.hypot(m.a, m.b);
        } else {
          const m = el.getScreenCTM();
          px = parseFloat(getComputedStyle(el).fontSize) * Math.hypot(m.a, m.b);
        }
        if (px < MIN_PX) say(`small: ${name} is drawn ${px.toFixed(1)} px high (under ${MIN_PX} px)`);
      }
    }
  }

  // A curve (a line of the data, clipped to its axes: not a grid line, which lies in a tick's group, nor a
  // legend's handle) drawn where a legend is: sampled along its length in screen pixels, the points that
  // its axes clip away left out.
  function coveredCurves() {
    for (const svg of Array.from(document.querySelectorAll("svg"))) {
      const legends = Array.from(svg.querySelectorAll('g[id^="legend_"]')).map((g) => g.getBoundingClientRect());
      if (!legends.length) continue;
      for (const path of Array.from(svg.querySelectorAll('g[id^="line2d_"] > path[clip-path]'))) {
        if (path.closest('g[id^="legend_"], g[id^="xtick_"], g[id^="ytick_"]')) continue;
        const m = path.getScreenCTM(), len = path.getTotalLength();
        const id = (path.getAttribute("clip-path").match(/url\(#([^)]+)\)/) || [])[1];
        const rect = id && svg.querySelector(`clipPath[id="${id}"] > rect`);
        const corner = (x, y) => new DOMPoint(x, y).matrixTransform(m);
        const c = rect && [corner(rect.x.baseVal.value, rect.y.baseVal.value),
          corner(rect.x.baseVal.value + rect.width.baseVal.value, rect.y.baseVal.value + rect.height.baseVal.value)];
        const shown = (q) => !c || (q.x >= Math.min(c[0].x, c[1].x) && q.x <= Math.max(c[0].x, c[1].x)
                                    && q.y >= Math.min(c[0].y, c[1].y) && q.y <= Math.max(c[0].y, c[1].y));
        const hit = legends.some((r) => Array.from({ length: 401 }, (_, i) => i * len / 400).some((at) => {
          const q = path.getPointAtLength(at).matrixTransform(m);
          return shown(q) && q.x > r.left + TOL && q.x < r.right - TOL && q.y > r.top + TOL && q.y < r.bottom - TOL;
        }));
        if (hit) say(`covered: ${svg.dataset.chart || "svg"}: a legend lies over the curve ${path.parentElement.id}`);
      }
    }
  }

  function clips(el) {
    const cs = getComputedStyle(el);
    return cs.overflowX !== "visible" || cs.overflowY !== "visible";
  }

  function block(el) {
    while (el && getComputedStyle(el).display.startsWith("inline")) el = el.parentElement;
    return el;
  }

  function pageTexts(out) {
    const width = document.documentElement.clientWidth;
    const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
      const owner = node.parentElement;
      if (!node.data.trim() || owner.closest("svg, script, style")) continue;
      const range = document.createRange();
      range.selectNodeContents(node);
      const name = `<${owner.tagName.toLowerCase()}> ${snip(node.data)}`;
      const px = parseFloat(getComputedStyle(owner).fontSize);
      if (px < MIN_PX) say(`small: ${name} is ${px.toFixed(1)} px (under ${MIN_PX} px)`);
      const holder = block(owner);
      for (const r of Array.from(range.getClientRects())) {
        if (r.width <= 0 || r.height <= 0) continue;
        out.push({ id: node, name, r, q: corners(r) });
        if (r.left < -TOL || r.right > width + TOL) say(`outside: ${name} runs past the page's ${width} px`);
        const h = holder.getBoundingClientRect();
        if (r.left < h.left - TOL || r.right > h.right + TOL) {
          say(`outside: ${name} runs past its <${holder.tagName.toLowerCase()}>`);
        }
        for (let a = owner; a && a !== document.body; a = a.parentElement) {
          const b = a.getBoundingClientRect();
          if (clips(a) && (r.left < b.left - TOL || r.right > b.right + TOL || r.top < b.top - TOL
                           || r.bottom > b.bottom + TOL)) {
            say(`outside: ${name} is cut off by its <${a.tagName.toLowerCase()}>`);
          }
        }
      }
    }
  }

  function corners(r) {
    return [[r.left, r.top], [r.right, r.top], [r.right, r.bottom], [r.left, r.bottom]];
  }

  // A chart text's box turned as the text is: its glyphs' box in their own (unturned) units, taken to the
  // screen. The upright box around a slanted label (getBoundingClientRect) would call two neighbouring
  // slanted labels overlapping where their letters are well apart.
  function turned(el) {
    const inner = el.tagName === "text" ? el : el.querySelector('g[transform*="scale"]') || el;
    const b = inner.getBBox(), m = inner.getScreenCTM();
    return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
      .map(([x, y]) => { const p = new DOMPoint(x, y).matrixTransform(m); return [p.x, p.y]; });
  }

  // Two convex boxes overlap by more than TOL when no edge's normal separates them (by more than TOL).
  function meet(a, b) {
    for (const quad of [a, b]) {
      for (let i = 0; i < 4; i++) {
        const [x0, y0] = quad[i], [x1, y1] = quad[(i + 1) % 4];
        const len = Math.hypot(x1 - x0, y1 - y0);
        if (len === 0) continue;
        const n = [(y0 - y1) / len, (x1 - x0) / len];
        const pa = a.map(([x, y]) => x * n[0] + y * n[1]), pb = b.map(([x, y]) => x * n[0] + y * n[1]);
        if (Math.min(Math.max(...pa), Math.max(...pb)) - Math.max(Math.min(...pa), Math.min(...pb)) <= TOL) {
          return false;
        }
      }
    }
    return true;
  }

  function overlaps(boxes) {
    boxes.sort((a, b) => a.r.top - b.r.top);
    for (let i = 0; i < boxes.length; i++) {
      const a = boxes[i];
      for (let j = i + 1; j < boxes.length && boxes[j].r.top < a.r.bottom - TOL; j++) {
        const b = boxes[j];
        if (a.id === b.id) continue;
        const w = Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left);
        const h = Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top);
        if (w > TOL && h > TOL && meet(a.q, b.q)) {
          say(`overlap: ${a.name} and ${b.name} (${w.toFixed(0)} x ${h.toFixed(0)} px)`);
        }
      }
    }
  }

  function scrolled() {
    for (const el of Array.from(document.body.querySelectorAll("*"))) {
      if (el.closest("svg") || !clips(el)) continue;
      if (el.scrollWidth > el.clientWidth + TOL || el.scrollHeight > el.clientHeight + TOL) {
        say(`overflow: <${el.tagName.toLowerCase()}> ${snip(el.textContent)} holds ${el.scrollWidth} x `
            + `${el.scrollHeight} px in ${el.clientWidth} x ${el.clientHeight} px (scrolls or is cut off)`);
      }
    }
    const doc = document.documentElement;
    if (doc.scrollWidth > doc.clientWidth + TOL) {
      say(`overflow: the page is ${doc.scrollWidth} px wide in a ${doc.clientWidth} px window`);
    }
  }

  function check() {
    inlineCharts();
    const boxes = [];
    chartTexts(boxes);
    pageTexts(boxes);
    overlaps(boxes);
    coveredCurves();
    scrolled();
    const found = { problems, texts: boxes.length, charts: document.querySelectorAll("svg").length };
    document.documentElement.setAttribute("data-layout", JSON.stringify(found));
  }

  function run() {  // a fault of the check itself is reported as such, not as a page without problems
    try {
      check();
    } catch (e) {
      document.documentElement.setAttribute("data-layout", JSON.stringify({ error: String((e && e.stack) || e) }));
    }
  }

  if (document.readyState === "complete") run(); else window.addEventListener("load", run);
})();
