#!/bin/sh
# Several attnviz replicas on one host, sharing a read-only model cache and one Dask cluster.
#   ATTNVIZ_CACHE      the converted-model cache, made once by `deploy/warm_cache.py`, then mounted
#                      read-only on every replica (the same install path on each: entries are keyed
#                      on the bundled file's path, size and modification time)
#   ATTNVIZ_SCHEDULER  the Dask scheduler that runs the corpus tool's per-text work
#   PORTS              the replicas' ports (the rendered nginx config's upstream lists the same)
#   LISTEN, NGINX_DIR  nginx's port (default 8080) and prefix (default: the private folder
#                      ${XDG_RUNTIME_DIR:-$HOME/.cache}/attnviz-nginx): the config for these ports is written
#                      to $NGINX_DIR/attnviz.conf; start nginx with the line printed. The prefix holds nginx's
#                      config, pid and logs, so it is made 0700 and refused when it is a symlink or not ours
#                      (never a fixed name in the shared /tmp, which anyone can make first).
#   DASK_TLS_DIR       the replicas' Dask certificates (deploy/make_tls.sh): ca.pem, client.pem, client-key.pem.
#                      Needed for a tls:// scheduler; every connection is then encrypted and authenticated.
# Start the cluster first (deploy/cluster.sh): on the scheduler's host  PRIVATE_HOST=10.0.0.5 deploy/cluster.sh scheduler
#                                              on each worker host      PRIVATE_HOST=10.0.0.6 SCHEDULER_HOST=10.0.0.5 deploy/cluster.sh worker
set -eu
: "${ATTNVIZ_CACHE:?set ATTNVIZ_CACHE to the shared (read-only) model cache}"
: "${ATTNVIZ_SCHEDULER:?set ATTNVIZ_SCHEDULER to the Dask scheduler, e.g. tcp://10.0.0.5:8786}"
PORTS="${PORTS:-8501 8502}"
NGINX_DIR="${NGINX_DIR:-${XDG_RUNTIME_DIR:-$HOME/.cache}/attnviz-nginx}"
if [ -L "$NGINX_DIR" ]; then echo "replicas.sh: $NGINX_DIR is a symlink; give NGINX_DIR a folder of your own" >&2; exit 2; fi
(umask 077 && mkdir -p "$NGINX_DIR")
if [ ! -d "$NGINX_DIR" ] || [ -L "$NGINX_DIR" ] || [ ! -O "$NGINX_DIR" ]; then
    echo "replicas.sh: $NGINX_DIR is not a folder of this user; give NGINX_DIR a folder of your own" >&2; exit 2
fi
chmod 700 "$NGINX_DIR"
case "$ATTNVIZ_SCHEDULER" in
    tls://*)
        : "${DASK_TLS_DIR:?a tls:// scheduler needs DASK_TLS_DIR (ca.pem, client.pem, client-key.pem from deploy/make_tls.sh)}"
        export DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True \
            DASK_DISTRIBUTED__COMM__TLS__CA_FILE="$DASK_TLS_DIR/ca.pem" \
            DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT="$DASK_TLS_DIR/client.pem" \
            DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY="$DASK_TLS_DIR/client-key.pem" ;;
    tcp://127.0.0.1:*|tcp://localhost:*) ;;   # a cluster on this machine only
    *) echo "replicas.sh: give a tls:// scheduler (deploy/cluster.sh): a plain tcp:// one runs anyone's code" >&2; exit 2 ;;
esac
"$(dirname "$0")/nginx_conf.sh" "$PORTS" "${LISTEN:-8080}" > "$NGINX_DIR/attnviz.conf"
echo "nginx config for ports $PORTS: nginx -p $NGINX_DIR -c $NGINX_DIR/attnviz.conf" >&2
export ATTNVIZ_CACHE ATTNVIZ_SCHEDULER HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ATTNVIZ_TORCH_THREADS="${ATTNVIZ_TORCH_THREADS:-1}"
for port in $PORTS; do
    streamlit run app.py --server.headless true --server.address 127.0.0.1 --server.port "$port" \
        --browser.gatherUsageStats false &
done
wait
