"""Fill the shared model cache once (ATTNVIZ_CACHE), before it is mounted read-only on the replicas
and the Dask workers: `python deploy/warm_cache.py [model keys...]` (default: every bundled model)."""
import sys

from attnviz.weights.catalogue import BUNDLED, load_model

for key in sys.argv[1:] or list(BUNDLED):
    print(key, load_model(key))
