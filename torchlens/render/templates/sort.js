document.querySelectorAll("table.tl-sort").forEach(function (t) {
  t.querySelectorAll("thead th").forEach(function (th, i) {
    th.addEventListener("click", function () {
      var asc = th.getAttribute("data-dir") !== "asc";
      t.querySelectorAll("thead th").forEach(function (h) { h.removeAttribute("data-dir"); });
      th.setAttribute("data-dir", asc ? "asc" : "desc");
      var body = t.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[i], y = b.cells[i], vx = x.getAttribute("data-v"), vy = y.getAttribute("data-v");
        var r = (vx !== null && vy !== null) ? Number(vx) - Number(vy)
                                             : x.textContent.localeCompare(y.textContent);
        return asc ? r : -r;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
