"""What a CLI run printed on stderr, for the one-line error contract."""


def one_error_line(capsys) -> str:
    """The run printed exactly one line, an error."""
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def last_error_line(capsys) -> str:
    """The run ended on an error line (a progress line may come before it)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), err
    return lines[-1]
