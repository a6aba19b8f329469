"""Summarise the recipe's runs under a folder from a clone: ``python recipes/summarize.py <folder> [--table test]``.

The same as the installed ``mqgnn-summarize`` command; ``lightning_mqgnn/recipe/summarize.py``
says what it reads and writes.
"""

from lightning_mqgnn.recipe.summarize import cli

if __name__ == "__main__":
    cli()
