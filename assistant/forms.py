"""The Approvals page's forms: each field checked by the same function its service
applies (skills/rules.py, skills/egress.py), so an error shows next to its field; and
the answer to an approval prompt."""

from __future__ import annotations

from django import forms

from skills import egress
from skills.models import Policy
from skills.registry import skill_names
from skills.rules import MAX_RULE_DAYS, ruled_skill


class SkillRuleForm(forms.Form):
    skill = forms.ChoiceField()
    policy = forms.ChoiceField(choices=Policy.choices)
    recipient_domain = forms.CharField(
        required=False, max_length=egress.DOMAIN_MAX, label="Only to addresses at",
        help_text="Optional, for a skill that sends: example.com.")
    days = forms.IntegerField(
        required=False, min_value=1, max_value=MAX_RULE_DAYS, label="For how many days",
        help_text="Blank: until you revoke it.")

    def __init__(self, *args, owner=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.owner = owner
        # read each time: the registry may gain a domain, the owner an MCP server
        self.fields["skill"].choices = [(name, name) for name in skill_names(read_only=False, user=owner)]

    def clean_recipient_domain(self) -> str:
        domain = self.cleaned_data["recipient_domain"]
        return egress.plain_domain(domain) if domain else ""

    def clean(self):
        cleaned = super().clean()
        name, domain = cleaned.get("skill"), cleaned.get("recipient_domain")
        if name and domain and not ruled_skill(name, self.owner).sends:
            self.add_error("recipient_domain", f"{name} sends nothing: leave this blank.")
        return cleaned


class EgressAllowForm(forms.Form):
    entry = forms.CharField(max_length=egress.ENTRY_MAX, label="Address or domain",
                            help_text="bob@example.com, or example.com for everyone there.")

    def clean_entry(self) -> str:
        return egress.allow_entry(self.cleaned_data["entry"])


class ApprovalAnswerForm(forms.Form):
    """An answer to an approval prompt, naming the question it answers: the approval's id
    and the digest of the call shown (orchestration/questions/approvals.py `approval_answer`)."""

    ANSWERS = {"approve": (True, False), "always": (True, True), "deny": (False, False)}  # (approve, always)

    answer = forms.ChoiceField(choices=[(answer, answer) for answer in ANSWERS])
    approval = forms.IntegerField(min_value=1)
    digest = forms.CharField(max_length=64)
