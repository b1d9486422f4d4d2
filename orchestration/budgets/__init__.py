"""What a turn, an agent and a user may spend: the limits and their words, the budgets
counted per agent and per conversation, the spend caps per user, model prices, and the
usage read back from the calls made."""
