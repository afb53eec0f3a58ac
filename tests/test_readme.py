"""The README's map of the recipe: each part it links is on the linked line of train_gpt.py, in
the recipe's sections (before the GPU kernels), where a reader of the recipe finds it; and the
training loop, which the recipe leads up to: short, and before line 700."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[`([^`]+)`\]\(train_gpt\.py#L(\d+)\)")


def test_each_part_of_the_recipe_is_on_the_line_the_readme_links():
    lines = (ROOT / "train_gpt.py").read_text().splitlines()
    kernels = next(i for i, line in enumerate(lines, 1) if line.startswith("# ---") and
                   line.endswith(" GPU kernels"))
    links = LINK.findall((ROOT / "README.md").read_text())
    named = {text for text, _ in links}
    assert {"relu_square_mlp", "softcap * torch.tanh(logits / softcap)", "document_causal",
            "attention_blocks", "softcap"} <= named and len(links) >= 35, sorted(named)
    for text, number in links:
        found = [i for i, line in enumerate(lines, 1) if text in line]
        assert text in lines[int(number) - 1], f"`{text}` is not on line {number} but {found}"
        assert int(number) < kernels, f"`{text}`, line {number}, is not in the recipe"


def test_the_training_loop_is_short_and_comes_before_line_700():
    lines = (ROOT / "train_gpt.py").read_text().splitlines()
    section = next(i for i, line in enumerate(lines, 1) if line.startswith("# ---") and
                   line.endswith(" training"))
    start = next(i for i, line in enumerate(lines, 1) if "for step in range(run.first_step" in line)
    indent = len(lines[start - 1]) - len(lines[start - 1].lstrip())
    end = next(i for i, line in enumerate(lines[start:], start + 1)
               if line.strip() and len(line) - len(line.lstrip()) <= indent) - 1
    assert section < start < 700 and end - start + 1 <= 25, (section, start, end)
