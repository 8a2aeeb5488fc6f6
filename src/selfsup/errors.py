"""The one exception type for mistakes a user can make: the CLI prints its message and exits 2."""


class UserError(Exception):
    """A bad input the user can fix: its message is one line naming the thing and the fix."""

    exit_code = 2


def positive(value: int, flag: str) -> int:
    """``value`` of the command-line ``flag``, refused below 1."""
    if value < 1:
        raise UserError(f"{flag} {value} must be >= 1")
    return value


def clean_message(exc: BaseException) -> str:
    """One line for the user, also for a UserError re-raised from a DataLoader worker."""
    text = str(exc)
    if "Original Traceback" in text:  # torch.utils.data wraps worker exceptions with the traceback
        last = text.strip().splitlines()[-1]
        text = last.split(": ", 1)[1] if ": " in last else last
    return " ".join(text.split())
