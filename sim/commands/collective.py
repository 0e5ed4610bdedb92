"""``trainsim collective``: placeholder until the engine lands."""
NAME = "collective"
HELP = "Simulate one collective on a topology."


def add_arguments(p):
    pass


def run(args):
    return 0
