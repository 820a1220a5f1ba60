// The dashboard's only script of its own: draws the Cost page's chart from the JSON the server rendered.
// (Live updates are htmx attributes in the templates; there is no inline script, see the CSP in tpuq.ui.app.)
document.addEventListener("DOMContentLoaded", function () {
  var data = document.getElementById("cost-data");
  var canvas = document.getElementById("cost-chart");
  if (!data || !canvas || typeof Chart === "undefined") return;
  var d = JSON.parse(data.textContent);
  var colours = {"billed": "#4c6ef5", "jobs' work kept": "#37b24d", "lost to preemption": "#e03131",
                 "idle": "#fab005", "race losers": "#f76707"};
  var sets = d.series.map(function (s) {
    return {label: s.name, data: s.values, backgroundColor: colours[s.name] || "#868e96", stack: s.stack};
  });
  window.tpuqCostChart = new Chart(canvas, {
    type: "bar", data: {labels: d.labels, datasets: sets},
    options: {animation: false, responsive: true, maintainAspectRatio: false,
              scales: {y: {title: {display: true, text: "VM-hours"}, stacked: true}, x: {stacked: true}}}
  });
});
