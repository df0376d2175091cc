"""The one exception `python -m syncopate.capture` reports.

It carries a message naming the flag or value at fault, and the exit code (1 error, 3 needs a GPU).
"""


class CaptureError(Exception):
    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code
