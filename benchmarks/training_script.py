"""The training script a benchmark measures: train_gpt.py, or a copy of it (an attempt)."""
import importlib.util
import sys
from pathlib import Path

TRAIN_GPT = Path(__file__).resolve().parent.parent / "train_gpt.py"


def load_script(path=TRAIN_GPT):
    """The script at `path`, imported as the module named for its file (one already imported
    from that file is reused)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise SystemExit(f"error: --script={path}: no such file")
    loaded = sys.modules.get(path.stem)
    if loaded is not None and Path(getattr(loaded, "__file__", "")).resolve() == path:
        return loaded
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # as an import would: dataclasses look the module up
    spec.loader.exec_module(module)
    return module


def run_tool(main):
    """Run a tool's `main()`: bad input that the training script refuses (its UserError) ends
    the tool with the script's one-line message, not a traceback."""
    try:
        main()
    except Exception as error:
        if type(error).__name__ != "UserError":  # each copy of the script has its own class
            raise
        sys.exit(f"error: {error}")
