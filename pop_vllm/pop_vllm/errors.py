"""The project's one base of refusals (pure: no vLLM, no torch). POP Lab's library re-exports it
as `pop_analysis.errors.InputError`; the plugin's run setting raises it too, so a refusal is
caught the same way whichever side of the seam it comes from."""


class InputError(ValueError):
    """Input the project refuses (a flag, a file, a stored record, a run setting); the message
    is one line."""


class SettingError(InputError):
    """A run setting that cannot run (run_setting.py and its parts: healing.py, precision.py);
    the message is one line, the same from every way in."""
