// Keep live pushes idempotent: a row or group the page already has is not appended again
// (a reconnect replays from the page's first known event; the server may resend).
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
