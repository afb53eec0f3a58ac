"""The README: its first screen, and its map of the recipe, each part it links by name in
train_gpt.py's recipe sections (before the GPU kernels), where a reader of the recipe finds it;
and the training loop, which the recipe leads up to, written out in one place."""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[`([^`]+)`\]\(train_gpt\.py([^)]*)\)")


def sections(source):
    """{section name: (first line, last line)} of train_gpt.py's `# ---- name` banners."""
    lines = source.splitlines()
    starts = [(i, line.lstrip("# -")) for i, line in enumerate(lines, 1)
              if line.startswith("# ---")]
    ends = [start - 1 for start, _ in starts[1:]] + [len(lines)]
    return {name: (start, end) for (start, name), end in zip(starts, ends)}


def test_each_part_of_the_recipe_the_readme_names_is_in_the_recipe():
    source = (ROOT / "train_gpt.py").read_text()
    recipe = "\n".join(source.splitlines()[:sections(source)["GPU kernels"][0]])
    links = LINK.findall((ROOT / "README.md").read_text())
    named = {text for text, _ in links}
    assert {"relu_square_mlp", "softcap * torch.tanh(logits / softcap)", "document_causal",
            "attention_blocks", "softcap", "Muon", "GPT"} <= named and len(links) >= 35, named
    for text, anchor in links:
        assert anchor == "", f"`{text}` links to {anchor!r}: a line number moves with every edit"
        assert re.search(rf"(?<!\w){re.escape(text)}(?!\w)", recipe), \
            f"`{text}`, which the README names, is not in the recipe's sections of train_gpt.py"


def test_the_training_loop_is_written_out_in_the_training_section_in_at_most_50_lines():
    source = (ROOT / "train_gpt.py").read_text()
    first, last = sections(source)["training"]
    train = next(node for node in ast.parse(source).body
                 if isinstance(node, ast.FunctionDef) and node.name == "train")
    (loop,) = [node for node in ast.walk(train) if isinstance(node, ast.For)
               and ast.unparse(node.target) == "step"]
    assert first < train.lineno and train.end_lineno <= last
    assert loop.end_lineno - loop.lineno + 1 <= 50, (loop.lineno, loop.end_lineno)


def test_the_first_screen_says_what_has_run_how_to_run_and_where_things_are():
    """At most 300 lines; in the first 40, the status (which says that 8 GPUs have not run it),
    the two commands and the layout of the repository's folders."""
    lines = (ROOT / "README.md").read_text().splitlines()
    first = "\n".join(lines[:40])
    assert len(lines) <= 300
    assert "What has run" in first and "never run on 8 GPUs" in first
    assert "./run.sh" in first and "python -m pytest -q" in first
    folders = {path.name for path in ROOT.iterdir() if path.is_dir()
               and not path.name.startswith((".", "__")) and path.name != "logs"}
    for folder in folders | {".ci"}:  # logs/ is what runs write
        assert f"\n{folder}/" in first, folder
