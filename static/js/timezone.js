// First visit: the user has no time zone yet, so the page (data-detect-time-zone on
// <body>) asks for the browser's and reports it once; the server keeps it only while
// none is set. Pages show times in it from the next load on.
// A beacon, not fetch: a click to the next page would abort a fetch still under way.
(function () {
  var url = document.body && document.body.getAttribute("data-detect-time-zone");
  var zone = window.Intl && Intl.DateTimeFormat().resolvedOptions().timeZone;
  if (!url || !zone || !navigator.sendBeacon) return;
  var headers = JSON.parse(document.body.getAttribute("hx-headers") || "{}");
  navigator.sendBeacon(url, new URLSearchParams({
    time_zone: zone, detected: "1", csrfmiddlewaretoken: headers["X-CSRFToken"] || "",
  }));
})();
