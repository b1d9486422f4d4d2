function eventId(row) {
  return row && row.id && row.id.indexOf("event-") === 0 ? parseInt(row.id.slice("event-".length), 10) || 0 : 0;
}

// Keep live pushes idempotent: a row the page already has is not appended again (a
// connect replays the few events just before the page's last one; the server may resend).
// And keep the timeline in event-id order: a row that committed late (ids are taken at
// insert, not at commit) goes before the first row with a larger id, not at the end.
document.addEventListener("htmx:oobBeforeSwap", function (evt) {
  var fragment = evt.detail.fragment;
  if (!fragment || !fragment.children) return;
  var target = evt.detail.target;
  Array.prototype.slice.call(fragment.children).forEach(function (child) {
    if (child.id && target.id !== child.id && document.getElementById(child.id)) {
      child.remove();
      return;
    }
    if (target.id !== "timeline") return;
    var id = eventId(child), later = null;
    for (var row = target.lastElementChild; row && eventId(row) > id; row = row.previousElementSibling) later = row;
    if (id && later) target.insertBefore(child, later);
  });
  if (fragment.children.length === 0 && !target.matches("[hx-swap-oob]")) {
    evt.detail.shouldSwap = false;
  }
  var empty = document.getElementById("timeline-empty");
  if (empty && target.closest && target.closest("#timeline")) empty.remove();
});

// A push computed while the turn ran can arrive after a reply to the page (a Stop, a
// Continue) replaced the panel that held the answer draft: a draft with no placeholder
// to fill is stale, and htmx would log it as an error (htmx:oobErrorNoTarget). The
// socket's element uses this extension (templates/conversations/detail.html); htmx
// hands it that element's pushes, and the replies to the requests of elements inside it.
if (window.htmx) {
  htmx.defineExtension("live-push", {
    transformResponse: function (text, xhr, elt) {
      if (xhr || !elt || !elt.hasAttribute("ws-connect")) return text;
      if (text.indexOf('id="answer-draft"') < 0 || document.getElementById("answer-draft")) return text;
      var parsed = document.createElement("template");
      parsed.innerHTML = text;
      var stale = Array.prototype.filter.call(parsed.content.children, function (child) {
        return child.id === "answer-draft" && child.hasAttribute("hx-swap-oob");
      });
      if (!stale.length || parsed.content.querySelector("[hx-swap-oob] #answer-draft")) return text;
      stale.forEach(function (draft) { draft.remove(); });
      return parsed.innerHTML;
    }
  });
}

// The timeline follows the run while the user is at its bottom; scrolled up, they keep
// their place and a "jump to latest" button offers the way back down.
(function () {
  var following = true;

  function box() { return document.getElementById("timeline"); }
  function jump() { return document.getElementById("timeline-jump"); }
  function atBottom(el) { return el.scrollHeight - el.scrollTop - el.clientHeight < 8; }
  function toBottom() {
    var el = box();
    if (el) el.scrollTop = el.scrollHeight;
    following = true;
    if (jump()) jump().hidden = true;
  }

  document.addEventListener("scroll", function (evt) {
    if (evt.target !== box()) return;
    following = atBottom(evt.target);
    if (following && jump()) jump().hidden = true;
  }, true);
  document.addEventListener("click", function (evt) {
    if (evt.target.closest && evt.target.closest("#timeline-jump")) toBottom();
  });
  document.addEventListener("htmx:oobAfterSwap", function (evt) {
    if (!evt.detail.target || evt.detail.target.id !== "timeline") return;
    if (following) toBottom();
    else if (jump()) jump().hidden = false;
  });
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", toBottom);
  else toBottom();
})();

// The "now running" strip by the chat (templates/conversations/detail.html) repeats the
// newest timeline row, so a running turn's latest step is in view without scrolling down to
// the timeline; CSS shows it only while a turn is on. The conversation's title, clamped to
// two lines, keeps its whole text in its title attribute (a push replaces the heading) and
// shows it whole on a tap.
(function () {
  function refresh() {
    var slot = document.getElementById("now-running-text");
    var timeline = document.getElementById("timeline");
    var row = timeline && timeline.lastElementChild;
    var summary = row && eventId(row) && row.querySelector("summary");
    if (slot && summary) {
      var copy = document.createDocumentFragment();
      summary.childNodes.forEach(function (node) { copy.appendChild(node.cloneNode(true)); });
      slot.replaceChildren(copy);
    }
    var title = document.getElementById("conversation-title");
    if (title) title.title = title.textContent.trim();
  }
  document.addEventListener("htmx:oobAfterSwap", refresh);
  // The tap marks the heading's row, which pushes do not replace (a class on the heading
  // itself would be undone by the next push and htmx's settle).
  document.addEventListener("click", function (evt) {
    var title = evt.target.closest && evt.target.closest("#conversation-title");
    if (title && title.parentElement) title.parentElement.classList.toggle("title-expanded");
  });
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", refresh);
  else refresh();
})();

// After an htmx post the composer is replaced; give the new textarea the focus back.
document.addEventListener("htmx:afterSettle", function () {
  var box = document.querySelector("#composer textarea:not([disabled])");
  if (box && document.activeElement === document.body) box.focus();
});

// A sent message is done with: the reply is an empty 204 (the socket brings the panels),
// so nothing else clears the box, and the push below must not carry the text over. A
// refusal (409 still running, 429 too many) counts as "successful" to htmx, which swaps
// its message in: the text stays, to send later.
document.addEventListener("htmx:afterRequest", function (evt) {
  if (evt.detail.xhr.status !== 204 || !evt.detail.elt.matches || !evt.detail.elt.matches("form.composer")) return;
  var box = document.querySelector("#composer textarea");
  if (box) box.value = "";
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
      last = Math.max(last, eventId(row));
    });
    parsed.searchParams.set("last", last);
    return create(parsed.href);
  };
})();

// The server closes a socket it will not serve with an application code (assistant/
// consumers.py). htmx's ws extension reconnects only after abnormal closes (1006, 1011-
// 1013), so these end live updates for good: say so on the page, once, instead of
// leaving it silently stale.
(function () {
  var CLOSED = {
    4403: "Live updates are off: this conversation is not yours, or you have been signed out. Reload the page after signing in.",
    4429: "Live updates are off: too many live pages are open for your account or this conversation. Close some tabs or windows, then reload this page."
  };
  document.addEventListener("htmx:wsClose", function (evt) {
    var code = evt.detail && evt.detail.event && evt.detail.event.code;
    if (!CLOSED[code] || document.getElementById("live-closed")) return;
    var note = document.createElement("p");
    note.id = "live-closed";
    note.className = "notice warning";
    note.setAttribute("role", "alert");
    note.dataset.code = code;
    note.textContent = CLOSED[code];
    var chat = document.querySelector("#live .chat") || document.getElementById("live");
    var title = chat && chat.querySelector(".row");
    if (title) title.after(note);
    else if (chat) chat.prepend(note);
  });
})();

// Nobody watches a tab in the background: tell the socket when the page hides and shows
// (the one thing a page sends it). It sends a hidden tab nothing, and when the tab is in
// view again, what it missed, as a reconnect's catch-up does. A new socket starts out
// visible, so a page that (re)connects while hidden says so at once.
(function () {
  var socket = null;
  function tell() {
    // not `send`: it queues while the socket is down and would replay a stale state
    if (socket) socket.sendImmediately(JSON.stringify({ visible: document.visibilityState !== "hidden" }));
  }
  document.addEventListener("htmx:wsOpen", function (evt) {
    socket = evt.detail.socketWrapper;
    if (document.visibilityState === "hidden") tell();
  });
  document.addEventListener("htmx:wsClose", function () { socket = null; });
  document.addEventListener("visibilitychange", tell);
})();
