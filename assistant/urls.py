from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView

from assistant import views

urlpatterns = [
    path("", views.conversation_list, name="conversation_list"),
    path("conversations/new/", views.conversation_create, name="conversation_create"),
    path("conversations/<int:conversation_id>/", views.conversation_detail, name="conversation_detail"),
    path("conversations/<int:conversation_id>/messages/", views.message_send, name="message_send"),
    path(
        "conversations/<int:conversation_id>/turns/<int:turn_id>/continue/",
        views.turn_continue_view,
        name="turn_continue",
    ),
    path(
        "conversations/<int:conversation_id>/turns/<int:turn_id>/stop/",
        views.turn_stop_view,
        name="turn_stop",
    ),
    path(
        "conversations/<int:conversation_id>/turns/<int:turn_id>/approval/",
        views.approval_answer_view,
        name="approval_answer",
    ),
    path("conversations/<int:conversation_id>/delete/", views.conversation_delete_view, name="conversation_delete"),
    path("conversations/<int:conversation_id>/audit/", views.conversation_audit, name="conversation_audit"),
    path("conversations/<int:conversation_id>/turns/<int:turn_id>/fork/", views.turn_fork_view, name="turn_fork"),
    path(
        "conversations/<int:conversation_id>/audit.json",
        views.conversation_export,
        name="conversation_export",
    ),
    path("approvals/", views.approval_rules, name="approval_rules"),
    path("approvals/rules/", views.approval_rule_add, name="approval_rule_add"),
    path("approvals/rules/<int:rule_id>/revoke/", views.approval_rule_revoke, name="approval_rule_revoke"),
    path("approvals/allow/", views.egress_allow_add, name="egress_allow_add"),
    path("approvals/allow/<int:entry_id>/remove/", views.egress_allow_remove, name="egress_allow_remove"),
    path("preferences/time-zone/", views.time_zone_set, name="time_zone_set"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("healthz", views.healthz, name="healthz"),
    # Pages that name no icon (the admin's) make the browser ask for this one: a 404
    # there is a console error on every admin page.
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True), name="favicon"),
    path("admin/", admin.site.urls),
]
