"""``python -m ludic.inference.server MODEL_DIR``: serve a model over HTTP."""

from ludic.inference.server.app import main

main()
