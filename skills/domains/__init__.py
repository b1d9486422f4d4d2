"""The skill domains, one package each: `models.py` for its records (owned by a user),
`skills.py` for its handlers and its `DOMAIN` (listed in skills/registry.py)."""
