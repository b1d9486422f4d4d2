"""What the engine records: the event log and its catalogue of types, the conversation's
transcript, bounds on stored output, outside content, and the audit that reads them."""
