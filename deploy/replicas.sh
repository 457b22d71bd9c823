#!/bin/sh
# Several attnviz replicas on one host, sharing a read-only model cache and one Dask cluster.
#   ATTNVIZ_CACHE      the converted-model cache, made once by `deploy/warm_cache.py`, then mounted
#                      read-only on every replica (the same install path on each: entries are keyed
#                      on the bundled file's path, size and modification time)
#   ATTNVIZ_SCHEDULER  the Dask scheduler that runs the corpus tool's per-text work
#   PORTS              the replicas' ports (the rendered nginx config's upstream lists the same)
#   LISTEN, NGINX_DIR  nginx's port (default 8080) and prefix (default /tmp/attnviz-nginx): the config for
#                      these ports is written to $NGINX_DIR/attnviz.conf; start nginx with the line printed
# Start the cluster first:  dask scheduler --host 10.0.0.5 --port 8786
#                           dask worker tcp://10.0.0.5:8786 --nworkers 2 --nthreads 1   (on each worker host)
set -eu
: "${ATTNVIZ_CACHE:?set ATTNVIZ_CACHE to the shared (read-only) model cache}"
: "${ATTNVIZ_SCHEDULER:?set ATTNVIZ_SCHEDULER to the Dask scheduler, e.g. tcp://10.0.0.5:8786}"
PORTS="${PORTS:-8501 8502}"
NGINX_DIR="${NGINX_DIR:-/tmp/attnviz-nginx}"
mkdir -p "$NGINX_DIR"
"$(dirname "$0")/nginx_conf.sh" "$PORTS" "${LISTEN:-8080}" > "$NGINX_DIR/attnviz.conf"
echo "nginx config for ports $PORTS: nginx -p $NGINX_DIR -c $NGINX_DIR/attnviz.conf" >&2
export ATTNVIZ_CACHE ATTNVIZ_SCHEDULER HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ATTNVIZ_TORCH_THREADS="${ATTNVIZ_TORCH_THREADS:-1}"
for port in $PORTS; do
    streamlit run app.py --server.headless true --server.address 127.0.0.1 --server.port "$port" \
        --browser.gatherUsageStats false &
done
wait
