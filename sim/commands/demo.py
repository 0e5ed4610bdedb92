"""``trainsim demo``: placeholder until the engine lands."""
NAME = "demo"
HELP = "Run a small built-in demo and write its plots."


def add_arguments(p):
    p.add_argument("--out", default="out/demo")


def run(args):
    return 0
