"""The one exception for mistakes a user can make, and the exit codes the CLI maps them to."""
from __future__ import annotations

# Named exit codes (pipx style). 2 is what argparse uses for bad usage, so every user mistake
# shares it; the name says which kind in the one-line message.
EXIT_OK = 0
EXIT_RUN_FAILED = 1      # the job ran and failed (a lab's broken variant does this on purpose)
EXIT_USAGE = 2           # bad input: unknown lab/variant, bad --nproc, missing script, port taken
EXIT_HUNG = 3            # every rank stopped making progress (the stall rule); ddplab read the evidence
EXIT_DEADLINE = 4        # still making progress when the optional outer --deadline ran out
EXIT_INTERRUPTED = 130   # Ctrl-C


class DdplabError(Exception):
    """A user mistake: the message names the cause and the next step, on one line."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(f"{message}: {hint}" if hint else message)
