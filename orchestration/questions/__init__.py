"""What the engine asks the owner, and their answers: a turn paused at a limit (Continue
or Stop), and approval of a side-effecting call the engine will not run unasked."""
