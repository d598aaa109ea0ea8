// The server panel's charts as inline SVG, one function per kind of chart; each returns an <svg>'s markup for
// the caller to put in the page. No libraries: the page must work offline.
"use strict";

const Charts = (() => {
  const W = 300, H = 86;                                       // the viewBox; CSS scales it to the panel
  const LEFT = 34, RIGHT = 4, TOP = 6, BOTTOM = 16;           // the plot area's margins, room for the labels
  const PLOT_W = W - LEFT - RIGHT, PLOT_H = H - TOP - BOTTOM;

  // 1, 2 or 5 × 10^k, the smallest at or above v (and at least `least`): a y-axis top that reads well
  function niceTop(v, least = 1) {
    if (!(v > least)) return least;
    const power = 10 ** Math.floor(Math.log10(v));
    return [1, 2, 5, 10].map((m) => m * power).find((top) => top >= v);
  }

  const number = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));
  const label = (x, y, s, anchor) => `<text class="tick" x="${x}" y="${y}" text-anchor="${anchor}">${s}</text>`;
  const svg = (body) => `<svg viewBox="0 0 ${W} ${H}">${body}</svg>`;

  // the baseline, a gridline at the top, 0 and the top on the y axis, and [x, text, anchor] labels under the plot
  function frame(top, unit, xLabels) {
    const bottom = TOP + PLOT_H;
    return `<line class="axis" x1="${LEFT}" y1="${bottom}" x2="${W - RIGHT}" y2="${bottom}"/>` +
           `<line class="grid" x1="${LEFT}" y1="${TOP}" x2="${W - RIGHT}" y2="${TOP}"/>` +
           label(LEFT - 4, TOP + 4, number(top) + unit, "end") + label(LEFT - 4, bottom + 3, "0", "end") +
           xLabels.map(([x, s, anchor]) => label(x, H - 3, s, anchor)).join("");
  }

  /** Lines of one value per second, oldest first, the newest at "now", on an x axis of the last `seconds`.
   *  lines: [{values, cls}] (cls styles the line); top: a fixed y-axis top (100 for a percentage) or null to
   *  fit the data. */
  function timeSeries({ lines, seconds, top = null, unit = "" }) {
    top ??= niceTop(Math.max(0, ...lines.flatMap((line) => line.values)));
    const x = (secondsAgo) => LEFT + PLOT_W * (1 - secondsAgo / seconds);
    const y = (v) => TOP + PLOT_H * (1 - Math.min(v, top) / top);
    const paths = lines.filter((line) => line.values.length).map(({ values, cls }) => {
      const n = values.length;
      const points = values.map((v, i) => `${x(n - 1 - i).toFixed(1)},${y(v).toFixed(1)}`);
      return `<path class="line ${cls}" d="M${points.join("L")}"/>`;
    });
    const minutes = seconds / 60;
    const xLabels = [[LEFT, `−${number(minutes)} min`, "start"], [LEFT + PLOT_W / 2, `−${number(minutes / 2)} min`, "middle"],
                     [W - RIGHT, "now", "end"]];
    return svg(frame(top, unit, xLabels) + paths.join(""));
  }

  const duration = (ms) => (ms < 1000 ? `${ms} ms` : `${ms / 1000} s`);

  /** Bars of a histogram: counts[i] values at or below bounds[i] (and above bounds[i - 1]), in ms; the last count
   *  is of those above the last bound. Shows the buckets from the first non-empty one to the last, at least 5,
   *  with the bounds under the bars' edges. */
  function histogram({ bounds, counts }) {
    const filled = counts.map((c, i) => (c ? i : -1)).filter((i) => i >= 0);
    if (!filled.length) return svg(frame(1, "", []) + label(LEFT + PLOT_W / 2, TOP + PLOT_H / 2, "no requests yet", "middle"));
    let first = filled[0], last = filled[filled.length - 1];
    while (last - first < 4 && (first > 0 || last < counts.length - 1)) {
      if (first > 0) first -= 1;
      if (last - first < 4 && last < counts.length - 1) last += 1;
    }
    const top = niceTop(Math.max(...counts));
    const slot = PLOT_W / (last - first + 1);
    const bucketName = (i) => (i === 0 ? `≤ ${duration(bounds[0])}` : i < bounds.length
      ? `${duration(bounds[i - 1])} – ${duration(bounds[i])}` : `> ${duration(bounds[bounds.length - 1])}`);
    const bars = [], xLabels = [];
    const every = Math.ceil((last - first + 2) / 6);           // at most about six bounds under the axis
    for (let i = first; i <= last; i++) {
      const h = PLOT_H * counts[i] / top, left = LEFT + (i - first) * slot;
      bars.push(`<rect class="bar" data-count="${counts[i]}" x="${(left + 1).toFixed(1)}" ` +
                `y="${(TOP + PLOT_H - h).toFixed(1)}" width="${(slot - 2).toFixed(1)}" height="${h.toFixed(1)}">` +
                `<title>${bucketName(i)}: ${counts[i]}</title></rect>`);
      if ((i - first) % every === 0) {
        const bound = i === 0 ? "0" : duration(bounds[i - 1]);
        xLabels.push([left, bound, i === first ? "start" : "middle"]);
      }
    }
    return svg(frame(top, "", xLabels) + bars.join(""));
  }

  return { timeSeries, histogram };
})();
