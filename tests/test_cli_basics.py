"""The CLI's contract: unknown flags are one-line errors with exit code 2."""

from sim.cli import main


def test_unknown_flag_is_one_line_exit_2(capsys):
    assert main(["collective", "--no-such-flag"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--no-such-flag" in err[0]
