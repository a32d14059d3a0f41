"""The one exception type for a user's mistake."""


class UserError(Exception):
    """Bad input from the user: the CLI prints the message without a traceback and exits 2.

    The message says what went wrong, where (file, line, key), and how to fix it.
    """

    def __init__(self, what: str, *, where: str | None = None, fix: str | None = None):
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(self.message)

    def __reduce__(self):  # crosses process boundaries whole (data engine workers)
        return _rebuild_user_error, (self.what, self.where, self.fix)

    @property
    def message(self) -> str:
        parts = [self.what.rstrip(".") + "."]
        if self.where:
            parts.append(f"Where: {self.where}.")
        if self.fix:
            parts.append(f"Fix: {self.fix.rstrip('.')}.")
        return " ".join(parts)


def _rebuild_user_error(what: str, where: str | None, fix: str | None) -> UserError:
    return UserError(what, where=where, fix=fix)
