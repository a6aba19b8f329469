"""Train a node classifier from a clone: ``python recipes/train.py model=sage data=cora [key=value ...]``.

The same run as the installed ``mqgnn-train`` command, with the same configs
(``lightning_mqgnn/conf``); ``lightning_mqgnn/recipe/train.py`` says what it prints and writes.
"""

from lightning_mqgnn.recipe.train import cli

if __name__ == "__main__":
    cli()
