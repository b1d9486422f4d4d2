"""What is read back from the engine's rows for people: the conversation lists and
progress (selectors), a turn's waterfall, and retention, which prunes and deletes them."""
