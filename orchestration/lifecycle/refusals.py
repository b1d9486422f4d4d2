"""Why a request cannot start or change a turn: raised by the turn's lifecycle and by
its questions (pauses, approvals), which the turn's lifecycle itself calls, so they live
apart from both."""


class TurnRefused(Exception):
    """The request cannot start or change a turn; the message says why, for the user."""


class TurnOver(TurnRefused):
    """The turn ended before the request reached it (a Stop pressed as it finished):
    nothing is left to do, which the page says as news, not as a failure."""
