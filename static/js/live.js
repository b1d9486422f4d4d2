// Keep live pushes idempotent: a row or group the page already has is not appended again
// (a connect replays the few events just before the page's last one; the server may resend).
document.addEventListener("htmx:oobBeforeSwap", function (evt) {
  var fragment = evt.detail.fragment;
  if (!fragment || !fragment.children) return;
  Array.prototype.slice.call(fragment.children).forEach(function (child) {
    if (child.id && evt.detail.target.id !== child.id && document.getElementById(child.id)) {
      child.remove();
    }
  });
  if (fragment.children.length === 0 && !evt.detail.target.matches("[hx-swap-oob]")) {
    evt.detail.shouldSwap = false;
  }
  var empty = document.getElementById("timeline-empty");
  if (empty && evt.detail.target.closest && evt.detail.target.closest("#timeline")) empty.remove();
});

// After an htmx post the composer is replaced; give the new textarea the focus back.
document.addEventListener("htmx:afterSettle", function () {
  var box = document.querySelector("#composer textarea:not([disabled])");
  if (box && document.activeElement === document.body) box.focus();
});

// A push replaces the composer whole (its state comes from the server); keep what the
// user was typing when the new one can take it.
document.addEventListener("htmx:oobBeforeSwap", function (evt) {
  if (evt.detail.target.id !== "composer" || !evt.detail.fragment.querySelector) return;
  var typed = evt.detail.target.querySelector("textarea");
  var incoming = evt.detail.fragment.querySelector("textarea");
  if (typed && typed.value && incoming && !incoming.disabled) incoming.value = typed.value;
});

// Every (re)connect asks for the events after the last one the page holds, not after the
// id rendered at page load: htmx's ws extension reads ws-connect once and hands the same
// URL to htmx.createWebSocket on each reconnect, so that is the one hook that sees every
// attempt (htmx:wsConnecting fires once the socket exists). The server steps back from
// this id to one surely settled (assistant/live.py resume_floor).
(function () {
  if (!window.htmx || !htmx.createWebSocket) return;
  var create = htmx.createWebSocket;
  htmx.createWebSocket = function (url) {
    var parsed = new URL(url, location.href);
    var last = parseInt(parsed.searchParams.get("last"), 10) || 0;
    document.querySelectorAll('#timeline [id^="event-"]').forEach(function (row) {
      last = Math.max(last, parseInt(row.id.slice("event-".length), 10) || 0);
    });
    parsed.searchParams.set("last", last);
    return create(parsed.href);
  };
})();
