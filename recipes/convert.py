"""Write a dataset to disk from a clone: ``python recipes/convert.py data=products_like_1m out=/data/products_1m``.

The same as the installed ``mqgnn-convert`` command; ``lightning_mqgnn/recipe/convert.py`` says
what it writes.
"""

from lightning_mqgnn.recipe.convert import cli

if __name__ == "__main__":
    cli()
