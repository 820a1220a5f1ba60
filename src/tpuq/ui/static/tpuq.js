// The dashboard's only script of its own: draws the Cost page's chart from the JSON the server rendered.
// (Live updates are htmx attributes in the templates; there is no inline script, see the CSP in tpuq.ui.app.)
document.addEventListener("DOMContentLoaded", function () {
  var data = document.getElementById("cost-data");
  var canvas = document.getElementById("cost-chart");
  if (!data || !canvas || typeof Chart === "undefined") return;
  var d = JSON.parse(data.textContent);
  var colours = {"billed": "#4c6ef5", "running": "#37b24d", "race losers": "#f76707", "idle": "#fab005",
                 "lost to preemption": "#e03131"};
  var sets = Object.keys(d.series).map(function (name) {
    return {label: name, data: d.series[name], backgroundColor: colours[name] || "#868e96",
            stack: (name === "billed" ? "billed" : (name === "running" ? "used" : "waste"))};
  });
  window.tpuqCostChart = new Chart(canvas, {
    type: "bar", data: {labels: d.labels, datasets: sets},
    options: {animation: false, responsive: true, maintainAspectRatio: false,
              scales: {y: {title: {display: true, text: "VM-hours"}, stacked: true}, x: {stacked: true}}}
  });
});
