"""What makes two runs of train_gpt.py alike, read from their logs: the hyperparameters they
logged, but those that may differ between runs of one result, and the code at the top of each log.

records/summarize.py averages only the runs that are alike; benchmarks/compare.py, whose job is
to compare two scripts' code, says where their hyperparameters differ. Both read them here. It
needs the standard library alone, so compare.py needs no scipy or matplotlib for it; and it lives
beside compare.py, so that a copy of tests/ and benchmarks/ (as the GPU runs' measure.sh make)
holds everything conftest.py imports.
"""
import ast
import os
import re

# A run's seed, where its files go or come from (its log, its checkpoints), and what runs off
# the clock and changes no step (validation's schedule, the undone compile steps): the runs of
# one result may differ in these. The data's folder may differ too: its files' names may not.
MAY_DIFFER = ("seed", "log_dir", "resume", "checkpoint_every", "save_checkpoint", "val_every",
              "compile_steps")
DATA = ("train_files", "val_files")
# train_gpt.py logs its dataclass as a dict's repr: strings, numbers, booleans and tuples
HYPERPARAMETERS = re.compile(r"^hyperparameters: (\{.*\})$", re.MULTILINE)
# train_gpt.py's log begins with the script's source, then this line (so do the record's)
END_OF_CODE = re.compile(r"^={100}$", re.MULTILINE)


def hyperparameters(text):
    """The hyperparameters a log's text gives below its code, less MAY_DIFFER and with the data's
    file names for DATA, as a dict; None where it gives none (the record format's logs) or none
    that reads as plain data. The first line counts: a run that torchrun restarted logs the same
    again."""
    end = END_OF_CODE.search(text)
    found = HYPERPARAMETERS.search(text, end.end() if end else 0)
    if found is None:
        return None
    try:
        logged = ast.literal_eval(NonFinite().visit(ast.parse(found[1], mode="eval")))
    except (ValueError, SyntaxError):  # not plain data
        return None
    return {name: os.path.basename(value) if name in DATA else value
            for name, value in logged.items() if name not in MAY_DIFFER}


class NonFinite(ast.NodeTransformer):
    """repr() writes an infinite or undefined float as the name inf or nan: read them as such."""

    def visit_Name(self, node):
        return ast.Constant(float(node.id)) if node.id in ("inf", "nan") else node


def code(text):
    """The code at the top of a log's text, before its line of 100 "="; None where it has no such
    line (a log written by code that exec() ran, a hand-written one)."""
    end = END_OF_CODE.search(text)
    return None if end is None else text[:end.start()]


def differing(a, b):
    """The hyperparameters in which a and b (as `hyperparameters` gives them) differ, as
    {name: [a's value, b's value]} in the order of a's log; None stands for a value a log lacks
    (no hyperparameter of train_gpt.py is None). Nothing differs where either is None: there is
    nothing to compare."""
    if a is None or b is None:
        return {}
    names = list(a) + [name for name in b if name not in a]
    return {name: [a.get(name), b.get(name)] for name in names if a.get(name) != b.get(name)}


def shown(value):
    """A hyperparameter's value as a report shows it: as the log has it, or "not logged"."""
    return "not logged" if value is None else repr(value)


def described(changed):
    """`differing`'s answer in words, one per hyperparameter: "model_dim 64 -> 128"."""
    return [f"{name} {shown(a)} -> {shown(b)}" for name, (a, b) in changed.items()]
