"""Launch recipes for a multi-host run, rendered from ``[cluster]``: a Slurm batch script and Kubernetes
manifests (docs/cluster.md). ``ludic cluster render`` writes them; no cluster is needed to render."""

from ludic.cluster.recipes.kubernetes import render_kubernetes
from ludic.cluster.recipes.render import render_recipes
from ludic.cluster.recipes.roles import RecipeError
from ludic.cluster.recipes.slurm import render_slurm

__all__ = ["RecipeError", "render_kubernetes", "render_recipes", "render_slurm"]
