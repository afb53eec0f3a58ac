"""The README's map of the recipe: each part it links is on the linked line of train_gpt.py, in
the recipe's sections (before the GPU kernels), where a reader of the recipe finds it."""
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
