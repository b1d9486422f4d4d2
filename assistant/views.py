"""Thin views: validate, call a service or selector, render."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.html import escape
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from assistant.decorators import audited_conversation, owned_conversation
from assistant.forms import ApprovalAnswerForm, EgressAllowForm, SkillRuleForm
from assistant.live import panel_context, replay_floor
from assistant.preferences import InvalidTimeZone, preferences_time_zone_set
from assistant.ratelimits import CONVERSATION, MESSAGE, RateLimited, rate_limited
from orchestration import services
from orchestration.lifecycle.turns import TurnOver, TurnRefused, turn_start, turn_stop
from orchestration.questions.approvals import approval_answer
from orchestration.questions.pauses import AlreadyAnswered, turn_continue
from orchestration.replay.forking import fork_points, fork_request
from orchestration.reports import audit, selectors
from orchestration.reports.retention import DeletionRefused, conversation_delete, conversation_deletion_summary
from orchestration.reports.waterfall import turn_waterfall
from orchestration.zones import user_time_zone
from skills import egress, rules
from skills.models import EgressAllow, SkillRule


@require_GET
@login_required
def conversation_list(request):
    return render(request, "conversations/list.html", {
        "rows": selectors.conversation_rows(user=request.user), "time_zone": user_time_zone(request.user)})


@require_POST
@login_required
def time_zone_set(request):
    """The user's own time zone, from the conversation list's picker (a plain form: back
    to that page, now in the new zone) or reported by the browser on a first visit
    (`detected`: fills a blank one only; 204, the page stays as it is)."""
    detected = bool(request.POST.get("detected"))
    try:
        preferences_time_zone_set(user=request.user, time_zone=request.POST.get("time_zone", ""),
                                  only_if_unset=detected)
    except InvalidTimeZone as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    if detected:
        return HttpResponse(status=204)
    return redirect("conversation_list")


@require_POST
@login_required
def conversation_create(request):
    try:
        with rate_limited(user=request.user, action=CONVERSATION):
            conversation = services.conversation_create(owner=request.user)
    except RateLimited as exc:
        return _too_many(request, exc)
    return redirect(conversation)


def _too_many(request, refusal: RateLimited, conversation=None, text: str = ""):
    """429 with Retry-After: htmx gets the message in the composer's error slot (as a
    409 is), a plain form the site's page, with the unsent message to send again."""
    if request.htmx:
        response = _composer_error(refusal, status=429)
    else:
        context = {"message": str(refusal)}
        if conversation is not None:
            context.update(back_url=conversation.get_absolute_url(), back_words="Back to the conversation",
                           resend_url=reverse("message_send", args=[conversation.pk]), text=text)
        response = render(request, "429.html", context, status=429)
    response["Retry-After"] = str(refusal.retry_after)
    return response


def _composer_error(error, *, status: int) -> HttpResponse:
    response = HttpResponse(f'<p class="notice error" id="composer-error">{escape(str(error))}</p>', status=status)
    response["HX-Retarget"] = "#composer-error-slot"
    response["HX-Reswap"] = "innerHTML"
    return response


def _page_notice(notice) -> HttpResponse:
    """A notice where the page's pushes do not replace it (the composer they do, often
    just after: a Stop pressed as the turn ends crosses the push that ends it)."""
    response = HttpResponse(f'<p class="notice" id="page-notice">{escape(str(notice))}</p>')
    response["HX-Retarget"] = "#page-notice-slot"
    response["HX-Reswap"] = "innerHTML"
    return response


@require_GET
@owned_conversation
def conversation_detail(request, conversation):
    return render(request, "conversations/detail.html", _detail_context(conversation))


def _detail_context(conversation) -> dict:
    timeline = list(selectors.timeline(conversation=conversation))
    last_event_id = timeline[-1].pk if timeline else 0
    return {**panel_context(conversation), "oob": False, "timeline": timeline,
            "replay_from": replay_floor(conversation.pk, last_event_id)}


def _after_change(request, conversation, error: str = ""):
    """htmx gets an empty 204 (or a refusal for the composer's error slot); a plain form
    gets a redirect.

    The page's socket pushes every panel the change affects (assistant/live.py), so the
    reply carries none. It used to carry them as out-of-band swaps too, and lost a race:
    when the push replaced the form before the reply arrived, htmx looked for the reply's
    targets from the detached form (its root node, not the document), found none and
    logged `htmx:oobErrorNoTarget` for every panel. One source of the panels, no race.
    """
    if request.htmx:
        if not error:
            return HttpResponse(status=204)
        return _composer_error(error, status=409)
    if error:
        messages.error(request, error)
    return redirect(conversation)


@require_POST
@owned_conversation
def message_send(request, conversation):
    text = request.POST.get("text", "")
    try:
        with rate_limited(user=request.user, action=MESSAGE):
            turn_start(conversation=conversation, text=text)
    except RateLimited as exc:
        return _too_many(request, exc, conversation, text)
    except TurnRefused as exc:
        return _after_change(request, conversation, str(exc))
    return _after_change(request, conversation)


def _answer_turn(request, conversation, turn_id: int, service):
    turn = get_object_or_404(conversation.turns, pk=turn_id)
    try:
        service(turn=turn, user=request.user)
    except TurnOver as exc:  # news, not a failure: a 200 (the browser logs no error for it)
        if request.htmx:
            return _page_notice(exc)
        messages.info(request, str(exc))
        return redirect(conversation)
    except (AlreadyAnswered, TurnRefused) as exc:
        return _after_change(request, conversation, str(exc))
    return _after_change(request, conversation)


@require_POST
@owned_conversation
def turn_continue_view(request, conversation, turn_id: int):
    return _answer_turn(request, conversation, turn_id, turn_continue)


@require_POST
@owned_conversation
def turn_stop_view(request, conversation, turn_id: int):
    return _answer_turn(request, conversation, turn_id, turn_stop)


@require_POST
@owned_conversation
def approval_answer_view(request, conversation, turn_id: int):
    """Approve (once, or "always" for a while) or deny the call the prompt showed, which
    the form names (approval id, digest of the call): an answer to a question no longer
    waiting gets 409 with the question that is, never lands on it."""
    turn = get_object_or_404(conversation.turns, pk=turn_id)
    form = ApprovalAnswerForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("answer must be approve, always or deny, with the approval's id and digest")
    approve, always = ApprovalAnswerForm.ANSWERS[form.cleaned_data["answer"]]
    try:
        approval_answer(turn=turn, user=request.user, approval_id=form.cleaned_data["approval"],
                        digest=form.cleaned_data["digest"], approve=approve, always=always)
    except (AlreadyAnswered, TurnRefused) as exc:
        return _question_now(request, conversation, str(exc))
    return _after_change(request, conversation)


def _question_now(request, conversation, refusal: str):
    """409 for an answer that was not applied, with the question waiting now (or none):
    htmx swaps it over the prompt the answer came from, a plain form gets the page."""
    if request.htmx:
        context = {**panel_context(conversation, frozenset({"pause"})), "oob": False, "refusal": refusal}
        return render(request, "conversations/detail.html#pause", context, status=409)
    return render(request, "conversations/detail.html", {**_detail_context(conversation), "refusal": refusal},
                  status=409)


@require_http_methods(["GET", "POST"])
@owned_conversation
def conversation_delete_view(request, conversation):
    """GET: the confirm step, saying what goes (or why it cannot yet); POST: delete it,
    with everything in it, for good."""
    if request.method == "POST":
        try:
            conversation_delete(conversation=conversation, user=request.user)
        except DeletionRefused as exc:
            context = {"conversation": conversation, "summary": conversation_deletion_summary(conversation=conversation),
                       "error": str(exc)}
            return render(request, "conversations/delete.html", context, status=409)
        messages.success(request, f"Deleted “{conversation}” and everything in it.")
        return redirect("conversation_list")
    return render(request, "conversations/delete.html", {
        "conversation": conversation, "summary": conversation_deletion_summary(conversation=conversation)})


@require_GET
@audited_conversation
def conversation_audit(request, conversation):
    turns = conversation.turns.prefetch_related("dispatches__skill_executions", "pauses")
    trail = [{**audit.turn_audit(turn), "waterfall": turn_waterfall(turn)} for turn in turns]
    usage = selectors.conversation_usage(conversation=conversation)
    return render(request, "conversations/audit.html", {"conversation": conversation, "turns": trail, "usage": usage})


@require_http_methods(["GET", "POST"])
@owned_conversation
def turn_fork_view(request, conversation, turn_id: int):
    """Fork an ended turn: its stored answers up to a point, an edited answer there, then
    live, in a new conversation (orchestration/replay/forking.py). GET ?at=role:n shows
    that point's stored answer to edit. The owner's only: a fork runs their skills on
    their data, and staff, who may read any audit trail, act on none (staff fork with
    `manage.py replay --fork`)."""
    turn = get_object_or_404(conversation.turns, pk=turn_id)
    points = fork_points(turn)
    at = request.POST.get("at") or request.GET.get("at") or (points[0]["at"] if points else "")
    chosen = next((p for p in points if p["at"] == at), None)
    answer, error = request.POST.get("answer", chosen["answer"] if chosen else ""), ""
    if request.method == "POST":
        try:
            fork = fork_request(turn, at=at, answer_text=answer)
        except ValueError as exc:
            error = str(exc)
        else:
            messages.success(request, f"Forking turn {turn.number} at {at}: “{fork}”.")
            return redirect("conversation_detail", conversation_id=fork.pk)
    return render(request, "conversations/fork.html", {
        "conversation": conversation, "turn": turn, "points": points, "at": at, "answer": answer, "error": error,
    }, status=400 if error else 200)


@require_GET
@audited_conversation
def conversation_export(request, conversation):
    response = JsonResponse(audit.conversation_audit(conversation), json_dumps_params={"indent": 2})
    response["Content-Disposition"] = f'attachment; filename="conversation-{conversation.pk}-audit.json"'
    return response


APPROVALS_PAGE = "approvals/page.html"


def _approvals_context(user, *, rule_form=None, allow_form=None) -> dict:
    return {**rules.policy_overview(user), **egress.egress_overview(user),
            "rule_form": rule_form or SkillRuleForm(owner=user), "allow_form": allow_form or EgressAllowForm()}


def _approvals_answer(request, section: str, *, done: str = "", **forms):
    """After a post on the Approvals page: htmx gets its section again (a form with
    errors inside it, as typed); a plain form goes back to the page (PRG), or with errors
    gets the page again, 400, the form as typed."""
    failed = any(form.errors for form in forms.values())
    if request.htmx:
        return render(request, f"{APPROVALS_PAGE}#{section}", _approvals_context(request.user, **forms))
    if failed:
        return render(request, APPROVALS_PAGE, _approvals_context(request.user, **forms), status=400)
    if done:
        messages.success(request, done)
    return redirect("approval_rules")


@require_GET
@login_required
def approval_rules(request):
    """The owner's approval policy: each skill's default, their rules, the allow list, the caps."""
    return render(request, APPROVALS_PAGE, _approvals_context(request.user))


@require_POST
@login_required
def approval_rule_add(request):
    form = SkillRuleForm(request.POST, owner=request.user)
    if not form.is_valid():
        return _approvals_answer(request, "rules", rule_form=form)
    rule = rules.skill_rule_create(owner=request.user, **form.cleaned_data)
    return _approvals_answer(request, "rules", done=f"Rule added: {rule.words()}")


@require_POST
@login_required
def approval_rule_revoke(request, rule_id: int):
    rule = get_object_or_404(SkillRule, pk=rule_id, owner=request.user)
    rules.skill_rule_revoke(rule=rule)
    return _approvals_answer(request, "rules", done=f"Rule revoked: {rule.words()}")


@require_POST
@login_required
def egress_allow_add(request):
    form = EgressAllowForm(request.POST)
    if not form.is_valid():
        return _approvals_answer(request, "egress", allow_form=form)
    allowed = egress.egress_allow_add(owner=request.user, entry=form.cleaned_data["entry"])
    return _approvals_answer(request, "egress", done=f"Messages to {allowed.entry} no longer ask first.")


@require_POST
@login_required
def egress_allow_remove(request, entry_id: int):
    allowed = get_object_or_404(EgressAllow, pk=entry_id, owner=request.user)
    egress.egress_allow_remove(allowed=allowed)
    return _approvals_answer(request, "egress", done=f"Removed {allowed.entry} from your allow list.")


@require_GET
def healthz(request):
    return HttpResponse("ok", content_type="text/plain")
